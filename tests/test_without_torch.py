"""The Airflow side without torch (issue 18, packaging): torch is the ``runtime`` extra, so an
Airflow scheduler, triggerer, API server or worker that launches jobs on Kubernetes, or runs only
trainers of the user's own, has none. Each test runs in a subprocess where ``import torch`` raises
``ModuleNotFoundError`` (a meta-path finder ahead of every other), as it does where the package is
installed without the extra. The real install is checked by hand: README, "Install"."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_dlrover.optimizer.constants import USER_ERROR_EXIT_CODE

pytestmark = pytest.mark.jobs

ROOT = Path(__file__).resolve().parents[1]
#: the runtime's modules that train, and so import torch at the top: only the job's workers import them
TORCH_MODULES = {"airflow_dlrover.runtime.dlrm", "airflow_dlrover.runtime.lookup",
                 "airflow_dlrover.runtime.worker"}
BLOCKER = '''
import sys

class NoTorch:
    """torch is not installed."""
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

assert "torch" not in sys.modules
sys.meta_path.insert(0, NoTorch())
'''


def without_torch(code: str, timeout: float = 240, **env: str) -> dict:
    """Run ``code`` with torch blocked; it prints one JSON line last, which is returned."""
    script = BLOCKER + textwrap.dedent(code)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **env}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environ,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def stop_jobs(*folders: Path) -> None:
    """Stop every local job under ``folders``: no process outlives a test, whatever failed."""
    from airflow_dlrover.launchers.local import LocalLauncher

    for folder in (f for f in folders if f.is_dir()):
        launcher = LocalLauncher(folder)
        for job in folder.iterdir():
            if launcher.exists(job.name):
                launcher.stop(job.name)


def test_every_module_but_the_trainers_imports_without_torch():
    out = without_torch("""
        import importlib, json, pkgutil
        import airflow_dlrover
        from airflow_dlrover.get_provider_info import get_provider_info

        try:
            import torch
            blocked = False
        except ImportError:
            blocked = True
        info = get_provider_info()
        listed = {m for section in ("hooks", "operators", "sensors", "triggers") for entry in info.get(section, [])
                  for m in entry["python-modules"]}
        modules = {m.name for m in pkgutil.walk_packages(airflow_dlrover.__path__, "airflow_dlrover.")}
        failed = {}
        for name in sorted(modules | listed):
            try:
                importlib.import_module(name)
            except ImportError as err:
                failed[name] = err.name
        from airflow_dlrover.plugins import DLRoverPlugin
        print(json.dumps({"blocked": blocked, "failed": failed, "listed": sorted(listed - modules),
                          "plugin": DLRoverPlugin.name}))
    """)
    assert out["blocked"]  # the blocker works: a top-level torch import anywhere fails below
    assert out["failed"] == dict.fromkeys(TORCH_MODULES, "torch")
    assert out["listed"] == [] and out["plugin"] == "dlrover"  # the provider's modules are among those walked


def test_the_dags_parse_without_torch():
    """The example DAGs (the retrain, a second team's on its layout, the deploy on its model Asset)
    and the trainers' DAGs (``tests/conftest.py`` copies them into the dags folder)."""
    out = without_torch("""
        import json, os
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
        print(json.dumps({"errors": {k: v[-500:] for k, v in bag.import_errors.items()}, "dags": sorted(bag.dag_ids)}))
    """)
    assert out["errors"] == {}
    assert out["dags"] == ["ctr_daily_retrain", "ddp_dlrm_daily_retrain", "deploy_on_new_model", "dlrm_daily_retrain",
                           "ps_dlrm_daily_retrain", "torchrec_dlrm_daily_retrain"]


def test_the_ui_app_builds_without_torch():
    out = without_torch("""
        import json
        from airflow_dlrover.plugins import DLRoverPlugin
        from airflow_dlrover.plugins.app import create_app

        app = create_app()
        schema = app.openapi()
        [mounted] = DLRoverPlugin().fastapi_apps
        print(json.dumps({"paths": sorted(schema["paths"]), "mounted": mounted["url_prefix"]}))
    """)
    assert out["mounted"] == "/dlrover"
    assert any(path.startswith("/api/") for path in out["paths"])


def test_the_cli_plans_and_renders_kubernetes_manifests_without_torch(tmp_path):
    out = without_torch(f"""
        import contextlib, io, json
        from airflow_dlrover.cli import main

        demo = main(["demo", "--out", {str(tmp_path)!r}])
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            render = main(["render", {str(tmp_path / "plan.json")!r}, "--launcher", "kubernetes", "--job-id", "nt"])
        print(json.dumps({{"demo": demo, "render": render, "yaml": text.getvalue()}}))
    """)
    assert out["demo"] == 0 and out["render"] == 0
    kinds = {line.split(":", 1)[1].strip() for line in out["yaml"].splitlines() if line.startswith("kind:")}
    assert {"Pod", "Service", "Secret", "NetworkPolicy"} <= kinds


#: a trainer of the user's without torch that keeps the contract: three reports, then exit 0
TRAINER = """
import json, os, time
total = int(os.environ["DLROVER_SAMPLES"])
for step in (1, 2, 3):
    with open(os.environ["DLROVER_METRICS_FILE"], "a") as f:
        f.write(json.dumps({"throughput": 1000.0, "samples_done": total * step // 3, "samples_total": total,
                            "loss": 0.4, "auc": 0.75, "time": time.time()}) + "\\n")
    time.sleep(0.5)
"""


def test_the_local_launcher_runs_a_trainer_to_its_report_without_torch(tmp_path):
    """Launch, status, progress, the report's summary (the evaluation is the trainer's) and stop."""
    trainer = tmp_path / "train.py"
    trainer.write_text(TRAINER)
    try:
        out = without_torch(f"""
            import json, sys
            from airflow_dlrover.cli import main

            code = main(["run-trainer", "--workers", "1", "--worker-cpu", "0.5", "--worker-memory", "256Mi",
                         "--samples", "3000", "--timeout", "60", "--job-id", "no-torch-trainer",
                         "--out", {str(tmp_path / "out")!r},
                         "--", sys.executable, {str(trainer)!r}])
            print(json.dumps({{"code": code, "torch": "torch" in sys.modules}}))
        """)
    finally:
        stop_jobs(tmp_path / "out" / "jobs")
    assert out == {"code": 0, "torch": False}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["samples_done"] == summary["samples_total"] == 3000
    assert summary["auc"] == 0.75 and summary["loss"] == 0.4  # as the trainer reported them
    job = json.loads((tmp_path / "out" / "jobs" / "no-torch-trainer" / "job.json").read_text())
    assert {node["state"] for node in job["nodes"].values()} == {"stopped"}  # run_job stops the job at its end


def test_our_runtime_reports_its_own_evaluation_to_a_launcher_without_torch(tmp_path):
    """The job's finishing worker evaluates the held-out split: the report side (progress, the
    job's summary, stop) reads it from the master and never imports torch. The job is launched by
    a process with torch (the nodes run this Python), then adopted by one without it."""
    jobs = tmp_path / "jobs"
    launch = ("from airflow_dlrover.launchers.local import LocalLauncher\n"
              "from airflow_dlrover.optimizer.types import Configuration\n"
              "from airflow_dlrover.runtime.spec import JobSpec\n"
              f"LocalLauncher({str(jobs)!r}).launch("
              "JobSpec(job_id='no-torch-report', samples=40_000, table_sizes=(2000,) * 26), "
              "Configuration(workers=1, ps=1, worker_cpu=1.0, ps_cpu=0.5, worker_memory_mb=2048, ps_memory_mb=1024))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        subprocess.run([sys.executable, "-c", launch], check=True, env=env, timeout=120)
        out = without_torch(f"""
            import json, sys, time
            from airflow_dlrover.launchers.local import LocalLauncher
            from airflow_dlrover.lifecycle.run import job_summary

            launcher = LocalLauncher({str(jobs)!r})
            deadline = time.time() + 150
            while launcher.progress("no-torch-report")["state"] != "done" and time.time() < deadline:
                time.sleep(1.0)
            summary = job_summary(launcher, "no-torch-report", launcher.spec("no-torch-report"))
            launcher.stop("no-torch-report")
            print(json.dumps({{"summary": summary, "torch": "torch" in sys.modules}}))
        """)
    finally:
        stop_jobs(jobs)
    summary = out["summary"]
    assert not out["torch"]
    assert summary["samples_trained"] == summary["samples_expected"] and summary["samples_lost"] == 0
    assert summary["eval_samples"] > 0 and 0 < summary["eval_auc"] < 1 and summary["eval_loss"] > 0


def test_the_local_launcher_refuses_our_runtime_without_torch_naming_the_extra(tmp_path):
    try:
        out = without_torch(f"""
            import contextlib, io, json, pathlib, runpy, sys
            from airflow_dlrover.cli import main
            from airflow_dlrover.launchers.local import LocalLauncher
            from airflow_dlrover.optimizer.types import Configuration, InvalidInputError
            from airflow_dlrover.runtime.spec import JobSpec

            launcher = LocalLauncher({str(tmp_path / "jobs")!r})
            try:
                launcher.launch(JobSpec(job_id="no-torch-refused", samples=20_000, table_sizes=(1000,) * 26),
                                Configuration(1, 1, 1.0, 0.5, 2048, 1024))
                refused = None
            except InvalidInputError as err:
                refused = {{"field": err.field, "value": err.value, "message": str(err)}}
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                train = main(["train", "--workers", "1", "--samples", "20000", "--table-size", "1000",
                              "--out", {str(tmp_path / "train")!r}])
            # a worker node started where torch is missing (an image built without the extra)
            node = pathlib.Path({str(tmp_path / "node")!r})
            node.mkdir()
            JobSpec(job_id="no-torch-node").save(node / "spec.json")
            sys.argv = ["airflow_dlrover.runtime", "worker", "--job-dir", str(node), "--name", "worker-0"]
            try:
                runpy.run_module("airflow_dlrover.runtime", run_name="__main__")
            except SystemExit as exit:
                worker = exit.code
            print(json.dumps({{"refused": refused, "launched": launcher.exists("no-torch-refused"), "train": train,
                              "train_err": err.getvalue(), "worker": worker}}))
        """)
    finally:
        stop_jobs(tmp_path / "jobs", tmp_path / "train" / "jobs")
    refused = out["refused"]
    assert refused is not None, "the launch was not refused"
    assert refused["field"] == "python" and refused["value"] == sys.executable
    assert "pip install 'airflow-dlrover[runtime]'" in refused["message"] and "torch" in refused["message"]
    assert not out["launched"]  # refused before any node started
    assert out["train"] == 2 and "airflow-dlrover[runtime]" in out["train_err"]
    assert out["worker"] == USER_ERROR_EXIT_CODE  # the launcher fails the job without retry
    message = (tmp_path / "node" / "exit" / "worker-0.message").read_text()
    assert "airflow-dlrover[runtime]" in message


def test_with_torch_installed_the_check_passes_without_importing_it():
    code = ("import json, sys; from airflow_dlrover.runtime.prepare import require_torch; require_torch(); "
            "print(json.dumps('torch' in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "false"


def test_torch_is_declared_only_by_the_extra_the_error_names_and_the_lock_pins():
    import tomllib

    from airflow_dlrover.runtime.prepare import RUNTIME_EXTRA

    def name(requirement: str) -> str:
        return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch" not in {name(r) for r in project["dependencies"]}
    assert [extra for extra, reqs in project["optional-dependencies"].items()
            if "torch" in {name(r) for r in reqs}] == [RUNTIME_EXTRA]
    [pin] = [r for r in project["optional-dependencies"][RUNTIME_EXTRA] if name(r) == "torch"]
    assert pin in (ROOT / "constraints.txt").read_text().splitlines()  # exact, as locked
    assert f"[{RUNTIME_EXTRA}]" in (ROOT / "Dockerfile").read_text()  # the job image trains
    assert f"[{RUNTIME_EXTRA}," in (ROOT / "Makefile").read_text()  # make demo runs jobs locally
