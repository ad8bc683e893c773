"""The views in a real browser: ``airflow api-server`` with the plugin, a login through
``POST /auth/token`` set as the UI's ``_token`` cookie, headless Chromium. Asserts that the charts
drew their data (points per dataset against the API's JSON, and ink on each canvas) and saves a
screenshot of each page it opens under ``tests/artifacts/``, or under the folder ``DLROVER_SCREENSHOTS``
names (relative to the repository root): ``DLROVER_SCREENSHOTS=docs/img/ui`` refreshes the docs' pictures."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from browser import Chromium, find_chromium
from ui_settings import PASSWORD, USER

ROOT = Path(__file__).parents[2]
SCREENSHOTS = ROOT / (os.environ.get("DLROVER_SCREENSHOTS") or "tests/artifacts")
CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install -y chromium; "
                                                          ".ci/run installs it)")]

#: Per canvas: data points per dataset, and the number of painted pixels.
CANVASES = """[...document.querySelectorAll('canvas')].map((c) => {
  const pixels = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let inked = 0;
  for (let i = 3; i < pixels.length; i += 4) if (pixels[i]) inked++;
  return {id: c.id, points: Number(c.dataset.points), series: JSON.parse(c.dataset.series || '{}'), inked};
})"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(auth_env, recorded_run, tmp_path_factory):
    """``airflow api-server`` on a free port, with the repository's plugins folder (the shim)."""
    port = free_port()
    log = tmp_path_factory.mktemp("api-server") / "api-server.log"
    env = {**os.environ, **auth_env, "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    airflow = Path(sys.executable).parent / "airflow"
    with log.open("w") as out:
        process = subprocess.Popen([str(airflow), "api-server", "--port", str(port), "--workers", "1"],
                                   stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=2):
                    break
            except OSError:
                assert process.poll() is None and time.monotonic() - started < 180, log.read_text()[-3000:]
                time.sleep(0.5)
        print(f"api-server healthy in {time.monotonic() - started:.1f} s")
        request = urllib.request.Request(f"{base}/auth/token", data=json.dumps({"username": USER, "password": PASSWORD})
                                         .encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            token = json.load(response)["access_token"]
        yield {"base": base, "token": token, "log": log}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def api(server, path: str):
    request = urllib.request.Request(f"{server['base']}/dlrover/api{path}",
                                     headers={"Authorization": f"Bearer {server['token']}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


@pytest.fixture()
def browser(server):
    with Chromium(CHROMIUM) as chromium:
        chromium.set_cookie(server["base"], "_token", server["token"])
        yield chromium


def screenshot(chromium: Chromium, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = chromium.screenshot(SCREENSHOTS / name)
    print(f"screenshot: {path}")
    return path


def test_the_plugin_is_mounted_once_and_needs_a_login(server):
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{server['base']}/dlrover/api/jobs", timeout=30)
    assert denied.value.code == 401
    request = urllib.request.Request(f"{server['base']}/api/v2/plugins",
                                     headers={"Authorization": f"Bearer {server['token']}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        plugins = [p for p in json.load(response)["plugins"] if p["name"] == "dlrover"]
    assert len(plugins) == 1 and len(plugins[0]["external_views"]) == 3
    assert "already registered" not in server["log"].read_text()


def test_the_run_view_draws_every_chart_from_the_api(server, browser, recorded_run):
    run = recorded_run["id"]
    started = time.monotonic()
    browser.open(f"{server['base']}/dlrover/runs/{run}")
    state = browser.wait_for("document.body && document.body.dataset.rendered")
    load_s = time.monotonic() - started
    assert state == "true", browser.evaluate("document.body.dataset.error")
    print(f"run view rendered in {load_s:.2f} s (charts drawn in {browser.evaluate('document.body.dataset.renderMs')} ms)")
    charts = {c["id"]: c for c in browser.evaluate(CANVASES)}
    screenshot(browser, "ui-run-view.png")
    assert set(charts) == {"chart-curve-workers", "chart-curve-ps", "chart-curve-worker_cpu", "chart-curve-ps_cpu",
                           "chart-pareto", "chart-cpu", "chart-memory", "chart-throughput"}
    for chart in charts.values():
        assert chart["points"] > 0 and chart["inked"] > 1000, chart

    samples = api(server, f"/runs/{run}/samples")
    profile = sum(s["stage"] == "profile" for s in samples)
    training = len(samples) - profile
    curves = api(server, f"/runs/{run}/curves")
    for axis in ("workers", "ps", "worker_cpu", "ps_cpu"):
        series = charts[f"chart-curve-{axis}"]["series"]
        assert series["model"] == series["90 % band"] == len(curves["axes"][axis]["x"])
        assert series["profile, on this slice"] + series["profile, elsewhere"] == profile
        assert series["training windows"] == training and series["plan"] == 1
    plans = api(server, f"/runs/{run}/plans")
    assert charts["chart-pareto"]["series"] == {"Pareto front": len(plans["pareto_front"]),
                                                "alternatives": len(plans["alternatives"]), "chosen": 1,
                                                "baseline (by hand)": 1}
    timeline = api(server, f"/runs/{run}/timeline")
    for role in ("workers", "PS"):
        assert charts["chart-cpu"]["series"][f"{role}: allocated"] == len(timeline["samples"]) == len(samples)
        assert charts["chart-memory"]["series"][f"{role}: used"] == len(samples)
    throughput = charts["chart-throughput"]["series"]
    assert throughput["profiling probes"] == profile and throughput["training windows"] == training
    assert throughput["keep"] + throughput["resize"] + throughput["revert"] == len(timeline["decisions"])
    assert throughput["failures / recoveries"] == len(api(server, f"/runs/{run}/instability")) >= 2
    rows = browser.evaluate("document.querySelectorAll('#instability-table tbody tr').length")
    assert rows == throughput["failures / recoveries"]
    assert browser.evaluate("document.querySelectorAll('#decisions tbody tr').length") == max(len(timeline["decisions"]), 1)

    # Today's model against the previous one: none in this run; a report with one shows both models' metrics.
    comparison = "document.getElementById('model-comparison').textContent"
    assert browser.evaluate(comparison) == "— (the job did not continue from an earlier model)"
    from airflow_dlrover.history.store import HistoryStore

    summary = HistoryStore().run(run)["summary"]
    set_summary(run, {**summary, "model_comparison": {
        "previous_uri": "/models/2026-11-01", "samples": 8000, "auc": 0.7123, "previous_auc": 0.7051,
        "auc_change": 0.0072, "log_loss": 0.4512, "previous_log_loss": 0.4601, "log_loss_change": -0.0089}})
    try:
        browser.open(f"{server['base']}/dlrover/runs/{run}")
        assert browser.wait_for("document.body && document.body.dataset.rendered") == "true"
        assert browser.evaluate(comparison) == "AUC 0.7123 vs 0.7051 (+0.0072) · log loss 0.4512 vs 0.4601 (−0.0089)"
        assert browser.evaluate("document.getElementById('model-comparison').value") == "/models/2026-11-01"
    finally:
        set_summary(run, summary)


def set_summary(run: int, summary: dict) -> None:
    """Replace the stored report of ``run`` (nothing else of it)."""
    from sqlalchemy.orm import Session

    from airflow_dlrover.history.store import HistoryStore, Run

    with Session(HistoryStore().engine) as session, session.begin():
        session.get(Run, run).summary = summary


def test_the_airflow_ui_shows_the_view_on_the_dag_run_and_task_pages(server, browser, recorded_run):
    dag, run_id = recorded_run["dag_id"], recorded_run["run_id"]
    quoted = urllib.parse.quote(run_id, safe="")
    frame = "document.querySelector('iframe[title=\"DLRover-RM\"]')"
    rendered = f"(() => {{ const f = {frame}; return f && f.contentDocument && f.contentDocument.body && f.contentDocument.body.dataset.rendered; }})()"

    browser.open(f"{server['base']}/dags/{dag}/runs/{quoted}/plugin/dlrover-run")
    assert browser.wait_for(rendered, timeout_s=90) == "true"
    src = urllib.parse.unquote(browser.evaluate(f"{frame}.src"))
    assert src == f"{server['base']}/dlrover/dag-runs/{dag}/{run_id}"  # the UI filled in the run
    assert browser.evaluate(f"{frame}.contentDocument.body.dataset.run") == str(recorded_run["id"])
    screenshot(browser, "ui-airflow-dag-run-tab.png")

    [guard] = [t for t in recorded_run["tasks"] if t.rsplit(".", 1)[-1] == "guard"]  # in the job's task group
    browser.open(f"{server['base']}/dags/{dag}/runs/{quoted}/tasks/{guard}/plugin/dlrover-task")
    assert browser.wait_for(rendered, timeout_s=90) == "true"
    body = f"{frame}.contentDocument.body"
    assert browser.evaluate(f"{body}.dataset.section") == "instability"  # the guard is the instability sensor
    assert browser.evaluate(f"{frame}.contentDocument.getElementById('instability').classList.contains('focus')")
    screenshot(browser, "ui-airflow-task-tab.png")


def test_the_job_list_and_the_what_if_form(server, browser, recorded_run):
    browser.open(f"{server['base']}/dlrover/")
    assert browser.wait_for("document.body && document.body.dataset.rendered") == "true"
    cells = browser.evaluate("[...document.querySelectorAll('#jobs tbody tr')].map((r) => r.innerText)")
    # the job's row shows its last run's status (other tests of the session may have run it since)
    [job] = [j for j in api(server, "/jobs") if (j["dag_id"], j["job"]) == (recorded_run["dag_id"], recorded_run["dag_id"])]
    assert any(recorded_run["dag_id"] in cell and job["last_run"]["status"] in cell for cell in cells)
    screenshot(browser, "ui-jobs.png")

    browser.open(f"{server['base']}/dlrover/what-if?job={job['id']}")
    assert browser.wait_for("document.body && document.body.dataset.rendered") == "true"
    submit = """(() => { const f = document.getElementById('what-if-form');
      f.elements.cpu.value = '%s'; f.elements.memory.value = '%s'; f.elements.objective.value = 'efficiency';
      f.requestSubmit(); return true; })()"""
    browser.evaluate(submit % ("6", "12Gi"))
    assert browser.wait_for("['done', 'error'].includes(document.body.dataset.whatIf) && document.body.dataset.whatIf") == "done"
    [chart] = browser.evaluate(CANVASES)
    expected = api(server, f"/jobs/{job['id']}/what-if?cpu=6&memory=12Gi&objective=efficiency")["plan"]
    assert chart["series"]["Pareto front"] == len(expected["pareto_front"]) and chart["inked"] > 1000
    text = browser.evaluate("document.getElementById('what-if-plan').innerText")
    assert f"{expected['workers']} worker" in text and "samples/s" in text
    screenshot(browser, "ui-what-if.png")

    browser.evaluate(submit % ("6", "12XB"))
    assert browser.wait_for("['done', 'error'].includes(document.body.dataset.whatIf) && document.body.dataset.whatIf") == "error"
    assert "memory='12XB' is invalid" in browser.evaluate("document.getElementById('what-if-error').innerText")
