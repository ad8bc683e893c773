"""Local launcher (the embedded default): each node is a process on this machine, in its own cgroup
with the plan's CPU quota and memory limit, torch threads sized from its CPU allocation.

Everything about a job lives in ``<base_dir>/<job_id>/``: ``spec.json``, ``job.json`` (the nodes,
their resources, pids and restarts), ``logs/``, ``run/`` (the address each node listens on),
``exit/`` (each node's exit status, written by a ``sh`` wrapper so that it survives the launcher)
and the master's state and checkpoints. A second launcher process adopts the job from there: an
Airflow retry never starts a second copy. The folder is its user's alone (mode 0700, its files
0600: the nodes run under umask 077): it holds the job's key, data and trained model.

Recovery of a failed node keeps the data consistent through the master: a lost worker's shards are
requeued; a restarted PS makes the master roll the whole job back to its last checkpoint; a
restarted master reloads its persisted state. Nodes keep their ports across restarts, so clients
reconnect transparently.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from airflow_dlrover.launchers.base import (
    FAILED, LOST, OOM_KILLED, RUNNING, STOPPED, SUCCEEDED, Launcher, exclusive, torch_threads,
)
from airflow_dlrover.launchers.cgroups import CgroupManager, Limits
from airflow_dlrover.launchers.contract import new_report, scrape
from airflow_dlrover import timings as T
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.runtime.spec import JobSpec, check_job_id

log = logging.getLogger(__name__)


def _private_dir(folder: Path) -> Path:
    """``folder`` (created) readable by its owner only, whatever umask created it before."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(path: Path) -> str:
    """The last complete line of a small JSON-lines file ("" when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return lines[-1] if lines else ""


class LocalLauncher(Launcher):
    """See the module docstring. ``base_dir`` holds one folder per job."""

    runs_local_code = True

    def __init__(self, base_dir: str | Path, cgroups: CgroupManager | None = None, python: str = sys.executable):
        super().__init__()
        self.base_dir = Path(base_dir).absolute()  # its nodes run in their own folders
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.cgroups = cgroups or CgroupManager()
        self.python = python
        self._groups: dict[tuple[str, str], Any] = {}
        self._scraped: dict[tuple, float] = {}  # (job, node, start) → when this process last scraped it

    def _group(self, job_id: str, node: dict[str, Any], *, apply: bool = False):
        """The node's cgroup: created (limits written) when first needed or when ``apply``;
        afterwards read from the cache, so that status polls do not rewrite limits."""
        key = (job_id, node["name"])
        if apply or key not in self._groups:
            self._groups[key] = self.cgroups.create(job_id, node["name"], Limits(node["cpu"], node["memory_mb"]))
        return self._groups[key]

    # -- the record ----------------------------------------------------------------------------
    def job_dir(self, job_id: str) -> Path:
        return self.base_dir / check_job_id(job_id)

    def _record(self, job_id: str) -> dict[str, Any]:
        path = self.job_dir(job_id) / "job.json"
        if not path.exists():
            raise KeyError(f"no job {job_id!r} under {self.base_dir}")
        return json.loads(path.read_text())

    def _write(self, job_id: str, job: dict[str, Any]) -> None:
        path = self.job_dir(job_id) / "job.json"
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(json.dumps(job, indent=1))
        os.replace(tmp, path)

    def spec(self, job_id: str) -> JobSpec:
        return JobSpec.load(self.job_dir(job_id) / "spec.json")

    def _acquire(self, job_id: str) -> int:
        """``flock`` on ``<job dir>/job.lock``: the kernel releases it when its holder dies."""
        import fcntl

        folder = _private_dir(self.job_dir(job_id))
        fd = os.open(folder / "job.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def _release(self, job_id: str, handle: int) -> None:
        os.close(handle)  # closing the descriptor releases its flock

    def exists(self, job_id: str) -> bool:
        """Whether the job was launched (its record exists): a retry adopts it."""
        return (self.job_dir(job_id) / "job.json").exists()

    def _master_url(self, job_id: str) -> str:
        return f"http://{self._record(job_id)['nodes']['master']['address']}"

    def _live_states(self, job_id: str, record: dict[str, Any]) -> dict[str, tuple]:
        return {name: (*self._process_state(job_id, node), node.get("started", 0))
                for name, node in record["nodes"].items()}

    # -- processes -----------------------------------------------------------------------------
    def _place(self, record: dict[str, Any], node: dict[str, Any], previous: dict[str, Any] | None) -> None:
        """Each port the node's kind listens on is a free one of its own (``port`` 0: it listens on
        none); nodes keep their ports across restarts (clients reconnect transparently)."""
        node["port"] = 0
        for key in self.kind(record["job_id"], record).ports(node["role"]):
            node[key] = (previous or {}).get(key) or _free_port()

    def _command(self, job_id: str, node: dict[str, Any], master: str | None) -> list[str]:
        args = [self.python, "-m", "airflow_dlrover.runtime", node["role"], "--job-dir", str(self.job_dir(job_id)),
                "--index", str(node["index"]), "--name", node["name"], "--port", str(node["port"])]
        if node["role"] == "ps":
            args += ["--count", str(node["count"])]
        if node["role"] == "worker":
            args += ["--master", master, "--threads", str(torch_threads(node["cpu"]))]
        return args

    def _create_job(self, spec: JobSpec, record: dict[str, Any]) -> None:
        self._save_job(spec, record)
        self._start_node(spec.job_id, record, record["nodes"]["master"])

    def _create_trainer_job(self, spec: JobSpec, record: dict[str, Any]) -> None:
        """The job's folder, and the checkpoint folder the contract promises: it exists, only the
        job's user can read it, before the first node starts."""
        self._save_job(spec, record)
        trainer = self.trainer(spec.job_id)
        # a relative checkpoint_dir is the nodes' (they run in the trainer's workdir)
        workdir = Path(trainer.workdir or self.job_dir(spec.job_id))
        (workdir / (trainer.checkpoint_dir or self._checkpoint_dir(spec.job_id))).mkdir(mode=0o700, parents=True,
                                                                                         exist_ok=True)

    def _save_job(self, spec: JobSpec, record: dict[str, Any]) -> None:
        """The job's folder with its spec and record."""
        folder = _private_dir(self.job_dir(spec.job_id))
        spec.save(folder / "spec.json")
        self._write(spec.job_id, record)

    def _peer_address(self, job_id: str, record: dict[str, Any], node: dict[str, Any]) -> str:
        return f"127.0.0.1:{node['port']}"

    def _rendezvous(self, job_id: str, record: dict[str, Any]) -> tuple[str, int]:
        return "127.0.0.1", _free_port()

    def _metrics_port(self, job_id: str, node: dict[str, Any]) -> int:
        return node.get("metrics_port", 0)

    def _read_output(self, job_id: str, node: dict[str, Any], via: str) -> tuple[str, float | None]:
        folder = self.job_dir(job_id)
        path = {"log": folder / "logs" / f"{node['name']}.log", "file": Path(self._metrics_file(job_id, node)),
                "prometheus": self._scrapes_file(job_id, node)}[via]
        if via == "prometheus" and node.get("state") == RUNNING:
            self._scrape(job_id, node, path)
        try:
            with open(path, "rb") as f:
                f.seek(node.get("log_offset", 0) if via == "log" else 0)
                return f.read().decode(errors="replace"), os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return "", None

    def _scrapes_file(self, job_id: str, node: dict[str, Any]) -> Path:
        """Where the launcher keeps a node's scraped reports (JSON lines; this incarnation's)."""
        return self.job_dir(job_id) / "metrics" / f"{node['name']}.scraped.jsonl"

    def _scrape(self, job_id: str, node: dict[str, Any], path: Path) -> None:
        """Scrape the node's endpoint (at most every ``TRAINER_SCRAPE_S`` per process) and append
        a new report to ``path`` (one ``O_APPEND`` write: processes scraping together interleave
        whole lines)."""
        key = (job_id, node["name"], node.get("started"))
        now = time.monotonic()
        if now - self._scraped.get(key, -math.inf) < T.TRAINER_SCRAPE_S:
            return
        self._scraped[key] = now
        trainer = self.trainer(job_id)
        report = scrape(f"http://127.0.0.1:{node['metrics_port']}{trainer.metrics_path}", trainer.metrics_names)
        line = new_report(report, _last_line(path))
        if line is not None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)

    def _start_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any]) -> None:
        """Our runtime's node, with as many torch threads as its whole cores."""
        argv = self._command(job_id, node, record["nodes"]["master"].get("address"))
        env = dict(os.environ, OMP_NUM_THREADS=str(torch_threads(node["cpu"])),
                   DLROVER_WORKER_GPU=str(node.get("gpu", 0)), PYTHONUNBUFFERED="1")
        self._spawn(job_id, record, node, argv, env, self.job_dir(job_id))

    def _start_trainer_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any], argv: list[str],
                            env: dict[str, str]) -> None:
        """A trainer's node, in the trainer's ``workdir`` (default: the job's folder); its reports
        start empty (its log is read from where it stood at the start: ``log_offset``)."""
        folder = self.job_dir(job_id)
        (folder / "metrics").mkdir(parents=True, exist_ok=True)
        Path(self._metrics_file(job_id, node)).unlink(missing_ok=True)
        self._scrapes_file(job_id, node).unlink(missing_ok=True)
        log_path = folder / "logs" / f"{node['name']}.log"
        node["log_offset"] = log_path.stat().st_size if log_path.exists() else 0
        self._spawn(job_id, record, node, argv, dict(os.environ, **env, PYTHONUNBUFFERED="1"),
                    self.trainer(job_id).workdir or folder)

    def _spawn(self, job_id: str, record: dict[str, Any], node: dict[str, Any], argv: list[str],
               env: dict[str, str], workdir: str | Path) -> None:
        """Run ``argv`` as the node, in its cgroup, its output in its log."""
        name = node["name"]
        folder = self.job_dir(job_id)
        for sub in ("logs", "run", "exit"):
            (folder / sub).mkdir(mode=0o700, exist_ok=True)
        (folder / "run" / f"{name}.addr").unlink(missing_ok=True)
        exit_file = folder / "exit" / f"{name}.code"
        exit_file.unlink(missing_ok=True)
        exit_file.with_suffix(".message").unlink(missing_ok=True)
        group = self._group(job_id, node, apply=True)
        # The wrapper records the exit status; every argument is quoted (no templated shell text).
        # stdin is /dev/null: a node outlives the task that starts it, and an Airflow task's fd 0 is
        # its supervisor's request socket, which the supervisor then waits for (60 s) after the task.
        script = f"umask 077; {shlex.join(argv)}; echo $? > {shlex.quote(str(exit_file))}"
        log_fd = os.open(folder / "logs" / f"{name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(log_fd, "ab") as logfile:
            process = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=logfile,
                                       stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                       preexec_fn=group.preexec_fn(), cwd=workdir)
        group.add_pid(process.pid)  # already there in v1/v2; advisory mode tracks usage from it
        node.update(pid=process.pid, started=psutil.Process(process.pid).create_time(), state=RUNNING,
                    oom_base=group.usage().oom_kills)
        try:
            self._write(job_id, record)  # the pid first: a launcher that dies now leaves no orphan
        except OSError:  # a full disk: a node the record cannot name is not left running
            self._kill(node, signal.SIGKILL, grace_s=0.0)
            raise

    def _wait_ready(self, job_id: str, record: dict[str, Any], names: list[str]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        for name in names:
            path = self.job_dir(job_id) / "run" / f"{name}.addr"
            while not path.exists():
                if time.monotonic() > deadline or self._process_state(job_id, record["nodes"][name])[0] != RUNNING:
                    tail = (self.job_dir(job_id) / "logs" / f"{name}.log").read_text()[-2000:]
                    raise RuntimeError(f"{name} of job {job_id} did not start:\n{tail}")
                time.sleep(self.poll_s)
            record["nodes"][name]["address"] = path.read_text()
        self._write(job_id, record)

    def _ps_addresses(self, job_id: str, record: dict[str, Any], names: list[str]) -> list[str]:
        return [record["nodes"][n]["address"] for n in names]

    def _process_state(self, job_id: str, node: dict[str, Any]) -> tuple[str, int | None, str, int]:
        """(state, exit code, reason, oom kills since start) of a node's process."""
        if node.get("state") == STOPPED:
            return STOPPED, None, "stopped", 0
        exit_file = self.job_dir(job_id) / "exit" / f"{node['name']}.code"
        ooms = self._group(job_id, node).usage().oom_kills - node.get("oom_base", 0)
        alive = False
        try:
            process = psutil.Process(node["pid"])
            alive = abs(process.create_time() - node["started"]) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, KeyError, TypeError):
            pass
        if exit_file.exists() and exit_file.read_text().strip():
            code = int(exit_file.read_text().strip())
            if code == 0:
                return SUCCEEDED, 0, "exited 0", ooms
            if ooms > 0 and code in C.SIGKILL_EXIT_CODES:
                return OOM_KILLED, code, f"OOM-killed at its {node['memory_mb']:g} MB limit", ooms
            reason = "killed (SIGKILL)" if code in C.SIGKILL_EXIT_CODES else f"exited {code}"
            message = exit_file.with_suffix(".message")
            if code == C.USER_ERROR_EXIT_CODE and message.exists():
                reason = message.read_text()
            return FAILED, code, reason, ooms
        if alive:
            return RUNNING, None, "", ooms
        return LOST, None, "process vanished without an exit status", ooms

    def _stop_node(self, job_id: str, record: dict[str, Any], node: dict[str, Any], *, replacing: bool) -> None:
        if replacing:  # it resumes from its master's state: nothing to save
            self._kill(node, signal.SIGKILL, T.RELAUNCH_GRACE_S)
        else:
            self._kill(node)

    def _kill(self, node: dict[str, Any], sig: int = signal.SIGTERM, grace_s: float | None = None) -> None:
        self._kill_all([node], sig, grace_s)

    def _stop_nodes(self, job_id: str, record: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
        self._kill_all(nodes)

    def _kill_all(self, nodes: list[dict[str, Any]], sig: int = signal.SIGTERM, grace_s: float | None = None) -> None:
        """Signal every node's whole process group (wrapper and training process) at once — the
        ranks of a group stop together — wait until the groups are empty, SIGKILL a group after
        ``grace_s`` (default: the node's own — a trainer's — else ``STOP_GRACE_S``)."""
        signalled = []
        for node in nodes:
            try:
                process = psutil.Process(node["pid"])
                if abs(process.create_time() - node["started"]) >= 1.0:
                    continue
                group = os.getpgid(process.pid)
                os.killpg(group, sig)
            except (psutil.NoSuchProcess, ProcessLookupError, KeyError):
                continue
            grace = grace_s if grace_s is not None else node.get("grace_s", T.STOP_GRACE_S)
            signalled.append((node, group, time.monotonic() + grace))
        while signalled:
            for entry in list(signalled):
                node, group, deadline = entry
                try:  # reap our own child, if it is one, so that it does not linger as a zombie
                    os.waitpid(node["pid"], os.WNOHANG)
                except ChildProcessError:
                    pass
                try:
                    os.killpg(group, 0)  # raises once no process of the group is left
                    if time.monotonic() > deadline:
                        os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    signalled.remove(entry)
            time.sleep(0.02)

    def _set_limits(self, job_id: str, node: dict[str, Any]) -> None:
        self._group(job_id, node, apply=True)

    def can_resize_in_place(self) -> bool:
        return True  # cgroup limits change under a running process

    def _adoptable(self, record: dict[str, Any]) -> bool:
        return record["nodes"]["master"]["state"] == RUNNING

    def _discard(self, job_id: str, record: dict[str, Any]) -> None:
        for node in record["nodes"].values():  # leftovers of a launch whose master died
            self._kill(node)

    # -- usage, faults, stop ---------------------------------------------------------------------
    def metrics(self, job_id: str) -> dict[str, Any]:
        """The master's metrics plus each node's cgroup usage (CPU seconds, memory)."""
        job = self._record(job_id)
        metrics = self.kind(job_id, job).job_metrics(job)
        usage = {}
        for name, node in job["nodes"].items():
            if node.get("state") == STOPPED:
                continue
            u = self._group(job_id, node).usage()
            usage[name] = {"role": node["role"], "cpu_seconds": u.cpu_seconds, "memory_mb": u.memory_mb,
                           "memory_peak_mb": u.memory_peak_mb, "cpu": node["cpu"], "memory_limit_mb": node["memory_mb"]}
        metrics["usage"] = usage
        metrics["usage_time"] = time.monotonic()  # when the usage was read (for CPU rates)
        return metrics

    def kill_node(self, job_id: str, node_name: str) -> None:
        """Fault injection: SIGKILL the node's training process (not its wrapper), waiting up to
        ``NODE_START_TIMEOUT_S`` for the wrapper to start it (a kill just after a launch)."""
        wrapper = psutil.Process(self._record(job_id)["nodes"][node_name]["pid"])
        deadline = time.monotonic() + T.NODE_START_TIMEOUT_S
        try:
            while not (children := wrapper.children(recursive=True)) and time.monotonic() < deadline \
                    and wrapper.status() != psutil.STATUS_ZOMBIE:
                time.sleep(T.LOCAL_POLL_S)
        except psutil.NoSuchProcess:  # the wrapper is gone: nothing of the node is left to kill
            return
        for child in children:
            child.kill()

    @exclusive
    def stop(self, job_id: str) -> None:
        job = self._record(job_id)
        self._kill_all(list(job["nodes"].values()))
        for node in job["nodes"].values():
            node["state"] = STOPPED
        job["stopped"] = True
        try:
            self._write(job_id, job)
        finally:  # a full disk: the processes are gone already; their groups go too
            self._groups = {key: group for key, group in self._groups.items() if key[0] != job_id}
            self.cgroups.remove_job(job_id)
