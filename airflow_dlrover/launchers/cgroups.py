"""Real CPU and memory limits for locally launched training nodes, through Linux cgroups.

The local launcher runs every training node (master, PS, worker) as a process. To make the
resource plan real, each node gets its own cgroup::

    <own cgroup of this process>/<root_name>/<job_id>/<node>

The groups are nested under the cgroup this process already lives in (read from
``/proc/self/cgroup``), never at the root of a hierarchy, so that whatever limits the surrounding
sandbox / container / systemd unit imposes keep applying to the training nodes as well.

Three modes, detected once by :class:`CgroupManager`:

``"v1"``
    Legacy hierarchies, one per controller (``<base>/cpu``, ``<base>/cpuacct``, ``<base>/memory``;
    a combined ``cpu,cpuacct`` mount is handled). CPU: ``cpu.cfs_period_us`` = 100000 and
    ``cpu.cfs_quota_us`` = cores * period (``-1`` = unlimited). Memory: ``memory.limit_in_bytes``
    (``-1`` = unlimited) and ``memory.swappiness`` = 0, so that an overrun is reclaimed from the
    page cache only and then ends in an OOM kill instead of swapping. ``memory.memsw.*`` is not
    touched.
``"v2"``
    The unified hierarchy (``<base>/cgroup.controllers`` exists). CPU: ``cpu.max`` =
    ``"<quota> <period>"`` or ``"max <period>"``; memory: ``memory.max`` (``"max"`` = unlimited)
    and ``memory.swap.max`` = 0 where the file exists. ``cpu`` and ``memory`` are enabled in
    ``cgroup.subtree_control`` down the path. (The "no internal processes" rule means that this
    only works where this process's own cgroup is the root of the hierarchy or is delegated with
    the controllers already enabled; otherwise the manager falls back to advisory mode.)
``"advisory"``
    Neither is usable (no hierarchy at ``base``, not writable, controllers missing). One warning is
    logged per process, naming the reason; all operations are no-ops, and :meth:`NodeCgroup.usage`
    reports the psutil CPU time and RSS of the pids passed to :meth:`NodeCgroup.add_pid` (and
    their descendants).

Typical use by a launcher::

    manager = CgroupManager()
    group = manager.create(job_id, "worker-0", Limits(cpu_cores=2.0, memory_mb=4096))
    proc = subprocess.Popen(cmd, preexec_fn=group.preexec_fn())
    group.add_pid(proc.pid)          # harmless in v1/v2 (already there); needed in advisory mode
    ...
    usage = group.usage()            # cpu_seconds, memory_mb, memory_peak_mb, oom_kills
    manager.remove_job(job_id)       # after the processes have exited

A memory overrun is a real kernel OOM kill: the child dies by ``SIGKILL`` (``Popen.returncode ==
-9``) and ``usage().oom_kills`` counts it (v1: ``oom_kill`` in ``memory.oom_control``, kernel >=
4.13; v2: ``oom_kill`` in ``memory.events``).

Units: ``memory_mb`` is MiB (1 MB = 2**20 bytes here); ``cpu_cores`` is a fraction of one CPU.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

__all__ = [
    "CFS_PERIOD_US",
    "CgroupError",
    "CgroupManager",
    "Limits",
    "NodeCgroup",
    "Usage",
]

log = logging.getLogger(__name__)

MB = 1024 * 1024
#: CFS bandwidth period written for every group (microseconds).
CFS_PERIOD_US = 100_000
#: The kernel refuses a CFS quota below 1 ms.
_MIN_QUOTA_US = 1_000
#: v1 reports "unlimited" memory as PAGE_COUNTER_MAX * PAGE_SIZE (~2**63); anything this large is "no limit".
_UNLIMITED_BYTES = 1 << 62
#: Controllers a node group needs.
_V1_CONTROLLERS = ("cpu", "cpuacct", "memory")

_advisory_lock = threading.Lock()
_advisory_warned = False


class CgroupError(OSError):
    """A cgroup file could not be written or read (the message names the file and the value)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one node. ``None`` means unlimited."""

    cpu_cores: float | None
    memory_mb: float | None

    def __post_init__(self) -> None:
        if self.cpu_cores is not None and not self.cpu_cores > 0:
            raise ValueError(f"cpu_cores must be > 0 or None, got {self.cpu_cores!r}")
        if self.memory_mb is not None and not self.memory_mb > 0:
            raise ValueError(f"memory_mb must be > 0 or None, got {self.memory_mb!r}")


@dataclass(frozen=True)
class Usage:
    """Resource usage of one node's group.

    ``cpu_seconds`` is cumulative CPU time; ``memory_mb`` the current working set (usage minus
    inactive page cache, i.e. what the kubelet calls the working set); ``memory_peak_mb`` the
    high-water mark where the kernel keeps one (v1 ``memory.max_usage_in_bytes``, v2
    ``memory.peak``), else ``None``; ``oom_kills`` the number of OOM kills inside the group.
    """

    cpu_seconds: float
    memory_mb: float
    memory_peak_mb: float | None
    oom_kills: int


# --------------------------------------------------------------------------------------------
# small file helpers
# --------------------------------------------------------------------------------------------


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _read_int(path: str) -> int | None:
    text = _read_text(path)
    if text is None or not text.strip():
        return None
    return int(text.split()[0])


def _read_keyed(path: str) -> dict[str, int]:
    """Parse a flat-keyed file (``key value`` per line), as memory.stat, cpu.stat, memory.events."""
    text = _read_text(path)
    out: dict[str, int] = {}
    if text is None:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def _write(path: str, value: str) -> None:
    # One write() call per value: cgroup files act on each write separately.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot open {path} to write {value!r}: {exc.strerror}") from exc
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot write {value!r} to {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def _write_if_present(path: str, value: str) -> None:
    """Best effort (no swap so that an overrun is an OOM kill): skip a file the kernel lacks."""
    if os.path.exists(path):
        try:
            _write(path, value)
        except CgroupError as exc:
            log.debug("could not set %s=%s: %s", os.path.basename(path), value, exc)


def _check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"invalid {kind} {name!r}: must be a non-empty path component")
    return name


def _parse_proc_cgroup(text: str) -> tuple[dict[str, str], str | None]:
    """``/proc/self/cgroup`` → ({v1 controller: path}, v2 path or None)."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hier_id, controllers, path = parts
        if hier_id == "0" and controllers == "":
            v2 = path
            continue
        for ctrl in controllers.split(","):
            if ctrl and not ctrl.startswith("name="):
                v1[ctrl] = path
    return v1, v2


def _cgroup_mount_points(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    text = _read_text(mountinfo) or ""
    points = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) >= 5 and rfields and rfields[0] in ("cgroup", "cgroup2"):
            points.append(os.path.realpath(fields[4].replace("\\040", " ")))
    return points


def _on_cgroupfs(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == p or real.startswith(p.rstrip("/") + "/") for p in _cgroup_mount_points())


def _join_own(mount: str, own: str | None) -> str:
    """The directory of our own cgroup inside a mounted hierarchy.

    If the path from /proc/self/cgroup is not visible under the mount (a container that
    bind-mounts only its own subtree, without a cgroup namespace), the mount itself *is* our
    cgroup, so use it.
    """
    if own:
        candidate = os.path.join(mount, own.lstrip("/"))
        if os.path.isdir(candidate):
            return os.path.normpath(candidate)
        log.debug("own cgroup %s not visible under %s; using the mount itself", own, mount)
    return os.path.normpath(mount)


def _psutil_tree(pids: set[int]) -> list[psutil.Process]:
    """Live processes among ``pids`` and all their descendants (a cgroup holds descendants too)."""
    seen: dict[int, psutil.Process] = {}
    for pid in sorted(pids):
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            seen.setdefault(proc.pid, proc)
            for child in proc.children(recursive=True):
                seen.setdefault(child.pid, child)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return list(seen.values())


# --------------------------------------------------------------------------------------------
# node groups
# --------------------------------------------------------------------------------------------


class NodeCgroup:
    """The cgroup of one training node. Obtain it from :meth:`CgroupManager.create`."""

    def __init__(self, manager: CgroupManager, job_id: str, node: str, paths: dict[str, str]):
        self.manager = manager
        self.job_id = job_id
        self.node = node
        #: controller → directory. v1: keys "cpu", "cpuacct", "memory" (a combined cpu,cpuacct mount
        #: gives the same directory twice); v2: key "unified"; advisory: empty.
        self.paths = dict(paths)
        self._pids: set[int] = set()  # advisory only
        self._cpu_seen: dict[tuple[int, float], float] = {}  # advisory: (pid, create_time) → cpu s

    # -- layout -------------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self.manager.mode

    @property
    def path(self) -> str | None:
        """The main directory (v1: the memory group, v2: the unified group; advisory: None)."""
        return self.paths.get("memory") or self.paths.get("unified")

    def _dirs(self) -> list[str]:
        """Distinct group directories, memory first (so a child is memory-limited as early as possible)."""
        out: list[str] = []
        real: set[str] = set()
        for key in ("memory", "unified", "cpu", "cpuacct"):
            d = self.paths.get(key)
            if d and os.path.realpath(d) not in real:
                real.add(os.path.realpath(d))
                out.append(d)
        return out

    def __repr__(self) -> str:
        return f"NodeCgroup(mode={self.mode!r}, job_id={self.job_id!r}, node={self.node!r}, path={self.path!r})"

    # -- membership ---------------------------------------------------------------------------

    def add_pid(self, pid: int) -> None:
        """Move ``pid`` (a whole thread group) into this node's group(s)."""
        pid = int(pid)
        if self.mode == "advisory":
            self._pids.add(pid)
            return
        for d in self._dirs():
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    def preexec_fn(self) -> Callable[[], None]:
        """A ``subprocess.Popen(preexec_fn=...)`` hook moving the child into the group before exec.

        The limits then apply from the child's first instruction. If the move fails, the hook
        raises and ``Popen`` raises ``SubprocessError`` instead of starting an unlimited child. In
        advisory mode the hook does nothing; call :meth:`add_pid` with ``Popen.pid`` afterwards so
        that :meth:`usage` can follow the process.
        """
        if self.mode == "advisory":

            def _noop() -> None:
                return None

            return _noop

        # Precompute everything: between fork and exec, keep to plain system calls.
        procs_files = [os.path.join(d, "cgroup.procs").encode() for d in self._dirs()]

        def _enter_cgroup() -> None:
            data = str(os.getpid()).encode()
            for path in procs_files:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)

        return _enter_cgroup

    def pids(self) -> list[int]:
        """Processes in the group (advisory: the added pids still alive, and their descendants)."""
        if self.mode == "advisory":
            return sorted(p.pid for p in _psutil_tree(self._pids))
        text = _read_text(os.path.join(self.path, "cgroup.procs")) or ""  # type: ignore[arg-type]
        return sorted({int(tok) for tok in text.split()})

    # -- limits -------------------------------------------------------------------------------

    def set_limits(self, limits: Limits) -> None:
        """Write ``limits`` to the kernel (advisory: no-op)."""
        mode = self.mode
        if mode == "advisory":
            return
        quota = None if limits.cpu_cores is None else max(_MIN_QUOTA_US, round(limits.cpu_cores * CFS_PERIOD_US))
        mem = None if limits.memory_mb is None else int(round(limits.memory_mb * MB))
        if mode == "v1":
            cpu = self.paths["cpu"]
            _write(os.path.join(cpu, "cpu.cfs_period_us"), str(CFS_PERIOD_US))
            _write(os.path.join(cpu, "cpu.cfs_quota_us"), "-1" if quota is None else str(quota))
            memd = self.paths["memory"]
            _write_if_present(os.path.join(memd, "memory.swappiness"), "0")
            _write(os.path.join(memd, "memory.limit_in_bytes"), "-1" if mem is None else str(mem))
        else:
            d = self.paths["unified"]
            _write(os.path.join(d, "cpu.max"), f"{'max' if quota is None else quota} {CFS_PERIOD_US}")
            _write_if_present(os.path.join(d, "memory.swap.max"), "0")
            _write(os.path.join(d, "memory.max"), "max" if mem is None else str(mem))

    def read_limits(self) -> Limits:
        """The limits the kernel holds (advisory: unlimited)."""
        mode = self.mode
        if mode == "advisory":
            return Limits(cpu_cores=None, memory_mb=None)
        if mode == "v1":
            cpu = self.paths["cpu"]
            quota = _read_int(os.path.join(cpu, "cpu.cfs_quota_us"))
            period = _read_int(os.path.join(cpu, "cpu.cfs_period_us")) or CFS_PERIOD_US
            cores = None if quota is None or quota < 0 else quota / period
            mem = _read_int(os.path.join(self.paths["memory"], "memory.limit_in_bytes"))
            mem_mb = None if mem is None or mem < 0 or mem >= _UNLIMITED_BYTES else mem / MB
            return Limits(cpu_cores=cores, memory_mb=mem_mb)
        d = self.paths["unified"]
        cpu_max = (_read_text(os.path.join(d, "cpu.max")) or "max").split()
        cores = None
        if cpu_max and cpu_max[0] != "max":
            period = int(cpu_max[1]) if len(cpu_max) > 1 else CFS_PERIOD_US
            cores = int(cpu_max[0]) / period
        mem_text = (_read_text(os.path.join(d, "memory.max")) or "max").strip()
        mem_mb = None if mem_text in ("", "max") else int(mem_text) / MB
        return Limits(cpu_cores=cores, memory_mb=mem_mb)

    # -- usage --------------------------------------------------------------------------------

    def usage(self) -> Usage:
        mode = self.mode
        if mode == "advisory":
            return self._advisory_usage()
        if mode == "v1":
            memd = self.paths["memory"]
            acct = self.paths.get("cpuacct")
            ns = _read_int(os.path.join(acct, "cpuacct.usage")) if acct else None
            cpu_s = ns / 1e9 if ns is not None else self._psutil_cpu_seconds()
            stat = _read_keyed(os.path.join(memd, "memory.stat"))
            used = _read_int(os.path.join(memd, "memory.usage_in_bytes")) or 0
            inactive_file = stat.get("total_inactive_file", stat.get("inactive_file", 0))
            peak = _read_int(os.path.join(memd, "memory.max_usage_in_bytes"))
            # "oom_kill" exists from kernel 4.13 on; older kernels only say whether one is under way.
            ooms = _read_keyed(os.path.join(memd, "memory.oom_control")).get("oom_kill", 0)
        else:
            d = self.paths["unified"]
            cpu_s = _read_keyed(os.path.join(d, "cpu.stat")).get("usage_usec", 0) / 1e6
            stat = _read_keyed(os.path.join(d, "memory.stat"))
            used = _read_int(os.path.join(d, "memory.current")) or 0
            inactive_file = stat.get("inactive_file", 0)
            peak = _read_int(os.path.join(d, "memory.peak"))  # kernel >= 5.19
            ooms = _read_keyed(os.path.join(d, "memory.events")).get("oom_kill", 0)
        return Usage(
            cpu_seconds=float(cpu_s),
            memory_mb=max(0, used - inactive_file) / MB,
            memory_peak_mb=None if peak is None else peak / MB,
            oom_kills=int(ooms),
        )

    def _psutil_cpu_seconds(self) -> float:
        pids = set(self.pids()) if self.mode != "advisory" else self._pids
        for proc in _psutil_tree(pids):
            try:
                with proc.oneshot():
                    t = proc.cpu_times()
                    key = (proc.pid, proc.create_time())
                self._cpu_seen[key] = max(self._cpu_seen.get(key, 0.0), t.user + t.system)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        # Processes that exited keep the CPU time last seen for them.
        return sum(self._cpu_seen.values())

    def _advisory_usage(self) -> Usage:
        cpu_s = self._psutil_cpu_seconds()
        rss = 0
        for proc in _psutil_tree(self._pids):
            try:
                rss += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return Usage(cpu_seconds=cpu_s, memory_mb=rss / MB, memory_peak_mb=None, oom_kills=0)


# --------------------------------------------------------------------------------------------
# manager
# --------------------------------------------------------------------------------------------


class _Advisory(Exception):
    """Internal: the reason why cgroups cannot be used."""


class CgroupManager:
    """Creates one cgroup per training node under ``<own cgroup>/<root_name>/<job_id>/<node>``.

    ``base`` is where the cgroup hierarchies are mounted (``/sys/fs/cgroup``); ``self_cgroup`` is
    the file that says which cgroup this process is in (``/proc/self/cgroup``; tests point it at a
    fake). The mode ("v1", "v2" or "advisory") is detected once, here.
    """

    def __init__(
        self,
        root_name: str = "dlrover",
        *,
        base: str = "/sys/fs/cgroup",
        self_cgroup: str = "/proc/self/cgroup",
    ):
        self.root_name = _check_name("root_name", root_name)
        self.base = base
        self.self_cgroup = self_cgroup
        #: controller → directory of <own cgroup>/<root_name> (v1: cpu/cpuacct/memory; v2: unified).
        self.roots: dict[str, str] = {}
        self.advisory_reason: str | None = None
        self._groups: dict[tuple[str, str], NodeCgroup] = {}
        try:
            if os.path.isfile(os.path.join(base, "cgroup.controllers")):
                self.mode = "v2"
                self._init_v2()
            elif self._v1_mounts():
                self.mode = "v1"
                self._init_v1()
            else:
                raise _Advisory(f"no cgroup v1 (cpu, cpuacct, memory) or v2 hierarchy found at {base}")
        except _Advisory as exc:
            self._go_advisory(str(exc))
        except OSError as exc:
            where = f" on {exc.filename}" if getattr(exc, "filename", None) else ""
            self._go_advisory(f"cgroups not writable ({type(exc).__name__}{where}: {exc.strerror or exc})")
        self._real_fs = self.mode != "advisory" and _on_cgroupfs(next(iter(self.roots.values())))

    # -- detection ----------------------------------------------------------------------------

    def _go_advisory(self, reason: str) -> None:
        global _advisory_warned
        self.mode = "advisory"
        self.advisory_reason = reason
        self.roots = {}
        with _advisory_lock:
            first = not _advisory_warned
            _advisory_warned = True
        if first:
            log.warning("%s: CPU and memory limits are advisory only", reason)
        else:
            log.debug("%s: CPU and memory limits are advisory only", reason)

    def _own_paths(self) -> tuple[dict[str, str], str | None]:
        text = _read_text(self.self_cgroup)
        if text is None:
            raise _Advisory(f"cannot read {self.self_cgroup}")
        return _parse_proc_cgroup(text)

    def _v1_mounts(self) -> dict[str, str]:
        """controller → mount directory for cpu, cpuacct, memory; {} unless cpu and memory are present."""
        found: dict[str, str] = {}
        try:
            entries = sorted(os.listdir(self.base))
        except OSError:
            return {}
        for ctrl in _V1_CONTROLLERS:
            direct = os.path.join(self.base, ctrl)
            if os.path.isfile(os.path.join(direct, "cgroup.procs")):
                found[ctrl] = direct
                continue
            for entry in entries:  # e.g. "cpu,cpuacct" without the usual symlinks
                d = os.path.join(self.base, entry)
                if ctrl in entry.split(",") and os.path.isfile(os.path.join(d, "cgroup.procs")):
                    found[ctrl] = d
                    break
        return found if "cpu" in found and "memory" in found else {}

    def _init_v1(self) -> None:
        mounts = self._v1_mounts()
        own, _ = self._own_paths()
        for ctrl, mount in mounts.items():
            self.roots[ctrl] = os.path.join(_join_own(mount, own.get(ctrl)), self.root_name)
        for d in self._distinct(self.roots):
            os.makedirs(d, exist_ok=True)
        for f in ("cpu.cfs_quota_us",):
            if not os.path.exists(os.path.join(self.roots["cpu"], f)):
                raise _Advisory(f"CFS bandwidth control ({f}) not available in {self.roots['cpu']}")

    def _init_v2(self) -> None:
        _, own = self._own_paths()
        own_dir = _join_own(self.base, own)
        available = (_read_text(os.path.join(own_dir, "cgroup.controllers")) or "").split()
        missing = [c for c in ("cpu", "memory") if c not in available]
        if missing:
            raise _Advisory(f"controller(s) {', '.join(missing)} not available in {own_dir}/cgroup.controllers")
        try:
            self._enable_subtree(own_dir)
        except OSError as exc:
            hint = (
                " (this process's cgroup has member processes; v2's no-internal-processes rule forbids "
                "enabling controllers for its children — run the launcher in a delegated cgroup)"
                if exc.errno == errno.EBUSY
                else ""
            )
            raise _Advisory(
                f"cgroups not writable ({type(exc).__name__} enabling cpu, memory in {own_dir}/cgroup.subtree_control"
                f"{hint})"
            ) from exc
        root = os.path.join(own_dir, self.root_name)
        os.makedirs(root, exist_ok=True)
        self._enable_subtree(root)
        self.roots["unified"] = root

    @staticmethod
    def _enable_subtree(d: str) -> None:
        path = os.path.join(d, "cgroup.subtree_control")
        enabled = (_read_text(path) or "").replace("+", " ").split()
        todo = [c for c in ("cpu", "memory") if c not in enabled]
        if todo:
            _write(path, " ".join("+" + c for c in todo))

    @staticmethod
    def _distinct(paths: dict[str, str]) -> list[str]:
        out, seen = [], set()
        for d in paths.values():
            r = os.path.realpath(d)
            if r not in seen:
                seen.add(r)
                out.append(d)
        return out

    # -- groups -------------------------------------------------------------------------------

    def create(self, job_id: str, node: str, limits: Limits) -> NodeCgroup:
        """Create (or reuse) the group of ``node`` in ``job_id`` and apply ``limits``."""
        _check_name("job_id", job_id)
        _check_name("node", node)
        key = (job_id, node)
        group = self._groups.get(key)
        if self.mode == "advisory":
            if group is None:
                group = self._groups[key] = NodeCgroup(self, job_id, node, {})
            return group
        paths = {ctrl: os.path.join(root, job_id, node) for ctrl, root in self.roots.items()}
        if self.mode == "v2":
            # Re-created each time: another manager may have removed the empty root meanwhile.
            os.makedirs(self.roots["unified"], exist_ok=True)
            self._enable_subtree(self.roots["unified"])
            job_dir = os.path.join(self.roots["unified"], job_id)
            os.makedirs(job_dir, exist_ok=True)
            self._enable_subtree(job_dir)
        for d in self._distinct(paths):
            os.makedirs(d, exist_ok=True)
        if group is None:
            group = self._groups[key] = NodeCgroup(self, job_id, node, paths)
        group.set_limits(limits)
        return group

    def groups(self, job_id: str | None = None) -> list[NodeCgroup]:
        """Groups created by this manager (of one job, or all)."""
        return [g for (j, _), g in self._groups.items() if job_id is None or j == job_id]

    def remove_job(self, job_id: str) -> None:
        """Remove the (empty) groups of ``job_id``. Kills nothing.

        A group that still holds processes is left in place with a warning (moving a running node
        out would silently lift its limits); remove it later, after the processes exited.
        """
        _check_name("job_id", job_id)
        for key in [k for k in self._groups if k[0] == job_id]:
            del self._groups[key]
        if self.mode == "advisory":
            return
        for root in self._distinct(self.roots):
            job_dir = os.path.join(root, job_id)
            if os.path.isdir(job_dir):
                self._remove_tree(job_dir)

    def remove_root(self) -> None:
        """Remove ``<own cgroup>/<root_name>`` if no job group is left under it (else leave it)."""
        if self.mode == "advisory":
            return
        for root in self._distinct(self.roots):
            if os.path.isdir(root):
                self._rmdir(root, quiet=True)

    def _remove_tree(self, top: str) -> bool:
        ok = True
        for dirpath, dirnames, _files in os.walk(top, topdown=False):
            if any(os.path.isdir(os.path.join(dirpath, d)) for d in dirnames):
                ok = False  # a child could not be removed
                continue
            ok = self._rmdir(dirpath) and ok
        return ok

    def _rmdir(self, d: str, *, quiet: bool = False) -> bool:
        """Remove the empty group ``d``; True once it is gone (one that another stop removed first
        included), False while it holds a child group or a process."""
        try:
            entries = os.listdir(d)
        except FileNotFoundError:
            return True
        if any(os.path.isdir(os.path.join(d, e)) for e in entries):
            if not quiet:
                log.warning("not removing cgroup %s: it still has child groups", d)
            return False
        procs = (_read_text(os.path.join(d, "cgroup.procs")) or "").split()
        if procs:
            log.warning("not removing cgroup %s: processes %s are still in it", d, " ".join(procs))
            return False
        attempts = 10
        for attempt in range(attempts):
            try:
                os.rmdir(d)
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY and not self._real_fs:
                    # A fake hierarchy (tests): control files are plain files, and we checked above
                    # that no child group is left. (cgroupfs never reports ENOTEMPTY here.)
                    shutil.rmtree(d)
                    return True
                if exc.errno == errno.EBUSY and attempt < attempts - 1:
                    time.sleep(0.01 * (attempt + 1))  # a just-exited task may still be detaching
                    continue
                if not quiet:
                    log.warning("could not remove cgroup %s: %s", d, exc)
                return False
        return False
