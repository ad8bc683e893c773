"""The profiling stage: measure the probe configurations the optimizer chose.

``profile_job`` profiles our DLRM runtime *on the job itself*: the job starts on the first probe
and is resized through the others (ordered so that the PS change as rarely as possible); each
probe is measured for ``PROBE_WINDOW_S`` once every worker has reported on it. The samples
trained while profiling count for the job — nothing is thrown away, as DLRover-RM profiles on
the job's first steps — so the launch that follows is a resize of the running job.

``profile_command`` profiles a user's own trainer ("bring your own"): for each probe the command
(an argv list, or a string split as a shell would split it; it runs without a shell) runs with the
probe's configuration in its arguments (``{workers}``, ``{ps}``, ``{worker_cpu}``,
``{ps_cpu}``, ``{worker_memory_mb}``, ``{ps_memory_mb}``, ``{worker_gpu}``, ``{batch_size}``) and in
``DLROVER_CONFIG`` (JSON), in a cgroup holding the probe's total CPU and memory, for
``window_s``; its CPU and peak memory are shared evenly over the probe's nodes (one process
tree runs the whole job); its throughput (samples/s) is read from a metrics file (JSON lines or CSV with a
``throughput`` column; the median of the values written) or from log lines matching a regex whose
first group is the throughput. The metrics file is a relative path inside the probe's folder.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from airflow_dlrover.launchers.cgroups import CgroupManager, Limits
from airflow_dlrover.launchers.watch import JobMeter, all_running
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import CONFIG_COLUMNS, Configuration, InvalidInputError
from airflow_dlrover.runtime.spec import JobSpec

log = logging.getLogger(__name__)



def order_probes(probes: pd.DataFrame) -> list[Configuration]:
    """The cheapest order to visit the probes on one running job: a PS count change costs a
    checkpoint and a PS restart, a new worker a process start (~4 s: torch import), a CPU or
    memory change nothing (in place). So: by PS count; within it by worker count, ascending and
    descending in turn (a snake: the job keeps its workers across the PS change); then by CPU."""
    table = probes.reindex(columns=list(CONFIG_COLUMNS))
    groups = []
    for turn, (_, group) in enumerate(table.groupby("ps", sort=True)):
        groups.append(group.sort_values(["workers", "ps_cpu", "worker_cpu", "ps_memory_mb", "worker_memory_mb"],
                                        ascending=[turn % 2 == 0, True, True, True, True], kind="stable"))
    return [Configuration(**row) for row in pd.concat(groups).to_dict("records")]


def profile_job(launcher: Any, spec: JobSpec, probes: pd.DataFrame, window_s: float = C.PROBE_WINDOW_S) -> pd.DataFrame:
    """Launch (or adopt) the job and measure it on each probe; returns the sample table with
    ``probe_s`` (seconds the probe took, resize included)."""
    rows = []
    job_id = spec.job_id
    for index, config in enumerate(order_probes(probes)):
        started = time.monotonic()
        if index == 0:
            launcher.launch(spec, config)
        if Configuration(**launcher.read_job(job_id)["config"]) != config:
            launcher.resize(job_id, config)
        if not _settle(launcher, job_id, time.time()):
            log.info("the job finished while profiling: %d of %d probes measured", index, len(probes))
            break
        meter = JobMeter(launcher, job_id)
        status = {"state": "training"}
        while meter.elapsed_s < window_s and status["state"] != "done":
            status = launcher.progress(job_id)
            meter.observe(status, healthy=all_running(launcher.status(job_id)))
            time.sleep(C.SUPERVISOR_POLL_S)
        row, _ = meter.close(time.monotonic() - started)
        if row is None:
            log.warning("probe %s was not measured cleanly (a node failed or the job ended)", config.describe())
            continue
        rows.append({**row, "probe_s": time.monotonic() - started})
        log.info("probe %d/%d %s: %.0f samples/s", index + 1, len(probes), config.describe(), row["throughput"])
    return pd.DataFrame(rows)


def _settle(launcher: Any, job_id: str, since: float) -> bool:
    """Wait until every active worker reported ``PROBE_REPORT_AFTER_S`` after ``since``;
    False when the job is done."""
    trainer = launcher.trainer(job_id)
    timeout = C.PROBE_SETTLE_TIMEOUT_S + (trainer.report_timeout_s if trainer else 0.0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = launcher.metrics(job_id)
        if metrics.get("status") and metrics["status"]["state"] == "done":
            return False
        nodes = launcher.status(job_id)
        broken = next((s for s in nodes if s.failed and s.exit_code == C.USER_ERROR_EXIT_CODE), None)
        if broken is not None:
            raise InvalidInputError("trainer" if trainer else "job", broken.name, "a job that keeps the contract "
                                    "(docs/trainers.md)", broken.reason)
        if any(s.failed for s in nodes):  # a probe too small for the job (an OOM kill): recovered as the guard does
            for record in launcher.recover(job_id):
                log.warning("while profiling: %s", record.get("text") or record)
            since = time.time()
            continue
        workers = [s.name for s in nodes if s.role == "worker" and s.state == "running"]
        reports = metrics["nodes"]
        if workers and all(reports.get(w, {}).get("reported_at", 0) >= since + C.PROBE_REPORT_AFTER_S for w in workers):
            return True
        time.sleep(C.SUPERVISOR_POLL_S)
    raise TimeoutError(f"job {job_id}: workers did not report within {timeout:.0f}s of a probe resize")


def command_argv(command: str | list[str], row: dict[str, Any]) -> list[str]:
    """The argv of a trainer's ``command`` for one configuration: a list of arguments (or a string,
    split as a shell would split it, ``shlex``), each with its ``{workers}``… placeholders filled.
    It runs without a shell: no templated value is ever parsed as shell text."""
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError as err:
            raise InvalidInputError("command", command, f"a command line with balanced quotes ({err})") from None
    if not command or not all(isinstance(arg, str) for arg in command):
        raise InvalidInputError("command", command, "a non-empty command line or list of strings")
    try:
        return [arg.format(**row) for arg in command]
    except (KeyError, IndexError, ValueError) as err:
        raise InvalidInputError("command", command, f"placeholders among {{{'}, {'.join(CONFIG_COLUMNS)}}} ({err})") from None


def metrics_path_in(folder: Path, metrics_file: str) -> Path:
    """``metrics_file`` inside ``folder`` (it is deleted before each probe): a relative path that
    stays in the folder, else a user error."""
    path = (folder / metrics_file).resolve()
    if Path(metrics_file).is_absolute() or folder.resolve() not in path.parents:
        raise InvalidInputError("metrics_file", metrics_file, "a relative path inside the probe's working folder")
    return path


def profile_command(command: str | list[str], probes: pd.DataFrame, workdir: str | Path, *, window_s: float,
                    metrics_file: str | None = None, log_regex: str | None = None,
                    cgroups: CgroupManager | None = None) -> pd.DataFrame:
    """Run a user's trainer on each probe (see the module docstring); returns the sample table."""
    if bool(metrics_file) == bool(log_regex):
        raise InvalidInputError("metrics_file / log_regex", f"{metrics_file!r} / {log_regex!r}",
                                "exactly one of them: where the trainer's throughput is read")
    pattern = None
    if log_regex:
        try:
            pattern = re.compile(log_regex)
        except re.error as err:
            raise InvalidInputError("log_regex", log_regex, f"a valid regular expression ({err})") from None
        if pattern.groups < 1:
            raise InvalidInputError("log_regex", log_regex, "a regex with a group capturing the throughput")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cgroups = cgroups or CgroupManager()
    rows = []
    for index, config in enumerate(order_probes(probes)):
        row = config.to_row()
        argv = command_argv(command, row)
        probe_dir = workdir / f"probe-{index}"
        probe_dir.mkdir(exist_ok=True)
        out_file = probe_dir / "output.log"
        metrics_path = metrics_path_in(probe_dir, metrics_file) if metrics_file else None
        if metrics_path is not None:
            metrics_path.unlink(missing_ok=True)
        memory = config.memory_mb or None
        group = cgroups.create(f"byo-{os.getpid()}", f"probe-{index}", Limits(config.cores, memory))
        env = dict(os.environ, DLROVER_CONFIG=json.dumps(row), DLROVER_METRICS_FILE=str(metrics_path or ""),
                   OMP_NUM_THREADS=str(max(1, math.floor(config.cores))))
        started = time.monotonic()
        with open(out_file, "wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=probe_dir,
                                       start_new_session=True, preexec_fn=group.preexec_fn())
            group.add_pid(process.pid)
            try:
                process.wait(timeout=window_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        seconds = time.monotonic() - started
        usage = group.usage()
        cgroups.remove_job(f"byo-{os.getpid()}")
        if metrics_path is not None:
            values = _read_metrics(metrics_path)
        else:
            values = [float(m.group(1)) for m in pattern.finditer(out_file.read_text(errors="replace"))]
        if not values:
            tail = out_file.read_text(errors="replace")[-1000:]
            raise InvalidInputError(
                "command", shlex.join(argv),
                f"a trainer that reports its throughput ({'in ' + metrics_file if metrics_file else 'matching ' + log_regex}) "
                f"within window_s={window_s:g}s; exit code {process.returncode}, output tail:\n{tail}",
            )
        # One process tree for the whole job: its CPU and peak memory are shared evenly over the
        # configuration's nodes, so that the memory model (and the plan's total) can be fitted.
        nodes = config.workers + config.ps
        cpu_share = usage.cpu_seconds / seconds / nodes
        memory_share = (usage.memory_peak_mb or usage.memory_mb) / nodes
        rows.append({**row, "throughput": float(np.median(values)), "probe_s": seconds, "timestamp": time.time(),
                     "worker_cpu_used": cpu_share, "ps_cpu_used": cpu_share,
                     "worker_memory_used_mb": memory_share, "ps_memory_used_mb": memory_share})
        log.info("probe %d/%d %s: %.0f samples/s", index + 1, len(probes), config.describe(), rows[-1]["throughput"])
    return pd.DataFrame(rows)


def _read_metrics(path: Path) -> list[float]:
    if not path.exists():
        return []
    text = path.read_text(errors="replace").strip()
    if not text:
        return []
    if text.startswith("{"):
        values = []
        for line in text.splitlines():
            try:
                value = json.loads(line).get("throughput")
            except json.JSONDecodeError:
                continue  # a line the trainer was writing when it was stopped
            if isinstance(value, (int, float)):
                values.append(float(value))
        return values
    table = pd.read_csv(path)
    if "throughput" not in table:
        raise InvalidInputError("metrics_file", str(path), "JSON lines or a CSV with a 'throughput' column")
    return table["throughput"].dropna().astype(float).tolist()
