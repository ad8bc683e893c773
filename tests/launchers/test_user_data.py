"""A team's own data and model on the elastic runtime, end to end with the local launcher: Parquet
read by row group under faults, a user module with its own layout, the checks at launch, the
bad-row limit, and the export the job writes."""

from __future__ import annotations

import math
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.lifecycle.run import run_job
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError, parse_faults
from airflow_dlrover.runtime.datasets import TabularSource, write_synthetic
from airflow_dlrover.runtime.evaluate import metrics
from airflow_dlrover.runtime.export import load_export
from airflow_dlrover.runtime.spec import JobSpec

pytestmark = pytest.mark.jobs

CONFIG = Configuration(workers=2, ps=2, worker_cpu=1.0, ps_cpu=0.5, worker_memory_mb=2048, ps_memory_mb=1024)


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    """A day of synthetic logs as Parquet: 3 files, row groups of 20k, 7k and 33k rows."""
    folder = tmp_path_factory.mktemp("day")
    write_synthetic(str(folder / "logs"), 300_000, files=3, row_group_rows=[20_000, 7_000, 33_000], table_sizes=(5000,) * 26)
    return folder / "logs"


@pytest.mark.parametrize("fault", ["kill-worker@3s", "kill-ps@4s"])
def test_a_parquet_job_recovers_loses_nothing_and_exports_what_it_scored(tmp_path, day, fault):
    job = JobSpec(job_id=fault.split("@")[0], data=str(day), table_sizes=(5000,) * 26, checkpoint_interval_s=2.0,
                  export=str(tmp_path / "model"))
    launcher = LocalLauncher(tmp_path / "jobs")
    summary = run_job(launcher, job, CONFIG, tmp_path, parse_faults(fault))
    assert summary["samples_expected"] == summary["samples_trained"] == 240_000  # the last 20 % held out
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] <= job.shard_size
    assert summary["restarts"] >= 1 and summary["bad_rows"] == 0
    assert summary["eval_samples"] == 60_000 and summary["eval_auc"] >= 0.65
    assert summary["export"] == str(tmp_path / "model")
    exported = load_export(summary["export"])  # the round trip: the same model scores the same AUC
    spec = launcher.spec(summary["job_id"])
    held_out = TabularSource(spec.dataset, spec.layout).samples(*spec.held_out)
    again = metrics(held_out.label, exported.logits(held_out))
    assert again["auc"] == pytest.approx(summary["eval_auc"], abs=1e-5)
    assert again["loss"] == pytest.approx(summary["eval_loss"], abs=1e-5)
    assert exported.manifest["metrics"]["auc"] == pytest.approx(summary["eval_auc"])
    assert not list(tmp_path.glob("model.*"))  # no staging or replaced folder is left behind


def test_epochs_under_a_killed_worker_and_a_ps_change_apply_every_sample_once_per_epoch(tmp_path, day):
    # six epochs, so that the job outlasts the PS change at 5 s on a fast machine
    job = JobSpec(job_id="epochs", data=str(day), samples=60_000, epochs=6, table_sizes=(5000,) * 26,
                  checkpoint_interval_s=2.0, shuffle_window_rows=25_000)  # three windows, each shuffled
    ps_change = [(5.0, Configuration(2, 3, 1.0, 0.5, 2048, 1024))]
    summary = run_job(LocalLauncher(tmp_path / "jobs"), job, CONFIG, tmp_path, parse_faults("kill-worker@3s"), ps_change)
    assert summary["restarts"] >= 1 and any("re-partition" in " ".join(e.get("actions", [])) for e in summary["events"])
    assert summary["samples_expected"] == 360_000 and summary["samples_lost"] == 0
    assert summary["samples_duplicated"] <= job.shard_size  # a batch half pushed when its worker was killed
    assert [e["samples_expected"] for e in summary["samples_by_epoch"]] == [60_000] * 6
    assert all(e["samples_lost"] == 0 for e in summary["samples_by_epoch"])


def test_day_b_continued_from_day_a_beats_day_b_from_scratch_on_its_held_out_rows(tmp_path):
    sizes = (5000,) * 26
    # day A as long as day B is short: what day B alone cannot learn, its start from day A brings
    write_synthetic(str(tmp_path / "a"), 100_000, row_group_rows=10_000, table_sizes=sizes)
    write_synthetic(str(tmp_path / "b"), 30_000, row_group_rows=10_000, table_sizes=sizes, first=100_000)
    launcher, config = LocalLauncher(tmp_path / "jobs"), Configuration(2, 1, 1.0, 0.5, 2048, 1024)

    def day(name: str, data: str, **more) -> dict:
        job = JobSpec(job_id=name, data=str(tmp_path / data), table_sizes=sizes, export=str(tmp_path / name), **more)
        return run_job(launcher, job, config, tmp_path / name)

    a = day("a", "a")
    scratch, continued = day("b-scratch", "b"), day("b-continued", "b", init_from=a["export"])
    assert continued["eval_auc"] > scratch["eval_auc"] + 0.01, (continued["eval_auc"], scratch["eval_auc"])
    assert scratch["previous_model"] is None and continued["previous_model"]["uri"] == a["export"]
    spec = launcher.spec(continued["job_id"])  # day A's model on day B's held-out rows, scored independently
    held_out = TabularSource(spec.dataset, spec.layout).samples(*spec.held_out)
    again = metrics(held_out.label, load_export(a["export"]).logits(held_out))
    assert again["auc"] == pytest.approx(continued["previous_model"]["auc"], abs=1e-5)
    assert again["samples"] == continued["previous_model"]["samples"] == 6_000
    assert load_export(continued["export"]).manifest["init_from"] == a["export"]
    with pytest.raises(InvalidInputError, match="init_from"):  # another layout: refused at launch
        run_job(launcher, JobSpec(job_id="b-other", data=str(tmp_path / "b"), table_sizes=(4000,) * 26,
                                  init_from=a["export"]), config, tmp_path / "other")


USER_MODEL = '''
import torch
from torch import nn


class Ranker(nn.Module):
    """Concatenate the dense features and every table's vector; two layers."""

    def __init__(self, layout):
        super().__init__()
        width = layout.num_dense + sum(layout.dims)
        self.net = nn.Sequential(nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, embedded):
        return self.net(torch.cat([dense, *embedded], dim=1)).squeeze(1)


def build(layout):
    return Ranker(layout)


def build_wrong_shape(layout):
    model = Ranker(layout)
    model.forward = lambda dense, embedded: torch.zeros(len(dense), 2)
    return model
'''


@pytest.fixture()
def user_package(tmp_path, monkeypatch):
    """A package ``myrank`` on the path of this process and of the job's processes."""
    (tmp_path / "pkgs" / "myrank").mkdir(parents=True)
    (tmp_path / "pkgs" / "myrank" / "__init__.py").write_text(textwrap.dedent(USER_MODEL))
    (tmp_path / "pkgs" / "broken.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pkgs"))
    yield
    for name in ("myrank", "broken"):
        sys.modules.pop(name, None)


def _own_layout_data(path, rows=60_000, seed=0):
    """A team's own columns: a label, two numbers, a user id, a country and a multi-hot item list;
    the click depends on the price and on the items."""
    rng = np.random.default_rng(seed)
    price = rng.lognormal(2.0, 1.0, rows)
    items = [list(rng.integers(0, 200, rng.integers(0, 5))) for _ in range(rows)]
    logit = -0.5 * np.log(price) + np.array([sum(1.0 if i < 20 else -0.3 for i in x) for x in items])
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int8)
    table = pa.table({"clicked": label, "price": price, "age": rng.integers(18, 80, rows).astype(np.float64),
                      "user": rng.integers(0, 10_000, rows), "country": rng.choice(["de", "fr", "us", "jp"], rows),
                      "items": pa.array(items, pa.list_(pa.int64()))})
    pq.write_table(table, path, row_group_size=15_000)


LAYOUT = {"label": "clicked",
          "dense": [{"name": "price", "transform": "log1p"}, {"name": "age", "transform": "standardize"}],
          "sparse": [{"name": "user", "table_size": 4096, "dim": 8},
                     {"name": "country", "vocabulary": ["de", "fr", "us"], "dim": 4},
                     {"name": "items", "table_size": 512, "dim": 8, "multi_hot": True, "pooling": "mean"}]}


def test_a_user_model_with_its_own_layout_trains_and_its_export_loads(tmp_path, user_package):
    _own_layout_data(tmp_path / "own.parquet")
    job = JobSpec(job_id="own", data=str(tmp_path / "own.parquet"), layout=LAYOUT, model="myrank:build",
                  export=str(tmp_path / "export"), batch_size=256, shard_size=4096, checkpoint_interval_s=2.0)
    launcher = LocalLauncher(tmp_path / "jobs")
    summary = run_job(launcher, job, Configuration(1, 1, 1.0, 0.5, 2048, 1024, batch_size=256), tmp_path)
    assert summary["samples_trained"] == summary["samples_expected"] == 48_000 and summary["samples_lost"] == 0
    assert summary["eval_auc"] > 0.6  # the items carry the signal: the bag and the user's net learn it
    spec = launcher.spec("own")
    age = next(c for c in spec.layout.dense if c.name == "age")
    assert 40 < age.mean < 60 and 10 < age.std < 25  # measured at launch, on the training rows
    exported = load_export(str(tmp_path / "export"))
    assert [t["dim"] for t in exported.manifest["tables"]] == [8, 4, 8]
    assert exported.manifest["model"] == "myrank:build"
    held_out = TabularSource(spec.dataset, spec.layout).samples(*spec.held_out)
    assert metrics(held_out.label, exported.logits(held_out))["auc"] == pytest.approx(summary["eval_auc"], abs=1e-5)


@pytest.mark.parametrize("model, says", [("broken:build", "No module named 'no_such_module_anywhere'"),
                                         ("myrank:build_wrong_shape", "forward returned (4, 2) for 4 rows"),
                                         ("myrank:nothing", "has no attribute 'nothing'")])
def test_a_broken_user_model_fails_at_launch_with_its_traceback_and_starts_nothing(tmp_path, user_package, model, says):
    _own_layout_data(tmp_path / "own.parquet", rows=2000)
    job = JobSpec(job_id="broken", data=str(tmp_path / "own.parquet"), layout=LAYOUT, model=model)
    launcher = LocalLauncher(tmp_path / "jobs")
    with pytest.raises(InvalidInputError) as err:
        launcher.launch(job, CONFIG)
    assert err.value.field == "model" and says in str(err.value)
    assert not launcher.exists("broken")


def test_past_the_bad_row_limit_the_job_fails_without_retry_naming_the_first_row(tmp_path):
    names = ["label"] + [f"I{j + 1}" for j in range(13)] + [f"C{t + 1}" for t in range(26)]
    lines = [",".join(names)]
    for i in range(3000):
        dense = [str(i % 7)] * 13
        if i in (1500, 1501, 1502, 1600, 1700):
            dense[4] = "n/a"
        lines.append(",".join(["1" if i % 3 == 0 else "0", *dense, *[f"{(i * 7 + t) % 97:08x}" for t in range(26)]]))
    (tmp_path / "logs.csv").write_text("\n".join(lines) + "\n")
    job = JobSpec(job_id="bad", data=str(tmp_path / "logs.csv"), table_sizes=(1000,) * 26, shard_size=256,
                  batch_size=64, max_bad_rows=3, shuffle_window_rows=0)  # in the data's order: the first is 1502
    with pytest.raises(RuntimeError, match=r"no retry fixes: .*\d+ rows cannot be read, more than max_bad_rows=3; "
                                           r"the first: .*logs\.csv: row 1502, column I5: 'n/a'"):
        run_job(LocalLauncher(tmp_path / "jobs"), job, Configuration(1, 1, 1.0, 0.5, 2048, 1024), tmp_path)
    tolerant = JobSpec(job_id="tolerant", data=str(tmp_path / "logs.csv"), table_sizes=(1000,) * 26, shard_size=256,
                       batch_size=64, max_bad_rows=5, epochs=3)  # each epoch meets the same 5 rows, shuffled
    summary = run_job(LocalLauncher(tmp_path / "jobs"), tolerant, Configuration(1, 1, 1.0, 0.5, 2048, 1024), tmp_path)
    assert summary["bad_rows"] == 5 and summary["samples_trained"] == 7200 and summary["samples_lost"] == 0
    assert not math.isnan(summary["eval_loss"])


def test_a_worker_that_finds_the_model_broken_exits_with_the_user_error_code_and_says_why(tmp_path, user_package):
    """What a pod does on Kubernetes, where the launcher cannot import the image's module."""
    from airflow_dlrover.optimizer.constants import USER_ERROR_EXIT_CODE
    from airflow_dlrover.runtime.__main__ import main

    JobSpec(job_id="k8s", samples=1000, model="myrank:build_wrong_shape").save(tmp_path / "spec.json")
    code = main(["worker", "--job-dir", str(tmp_path), "--master", "127.0.0.1:9", "--name", "worker-0"])
    assert code == USER_ERROR_EXIT_CODE
    message = (tmp_path / "exit" / "worker-0.message").read_text()
    assert message.startswith("model='myrank:build_wrong_shape' is invalid") and "forward returned (4, 2)" in message


def test_an_export_folder_the_job_cannot_write_fails_at_launch(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    job = JobSpec(job_id="unwritable", samples=1000, export=str(tmp_path / "a-file" / "model"))
    launcher = LocalLauncher(tmp_path / "jobs")
    with pytest.raises(InvalidInputError) as err:
        launcher.launch(job, CONFIG)
    assert err.value.field == "export" and "a-file" in str(err.value) and not launcher.exists("unwritable")
