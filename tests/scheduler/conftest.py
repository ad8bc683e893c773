"""A real Airflow deployment for the scheduler tier: the components ``airflow standalone`` starts
(api-server, scheduler, dag-processor, triggerer) as subprocesses of the test, with the
LocalExecutor, in a temporary ``AIRFLOW_HOME`` whose dags folder is the repository's ``dags/``.

The configuration is standalone's (``airflow/cli/commands/standalone_command.py``): a local
executor, the SimpleAuthManager, one JWT secret for every component (it signs the execution API's
task tokens; standalone's is the one it writes to airflow.cfg), the execution API on the api-server. What differs, and why: free
ports (the api-server's and the log servers'); ``all admins`` (no password to fetch); one
api-server worker and a parallelism of 4 (2 cores); no paused-at-creation and no cron scheduling
(the DAG is ``@daily`` from a past start date), so that the only run is the test's.
Metadata DB: SQLite (Airflow 3's tasks reach it only through the api-server, so the
LocalExecutor needs no server database).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

import airflow_dlrover
from airflow_dlrover.launchers.local import LocalLauncher

ROOT = Path(__file__).parents[2]
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
#: Seconds for `airflow db migrate` and for the components to report healthy with the DAG parsed
#: (measured 20-30 s together on 2 busy cores; generous for a loaded machine).
MIGRATE_TIMEOUT_S = 600
READY_TIMEOUT_S = 600
#: Seconds between SIGTERM and SIGKILL when a component's process group is stopped.
STOP_GRACE_S = 30
LOG_TAIL_LINES = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no file)"
    return "\n".join(text[-lines:])


class Deployment:
    """The running components, their logs, and a client of the public REST API (``/api/v2``)."""

    def __init__(self, home: Path):
        self.home = home
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.logs = home / "components"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen] = {}
        inherited = {k: v for k, v in os.environ.items()
                     if not k.startswith("AIRFLOW__") and k not in ("AIRFLOW_HOME", "AIRFLOW_CONFIG")}
        package_root = str(Path(airflow_dlrover.__file__).parents[1])  # the components import this copy
        self.env = {
            **inherited,
            "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            # the fine-tune and the guard watch from the triggerer
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base}/execution/",
            "AIRFLOW__API__BASE_URL": self.base,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            # no @daily run of the example DAG beside the test's own (this also stops asset-triggered
            # runs: the test turns it on once it has paused the example DAG)
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        }
        self.client = httpx.Client(base_url=f"{self.base}/api/v2", timeout=60)

    # -- processes ---------------------------------------------------------------------------------
    def airflow(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "airflow", *args]

    def migrate(self) -> None:
        with (self.logs / "db-migrate.log").open("w") as out:
            done = subprocess.run(self.airflow("db", "migrate"), stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                  timeout=MIGRATE_TIMEOUT_S)
        assert done.returncode == 0, tail(self.logs / "db-migrate.log")

    def start(self) -> None:
        for name in COMPONENTS:
            with (self.logs / f"{name}.log").open("w") as out:
                self.processes[name] = subprocess.Popen(self.airflow(name), stdout=out, stderr=subprocess.STDOUT,
                                                        env=self.env, start_new_session=True)

    def restart(self, name: str, **env: str) -> None:
        """Stop one component's process group and start it again with ``env`` over the settings."""
        process = self.processes[name]
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
        self.env.update(env)
        with (self.logs / f"{name}.log").open("a") as out:
            self.processes[name] = subprocess.Popen(self.airflow(name), stdout=out, stderr=subprocess.STDOUT,
                                                    env=self.env, start_new_session=True)

    def dead(self) -> list[str]:
        return [f"{name} (exit {p.returncode})" for name, p in self.processes.items() if p.poll() is not None]

    def stop(self) -> None:
        """SIGTERM every component's process group (the LocalExecutor's workers and their task
        processes are in the scheduler's), SIGKILL what is left after ``STOP_GRACE_S``."""
        for process in self.processes.values():
            _signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
        self.client.close()

    def wait_ready(self, dag_id: str) -> float:
        """Until the scheduler, dag-processor and triggerer heartbeat and ``dag_id`` is parsed
        (an import error fails at once); returns the seconds it took."""
        started = time.monotonic()
        while True:
            assert not self.dead(), f"components died: {self.dead()}\n{self.diagnostics()}"
            waited = time.monotonic() - started
            assert waited < READY_TIMEOUT_S, f"not ready in {READY_TIMEOUT_S} s\n{self.diagnostics()}"
            try:
                health = self.client.get("/monitor/health").json()
                healthy = all((health.get(c) or {}).get("status") == "healthy"
                              for c in ("metadatabase", "scheduler", "triggerer", "dag_processor"))
                if healthy and self.client.get(f"/dags/{dag_id}").status_code == 200:
                    return time.monotonic() - started
                errors = self.client.get("/importErrors").json().get("import_errors")
                assert not errors, "\n".join(f"{e['filename']}: {e['stack_trace']}" for e in errors)
            except (httpx.HTTPError, json.JSONDecodeError):
                pass  # the api-server is still starting
            time.sleep(1)

    # -- the REST API ------------------------------------------------------------------------------
    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.client.request(method, path, **kwargs)
        assert response.status_code < 300, f"{method} {path}: {response.status_code} {response.text}"
        return response.json()

    # -- what went wrong ---------------------------------------------------------------------------
    def diagnostics(self) -> str:
        """Tails of every component's log, of every task's log and of the job's node logs."""
        parts = [f"==== {path.name} ====\n{tail(path)}" for path in sorted(self.logs.glob("*.log"))]
        for path in sorted((self.home / "logs").glob("dag_id=*/**/*.log")):
            parts.append(f"==== task log {path.relative_to(self.home / 'logs')} ====\n{tail(path)}")
        for path in sorted((self.home / "dlrover" / "jobs").glob("*/logs/*.log")):
            parts.append(f"==== job log {path.relative_to(self.home)} ====\n{tail(path, 20)}")
        return "\n".join(parts)

    def job_processes(self) -> list[psutil.Process]:
        """The processes of the launcher's jobs (the command names their folder under this home)."""
        jobs = str(self.home / "dlrover" / "jobs")
        found = []
        for process in psutil.process_iter(["cmdline"]):
            if any(jobs in part for part in process.info["cmdline"] or ()):
                found.append(process)
        return found


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.failed_call = report.failed
    return report


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The running deployment; on teardown every component's process group is stopped, then the
    launcher stops any job a failed run left behind (processes and cgroups; the test asserts that
    a run leaves none) and whatever process of a job is left is killed."""
    deployment = Deployment(tmp_path_factory.mktemp("airflow-scheduler"))
    try:
        started = time.monotonic()
        deployment.migrate()
        deployment.start()
        ready_s = deployment.wait_ready("dlrm_daily_retrain")
        print(f"deployment ready in {time.monotonic() - started:.0f} s (components {ready_s:.0f} s)")
        yield deployment
    finally:
        deployment.stop()
        jobs = LocalLauncher(deployment.home / "dlrover" / "jobs")
        for folder in jobs.base_dir.iterdir():
            if jobs.exists(folder.name):
                jobs.stop(folder.name)
        for process in deployment.job_processes():
            process.kill()


@pytest.fixture()
def diagnose(request, deployment):
    """Print the logs' tails when the test fails."""
    yield
    if getattr(request.node, "failed_call", True):
        print(deployment.diagnostics())
