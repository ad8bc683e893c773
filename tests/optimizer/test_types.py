"""The vocabulary with ``ps = 0``: an all-reduce job's configurations and sample tables."""

import numpy as np
import pandas as pd
import pytest

from airflow_dlrover.optimizer.types import Configuration, InvalidInputError, is_allreduce, validate_samples

pytestmark = pytest.mark.unit


def allreduce_table(**overrides):
    table = pd.DataFrame({
        "workers": [1, 2, 4], "ps": 0, "worker_cpu": [1.0, 2.0, 1.0], "ps_cpu": 0.0, "batch_size": 256,
        "throughput": [100.0, 180.0, 300.0], "worker_memory_used_mb": [900.0, 910.0, 905.0],
        "ps_cpu_used": np.nan, "ps_memory_used_mb": np.nan,
    })
    return table.assign(**overrides)


def test_an_allreduce_configuration_has_no_ps_resources():
    config = Configuration(workers=4, ps=0, worker_cpu=2.0, ps_cpu=0, worker_memory_mb=4096)
    assert (config.ps, config.ps_cpu, config.ps_memory_mb) == (0, 0.0, 0.0)
    assert isinstance(config.ps_cpu, float) and isinstance(config.ps_memory_mb, float)
    assert (config.cores, config.memory_mb, config.nodes) == (8.0, 4 * 4096.0, 4)
    assert "no PS (all-reduce)" in config.describe() and "0 PS" not in config.describe()
    assert is_allreduce(config) and is_allreduce(config.to_row())
    assert not is_allreduce(Configuration(4, 1, 2.0, 1.0))


@pytest.mark.parametrize("field, value", [("ps_cpu", 1.0), ("ps_memory_mb", 512.0)])
def test_a_ps_size_on_a_job_without_ps_names_the_field(field, value):
    kwargs = dict(workers=2, ps=0, worker_cpu=1.0, ps_cpu=0.0) | {field: value}
    with pytest.raises(InvalidInputError) as err:
        Configuration(**kwargs)
    assert err.value.field == field and err.value.value == value and "ps = 0" in err.value.allowed


def test_a_ps_job_still_needs_ps_cpu():
    with pytest.raises(InvalidInputError) as err:
        Configuration(2, 1, 1.0, 0.0)
    assert err.value.field == "ps_cpu" and "> 0" in err.value.allowed
    with pytest.raises(InvalidInputError) as err:
        Configuration(2, -1, 1.0, 1.0)
    assert err.value.field == "ps"


def test_an_allreduce_sample_table_validates_with_empty_ps_columns():
    table = allreduce_table(ps_cpu=np.nan, ps_memory_mb=np.nan)
    clean = validate_samples(table)
    assert (clean["ps"] == 0).all() and (clean["ps_cpu"] == 0.0).all() and (clean["ps_memory_mb"] == 0.0).all()
    assert clean["ps_memory_used_mb"].isna().all() and clean["ps_cpu_used"].isna().all()
    assert is_allreduce(clean) and not is_allreduce(clean.assign(ps=1, ps_cpu=1.0))
    validate_samples(allreduce_table().drop(columns=["ps_cpu_used", "ps_memory_used_mb"]))
    validate_samples(allreduce_table(ps_memory_used_mb=0.0))  # 0: nothing measured on no PS


@pytest.mark.parametrize("column, value", [("ps_cpu", 0.5), ("ps_memory_mb", 1024.0), ("ps_memory_used_mb", 300.0),
                                           ("ps_cpu_used", 0.2)])
def test_a_ps_value_on_a_row_without_ps_is_named(column, value):
    table = allreduce_table()
    table.loc[1, column] = value
    with pytest.raises(InvalidInputError) as err:
        validate_samples(table)
    assert err.value.field == f"samples.{column}" and err.value.value == value and "row: 1" in str(err.value)


def test_a_table_that_mixes_ps_and_allreduce_rows_is_refused():
    table = allreduce_table()
    table.loc[2, ["ps", "ps_cpu"]] = [2, 1.0]
    with pytest.raises(InvalidInputError) as err:
        validate_samples(table)
    assert err.value.field == "samples.ps" and "one kind of job" in err.value.allowed
    assert "row 2" in str(err.value.value) and "row 0" in str(err.value.value)
    with pytest.raises(InvalidInputError) as err:
        is_allreduce(table)
    assert err.value.field == "ps"


def test_a_ps_row_with_no_ps_cpu_is_still_refused():
    table = allreduce_table(ps=1, ps_cpu=1.0)
    table.loc[0, "ps_cpu"] = np.nan
    with pytest.raises(InvalidInputError) as err:
        validate_samples(table)
    assert err.value.field == "samples.ps_cpu" and "> 0" in err.value.allowed
