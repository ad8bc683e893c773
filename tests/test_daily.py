"""Day over day: the export a daily run continues from, and the deploy gate's rule."""

import math
import runpy
from pathlib import Path

import pytest

from airflow_dlrover.daily import MANIFEST, MAX_AUC_DROP, Verdict, deploy_verdict, previous_export

pytestmark = pytest.mark.unit

DAGS = Path(__file__).parents[1] / "dags"


def exports(root: Path, complete: list[str], incomplete: list[str] = ()) -> str:
    """``root`` with an export folder per date: ``complete`` ones with a manifest."""
    for day in complete:
        (root / day / "tables").mkdir(parents=True)
        (root / day / MANIFEST).write_text("{}")
    for day in incomplete:
        (root / day / "tables").mkdir(parents=True)
    return str(root)


def test_no_export_root_or_none_in_it_gives_none(tmp_path):
    assert previous_export("", "2026-11-05") == ""
    assert previous_export(str(tmp_path / "missing"), "2026-11-05") == ""
    assert previous_export(str(tmp_path), "2026-11-05") == ""
    (tmp_path / "a-file").write_text("")
    assert previous_export(str(tmp_path / "a-file"), "2026-11-05") == ""


def test_the_newest_complete_export_before_the_run_day_is_chosen(tmp_path):
    root = exports(tmp_path, ["2026-11-01", "2026-11-03", "2026-11-05", "2026-11-07"], incomplete=["2026-11-04"])
    (tmp_path / "2026-11-04.staging-1a2b3c4d").mkdir()  # an export being written
    (tmp_path / "2026-11-04.staging-1a2b3c4d" / MANIFEST).write_text("{}")
    assert previous_export(root, "2026-11-05") == f"{root}/2026-11-03"  # 11-04 has no manifest, 11-05 is the run's
    assert previous_export(root, "2026-11-06") == f"{root}/2026-11-05"
    assert previous_export(root + "/", "2026-11-02") == f"{root}/2026-11-01"
    assert previous_export(root, "2026-11-01") == ""  # only the run's own day
    assert previous_export(root) == f"{root}/2026-11-07"  # no day: the newest


def test_an_fsspec_url_keeps_its_form(tmp_path):
    root = exports(tmp_path, ["2026-11-01"])
    assert previous_export(f"file://{root}", "2026-11-02") == f"file://{root}/2026-11-01"


def test_the_daily_dag_continues_from_the_export_before_its_day(tmp_path):
    namespace = runpy.run_path(str(DAGS / "dlrm_daily_retrain.py"))
    dag, template = namespace["dag"], namespace["JOB_ARGS"]["init_from"]
    root = exports(tmp_path, ["2026-11-01", "2026-11-02"])
    render = dag.get_template_env().from_string(template).render
    assert render(params={"export": root}, ds="2026-11-02") == f"{root}/2026-11-01"
    assert render(params={"export": ""}, ds="2026-11-02") == ""


@pytest.mark.parametrize("auc, previous, deploy", [
    (0.75, None, True),  # no previous model: only min_auc
    (0.25, None, False),
    (0.5, None, True),  # min_auc itself passes
    (0.76, 0.75, True),  # better than yesterday
    (0.749, 0.75, True),  # within the tolerance
    (0.75 - MAX_AUC_DROP, 0.75, True),  # exactly the tolerance
    (0.7, 0.701, True),  # exactly the tolerance in decimal: float rounding does not fail it
    (0.7489, 0.75, False),  # past it
    (0.45, 0.44, False),  # better than yesterday, below min_auc
    (0.70, 0.80, False),
    (None, 0.75, False),  # no AUC today
    (math.nan, None, False),
    (0.75, math.nan, True),  # the previous model's AUC undefined: only min_auc
])
def test_the_gate_deploys_above_min_auc_and_within_max_auc_drop_of_the_previous_model(auc, previous, deploy):
    verdict = deploy_verdict(auc, previous, min_auc=0.5)
    assert isinstance(verdict, Verdict) and verdict.deploy is deploy, verdict


def test_a_refusal_names_both_aucs_and_the_tolerance():
    verdict = deploy_verdict(0.7010, 0.7050, min_auc=0.5, max_auc_drop=0.002)
    assert verdict == Verdict(False, "AUC 0.7010 is 0.0040 below the previous model's AUC 0.7050 on the same held-out "
                                     "rows, more than max_auc_drop=0.002: not deployed")
    both = deploy_verdict(0.45, 0.6, min_auc=0.5).reason
    assert both.startswith("AUC 0.4500 is below min_auc=0.5; AUC 0.4500 is 0.1500 below") and "0.6000" in both
    assert deploy_verdict(None, 0.7, min_auc=0.5).reason.startswith("the model has no held-out AUC")
    assert deploy_verdict(0.7, None, min_auc=0.5) == Verdict(
        True, "AUC 0.7000 is at least min_auc=0.5 (no previous model's AUC to compare with)")
    assert deploy_verdict(0.7, 0.7005, min_auc=0.5).reason == (
        "AUC 0.7000 is at least min_auc=0.5, and at most max_auc_drop=0.001 below the previous model's AUC 0.7005")
    assert deploy_verdict(0.7, 0.75, min_auc=0.5, max_auc_drop=0.05).deploy  # a looser tolerance
    assert deploy_verdict(0.625, 0.75, min_auc=0.5, max_auc_drop=0.125).deploy  # the boundary, exact in binary
    assert not deploy_verdict(0.625, 0.75, min_auc=0.5, max_auc_drop=0.124).deploy
    assert not deploy_verdict(0.75, 0.7, min_auc=0.8, max_auc_drop=1).deploy  # min_auc holds anyway


def test_the_deploy_dag_gates_the_newest_model_event_on_the_verdict():
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    namespace = runpy.run_path(str(DAGS / "deploy_on_new_model.py"))
    dag, model = namespace["deploy_on_new_model"](), namespace["MODEL"]
    assert dag.params["max_auc_drop"] == MAX_AUC_DROP and dag.params["min_auc"] == 0.5
    gate = dag.task_dict["gate"].python_callable
    params = {"min_auc": 0.5, "max_auc_drop": 0.001}

    def events(*extras):
        return {model: [SimpleNamespace(extra=extra) for extra in extras]}

    older = {"uri": "/m/1", "auc": 0.9, "previous_auc": None}
    newest = {"uri": "/m/2", "auc": 0.7051, "previous_uri": "/m/1", "previous_auc": 0.7050, "dag_run": "r"}
    assert gate(triggering_asset_events=events(older, newest), params=params) == newest
    with pytest.raises(AirflowFailException, match=r"AUC 0.7000 is 0.0050 below the previous model's AUC 0.7050 .* "
                                                   r"max_auc_drop=0.001"):
        gate(triggering_asset_events=events({**newest, "auc": 0.7}), params=params)
    assert gate(triggering_asset_events=events({**newest, "auc": 0.7}), params={**params, "max_auc_drop": 0.01})
