"""Faults of the control plane that the chaos benchmark (benchmarks/chaos.py) and its process test
fire on a running job of the local launcher. Each returns the event it records (a dict).

    supervisor_kill          the launcher operation that drives a PS change (before ``/cluster``) or a
                             PS relaunch (before ``/restore``) dies there; a fresh ``LocalLauncher``
                             adopts the job (``launch`` of the same spec returns its id)
    damaged_checkpoint       a byte flipped in the middle of the newest checkpoint's ``ps-0.npz``, then
                             ps-0 killed: the restore must fall back to the newest one that verifies
                             (again where a checkpoint completed meanwhile spared it the damaged one)
    fill_disk / free_disk    a file that takes every free byte of the job's filesystem, then a killed
                             worker (its relaunch must record it); removed once the run ended with ENOSPC
    unsigned_large_body      a 400 MB unsigned POST streamed to the master; its RSS peak while it streams
    half_open_connections    hundreds of sockets that send half a request and stay open; signed requests
                             meanwhile, and the master's thread count
    skewed_clock_worker      a worker relaunched under libfaketime, its wall clock ``skew_s`` ahead
"""

from __future__ import annotations

import dataclasses
import errno
import os
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import psutil

from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.optimizer.types import Configuration
from airflow_dlrover.runtime.transport import parse_address

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
FILL_FILE = "chaos-fill.bin"


class SupervisorDied(BaseException):
    """The process that drives the job dies (a BaseException: nothing in the launcher catches it)."""


def dying_before(launcher: LocalLauncher, route: str) -> Callable[..., Any]:
    """``launcher.master_call`` that dies when it is about to make a request to ``route``."""
    call = launcher.master_call

    def master_call(job_id, path, *args, **kwargs):
        if path == route:
            raise SupervisorDied(route)
        return call(job_id, path, *args, **kwargs)
    return master_call


def config_of(launcher: LocalLauncher, job_id: str) -> Configuration:
    return Configuration(**launcher.read_job(job_id)["config"])


def other_ps_count(current: Configuration) -> Configuration:
    """The PS change a fault asks for: 1 PS × 0.4 CPU ↔ 2 × 0.3."""
    return dataclasses.replace(current, ps=2 if current.ps == 1 else 1, ps_cpu=0.3 if current.ps == 1 else 0.4)


def supervisor_kill(launcher: LocalLauncher, job_id: str, route: str) -> dict[str, Any]:
    """``route`` "/cluster": a PS-count change (1 ↔ 2) whose launcher dies after the new PS started;
    "/restore": a relaunch of ps-0 whose launcher dies before it asks the master to restore. A fresh
    ``LocalLauncher`` on the same folder then launches the job's spec: it must adopt the job (and hand
    the master the record's PS set). Returns whether it adopted and the seconds adopting took."""
    current = config_of(launcher, job_id)
    launcher.master_call = dying_before(launcher, route)
    try:
        if route == "/cluster":
            launcher.resize(job_id, other_ps_count(current))
        else:
            launcher.relaunch(job_id, "ps-0")
        died = False
    except SupervisorDied:
        died = True
    finally:
        del launcher.master_call  # the class's again
    started = time.monotonic()
    adopter = LocalLauncher(launcher.base_dir, launcher.cgroups)
    adopted = adopter.launch(launcher.spec(job_id), current) == job_id and adopter.read_job(job_id)["launched"]
    ps = adopter.master_call(job_id, "/status")["ps"]
    return {"died_before": route, "died": died, "adopted": bool(adopted), "adopt_s": time.monotonic() - started,
            "ps": len(ps)}


def flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def damaged_checkpoint(launcher: LocalLauncher, job_id: str, attempts: int = 3,
                       restore_wait_s: float = 20.0) -> dict[str, Any]:
    """Flip a byte of the newest checkpoint's ps-0 file, then kill ps-0 so that a restore must read
    it and fall back (the master log's ``fallbacks``). Again, up to ``attempts`` times, where the
    restore did not fall back within ``restore_wait_s``: a checkpoint in flight at the flip that
    completed before the kill is newer and whole, or ps-0 was down (a relaunch restoring already).
    A checkpoint is flipped once: flipped again, its byte would be whole (the kill alone retries)."""
    before = fallbacks(launcher, job_id)
    event: dict[str, Any] = {"skipped": "no checkpoint yet"}
    flipped: set = set()
    for attempt in range(1, attempts + 1):
        _wait(lambda: running(launcher, job_id, "ps-0"), 10.0)
        checkpoint = launcher.master_call(job_id, "/status")["checkpoint"]
        if not checkpoint:
            return event
        if checkpoint["id"] not in flipped:
            flip_middle_byte(Path(checkpoint["path"]) / "ps-0.npz")
            flipped.add(checkpoint["id"])
        was_running = running(launcher, job_id, "ps-0")
        if was_running:
            launcher.kill_node(job_id, "ps-0")
            _wait(lambda: not running(launcher, job_id, "ps-0"), 10.0)  # its exit status written
        event = {"flipped": checkpoint["id"], "path": checkpoint["path"], "killed": was_running, "attempts": attempt,
                 "fell_back": _wait(lambda: fallbacks(launcher, job_id) > before, restore_wait_s)}
        if event["fell_back"]:
            return event
    return event


def _wait(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``condition`` every 50 ms for up to ``timeout_s``; whether it held."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def running(launcher: LocalLauncher, job_id: str, name: str) -> bool:
    return any(s.name == name and s.state == "running" for s in launcher.status(job_id))


def fallbacks(launcher: LocalLauncher, job_id: str) -> int:
    """How often the master's log says a checkpoint did not verify and it fell back to an older one."""
    text = (launcher.job_dir(job_id) / "logs" / "master.log").read_text(errors="replace")
    return text.count("does not verify: falling back")


def fill_disk(launcher: LocalLauncher, job_id: str, worker: str) -> dict[str, Any]:
    """A file in the job's folder takes every free byte of its filesystem; then ``worker`` is killed,
    so that the supervisor's relaunch must write the job's record on the full disk."""
    folder = launcher.job_dir(job_id)
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    path = folder.parent / FILL_FILE
    with open(path, "wb") as f:
        block = b"\0" * (1 << 20)
        try:
            while True:
                f.write(block)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
    launcher.kill_node(job_id, worker)
    return {"filled_mb": round(free / 2**20), "node": worker}


def free_disk(launcher: LocalLauncher) -> None:
    (launcher.base_dir / FILL_FILE).unlink(missing_ok=True)


def master_process(launcher: LocalLauncher, job_id: str) -> psutil.Process:
    """The master's Python process (the child of its ``sh`` wrapper)."""
    wrapper = psutil.Process(launcher.read_job(job_id)["nodes"]["master"]["pid"])
    return next(p for p in wrapper.children(recursive=True) if "airflow_dlrover.runtime" in " ".join(p.cmdline()))


def _master_address(launcher: LocalLauncher, job_id: str) -> tuple[str, int]:
    return parse_address(launcher.read_job(job_id)["nodes"]["master"]["address"])


class _Peak(threading.Thread):
    """Samples ``read()`` every ``every_s`` until stopped; ``peak`` is the largest value seen."""

    def __init__(self, read: Callable[[], float], every_s: float = 0.005):
        super().__init__(daemon=True)
        self.read, self.every_s, self.peak, self.done = read, every_s, read(), threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                self.peak = max(self.peak, self.read())
            except psutil.Error:
                return
            time.sleep(self.every_s)

    def stop(self) -> float:
        self.done.set()
        self.join()
        return self.peak


def unsigned_large_body(launcher: LocalLauncher, job_id: str, total_mb: int = 400,
                        path: str = "/shard/done") -> dict[str, Any]:
    """Stream a ``total_mb`` POST without a signature to the master; the master's RSS growth (peak
    while streaming and 0.3 s after, over the RSS before) in MB, the bytes it took, and its answer."""
    if not running(launcher, job_id, "master"):
        return {"skipped": "master down"}
    process = master_process(launcher, job_id)
    baseline = process.memory_info().rss
    peak = _Peak(lambda: process.memory_info().rss)
    peak.start()
    total, block, sent, answer = total_mb << 20, b"x" * (1 << 20), 0, b""
    with socket.create_connection(_master_address(launcher, job_id), timeout=30) as sock:
        try:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: m\r\nContent-Length: {total}\r\n\r\n".encode())
            while sent < total:
                sock.sendall(block)
                sent += len(block)
        except OSError:  # the master answered and closed the connection
            pass
        try:
            answer = sock.recv(64).split(b"\r\n")[0]
        except OSError:
            pass
    time.sleep(0.3)
    growth = (peak.stop() - baseline) / 2**20
    return {"rss_growth_mb": round(growth, 1), "sent_mb": round(sent / 2**20, 1),
            "refused": sent < total and not answer.startswith((b"HTTP/1.1 2", b"HTTP/1.0 2")),
            "answer": answer.decode(errors="replace")}


def half_open_connections(launcher: LocalLauncher, job_id: str, count: int = 300,
                          hold_s: float = 15.0) -> dict[str, Any]:
    """``count`` sockets each send half a request and stay open for ``hold_s``; meanwhile a signed
    ``/status`` every second. Returns how many the master turned away at once (503, past its
    connection bound), closed (its read timeout) or left open, the peak of its threads, and the
    signed requests answered with their slowest answer in seconds."""
    if not running(launcher, job_id, "master"):
        return {"skipped": "master down"}
    process = master_process(launcher, job_id)
    threads_before = process.num_threads()
    peak = _Peak(process.num_threads, every_s=0.05)
    peak.start()
    address, sockets = _master_address(launcher, job_id), []
    try:
        for _ in range(count):
            try:
                sock = socket.create_connection(address, timeout=5)
                sock.sendall(b"POST /shard/done HTTP/1.1\r\nHost: m\r\n")  # and nothing more
                sockets.append(sock)
            except OSError:
                pass
        answered, slowest, deadline = 0, 0.0, time.monotonic() + hold_s
        asked = 0
        while time.monotonic() < deadline:
            asked += 1
            started = time.monotonic()
            try:
                launcher.master_call(job_id, "/status", timeout=30.0)
                answered += 1
            except (ConnectionError, PermissionError):
                pass
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(1.0)
        ends = Counter()
        for sock in sockets:  # turned away at once (503), closed after the read timeout, or open still
            sock.setblocking(False)
            try:
                data = sock.recv(64)
                ends["turned_away" if b" 503 " in data else "closed"] += 1
            except BlockingIOError:
                ends["open"] += 1
            except OSError:
                ends["closed"] += 1
    finally:
        for sock in sockets:
            sock.close()
    return {"opened": len(sockets), **{k: ends[k] for k in ("turned_away", "closed", "open")},
            "threads_before": threads_before, "threads_peak": peak.stop(),
            "signed_answered": answered, "signed_asked": asked, "signed_slowest_s": round(slowest, 2)}


def skewed_clock_worker(launcher: LocalLauncher, job_id: str, worker: str, skew_s: float = 90.0,
                        wait_s: float = 20.0) -> dict[str, Any]:
    """Relaunch ``worker`` under libfaketime (``LD_PRELOAD``, ``FAKETIME=+skew_s``: its wall clock
    runs ``skew_s`` ahead, its monotonic clock too — left alone, Python's ``time.sleep``, an
    absolute ``clock_nanosleep`` on it, fails with EINVAL under libfaketime) — the launcher passes its own
    environment to the nodes it starts. Waits up to ``wait_s`` for the worker to report training."""
    if not LIBFAKETIME.exists():
        raise FileNotFoundError(f"{LIBFAKETIME}: install libfaketime (apt-get install libfaketime)")
    saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", "FAKETIME")}
    os.environ.update(LD_PRELOAD=str(LIBFAKETIME), FAKETIME=f"{skew_s:+.0f}s")
    try:
        launcher.relaunch(job_id, worker)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    node = launcher.read_job(job_id)["nodes"][worker]
    started, relaunched, training = time.monotonic(), time.time(), False
    while time.monotonic() - started < wait_s and not training:
        report = launcher.metrics(job_id)["nodes"].get(worker, {})
        training = (report.get("samples_per_s") or 0) > 0 and report.get("reported_at", 0) > relaunched
        time.sleep(0.5)
    return {"node": worker, "skew_s": skew_s, "training": training, "training_after_s":
            round(time.monotonic() - started, 1), "restarts": node.get("restarts", 0), "pid": node["pid"]}

