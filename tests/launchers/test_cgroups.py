"""Tests of airflow_dlrover.launchers.cgroups.

The first group runs against the real kernel (skipped where cgroups are not usable): real child
processes, a real CFS quota, a real OOM kill. The others check the v1 / v2 file formats against
fake hierarchies in tmp_path, and the advisory fallback.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from airflow_dlrover.launchers import cgroups
from airflow_dlrover.launchers.cgroups import CgroupManager, Limits, Usage, _read_keyed

pytestmark = pytest.mark.jobs

MB = 1024 * 1024


# ------------------------------------------------------------------------------------------------
# helpers and fixtures
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def children():
    """Start child Pythons; every one still alive at teardown is killed and reaped."""
    started: list[subprocess.Popen] = []

    def spawn(code: str, preexec_fn=None, **kw) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", code],
            preexec_fn=preexec_fn,
            stdin=subprocess.DEVNULL,
            stdout=kw.pop("stdout", subprocess.DEVNULL),
            stderr=kw.pop("stderr", subprocess.DEVNULL),
            **kw,
        )
        started.append(proc)
        return proc

    yield spawn
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


def _wait_ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == b"ready", f"child did not start: {line!r}, rc={proc.poll()}"


@pytest.fixture
def real(children):
    """A manager on this machine's real cgroups, under a unique root name, removed at teardown."""
    mgr = CgroupManager(f"dlrover-test-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    if mgr.mode not in ("v1", "v2"):
        pytest.skip(f"real cgroups not usable on this machine: {mgr.advisory_reason}")
    yield mgr
    # `children` is torn down after this fixture (it was requested first), so kill ours here.
    roots = set(mgr.roots.values())
    for root in roots:
        procs = []
        for dirpath, _dirs, _files in os.walk(root):
            with open(os.path.join(dirpath, "cgroup.procs")) as f:
                procs += f.read().split()
        for pid in procs:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    while True:
        for root in roots:
            if os.path.isdir(root):
                for job in os.listdir(root):
                    if os.path.isdir(os.path.join(root, job)):
                        mgr.remove_job(job)
        mgr.remove_root()
        if not any(os.path.exists(r) for r in roots) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not [r for r in roots if os.path.exists(r)], "test cgroups left behind"


BURN = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < {s}:\n    pass\n"

# Touch every page: a bytearray is calloc'ed (fresh zero pages), so writing is what charges memory.
ALLOC = (
    "import sys, time\n"
    "b = bytearray({mb} * 1024 * 1024)\n"
    "for i in range(0, len(b), 4096):\n"
    "    b[i] = 1\n"
    "print('ready', flush=True)\n"
    "time.sleep({sleep})\n"
)


# ------------------------------------------------------------------------------------------------
# real kernel
# ------------------------------------------------------------------------------------------------


def test_real_groups_are_nested_under_own_cgroup(real):
    with open("/proc/self/cgroup") as f:
        own_v1, own_v2 = cgroups._parse_proc_cgroup(f.read())
    for ctrl, root in real.roots.items():
        assert os.path.basename(root) == real.root_name
        own = own_v2 if ctrl == "unified" else own_v1[ctrl]
        # The parent of our root is this process's own cgroup, not the hierarchy root (unless it is "/").
        assert os.path.dirname(root).endswith(own.rstrip("/")) or own == "/"


def test_real_limits_read_back_and_cpu_quota_is_enforced(real, children):
    group = real.create("job-cpu", "worker-0", Limits(cpu_cores=0.5, memory_mb=200))
    assert group.read_limits() == Limits(cpu_cores=0.5, memory_mb=200.0)
    assert group.usage().cpu_seconds == pytest.approx(0.0, abs=0.05)

    t0 = time.monotonic()
    proc = children(BURN.format(s=1.5), preexec_fn=group.preexec_fn())
    # preexec_fn ran before exec, and Popen returns only after exec: the child is in already.
    assert proc.pid in group.pids()
    assert proc.wait(timeout=10) == 0
    wall = time.monotonic() - t0

    share = group.usage().cpu_seconds / wall
    print(f"cpu share of the 0.5-core group: {share:.3f} ({group.usage().cpu_seconds:.3f} s over {wall:.3f} s)")
    assert 0.3 <= share <= 0.7
    assert group.pids() == []


def test_real_unlimited_cpu_is_not_throttled(real, children):
    # The control for the quota test: the same busy loop without a quota is never throttled (the
    # kernel's own count, cpu.stat's nr_throttled: its share of a core depends on the box's load).
    group = real.create("job-cpu", "worker-free", Limits(cpu_cores=None, memory_mb=None))
    assert group.read_limits() == Limits(cpu_cores=None, memory_mb=None)
    proc = children(BURN.format(s=0.6), preexec_fn=group.preexec_fn())
    assert proc.wait(timeout=10) == 0
    stats = [_read_keyed(os.path.join(d, "cpu.stat")) for d in group._dirs()]
    assert any("nr_throttled" in stat for stat in stats)
    assert all(stat.get("nr_throttled", 0) == 0 for stat in stats)
    assert group.usage().cpu_seconds > 0.3


def test_real_memory_overrun_is_an_oom_kill(real, children):
    group = real.create("job-mem", "ps-0", Limits(cpu_cores=None, memory_mb=200))

    # Within the limit: runs, is accounted, no OOM.
    ok = children(ALLOC.format(mb=60, sleep=30), preexec_fn=group.preexec_fn(), stdout=subprocess.PIPE)
    _wait_ready(ok)
    usage = group.usage()
    assert isinstance(usage, Usage)
    assert 60 <= usage.memory_mb < 200
    assert usage.oom_kills == 0
    ok.kill()
    ok.wait(timeout=10)

    # Past the limit: the kernel kills it with SIGKILL.
    bad = children(ALLOC.format(mb=400, sleep=0), preexec_fn=group.preexec_fn())
    assert bad.wait(timeout=20) == -signal.SIGKILL
    usage = group.usage()
    assert usage.oom_kills >= 1
    if usage.memory_peak_mb is not None:
        assert 60 <= usage.memory_peak_mb <= 200 + 1


def test_real_add_pid_moves_a_running_process(real, children):
    group = real.create("job-add", "master", Limits(cpu_cores=1.0, memory_mb=100))
    proc = children(ALLOC.format(mb=1, sleep=30), stdout=subprocess.PIPE)
    _wait_ready(proc)
    assert proc.pid not in group.pids()
    group.add_pid(proc.pid)
    assert proc.pid in group.pids()
    # In every hierarchy (v1: cpu, cpuacct and memory), /proc/<pid>/cgroup shows the node group.
    with open(f"/proc/{proc.pid}/cgroup") as f:
        text = f.read()
    rel = f"/{real.root_name}/job-add/master"
    if real.mode == "v1":
        for ctrl in ("cpu", "cpuacct", "memory"):
            if ctrl in real.roots:
                line = next(ln for ln in text.splitlines() if ctrl in ln.split(":")[1].split(","))
                assert line.endswith(rel), line
    else:
        assert any(ln.startswith("0::") and ln.endswith(rel) for ln in text.splitlines())


def test_real_create_is_idempotent_and_updates_limits(real):
    first = real.create("job-idem", "worker-0", Limits(cpu_cores=0.5, memory_mb=200))
    again = real.create("job-idem", "worker-0", Limits(cpu_cores=1.5, memory_mb=None))
    assert again is first
    assert again.read_limits() == Limits(cpu_cores=1.5, memory_mb=None)
    # Another launcher process (a second manager with the same root) reuses the same group.
    other = CgroupManager(real.root_name)
    third = other.create("job-idem", "worker-0", Limits(cpu_cores=0.25, memory_mb=64))
    assert third.paths == first.paths
    assert first.read_limits() == Limits(cpu_cores=0.25, memory_mb=64.0)
    for root in real.roots.values():
        job_dir = os.path.join(root, "job-idem")
        assert [e for e in os.listdir(job_dir) if os.path.isdir(os.path.join(job_dir, e))] == ["worker-0"]


def test_real_remove_job_removes_empty_groups_and_kills_nothing(real, children, caplog):
    busy = real.create("job-rm", "worker-0", Limits(cpu_cores=1.0, memory_mb=100))
    idle = real.create("job-rm", "worker-1", Limits(cpu_cores=1.0, memory_mb=100))
    proc = children(ALLOC.format(mb=1, sleep=30), preexec_fn=busy.preexec_fn(), stdout=subprocess.PIPE)
    _wait_ready(proc)

    with caplog.at_level(logging.WARNING, logger=cgroups.__name__):
        real.remove_job("job-rm")
    assert proc.poll() is None, "remove_job must not kill anything"
    assert all(os.path.isdir(d) for d in busy.paths.values())
    assert not any(os.path.exists(d) for d in idle.paths.values())
    assert any("still in it" in r.getMessage() and str(proc.pid) in r.getMessage() for r in caplog.records)

    proc.kill()
    proc.wait(timeout=10)
    real.remove_job("job-rm")
    for root in real.roots.values():
        assert not os.path.exists(os.path.join(root, "job-rm"))
    real.remove_root()
    assert not any(os.path.exists(r) for r in real.roots.values())


# ------------------------------------------------------------------------------------------------
# v2 formats on a fake unified hierarchy
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_v2(tmp_path):
    base = tmp_path / "cgroup"
    base.mkdir()
    (base / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (base / "cgroup.subtree_control").write_text("")
    own = base / "user.slice" / "launcher.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    self_cg = tmp_path / "self_cgroup"
    self_cg.write_text("0::/user.slice/launcher.service\n")
    return base, own, self_cg


def test_v2_detection_and_subtree_control(fake_v2):
    base, own, self_cg = fake_v2
    mgr = CgroupManager("dlrover", base=str(base), self_cgroup=str(self_cg))
    assert mgr.mode == "v2"
    assert mgr.roots == {"unified": str(own / "dlrover")}
    group = mgr.create("job1", "ps-0", Limits(cpu_cores=0.5, memory_mb=200))
    assert group.path == str(own / "dlrover" / "job1" / "ps-0")
    # cpu and memory are enabled on every ancestor of the node group, below our own cgroup.
    for d in (own, own / "dlrover", own / "dlrover" / "job1"):
        assert set((d / "cgroup.subtree_control").read_text().split()) == {"+cpu", "+memory"}
    assert (base / "cgroup.subtree_control").read_text() == ""  # the hierarchy root is not touched


def test_v2_limit_formats_round_trip(fake_v2):
    base, own, self_cg = fake_v2
    mgr = CgroupManager("dlrover", base=str(base), self_cgroup=str(self_cg))
    node = own / "dlrover" / "job1" / "worker-0"
    node.mkdir(parents=True)
    (node / "memory.swap.max").write_text("max\n")

    group = mgr.create("job1", "worker-0", Limits(cpu_cores=0.5, memory_mb=200))
    assert (node / "cpu.max").read_text() == "50000 100000"
    assert (node / "memory.max").read_text() == str(200 * MB)
    assert (node / "memory.swap.max").read_text() == "0"
    assert group.read_limits() == Limits(cpu_cores=0.5, memory_mb=200.0)

    group.set_limits(Limits(cpu_cores=None, memory_mb=None))
    assert (node / "cpu.max").read_text() == "max 100000"
    assert (node / "memory.max").read_text() == "max"
    assert group.read_limits() == Limits(cpu_cores=None, memory_mb=None)

    group.set_limits(Limits(cpu_cores=2.25, memory_mb=1.5))
    assert (node / "cpu.max").read_text() == "225000 100000"
    assert group.read_limits() == Limits(cpu_cores=2.25, memory_mb=1.5)
    # A kernel-written file with another period and a trailing newline parses too.
    (node / "cpu.max").write_text("150000 200000\n")
    (node / "memory.max").write_text(f"{512 * MB}\n")
    assert group.read_limits() == Limits(cpu_cores=0.75, memory_mb=512.0)


def test_v2_usage_pids_and_preexec(fake_v2):
    base, own, self_cg = fake_v2
    mgr = CgroupManager("dlrover", base=str(base), self_cgroup=str(self_cg))
    group = mgr.create("job1", "worker-0", Limits(cpu_cores=1.0, memory_mb=100))
    node = own / "dlrover" / "job1" / "worker-0"
    (node / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    (node / "memory.current").write_text(f"{150 * MB}\n")
    (node / "memory.stat").write_text(f"anon {100 * MB}\nfile {50 * MB}\ninactive_file {30 * MB}\n")
    (node / "memory.peak").write_text(f"{180 * MB}\n")
    (node / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 3\noom_kill 2\noom_group_kill 0\n")
    assert group.usage() == Usage(cpu_seconds=1.5, memory_mb=120.0, memory_peak_mb=180.0, oom_kills=2)

    (node / "memory.peak").unlink()  # kernels before 5.19
    assert group.usage().memory_peak_mb is None

    group.add_pid(4321)
    assert (node / "cgroup.procs").read_text() == "4321"
    assert group.pids() == [4321]
    # The hook writes without truncating, as a cgroupfs file takes each write as one record; this
    # fake is a regular file, so empty it first (a shorter pid would read "5621" after "4321").
    (node / "cgroup.procs").write_text("")
    group.preexec_fn()()  # in a child it would move the child; here it writes our own pid
    assert (node / "cgroup.procs").read_text() == str(os.getpid())

    (node / "cgroup.procs").write_text("")
    mgr.remove_job("job1")
    assert not (own / "dlrover" / "job1").exists()
    mgr.remove_root()
    assert not (own / "dlrover").exists()



def test_a_group_another_stop_removed_first_counts_as_removed(fake_v2, monkeypatch):
    base, own, self_cg = fake_v2
    mgr = CgroupManager("dlrover", base=str(base), self_cgroup=str(self_cg))
    mgr.create("job1", "worker-0", Limits(cpu_cores=1.0, memory_mb=100))
    node = own / "dlrover" / "job1" / "worker-0"
    walk = os.walk

    def racing_walk(top, topdown=True):  # another stop removes worker-0 after this one listed it
        listed = list(walk(top, topdown=topdown))
        shutil.rmtree(node)
        return iter(listed)

    monkeypatch.setattr(os, "walk", racing_walk)
    mgr.remove_job("job1")
    assert not (own / "dlrover" / "job1").exists()

def test_v2_without_memory_controller_is_advisory(fake_v2, monkeypatch, caplog):
    base, own, self_cg = fake_v2
    (own / "cgroup.controllers").write_text("cpu pids\n")
    monkeypatch.setattr(cgroups, "_advisory_warned", False)
    with caplog.at_level(logging.WARNING, logger=cgroups.__name__):
        mgr = CgroupManager("dlrover", base=str(base), self_cgroup=str(self_cg))
    assert mgr.mode == "advisory"
    assert "memory" in mgr.advisory_reason
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


# ------------------------------------------------------------------------------------------------
# v1 formats on a fake legacy hierarchy (combined cpu,cpuacct mount)
# ------------------------------------------------------------------------------------------------


def test_v1_formats_on_fake_tree_with_combined_cpu_cpuacct(tmp_path):
    base = tmp_path / "cgroup"
    cpu = base / "cpu,cpuacct" / "sandbox"
    mem = base / "memory" / "process_api" / "abc"
    for d in (base / "cpu,cpuacct", base / "memory"):
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text("")
    cpu.mkdir()
    mem.mkdir(parents=True)
    (base / "cpu,cpuacct" / "sandbox" / "dlrover").mkdir()
    (cpu / "dlrover" / "cpu.cfs_quota_us").write_text("-1\n")
    self_cg = tmp_path / "self_cgroup"
    self_cg.write_text("9:name=systemd:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/sandbox\n0::/\n")

    mgr = CgroupManager("dlrover", base=str(base), self_cgroup=str(self_cg))
    assert mgr.mode == "v1"
    assert mgr.roots == {
        "cpu": str(cpu / "dlrover"),
        "cpuacct": str(cpu / "dlrover"),
        "memory": str(mem / "dlrover"),
    }
    group = mgr.create("j", "worker-0", Limits(cpu_cores=0.5, memory_mb=200))
    cnode, mnode = cpu / "dlrover" / "j" / "worker-0", mem / "dlrover" / "j" / "worker-0"
    assert (cnode / "cpu.cfs_period_us").read_text() == "100000"
    assert (cnode / "cpu.cfs_quota_us").read_text() == "50000"
    assert (mnode / "memory.limit_in_bytes").read_text() == str(200 * MB)
    assert group.read_limits() == Limits(cpu_cores=0.5, memory_mb=200.0)

    group.set_limits(Limits(cpu_cores=None, memory_mb=None))
    assert (cnode / "cpu.cfs_quota_us").read_text() == "-1"
    assert (mnode / "memory.limit_in_bytes").read_text() == "-1"
    # What the kernel shows for "unlimited":
    (mnode / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert group.read_limits() == Limits(cpu_cores=None, memory_mb=None)

    (cnode / "cpuacct.usage").write_text("2500000000\n")
    (mnode / "memory.usage_in_bytes").write_text(f"{100 * MB}\n")
    (mnode / "memory.max_usage_in_bytes").write_text(f"{190 * MB}\n")
    (mnode / "memory.stat").write_text(f"cache {40 * MB}\nrss {60 * MB}\ntotal_inactive_file {25 * MB}\n")
    (mnode / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert group.usage() == Usage(cpu_seconds=2.5, memory_mb=75.0, memory_peak_mb=190.0, oom_kills=1)

    group.add_pid(777)  # once per distinct hierarchy: the combined cpu,cpuacct group and memory
    assert (cnode / "cgroup.procs").read_text() == "777"
    assert (mnode / "cgroup.procs").read_text() == "777"


# ------------------------------------------------------------------------------------------------
# advisory mode
# ------------------------------------------------------------------------------------------------


def test_advisory_when_no_hierarchy_warns_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(cgroups, "_advisory_warned", False)
    with caplog.at_level(logging.DEBUG, logger=cgroups.__name__):
        managers = [CgroupManager("dlrover", base=str(tmp_path)) for _ in range(3)]
        for i, mgr in enumerate(managers):
            for node in ("master", "ps-0", "worker-0"):
                mgr.create(f"job{i}", node, Limits(cpu_cores=1.0, memory_mb=100))
    assert all(m.mode == "advisory" for m in managers)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert str(tmp_path) in msg and "advisory only" in msg
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_advisory_when_not_writable_names_the_error(tmp_path, monkeypatch, caplog):
    base = tmp_path / "cgroup"
    for ctrl in ("cpu", "cpuacct", "memory"):
        (base / ctrl).mkdir(parents=True)
        (base / ctrl / "cgroup.procs").write_text("")
    self_cg = tmp_path / "self_cgroup"
    self_cg.write_text("4:memory:/\n2:cpuacct:/\n1:cpu:/\n")

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(cgroups, "_advisory_warned", False)
    with caplog.at_level(logging.WARNING, logger=cgroups.__name__), monkeypatch.context() as m:
        m.setattr(cgroups.os, "makedirs", denied)
        mgr = CgroupManager("dlrover", base=str(base), self_cgroup=str(self_cg))
    assert mgr.mode == "advisory"
    (record,) = caplog.records
    msg = record.getMessage()
    assert msg.startswith("cgroups not writable (PermissionError on ")
    assert str(base) in msg and msg.endswith("CPU and memory limits are advisory only")


def test_advisory_operations_are_noops_and_usage_comes_from_psutil(tmp_path, children, monkeypatch):
    monkeypatch.setattr(cgroups, "_advisory_warned", False)
    mgr = CgroupManager("dlrover", base=str(tmp_path))
    assert mgr.mode == "advisory"
    group = mgr.create("job", "worker-0", Limits(cpu_cores=0.5, memory_mb=10))
    assert mgr.create("job", "worker-0", Limits(cpu_cores=1, memory_mb=20)) is group
    group.set_limits(Limits(cpu_cores=0.25, memory_mb=5))
    assert group.read_limits() == Limits(cpu_cores=None, memory_mb=None)

    hook = group.preexec_fn()
    # The 10 MB "limit" is advisory: a 50 MB child just runs.
    proc = children(ALLOC.format(mb=50, sleep=30), preexec_fn=hook, stdout=subprocess.PIPE)
    _wait_ready(proc)
    assert group.pids() == []
    group.add_pid(proc.pid)
    assert group.pids() == [proc.pid]

    usage = group.usage()
    rss_mb = psutil.Process(proc.pid).memory_info().rss / MB
    assert usage.memory_mb >= 50
    assert usage.memory_mb == pytest.approx(rss_mb, rel=0.2)
    assert usage.cpu_seconds > 0
    assert usage.memory_peak_mb is None and usage.oom_kills == 0

    proc.kill()
    proc.wait(timeout=10)
    assert group.pids() == []
    assert group.usage().cpu_seconds >= usage.cpu_seconds  # CPU time of the exited child is kept
    mgr.remove_job("job")
    mgr.remove_root()
    assert mgr.groups() == [] and list(tmp_path.iterdir()) == []


def test_limits_validation():
    with pytest.raises(ValueError):
        Limits(cpu_cores=0, memory_mb=None)
    with pytest.raises(ValueError):
        Limits(cpu_cores=None, memory_mb=-1)
    with pytest.raises(ValueError):
        CgroupManager("a/b")
