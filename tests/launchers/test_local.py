"""The local launcher with real processes, cgroups and torch training (small jobs)."""

import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path

import chaos_faults as cf
import numpy as np
import pandas as pd
import pytest

from airflow_dlrover import timings as T
from airflow_dlrover.launchers.base import RUNNING
from airflow_dlrover.launchers.cgroups import CgroupManager
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.lifecycle.profiling import profile_job
from airflow_dlrover.lifecycle.run import run_job
from airflow_dlrover.optimizer.types import (
    CONFIG_COLUMNS, USAGE_COLUMNS, Configuration, Fault, FaultKind, InvalidInputError, Quota, parse_faults,
)
from airflow_dlrover.runtime.spec import JobSpec

pytestmark = pytest.mark.jobs

CONFIG = Configuration(workers=2, ps=1, worker_cpu=1.0, ps_cpu=0.5, worker_memory_mb=2048, ps_memory_mb=1024)
CGROUPS = CgroupManager()
needs_cgroups = pytest.mark.skipif(
    CGROUPS.mode == "advisory", reason=f"needs writable cgroups for real limits: {CGROUPS.advisory_reason}"
)
CRITEO = Path(__file__).resolve().parents[1] / "data" / "criteo_sample.csv"


def spec(job_id, **changes):
    return JobSpec(job_id=job_id, samples=changes.pop("samples", 120_000), checkpoint_interval_s=2.0, **changes)


def untrained_eval_loss(job: JobSpec) -> float:
    """Held-out loss of the model before any update: initial dense weights and initial rows."""
    import torch

    from airflow_dlrover.runtime.dlrm import build_model
    from airflow_dlrover.runtime.ps import initial_rows
    from airflow_dlrover.runtime.worker import source_for

    batch = source_for(job).samples(*job.held_out)
    embedded = [torch.from_numpy(initial_rows(job.seed, t, ids, dim)) for t, (ids, dim) in
                enumerate(zip(batch.sparse, job.layout.dims))]
    with torch.no_grad():
        logits = build_model(job)(torch.from_numpy(batch.dense), embedded)
        return float(torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.from_numpy(batch.label)))


def test_training_learns_and_writes_profile_samples(tmp_path):
    # long enough (~15 s at the runtime's speed) for several clean 3 s windows: the first one opens before any
    # worker reported
    summary = run_job(LocalLauncher(tmp_path / "jobs"), spec("learn", samples=1_000_000), CONFIG, tmp_path)
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    assert summary["samples_trained"] == summary["samples_expected"] == 1_000_000
    assert summary["eval_auc"] >= 0.70
    assert summary["eval_loss"] < untrained_eval_loss(spec("learn", samples=1_000_000)) - 0.05  # loss falls
    samples = pd.read_csv(tmp_path / "samples.csv")
    assert set(CONFIG_COLUMNS) | set(USAGE_COLUMNS) | {"throughput"} <= set(samples.columns)
    assert len(samples) >= 1 and (samples.throughput > 0).all()
    assert (samples.worker_cpu_used <= CONFIG.worker_cpu * 1.1).all()  # the quota holds
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["samples_lost"] == 0 and saved["throughput_series"]


def test_workers_report_at_the_probe_interval_while_profiled_and_at_their_own_after(tmp_path):
    """The profile asks the master for reports every ``PROBE_REPORT_INTERVAL_S`` and gives the
    interval back when it ends: the reports' own windows say how often the workers reported."""
    launcher, job = LocalLauncher(tmp_path / "jobs"), spec("often", samples=20_000_000)
    probes = pd.DataFrame([replace(CONFIG, workers=workers, worker_cpu=0.5).to_row() for workers in (1, 2)])
    try:
        table = profile_job(launcher, job, Quota(cpu=2, memory_mb=8192), probes=probes)
        profiled = time.time()
        time.sleep(4 * T.REPORT_INTERVAL_S)
        rows = [json.loads(line) for line in (launcher.job_dir(job.job_id) / "metrics.jsonl").read_text().splitlines()]
    finally:
        launcher.stop(job.job_id)
    assert len(table) == 2 and (table.throughput > 0).all()
    reports = [r for r in rows if r.get("role") == "worker" and not r.get("final")]
    during = [r["window_s"] for r in reports if r["time"] < profiled]
    after = [r["window_s"] for r in reports if r["time"] > profiled + 1.5 * T.REPORT_INTERVAL_S]
    assert len(during) >= 8 and np.median(during) < 2 * T.PROBE_REPORT_INTERVAL_S
    assert after and min(after) > 0.9 * T.REPORT_INTERVAL_S


@pytest.mark.parametrize("fault", ["kill-worker@4s", "kill-ps@5s", "kill-master@4s",
                                   pytest.param("oom-worker@4s", marks=needs_cgroups)])
def test_each_fault_is_recovered_and_loses_nothing(tmp_path, fault):
    config = Configuration(2, 1, 1.0, 0.5, 768 if fault.startswith("oom") else 2048, 1024)
    job = spec(fault.split("@")[0], samples=1_000_000)  # the fault lands mid-training (~100k samples/s here)
    summary = run_job(LocalLauncher(tmp_path / "jobs"), job, config, tmp_path, parse_faults(fault))
    assert summary["samples_lost"] == 0
    assert summary["samples_duplicated"] <= job.shard_size  # at most one shard per failure
    assert summary["restarts"] >= 1
    node = parse_faults(fault)[0].node
    reported = [e for e in summary["events"] if e.get("action") == "fail"]
    recovered = [e for e in summary["events"] if e.get("action") == "relaunch"]
    assert reported and reported[0]["nodes"] == [node] and reported[0]["retryable"]  # the failure first ...
    assert recovered and recovered[0]["node"] == node  # ... then its recovery, on the next step
    if fault.startswith("oom"):
        assert recovered[0]["reason"] == "oom_killed"
        assert recovered[0]["memory_mb"] == 1152  # 768 × 1.5: more memory after a real OOM kill
    assert summary["eval_auc"] >= 0.65


def test_resize_keeps_training_going(tmp_path):
    resizes = [(3.0, Configuration(3, 1, 1.0, 0.5, 2048, 1024)), (6.0, Configuration(1, 1, 1.0, 0.5, 2048, 1024)),
               (8.0, Configuration(1, 2, 1.0, 0.5, 2048, 1024))]
    summary = run_job(LocalLauncher(tmp_path / "jobs"), spec("resize", samples=1_200_000), CONFIG, tmp_path,
                      resizes=resizes)
    resized = [e for e in summary["events"] if "resize" in e]
    # a run slowed by a busy machine lasts long enough for the guard to see the new PS's restore
    # ramp as a trend: its memory resize is the only other one, and the job counts each once
    guarded = [e for e in summary["events"] if e.get("action") == "resize"]
    assert all(e["reason"] == "oom_risk" for e in guarded)
    assert summary["samples_lost"] == 0 and len(resized) == 3 and summary["resizes"] == 3 + len(guarded)
    actions = [e["actions"] for e in resized]
    assert actions[0] == ["worker-2 added"]
    assert sorted(actions[1]) == ["worker-1 removed", "worker-2 removed"]
    assert "re-partition" in actions[2][0]
    ps_changed = resized[2]["time_s"] + resized[2]["seconds"]
    after = [s["throughput"] for s in summary["throughput_series"] if s["time_s"] > ps_changed + 1]
    assert after and max(after) > 0  # still training after the PS change
    assert summary["config"]["ps"] == 2 and summary["config"]["workers"] == 1


def test_a_half_launched_job_is_launched_again_not_adopted(tmp_path):
    """A launcher that died after starting the master but before the workers left a record
    without ``launched``: the retry must not adopt a job that has no workers."""
    launcher = LocalLauncher(tmp_path)
    job = spec("half", samples=10_000_000)
    launcher.launch(job, CONFIG)
    try:
        record = launcher.read_job("half")
        old_master = record["nodes"]["master"]["pid"]
        del record["launched"]
        launcher._write("half", record)  # as the launch left it half-way
        assert LocalLauncher(tmp_path).launch(job, CONFIG) == "half"
        again = launcher.read_job("half")
        assert again["launched"] and again["nodes"]["master"]["pid"] != old_master
        assert sorted(n for n, node in again["nodes"].items() if node["state"] == RUNNING) == [
            "master", "ps-0", "worker-0", "worker-1"]
    finally:
        launcher.stop("half")


def test_second_launch_adopts_the_running_job_and_limits_are_applied(tmp_path):
    manager = CgroupManager()
    first = LocalLauncher(tmp_path, manager)
    job = spec("adopt", samples=10_000_000)
    first.launch(job, CONFIG)
    try:
        before = {s.name: s for s in first.status("adopt")}
        master_pid = first.read_job("adopt")["nodes"]["master"]["pid"]
        second = LocalLauncher(tmp_path, CgroupManager())
        assert second.launch(job, CONFIG) == "adopt"
        assert second.read_job("adopt")["nodes"]["master"]["pid"] == master_pid
        assert {s.name for s in second.status("adopt")} == set(before)
        assert all(s.state == RUNNING for s in second.status("adopt"))
        if manager.mode == "advisory":
            pytest.skip(f"cgroups not writable here: {manager.advisory_reason}")

        def limits_applied():
            groups = {g.node: g.read_limits() for g in manager.groups("adopt")}  # read back, not written
            for name, node in first.read_job("adopt")["nodes"].items():
                assert groups[name].cpu_cores == pytest.approx(node["cpu"])
                assert groups[name].memory_mb == pytest.approx(node["memory_mb"])

        limits_applied()
        assert first.read_job("adopt")["nodes"]["worker-0"]["cpu"] == CONFIG.worker_cpu
        pids = {name: node["pid"] for name, node in first.read_job("adopt")["nodes"].items()}
        # Same torch threads (1) and the same PS count: new limits in place, no process restarted.
        result = second.resize("adopt", replace(CONFIG, worker_cpu=0.75, ps_cpu=1.0, ps_memory_mb=1536))
        assert [a.split(" to ")[0] for a in result["actions"]] == ["ps resized in place", "workers resized in place"]
        assert {name: node["pid"] for name, node in first.read_job("adopt")["nodes"].items()} == pids
        assert first.read_job("adopt")["nodes"]["ps-0"]["cpu"] == 1.0
        limits_applied()
    finally:
        first.stop("adopt")
    assert all(s.state == "stopped" for s in first.status("adopt"))


def test_advisory_mode_warns_once_and_still_trains(tmp_path, caplog):
    not_cgroups = tmp_path / "not-a-cgroup-fs"
    not_cgroups.mkdir()
    with caplog.at_level(logging.WARNING):
        launcher = LocalLauncher(tmp_path / "jobs", CgroupManager(base=str(not_cgroups)))
        summary = run_job(launcher, spec("advisory", samples=40_000), CONFIG, tmp_path)
    assert summary["samples_lost"] == 0
    assert [r for r in caplog.records if "advisory" in r.getMessage()]


def test_criteo_sample_file_trains(tmp_path):
    job = JobSpec(job_id="criteo", data=str(CRITEO), samples=160, shard_size=32, batch_size=16,
                  table_sizes=(1000,) * 26, checkpoint_interval_s=2.0)
    summary = run_job(LocalLauncher(tmp_path / "jobs"), job, Configuration(1, 1, 1.0, 0.5, 2048, 1024), tmp_path)
    assert summary["samples_trained"] == 160 and summary["samples_lost"] == 0
    assert summary["eval_samples"] == 40


def test_fault_syntax_errors_name_the_field():
    assert parse_faults("kill-ps:1@30s") == [Fault(FaultKind.KILL_PS, 30.0, "ps-1")]
    assert parse_faults(["hot-ps", "kill-master@1m"]) == [Fault(FaultKind.HOT_PS, 0.0, "ps-0"),
                                                         Fault(FaultKind.KILL_MASTER, 60.0, "master")]
    for bad in ("kill-everything@3s", "kill-worker", "oom-worker@soon"):
        with pytest.raises(InvalidInputError) as err:
            parse_faults(bad)
        assert err.value.field == "inject"
    with pytest.raises(InvalidInputError) as err:  # a caller that injects only some kinds says which
        parse_faults("kill-ps@3s", allowed=(FaultKind.KILL_WORKER,))
    assert err.value.allowed.startswith("kill-worker[:N]@<time>")


@needs_cgroups
def test_slow_worker_is_detected_and_replaced(tmp_path):
    # The job asks for 1.5 of the 2 cores, so its quotas more than a busy machine's contention set
    # each worker's speed: on a loaded box two 1-core workers ran at 0.58 of each other (the
    # detector's line is 0.6), two half-core workers at 0.47. Long enough (~40 s) that the
    # detectors see 3 windows of the slowed worker after its warm-up.
    config = replace(CONFIG, worker_cpu=0.5)
    summary = run_job(LocalLauncher(tmp_path / "jobs"), spec("slow", samples=1_000_000), config, tmp_path,
                      parse_faults("slow-worker@3s"))
    assert summary["samples_lost"] == 0
    healed = [e for e in summary["events"] if e.get("reason") == "straggler"]
    assert healed and healed[0]["node"] == "worker-0" and healed[0]["action"] == "relaunch"
    assert healed[0]["cpu"] == config.worker_cpu
    nodes = json.loads((tmp_path / "jobs" / "slow" / "job.json").read_text())["nodes"]
    assert nodes["worker-0"]["cpu"] == config.worker_cpu  # the quota cut is undone


def test_relaunch_after_the_whole_job_died_resumes_from_the_checkpoint(tmp_path):
    launcher = LocalLauncher(tmp_path / "jobs")
    job = spec("resume", samples=2_000_000)
    launcher.launch(job, CONFIG)
    deadline = time.monotonic() + 60
    while True:  # wait for a checkpoint that holds trained shards
        checkpoint = launcher.master_call("resume", "/status")["checkpoint"]
        if checkpoint and json.loads((Path(checkpoint["path"]) / "manifest.json").read_text())["done"]:
            break
        assert time.monotonic() < deadline, "no checkpoint with trained shards within 60 s"
        time.sleep(0.2)
    for status in launcher.status("resume"):  # the machine lost every process of the job
        launcher.kill_node("resume", status.name)
    time.sleep(0.5)
    checkpoint = json.loads((tmp_path / "jobs" / "resume" / "master_state.json").read_text())["checkpoints"][-1]
    again = LocalLauncher(tmp_path / "jobs")
    assert again.launch(job, CONFIG) == "resume"
    try:
        status = again.master_call("resume", "/status")
        assert status["counters"]["restores"] >= 1
        done = len(json.loads((Path(checkpoint["path"]) / "manifest.json").read_text())["done"])
        assert status["shards"]["done"] >= done > 0  # resumed, not restarted from zero
        assert again.master_call("resume", "/accounting")["samples_trained"] >= done * job.shard_size
    finally:
        again.stop("resume")


def test_launcher_processes_take_turns_on_a_job_and_a_killed_holder_frees_it(tmp_path):
    """The job's flock: a second launcher process waits while another changes the job, and the
    kernel frees the lock of one that is killed mid-operation."""
    import subprocess
    import sys
    import threading

    from airflow_dlrover.launchers.local import LocalLauncher

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from airflow_dlrover.launchers.local import LocalLauncher; "
        f"lock = LocalLauncher({str(tmp_path)!r})._job_lock('j'); lock.__enter__(); print('held', flush=True); "
        "time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        got, second = threading.Event(), LocalLauncher(tmp_path)

        def take_it():
            handle = second._acquire("j")
            got.set()
            second._release("j", handle)

        waiter = threading.Thread(target=take_it)
        waiter.start()
        assert not got.wait(1.0)  # the other process holds it
        holder.kill()  # dies in the middle of its operation
        assert got.wait(10)
        waiter.join(timeout=10)
    finally:
        holder.kill()
        holder.wait()


def test_a_launcher_that_dies_before_it_hands_the_master_new_ps_leaves_a_job_that_finishes(tmp_path, monkeypatch):
    """A PS relaunched, its launcher dead before ``/restore``: the master restores the job itself.
    A PS change, its launcher dead before ``/cluster``: the launcher that adopts the job hands the
    master the new set. Either way every sample is trained and none lost."""
    job = spec("orphan", samples=600_000)
    launcher = LocalLauncher(tmp_path / "jobs")
    launcher.launch(job, CONFIG)
    try:
        _die_and_adopt(launcher, job, monkeypatch, tmp_path)
    finally:
        LocalLauncher(tmp_path / "jobs").stop("orphan")


def _die_and_adopt(launcher, job, monkeypatch, tmp_path):
    def progress(done: float = 0.0, timeout_s: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = launcher.master_call("orphan", "/status")
            if status["samples_done"] > done or status["state"] == "done":
                return status
            time.sleep(0.2)
        raise AssertionError(f"no progress past {done} samples in {timeout_s} s: {status}")

    before = progress(50_000)
    monkeypatch.setattr(launcher, "master_call", cf.dying_before(launcher, "/restore"))
    with pytest.raises(cf.SupervisorDied):
        launcher.relaunch("orphan", "ps-0")
    monkeypatch.undo()
    restored = progress(before["samples_done"] + 50_000)  # the master restored onto the new PS by itself
    assert restored["counters"]["restores"] >= 1
    monkeypatch.setattr(launcher, "master_call", cf.dying_before(launcher, "/cluster"))
    with pytest.raises(cf.SupervisorDied):
        launcher.resize("orphan", replace(CONFIG, ps=2))
    monkeypatch.undo()
    adopter = LocalLauncher(tmp_path / "jobs")
    assert adopter.launch(job, CONFIG) == "orphan"  # adopted: it hands the master the two new PS
    assert len(adopter.master_call("orphan", "/status")["ps"]) == 2
    # a PS change whose launcher died right after its checkpoint: the master holds on the record's set
    before = progress()
    adopter.master_call("orphan", "/checkpoint", {"hold": True})
    assert adopter.master_call("orphan", "/status")["held"]
    assert LocalLauncher(tmp_path / "jobs").launch(job, CONFIG) == "orphan"  # adopted: restored, not held
    assert not adopter.master_call("orphan", "/status")["held"]
    progress(before["samples_done"] + 50_000, timeout_s=60.0)
    assert progress(float("inf"), timeout_s=180.0)["state"] == "done"
    accounting = adopter.master_call("orphan", "/accounting")
    assert accounting["samples_lost"] == 0 and accounting["samples_trained"] >= 600_000
    assert accounting["samples_duplicated"] <= job.shard_size


def test_a_ps_change_while_a_ps_is_down_restores_the_new_set_from_the_last_checkpoint(tmp_path):
    """A PS change asked for while a PS is down (its relaunch not yet done): no checkpoint can be
    taken, so the change does not wait for one (it held the job's lock while the master failed to
    reach the PS, until the call timed out); the new set is restored from the last checkpoint and
    the job finishes, every sample trained, none lost."""
    job = spec("downps", samples=600_000)
    launcher = LocalLauncher(tmp_path / "jobs")
    launcher.launch(job, CONFIG)
    try:
        deadline = time.monotonic() + 60
        while not launcher.master_call("downps", "/status")["checkpoint"]:
            assert time.monotonic() < deadline, "no checkpoint within 60 s"
            time.sleep(0.2)
        launcher.kill_node("downps", "ps-0")
        while next(s for s in launcher.status("downps") if s.name == "ps-0").state == RUNNING:
            assert time.monotonic() < deadline + 30, "ps-0 did not die"
            time.sleep(0.1)
        started = time.monotonic()
        launcher.resize("downps", replace(CONFIG, ps=2))
        assert time.monotonic() - started < 30
        deadline = time.monotonic() + 180
        while (status := launcher.master_call("downps", "/status"))["state"] != "done":
            assert time.monotonic() < deadline, f"not done in 180 s: {status}"
            time.sleep(0.5)
        accounting = launcher.master_call("downps", "/accounting")
        assert accounting["samples_lost"] == 0 and accounting["samples_trained"] >= 600_000
        assert accounting["samples_duplicated"] <= job.shard_size
    finally:
        launcher.stop("downps")


def test_a_full_disk_ends_the_run_with_its_error_and_leaves_no_process_running(tmp_path, monkeypatch):
    """The disk fills mid-run: the relaunch of a killed worker cannot record its process, so it is
    not left running; the supervisor stops the job and raises ENOSPC, and no process of the job
    remains (none whose command line names its folder)."""
    import errno

    import psutil

    full, write = {"now": False}, LocalLauncher._write

    def writing(self, job_id, record):
        if full["now"]:
            raise OSError(errno.ENOSPC, "No space left on device", "job.json")
        return write(self, job_id, record)

    def disk_fills(launcher, job_id):
        full["now"] = True
        return {"disk": "full"}

    monkeypatch.setattr(LocalLauncher, "_write", writing)
    with pytest.raises(OSError) as err:
        run_job(LocalLauncher(tmp_path / "jobs"), spec("full", samples=2_000_000), CONFIG, tmp_path,
                parse_faults("kill-worker@3s"), interventions=[(2.5, disk_fills)], timeout_s=60.0)
    assert err.value.errno == errno.ENOSPC
    time.sleep(0.5)
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if any(str(tmp_path) in a for a in p.info["cmdline"] or [])]
    assert left == []


@pytest.mark.skipif(os.geteuid() != 0 or not cf.LIBFAKETIME.exists(),
                    reason="needs root (a tmpfs for the full disk) and libfaketime (the skewed clock)")
def test_chaos_control_plane_faults_each_once_and_the_job_finishes(tmp_path):
    """The chaos benchmark's control-plane faults, once each and back to back, on one small job: an
    unsigned 400 MB POST (refused, RSS + < 64 MB), 150 half-open connections (signed requests
    answered, threads bounded), a worker 90 s ahead (it trains), a supervisor dying before
    ``/cluster`` (adopted), a bit-flipped newest checkpoint (the restore falls back), a supervisor
    dying before ``/restore`` (adopted), a full disk (the run ends with ENOSPC; the retry resumes).
    Every sample is trained, none lost."""
    import errno
    import subprocess

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    assert subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(jobs)]).returncode == 0
    job, events = spec("chaos", samples=700_000), {}

    def fire(name, fault):
        def act(launcher, job_id):
            events[name] = fault(launcher, job_id)
            return {"chaos": name}
        return act

    worker = "worker-1"
    interventions = [
        (1.0, fire("unsigned", cf.unsigned_large_body)),
        (1.0, fire("half-open", lambda launcher, j: cf.half_open_connections(launcher, j, count=150, hold_s=3.0))),
        (1.0, fire("skewed", lambda launcher, j: cf.skewed_clock_worker(launcher, j, worker, wait_s=15.0))),
        (1.0, fire("mid-resize", lambda launcher, j: cf.supervisor_kill(launcher, j, "/cluster"))),
        (1.0, fire("damaged", cf.damaged_checkpoint)),
        (1.0, fire("mid-restore", lambda launcher, j: cf.supervisor_kill(launcher, j, "/restore"))),
        (1.0, fire("full-disk", lambda launcher, j: cf.fill_disk(launcher, j, "worker-0")))]
    try:
        with pytest.raises(OSError) as err:
            run_job(LocalLauncher(jobs), job, CONFIG, tmp_path / "out", interventions=interventions, timeout_s=120.0)
        assert err.value.errno == errno.ENOSPC and "full-disk" in events
        cf.free_disk(LocalLauncher(jobs))
        summary = run_job(LocalLauncher(jobs), job, CONFIG, tmp_path / "out", timeout_s=120.0)  # Airflow's retry
        fallbacks = cf.fallbacks(LocalLauncher(jobs), "chaos")
    finally:
        subprocess.run(["umount", "-l", str(jobs)])
    assert events["unsigned"]["refused"] and events["unsigned"]["rss_growth_mb"] < 64
    half_open = events["half-open"]
    assert half_open["signed_answered"] >= 1 and half_open["threads_peak"] <= half_open["threads_before"] + 128 + 4
    assert events["skewed"]["training"]
    assert events["damaged"]["flipped"] and fallbacks >= 1
    assert events["mid-restore"]["died"] and events["mid-restore"]["adopted"]
    assert events["mid-resize"]["died"] and events["mid-resize"]["adopted"] and events["mid-resize"]["ps"] == 2
    assert summary["samples_lost"] == 0 and summary["samples_trained"] >= job.samples
    assert summary["samples_duplicated"] <= 5 * job.shard_size  # a shard per failure: ps-0 ×2, worker ×2, the job
