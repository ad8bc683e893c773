"""A trainer of the user's (examples/ddp_dlrm, torch.distributed) through the local launcher:
launch, resize by group restart, a killed worker recovered, contract errors refused."""

import json
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from airflow_dlrover.launchers.contract import TrainerSpec
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.lifecycle.run import run_job
from airflow_dlrover.lifecycle.observer import recover
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import Configuration, Fault, FaultKind
from airflow_dlrover.runtime.spec import JobSpec

pytestmark = pytest.mark.jobs

DDP = Path(__file__).resolve().parents[2] / "examples" / "ddp_dlrm" / "train.py"
TWO = Configuration(workers=2, ps=0, worker_cpu=0.5, ps_cpu=0, worker_memory_mb=1024)
ONE = Configuration(workers=1, ps=0, worker_cpu=1.0, ps_cpu=0, worker_memory_mb=1024)


def trainer_spec(job_id, command, samples=None, **trainer):
    return JobSpec(job_id=job_id, samples=samples, batch_size=512,
                   trainer=TrainerSpec(command=tuple(command), grace_s=10, **trainer).to_dict())


def test_ddp_trainer_resized_and_killed_trains_every_sample_once(tmp_path):
    # 20 s on two workers of half a core: their start (torch, gloo) takes ~10 s when the machine is
    # busy, and the 3 s windows that follow must include a clean one; sized to outlast the kill at
    # 30 s where they train fast (2.5 M samples ended in 30 s on an idle 2-core EPYC)
    spec = trainer_spec("ddp", [sys.executable, str(DDP), "--checkpoint-interval", "2"], samples=4_000_000)
    summary = run_job(LocalLauncher(tmp_path / "jobs"), spec, TWO, tmp_path, resizes=[(20.0, ONE)],
                      faults=[Fault(FaultKind.KILL_WORKER, 30.0, "worker-0")], timeout_s=300)
    # the trainer's own counter, restored from its checkpoint after each restart, reached the end
    assert summary["samples_done"] == summary["samples_total"] == 4_000_000
    assert summary["resizes"] == 1 and summary["restarts"] == 1
    assert len(summary["restart_s"]) == 2 and all(0 < s < 60 for s in summary["restart_s"])
    assert summary["auc"] > 0.7
    assert summary["config"] == ONE.to_row()
    events = [e for e in summary["events"] if e.get("action") == "relaunch"]
    assert events and events[0]["node"] == "worker-0"  # the controller's step relaunched it
    samples = pd.read_csv(tmp_path / "samples.csv")
    assert len(samples) >= 2 and (samples.ps == 0).all() and samples.ps_cpu_used.isna().all()
    for config in (TWO, ONE):  # measured per node, from its own cgroup, within its quota
        rows = samples[(samples.workers == config.workers) & (samples.worker_cpu == config.worker_cpu)]
        assert len(rows) >= 1 and (rows.worker_cpu_used > 0.1).all()
        assert (rows.worker_cpu_used <= config.worker_cpu * 1.15).all()
        assert (rows.worker_memory_used_mb > 50).all()


def test_a_ddp_trainer_reporting_through_prometheus_is_scraped_through_a_kill(tmp_path):
    spec = trainer_spec("prom", [sys.executable, str(DDP), "--checkpoint-interval", "2"], samples=1_500_000,
                        metrics_port=9400)
    summary = run_job(LocalLauncher(tmp_path / "jobs"), spec, TWO, tmp_path,
                      faults=[Fault(FaultKind.KILL_WORKER, 12.0, "worker-1")], timeout_s=240)
    # the trainer's own counter, as last scraped from its gauges, reached the end through the restart
    assert summary["samples_done"] == summary["samples_total"] == 1_500_000
    assert summary["restarts"] == 1 and len(summary["restart_s"]) == 1 and 0 < summary["restart_s"][0] < 60
    assert summary["auc"] > 0.7 and summary["median_throughput"] > 0
    metrics = tmp_path / "jobs" / "prom" / "metrics"
    assert not (metrics / "worker-0.jsonl").exists()  # it wrote no metrics file: the reports are the scrapes
    scraped = [json.loads(line) for line in (metrics / "worker-0.scraped.jsonl").read_text().splitlines()]
    assert scraped and all(r["throughput"] >= 0 for r in scraped)
    assert [r["samples_done"] for r in scraped] == sorted(r["samples_done"] for r in scraped)


def test_a_trainer_whose_endpoint_never_answers_is_refused_after_its_report_timeout(tmp_path):
    launcher = LocalLauncher(tmp_path / "jobs")
    spec = trainer_spec("deaf", [sys.executable, "-c", "import time; time.sleep(60)"], report_timeout_s=2.0,
                        metrics_port=9400)
    launcher.launch(spec, ONE)
    try:
        time.sleep(3.0)
        records = recover(launcher, "deaf")
        assert records[0]["reason"] == "user_error" and records[0]["retryable"] is False
        port = launcher.read_job("deaf")["nodes"]["worker-0"]["metrics_port"]
        assert "Prometheus text on port 9400/metrics" in records[0]["text"] and port != 9400  # locally: its own port
    finally:
        launcher.stop("deaf")


REPORT_AND_WAIT = ("import json, os, time\n"
                   "open(os.environ['DLROVER_METRICS_FILE'], 'a').write(json.dumps(dict(throughput=1.0)) + '\\n')\n"
                   "time.sleep(120)")


def test_two_failed_members_restart_an_allreduce_group_once(tmp_path):
    launcher = LocalLauncher(tmp_path / "jobs")
    launcher.launch(trainer_spec("pair", [sys.executable, "-c", REPORT_AND_WAIT]), TWO)
    try:
        launcher.kind("pair").wait_first_reports()
        launcher.kill_node("pair", "worker-0")
        launcher.kill_node("pair", "worker-1")
        deadline = time.monotonic() + 10
        while sum(s.failed for s in launcher.status("pair")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        records = recover(launcher, "pair")
        # one relaunch for the group: the controller's step asks it once, the group restarts once
        assert [r["node"] for r in records if r.get("action") == "relaunch"] == ["worker-0"]
        restarts = [e for e in launcher.read_job("pair")["events"] if e.get("event") == "restart"]
        assert len(restarts) == 1 and restarts[0]["generation"] == 1
        assert all(s.state == "running" for s in launcher.status("pair"))
    finally:
        launcher.stop("pair")


def test_a_trainer_that_fails_before_reporting_is_the_users_mistake(tmp_path):
    launcher = LocalLauncher(tmp_path / "jobs")
    spec = trainer_spec("bad", [sys.executable, "-c", "import sys; print('unknown flag --lr'); sys.exit(1)"])
    with pytest.raises(RuntimeError) as err:
        run_job(launcher, spec, ONE, tmp_path, timeout_s=60)
    message = str(err.value)
    assert "exited 1 before its first report" in message and "unknown flag --lr" in message and "no retry" in message
    assert not (tmp_path / "jobs" / "bad" / "logs" / "worker-0.log").read_text().count("unknown flag") > 1  # not retried


def test_a_trainer_killed_before_its_first_report_is_the_clusters_failure_and_relaunched(tmp_path):
    # a busy node starts torch slowly: a SIGKILL (OOM killer, lost node) can land before any report
    launcher = LocalLauncher(tmp_path / "jobs")
    slow_start = "import time; time.sleep(3)\n" + REPORT_AND_WAIT
    launcher.launch(trainer_spec("early", [sys.executable, "-c", slow_start]), ONE)
    try:
        launcher.kill_node("early", "worker-0")
        deadline = time.monotonic() + 10
        while not any(s.failed for s in launcher.status("early")) and time.monotonic() < deadline:
            time.sleep(0.1)
        [node] = launcher.status("early")
        assert node.failed and node.exit_code in C.SIGKILL_EXIT_CODES and node.exit_code != C.USER_ERROR_EXIT_CODE
        records = recover(launcher, "early")
        assert [(r.get("action"), r.get("reason")) for r in records] == [("relaunch", "node_failed")]
        assert [s.state for s in launcher.status("early")] == ["running"]
    finally:
        launcher.stop("early")


def test_a_trainer_that_never_reports_is_refused_after_its_report_timeout(tmp_path):
    launcher = LocalLauncher(tmp_path / "jobs")
    spec = trainer_spec("mute", [sys.executable, "-c", "import time; time.sleep(60)"], report_timeout_s=2.0)
    launcher.launch(spec, ONE)
    try:
        import time

        time.sleep(3.0)
        records = recover(launcher, "mute")
        assert records[0]["reason"] == "user_error" and records[0]["retryable"] is False
        assert "reported nothing" in records[0]["text"] and "report_timeout_s=2s" in records[0]["text"]
        assert not any(r.get("action") == "relaunch" for r in records)
    finally:
        launcher.stop("mute")


def test_nodes_do_not_inherit_the_launching_process_stdin(tmp_path):
    """Under Airflow a task's fd 0 is its supervisor's request socket: a node that kept it would
    hold the finished task's supervisor (and its executor slot) until the node exits."""
    import os
    import socket

    import psutil

    launcher = LocalLauncher(tmp_path / "jobs")
    ours, theirs = socket.socketpair()
    saved = os.dup(0)
    os.dup2(theirs.fileno(), 0)
    try:
        launcher.launch(trainer_spec("stdin", [sys.executable, "-c", "import time; time.sleep(60)"]), ONE)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        theirs.close()
    try:
        wrapper = psutil.Process(launcher.read_job("stdin")["nodes"]["worker-0"]["pid"])
        for process in [wrapper, *wrapper.children(recursive=True)]:
            assert os.readlink(f"/proc/{process.pid}/fd/0") == "/dev/null", process.cmdline()
        ours.settimeout(5)
        assert ours.recv(1) == b""  # no process holds the other end any more
    finally:
        launcher.stop("stdin")
        ours.close()


def test_a_retried_launch_adopts_the_running_trainer_and_stop_leaves_nothing(tmp_path):
    """A second launcher process (an Airflow retry) finds the group running and adopts it: no
    second copy; stop removes every process and cgroup."""
    import time

    from airflow_dlrover.launchers.cgroups import CgroupManager

    reporting = ("import json, os, time\n"  # braces doubled: the argv's placeholders are {name}
                 "while True:\n"
                 "    open(os.environ['DLROVER_METRICS_FILE'], 'a').write(json.dumps({{'throughput': 1.0}}) + '\\n')\n"
                 "    time.sleep(0.2)\n")
    spec = trainer_spec("adopt", [sys.executable, "-c", reporting])
    first = LocalLauncher(tmp_path / "jobs")
    first.launch(spec, TWO)
    pids = {n: node["pid"] for n, node in first.read_job("adopt")["nodes"].items()}
    again = LocalLauncher(tmp_path / "jobs")
    assert again.launch(spec, TWO) == "adopt"
    assert {n: node["pid"] for n, node in again.read_job("adopt")["nodes"].items()} == pids
    time.sleep(0.5)
    assert again.progress("adopt")["throughput"] == 2.0  # both workers' reports
    again.stop("adopt")
    assert all(s.state == "stopped" for s in first.status("adopt"))
    assert not list(CgroupManager().groups("adopt"))
