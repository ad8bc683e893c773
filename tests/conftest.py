"""Session-wide test settings: an isolated AIRFLOW_HOME without examples, a dags folder with the
example DAG, and (for the tests that need it) one migrated metadata DB per session."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_HOME = tempfile.mkdtemp(prefix="dlrover-test-airflow-")
if os.environ.get("PYTEST_XDIST_WORKER"):  # not the controller's, which each worker inherits: one SQLite DB each
    os.environ["AIRFLOW_HOME"] = _HOME
os.environ.setdefault("AIRFLOW_HOME", _HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
DAGS_FOLDER = Path(os.environ["AIRFLOW_HOME"]) / "dags"
DAGS_FOLDER.mkdir(parents=True, exist_ok=True)
for dag_file in ("dlrm_daily_retrain.py", "deploy_on_new_model.py", "ctr_daily_retrain.py"):
    shutil.copy(Path(__file__).parents[1] / "dags" / dag_file, DAGS_FOLDER)
#: an example trainer's DAG runs beside its trainer (examples/<name>: dag.py and train.py)
for example in ("ddp_dlrm", "ps_dlrm", "torchrec_dlrm"):
    shutil.copytree(Path(__file__).parents[1] / "examples" / example, DAGS_FOLDER / example, dirs_exist_ok=True)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS_FOLDER)


@pytest.fixture(scope="session")
def airflow_db():
    """The metadata DB, migrated once per session (SQLite under the test AIRFLOW_HOME)."""
    from airflow.utils.db import initdb

    initdb()
    return os.environ["AIRFLOW_HOME"]


#: The example DAG's small run with a killed worker (about a minute of training at the 1.5-core
#: plan's ~90 k samples/s: the recovered job still trains through a fine-tune turn, which measures
#: windows only while its trigger runs): tests/dags checks its recovery through a retry,
#: tests/plugins draws it. One run per session serves both.
KILLED_WORKER_CONF = {"samples": 4_800_000, "table_size": 5000, "quota_cpu": 1.5, "quota_memory": "4Gi",
                      "inject": "kill-worker@4s"}


@pytest.fixture(scope="session")
def killed_worker_run(airflow_db):
    """The ``DagRun`` of ``dag.test()`` with :data:`KILLED_WORKER_CONF` (warm-started when an
    earlier test of the session ran the job)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    return bag.get_dag("dlrm_daily_retrain").test(run_conf=KILLED_WORKER_CONF)


# -- tiers ------------------------------------------------------------------------------------

#: Every test is in one tier: its nearest tier marker (the test's, else its class's, else its
#: module's ``pytestmark``). ``--tier`` selects by it: ``make test-fast`` runs ``--tier unit``,
#: ``make test`` (CI) runs every tier. A unit test that tries to start a process fails.
TIERS = {
    "unit": "pure: in this process, no child process (the pre-commit tier, `make test-fast`)",
    "jobs": "real processes: our runtime, a trainer, the launchers, cgroups, a command in a subprocess",
    "dag": "a whole DAG run with dag.test() on the local launcher (minutes)",
    "scheduler": "the example DAG under a real scheduler, triggerer and LocalExecutor (minutes)",
    "browser": "headless Chromium against the UI, beside a DAG run",
}
#: What a test needs besides its tier (it skips, saying why, where that is missing).
NEEDS = {"postgres": "a PostgreSQL server at DLROVER_TEST_POSTGRES_URL (`.ci/run` starts one)"}
TIER = pytest.StashKey[str]()


def pytest_addoption(parser):
    parser.addoption("--tier", action="append", choices=sorted(TIERS), default=[],
                     help="run only the tests of this tier (repeatable); default: every tier")


def pytest_configure(config):
    for name, text in {**TIERS, **NEEDS}.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.pluginmanager.register(UnitTierGuard(), "unit-tier-guard")
    # croniter (Airflow's cron timetables) runs `file` on the interpreter when first imported
    # (``platform.architecture``): imported here, before any test is guarded, not by the first one.
    import croniter  # noqa: F401
    # matplotlib (the simulator's figures) runs `fc-list` to build its font cache the first time
    # it is imported on a machine with fontconfig (Chromium brings it): likewise.
    import matplotlib.font_manager  # noqa: F401


def tier_of(item) -> str | None:
    """The item's nearest tier marker (``iter_markers`` yields the test's own marks first)."""
    return next((mark.name for mark in item.iter_markers() if mark.name in TIERS), None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Refuse a test in no tier; keep only the tiers ``--tier`` names."""
    missing = [item.nodeid for item in items if tier_of(item) is None]
    if missing:
        raise pytest.UsageError(f"tests without a tier marker ({', '.join(TIERS)}):\n  " + "\n  ".join(missing))
    for item in items:
        item.stash[TIER] = tier_of(item)
        item.user_properties.append(("tier", item.stash[TIER]))  # on its reports, across xdist workers
    wanted = set(config.getoption("tier"))
    if wanted:
        dropped = [item for item in items if item.stash[TIER] not in wanted]
        items[:] = [item for item in items if item.stash[TIER] in wanted]
        config.hook.pytest_deselected(items=dropped)
    check_shared_run_modules(items)


#: the session-scoped run that several modules of the process tiers draw, and those modules
SHARED_RUN = "killed_worker_run"
SHARED_RUN_MODULES = ("tests/dags/test_dlrm_daily_retrain.py", "tests/plugins/")


def scope_of(nodeid: str) -> str:
    """A test's unit of work on ``-n 2 --dist loadscope`` (``make test``'s process tiers): its
    module — its module-scoped jobs run once —, or :data:`SHARED_RUN` for every module that draws
    it, on one worker, which runs it once."""
    module = nodeid.split("::")[0]
    return SHARED_RUN if module.startswith(SHARED_RUN_MODULES) else module


def check_shared_run_modules(items) -> None:
    """Refuse a test that draws :data:`SHARED_RUN` from a module that is not among
    :data:`SHARED_RUN_MODULES` (a worker of its own would run it again)."""
    stray = [item.nodeid for item in items
             if SHARED_RUN in getattr(item, "fixturenames", ()) and scope_of(item.nodeid) != SHARED_RUN]
    if stray:
        raise pytest.UsageError(f"tests that draw {SHARED_RUN} outside SHARED_RUN_MODULES (tests/conftest.py):\n  "
                                + "\n  ".join(stray))


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` by :func:`scope_of` (xdist's own scopes are modules and classes; its
    ``loadgroup`` marks do not group under pytest 9, whose node ids it cannot suffix)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ModuleScheduling(config, log)


#: The longest a test of a tier that is not end-to-end may take (seconds of its call): longer
#: ones are listed at the end of the run, for review.
SLOW_LIMIT_S = 60.0
SLOW_TIERS = ("unit", "jobs")
_SLOW: list[tuple[float, str, str]] = []  # (seconds, tier, test)


def pytest_runtest_logreport(report):
    tier = dict(report.user_properties).get("tier")
    if report.when == "call" and tier in SLOW_TIERS and report.duration > SLOW_LIMIT_S:
        _SLOW.append((report.duration, tier, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    if _SLOW:
        terminalreporter.section(f"over {SLOW_LIMIT_S:g} s outside the end-to-end tiers", sep="-", yellow=True)
        for duration, tier, nodeid in sorted(_SLOW, reverse=True):
            terminalreporter.write_line(f"{duration:6.1f}s  {tier:<5} {nodeid}")


class ProcessGuard:
    """While a unit test and its function-scoped fixtures run, every way of starting a process
    (subprocess, multiprocessing, ``os.fork``, ``posix_spawn``) raises and is recorded against the
    test (a launcher may catch the refusal). Module- and session-scoped fixtures, which tiers share,
    set up unguarded."""

    def __init__(self):
        import _posixsubprocess
        import subprocess

        self.targets = [(_posixsubprocess, "fork_exec"), (subprocess, "_fork_exec"), (os, "fork"),
                        (os, "posix_spawn"), (os, "posix_spawnp")]
        self.originals = [getattr(owner, name) for owner, name in self.targets]
        self.nodeid: str | None = None
        self.started: dict[str, list[str]] = {}

    def _refusing(self, name: str):
        def refuse(*args, **kwargs):
            self.started.setdefault(self.nodeid, []).append(name)
            raise AssertionError(f"{self.nodeid} is marked unit but started a process ({name}): mark it jobs")
        return refuse

    def on(self, nodeid: str) -> None:
        self.nodeid = nodeid
        for owner, name in self.targets:
            setattr(owner, name, self._refusing(name))

    def off(self) -> None:
        for (owner, name), original in zip(self.targets, self.originals):
            setattr(owner, name, original)


GUARD = ProcessGuard()


class UnitTierGuard:
    """The guard's hooks, registered as a plugin (``pytest_configure``): a conftest's own hooks do
    not see the setup of a session-scoped fixture."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        unit = item.stash.get(TIER, None) == "unit"
        if unit:
            GUARD.on(item.nodeid)
        try:
            return (yield)
        finally:
            if unit:
                GUARD.off()
                GUARD.nodeid = None

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        shared = GUARD.nodeid is not None and fixturedef.scope != "function"
        if shared:
            GUARD.off()
        try:
            return (yield)
        finally:
            if shared:
                GUARD.on(GUARD.nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        result = yield
        if item.nodeid in GUARD.started:
            raise AssertionError(f"marked unit but tried to start processes ({', '.join(GUARD.started[item.nodeid])}):"
                                 " mark it jobs")
        return result
