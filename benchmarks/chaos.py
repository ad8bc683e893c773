"""Chaos: one long job on the local launcher under random faults, per seed; prints a table.

    python benchmarks/chaos.py [--seeds 1 2 3] [--samples 34000000] [--faults 22] [--span-s 560] [--out DIR]
                               [--tmpfs-mb 3072]

Each seed draws ``--faults`` faults at random over ``--span-s`` seconds (one per slot of
span/faults seconds, at a random point of it) from

    kill-worker, kill-ps, kill-master, oom-worker, slow-worker  (the runtime's fault injection)
    resize-during-checkpoint   a /checkpoint in flight while the workers change 2 ↔ 3
    ps-change                  the PS count changes 1 ↔ 2 (checkpoint, new PS set, re-partition)
    forged-request             requests without the job's key, or with another key: /shard/done of
                               every shard, /command kill, /faults, /cluster with a stranger's PS,
                               /drain — each must get 401
    supervisor-kill-mid-resize   a PS change whose launcher operation dies (a BaseException raised in
                               its ``master_call``) after the new PS started, before ``/cluster``;
    supervisor-kill-mid-restore  a ps-0 relaunch whose operation dies the same way before ``/restore``.
                               Either way a fresh ``LocalLauncher`` on the job's folder then launches the
                               spec and must adopt the job; the ``run_job`` loop itself goes on (its
                               death would run its ``finally``, which stops the job: not a dying process)
    damaged-checkpoint         a byte flipped in the newest checkpoint's ps-0 file, then ps-0 killed: the
                               restore falls back to the newest checkpoint that verifies
    full-disk                  the seed's folder is a tmpfs of ``--tmpfs-mb``; a file fills it and a worker
                               is killed: the run ends with ENOSPC and stops the job; the file is removed
                               and ``run_job`` runs again as an Airflow retry does (a fresh launcher: the
                               stopped job is launched again and resumes from its checkpoint)
    unsigned-large-body        a 400 MB unsigned POST streamed to the master: refused, its RSS grows < 64 MB
    half-open-connections      300 sockets send half a request and stay open 15 s: signed requests are
                               still answered, the master's threads stay bounded
    skewed-clock-worker        a worker relaunched under libfaketime, its wall clock 90 s ahead: it trains

on a random running worker where the fault takes one; recovery is the product's own (the
controller's step on each poll, as ``dlrover-rm train``). Goals: every run completes,
``samples_lost == 0`` from the PS journals (``runtime.accounting``), duplicates ≤ one shard per
failure, every forged or unsigned request refused, RSS growth < 64 MB under the 400 MB POST,
throughput back at 90 % of its pre-fault median within 10 s of a worker fault and 30 s of a PS,
master, supervisor or checkpoint fault (after the dip the fault caused; a fault whose dip never
shows within 20 s counts as 0 s). Needs root (cgroup limits, the tmpfs) and libfaketime. Takes
about (span + the tail) × seeds: ~12 min a seed for the defaults on an idle 2-core box.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pandas as pd
import psutil

from airflow_dlrover.launchers.cgroups import CgroupManager
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.lifecycle.observer import recover
from airflow_dlrover.lifecycle.run import inject, run_job
from airflow_dlrover.optimizer.types import Configuration, Fault, FaultKind
from airflow_dlrover.runtime.auth import HEADER, sign
from airflow_dlrover.runtime.spec import JobSpec

import chaos_faults as cf

KINDS = ("kill-worker", "kill-ps", "kill-master", "oom-worker", "slow-worker", "resize-during-checkpoint",
         "ps-change", "forged-request", "supervisor-kill-mid-resize", "supervisor-kill-mid-restore",
         "damaged-checkpoint", "full-disk", "unsigned-large-body", "half-open-connections", "skewed-clock-worker")
#: recovery groups and their goals: a worker back within 10 s, a PS, master, supervisor or checkpoint within 30 s
RECOVERY_GROUPS = {"kill-worker": "worker kill/OOM", "oom-worker": "worker kill/OOM", "slow-worker": "slow worker",
                   "skewed-clock-worker": "skewed clock", "kill-ps": "PS/master", "kill-master": "PS/master",
                   "supervisor-kill-mid-resize": "supervisor kill", "supervisor-kill-mid-restore": "supervisor kill",
                   "damaged-checkpoint": "damaged ckpt"}
RECOVERY_GOAL_S = {"worker kill/OOM": 10.0, "slow worker": 10.0, "skewed clock": 10.0, "PS/master": 30.0,
                   "supervisor kill": 30.0, "damaged ckpt": 30.0}
#: faults that fail a process of the job (its shards requeued or the job rolled back): one shard each may train twice
FAILURES = (*RECOVERY_GROUPS, "full-disk")
RSS_GOAL_MB = 64.0
#: the kinds that do not talk to the master; any other, fired while the master is down (its relaunch in
#: the controller's backoff), first recovers the job as a retry does (``observer.recover``): the
#: fault runs in the supervisor's loop, which would not relaunch the master while the fault waits on it
WITHOUT_MASTER = ("kill-worker", "kill-ps", "kill-master", "slow-worker", "full-disk")
START = Configuration(workers=2, ps=1, worker_cpu=0.6, ps_cpu=0.4, worker_memory_mb=2048, ps_memory_mb=1536)


def recovery_s(series: pd.DataFrame, at: float, window_s: float = 6.0, dip_within_s: float = 20.0) -> float:
    """Seconds from a fault at ``at`` to throughput back at 90 % of its median over the
    ``window_s`` before, after the dip (< 90 %) it caused; 0 when no dip shows within ``dip_within_s``
    (reports lag by up to a second, and the master averages a worker's rate over its window)."""
    before = series[(series.time_s > at - window_s) & (series.time_s < at)].throughput.median()
    later = series[(series.time_s > at) & (series.time_s < at + dip_within_s)]
    dips = later[later.throughput < 0.9 * before]
    if not len(dips):
        return 0.0
    back = series[(series.time_s > dips.time_s.min()) & (series.throughput >= 0.9 * before)]
    return float(back.time_s.min() - at) if len(back) else float("nan")


def _running_workers(launcher: LocalLauncher, job_id: str) -> list[str]:
    return [s.name for s in launcher.status(job_id) if s.role == "worker" and s.state == "running"]


def _forge(launcher: LocalLauncher, job_id: str, rng: random.Random) -> dict:
    """Requests a stranger could make: unsigned, or signed with another key. Counts the 401s."""
    base = f"http://{launcher.read_job(job_id)['nodes']['master']['address']}"
    attempts = [("/shard/done", {"worker": "stranger", "shard": s, "generation": 0}) for s in range(3)] + [
        ("/command", {"node": "worker-0", "command": "kill"}),
        ("/faults", {"faults": [{"kind": "kill-worker", "at_s": 0, "node": "worker-0"}]}),
        ("/cluster", {"ps": ["203.0.113.7:7070"]}), ("/drain", {"node": "worker-0"}), ("/restore", {})]
    refused = 0
    for path, body in attempts:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if rng.random() < 0.5:
            headers[HEADER] = sign(b"a key that is not the job's", "POST", path, data)
        try:
            with urllib.request.urlopen(urllib.request.Request(base + path, data=data, headers=headers), timeout=10):
                pass
        except urllib.error.HTTPError as err:
            refused += err.code == 401
    return {"chaos": "forged-request", "forged": len(attempts), "refused": refused}


def _resize_during_checkpoint(launcher: LocalLauncher, job_id: str) -> dict:
    current = cf.config_of(launcher, job_id)
    target = dataclasses.replace(current, workers=3 if current.workers == 2 else 2)

    def take() -> None:  # a PS down: the master cannot take it; the resize goes on regardless
        try:
            launcher.master_call(job_id, "/checkpoint", {}, timeout=30.0)
        except (ConnectionError, PermissionError):
            pass

    checkpoint = threading.Thread(target=take)
    checkpoint.start()
    time.sleep(0.05)  # the checkpoint is quiescing the job when the resize arrives
    result = launcher.resize(job_id, target)
    checkpoint.join()
    return {"chaos": "resize-during-checkpoint", "workers": target.workers, "seconds": result["seconds"]}


def _ps_change(launcher: LocalLauncher, job_id: str) -> dict:
    target = cf.other_ps_count(cf.config_of(launcher, job_id))
    result = launcher.resize(job_id, target)
    return {"chaos": "ps-change", "ps": target.ps, "seconds": result["seconds"]}


def plan_faults(rng: random.Random, count: int, span_s: float, start_s: float = 30.0) -> list[tuple[float, str]]:
    """``count`` (time, kind): one at a random point of each of ``count`` equal slots; every kind at
    least once when ``count`` allows."""
    kinds = list(KINDS) * (count // len(KINDS)) + rng.sample(KINDS, count % len(KINDS))
    rng.shuffle(kinds)
    slot = span_s / count
    return [(start_s + i * slot + rng.uniform(0.2, 0.8) * slot, kind) for i, kind in enumerate(kinds)]


class Sampler(threading.Thread):
    """The job's throughput from its master's ``/status`` every ``every_s`` (across the runs of a retry)."""

    def __init__(self, base_dir: Path, job_id: str, started: float, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.launcher, self.job_id, self.started, self.every_s = LocalLauncher(base_dir), job_id, started, every_s
        self.series: list[dict] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                status = self.launcher.master_call(self.job_id, "/status", timeout=1.0)
            except (ConnectionError, PermissionError, KeyError, OSError, ValueError):
                continue
            self.series.append({"time_s": time.time() - self.started, "throughput": status["throughput"],
                                "samples_done": status["samples_done"]})


def _tmpfs(folder: Path, size_mb: int) -> bool:
    """Mount a tmpfs of ``size_mb`` on ``folder`` (root only); False when it cannot."""
    folder.mkdir(parents=True, exist_ok=True)
    if not size_mb or os.geteuid() != 0:
        return False
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(folder)]
    return subprocess.run(mount).returncode == 0


def run_seed(seed: int, samples: int, faults: int, span_s: float, out: Path, tmpfs_mb: int = 0) -> dict:
    rng = random.Random(seed)
    spec = JobSpec(job_id=f"chaos-{seed}", samples=samples, seed=seed)
    plan = plan_faults(rng, faults, span_s)
    jobs = out / "jobs"
    mounted = _tmpfs(jobs, tmpfs_mb)
    launcher = LocalLauncher(jobs, CgroupManager())
    fired: list[dict] = []
    pending = list(range(len(plan)))
    disk = {"full": False, "timer": None}

    def action(index: int, kind: str):
        def act(launcher: LocalLauncher, job_id: str) -> dict:
            pending.remove(index)
            recovered = []
            if kind not in WITHOUT_MASTER and not cf.running(launcher, job_id, "master"):
                recovered = recover(launcher, job_id)  # the fault needs the master: back first
            now = time.time() - started
            try:
                event = fire(kind, launcher, job_id, now)
            except OSError as err:  # the disk is full: the fault could not be set up (the run ends with it)
                fired.append({"at_s": now, "chaos": kind, "skipped": f"{type(err).__name__}: {err}"})
                raise
            except psutil.NoSuchProcess as err:  # the node it was aimed at died just before
                event = {"skipped": f"{type(err).__name__}: {err}"}
            event = {"at_s": now, "chaos": kind, **event, **({"recovered_first": recovered} if recovered else {})}
            fired.append(event)
            return event
        return act

    def fire(kind: str, launcher: LocalLauncher, job_id: str, now: float) -> dict:
        worker = rng.choice(_running_workers(launcher, job_id) or ["worker-0"])
        if kind == "forged-request":
            event = _forge(launcher, job_id, rng)
        elif kind == "resize-during-checkpoint":
            event = _resize_during_checkpoint(launcher, job_id)
        elif kind == "ps-change":
            event = _ps_change(launcher, job_id)
        elif kind.startswith("supervisor-kill"):
            event = cf.supervisor_kill(launcher, job_id, "/cluster" if kind.endswith("resize") else "/restore")
        elif kind == "damaged-checkpoint":
            event = cf.damaged_checkpoint(launcher, job_id)
        elif kind == "full-disk":
            if not mounted:
                event = {"skipped": "no tmpfs (needs root and --tmpfs-mb)"}
            else:
                disk["full"] = True
                disk["timer"] = threading.Timer(60.0, cf.free_disk, (launcher,))  # never left full
                disk["timer"].start()
                event = cf.fill_disk(launcher, job_id, worker)
        elif kind == "unsigned-large-body":
            event = cf.unsigned_large_body(launcher, job_id)
        elif kind == "half-open-connections":
            event = cf.half_open_connections(launcher, job_id)
        elif kind == "skewed-clock-worker":
            event = cf.skewed_clock_worker(launcher, job_id, worker)
        else:
            node = {"kill-ps": "ps-0", "kill-master": "master"}.get(kind) or worker
            event = inject(launcher, job_id, Fault(FaultKind(kind), now, node), now)
        return event

    started = time.time()
    sampler = Sampler(jobs, spec.job_id, started)
    sampler.start()
    retries: list[dict] = []
    try:
        while True:
            offset = time.time() - started  # the faults a failed run left due fire one every half slot
            overdue = iter(range(1, len(pending) + 1))
            interventions = [(plan[i][0] - offset if plan[i][0] > offset else next(overdue) * span_s / faults / 2,
                              action(i, plan[i][1])) for i in pending]
            try:
                summary = run_job(launcher, spec, START, out / "out", interventions=interventions,
                                  timeout_s=span_s * 4, series_points=None)
                break
            except OSError as err:  # the full disk ended the run: free it, and retry as Airflow would
                if not disk["full"] or len(retries) >= 3:
                    raise
                disk["timer"].cancel()
                cf.free_disk(launcher)
                disk["full"] = False
                retries.append({"at_s": time.time() - started, "error": f"{type(err).__name__}: {err}",
                                "enospc": err.errno == errno.ENOSPC})
                launcher = LocalLauncher(jobs, CgroupManager())  # the retry's own supervisor
        summary["fallbacks"] = cf.fallbacks(launcher, spec.job_id)
    finally:
        sampler.done.set()
        sampler.join()
        if disk["timer"]:
            disk["timer"].cancel()
        if mounted:
            shutil.copytree(jobs / spec.job_id / "logs", out / "logs", dirs_exist_ok=True)
            subprocess.run(["umount", "-l", str(jobs)])
    series = pd.DataFrame(sampler.series)
    for retry in retries:  # the retry resumed: the first time it trained again
        later = series[(series.time_s > retry["at_s"]) & (series.throughput > 0)]
        retry["resumed_after_s"] = float(later.time_s.min() - retry["at_s"]) if len(later) else float("nan")
    recoveries: dict[str, list[float]] = {group: [] for group in RECOVERY_GOAL_S}
    for event in fired:
        if event["chaos"] in RECOVERY_GROUPS and "skipped" not in event:
            event["recovery_s"] = recovery_s(series, event["at_s"])
            recoveries[RECOVERY_GROUPS[event["chaos"]]].append(event["recovery_s"])
    failures = sum(1 for e in fired if e["chaos"] in FAILURES and "skipped" not in e)
    of = lambda kind: [e for e in fired if e["chaos"] == kind and "skipped" not in e]  # noqa: E731
    forged, unsigned, half_open = of("forged-request"), of("unsigned-large-body"), of("half-open-connections")
    supervisors = of("supervisor-kill-mid-resize") + of("supervisor-kill-mid-restore")
    skewed = of("skewed-clock-worker")
    return {
        "seed": seed, "wall_s": summary["wall_s"] + (retries[-1]["at_s"] if retries else 0.0), "faults": len(fired),
        "skipped": [{"chaos": e["chaos"], "why": e["skipped"]} for e in fired if "skipped" in e],
        "kinds": dict(Counter(e["chaos"] for e in fired)),
        "samples_expected": summary["samples_expected"], "samples_trained": summary["samples_trained"],
        "samples_lost": summary["samples_lost"], "samples_duplicated": summary["samples_duplicated"],
        "duplicated_by": summary["duplicated_by"], "duplicates_refused": summary["duplicates_refused"],
        "duplicate_limit": failures * spec.shard_size,
        "forged": sum(e["forged"] for e in forged), "forged_refused": sum(e["refused"] for e in forged),
        "unsigned": len(unsigned), "unsigned_refused": sum(bool(e["refused"]) for e in unsigned),
        "rss_growth_mb": max((e["rss_growth_mb"] for e in unsigned), default=None),
        "half_open": max((e["opened"] for e in half_open), default=None),
        "half_open_turned_away": max((e["turned_away"] for e in half_open), default=None),
        "master_threads_peak": max((e["threads_peak"] for e in half_open), default=None),
        "signed_answered": f"{sum(e['signed_answered'] for e in half_open)}/"
                           f"{sum(e['signed_asked'] for e in half_open)}",
        "signed_slowest_s": max((e["signed_slowest_s"] for e in half_open), default=None),
        "full_disk_retries": len(retries), "full_disk_enospc": sum(r["enospc"] for r in retries), "retries": retries,
        "adoptions": sum(bool(e["adopted"]) for e in supervisors), "supervisor_kills": len(supervisors),
        "checkpoint_fallbacks": summary["fallbacks"], "damaged": len(of("damaged-checkpoint")),
        "skewed_trained": sum(bool(e["training"]) for e in skewed), "skewed": len(skewed),
        "recovery_s": recoveries, "restores": summary["restores"], "checkpoints": summary["checkpoints"],
        "eval_auc": summary["eval_auc"], "median_throughput": summary["median_throughput"],
        "fired": fired, "actions": [e for e in summary["events"] if "reason" in e],
    }


def _fmt(values: list[float]) -> str:
    finite = [v for v in values if v == v]
    if not values:
        return "—"
    missing = len(values) - len(finite)
    text = f"{statistics.median(finite):.1f} / {max(finite):.1f}" if finite else "never"
    return text + (f" ({missing} never)" if missing else "")


def _num(value, spec: str = ".0f") -> str:
    return "—" if value is None else format(value, spec)


COLUMNS = [  # (header, width, cell of a row)
    ("seed", 4, lambda r: str(r["seed"])), ("done", 4, lambda r: "yes"), ("wall s", 6, lambda r: f"{r['wall_s']:.0f}"),
    ("faults", 8, lambda r: str(r["faults"]) + (f"-{len(r['skipped'])}sk" if r["skipped"] else "")),
    ("lost", 4, lambda r: str(r["samples_lost"])),
    ("dup", 6, lambda r: str(r["samples_duplicated"])), ("dup limit", 9, lambda r: str(r["duplicate_limit"])),
    ("forged refused", 14, lambda r: f"{r['forged_refused']}/{r['forged']}"),
    ("unsigned refused", 16, lambda r: f"{r['unsigned_refused']}/{r['unsigned']}"),
    ("RSS +MB 400MB POST", 18, lambda r: _num(r["rss_growth_mb"], ".1f")),
    ("half-open/503/threads", 21,
     lambda r: f"{_num(r['half_open'])}/{_num(r['half_open_turned_away'])}/{_num(r['master_threads_peak'])}"),
    ("signed ans. (slowest s)", 23, lambda r: f"{r['signed_answered']} ({_num(r['signed_slowest_s'], '.1f')})"),
    ("disk retries", 12, lambda r: f"{r['full_disk_retries']}"
     + (f" ({statistics.median([x['resumed_after_s'] for x in r['retries']]):.0f} s)" if r["retries"] else "")),
    ("adoptions", 9, lambda r: f"{r['adoptions']}/{r['supervisor_kills']}"),
    ("ckpt fallbacks", 14, lambda r: f"{r['checkpoint_fallbacks']}/{r['damaged']}"),
    ("skew trains", 11, lambda r: f"{r['skewed_trained']}/{r['skewed']}"),
    *[(f"{group} rec. s med/max", 30, lambda r, g=group: _fmt(r["recovery_s"][g])) for group in RECOVERY_GOAL_S],
    ("AUC", 6, lambda r: f"{r['eval_auc'] or 0:.3f}"),
]


def table(rows: list[dict]) -> str:
    """The printed table: one line a seed; a run that did not complete shows its error."""
    lines = [" ".join(f"{h:>{w}}" for h, w, _ in COLUMNS)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['seed']:>4} {'no':>4}  {r['error']}")
        else:
            lines.append(" ".join(f"{cell(r):>{w}}" for _, w, cell in COLUMNS))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--samples", type=int, default=34_000_000)
    parser.add_argument("--faults", type=int, default=22)
    parser.add_argument("--span-s", type=float, default=560.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tmpfs-mb", type=int, default=3072, help="each seed's job folder on a tmpfs this big "
                        "(root; 0: none, and full-disk is skipped)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="dlrover-chaos-"))
    rows = []
    for seed in args.seeds:
        try:
            rows.append(run_seed(seed, args.samples, args.faults, args.span_s, out / f"seed-{seed}", args.tmpfs_mb))
        except Exception as err:  # a run that does not complete is a result: report it
            rows.append({"seed": seed, "error": f"{type(err).__name__}: {err}"})
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("fired", "actions")}), flush=True)
        (out / "chaos.json").write_text(json.dumps(rows, indent=1, default=str))
    print("\n" + table(rows))
    print(f"goals: every run completes; lost 0; dup ≤ limit (one shard per failure); every forged and unsigned "
          f"request refused; RSS growth < {RSS_GOAL_MB:g} MB under the 400 MB POST; recovery ≤ "
          + ", ".join(f"{goal:g} s ({group})" for group, goal in RECOVERY_GOAL_S.items()) + f". Output: {out}")


if __name__ == "__main__":
    main()
