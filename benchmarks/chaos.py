"""Chaos: one long job on the local launcher under random faults, per seed; prints a table.

    python benchmarks/chaos.py [--seeds 1 2 3] [--samples 34000000] [--faults 20] [--span-s 500] [--out DIR]

Each seed draws ``--faults`` faults at random over ``--span-s`` seconds (one per slot of
span/faults seconds, at a random point of it) from

    kill-worker, kill-ps, kill-master, oom-worker, slow-worker  (the runtime's fault injection)
    resize-during-checkpoint   a /checkpoint in flight while the workers change 2 ↔ 3
    ps-change                  the PS count changes 1 ↔ 2 (checkpoint, new PS set, re-partition)
    forged-request             requests without the job's key, or with another key: /shard/done of
                               every shard, /command kill, /faults, /cluster with a stranger's PS,
                               /drain — each must get 401

on a random running worker where the fault takes one; recovery is the product's own (the
controller's step on each poll, as ``dlrover-rm train``). Goals (issue 14): every run completes,
``samples_lost == 0`` from the PS journals (``runtime.accounting``), duplicates ≤ one shard per
failure, every forged request refused, throughput back at 90 % of its pre-fault median within
10 s of a worker fault and 30 s of a PS or master fault (after the dip the fault caused; a fault
whose dip never shows within 20 s counts as 0 s). Needs root for the cgroup limits (an OOM kill
needs a memory limit). Takes about (span + the tail) × seeds: ~35 min for the defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pandas as pd

from airflow_dlrover.launchers.cgroups import CgroupManager
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.lifecycle.run import inject, run_job
from airflow_dlrover.optimizer.types import Configuration, Fault, FaultKind
from airflow_dlrover.runtime.auth import HEADER, sign
from airflow_dlrover.runtime.spec import JobSpec

KINDS = ("kill-worker", "kill-ps", "kill-master", "oom-worker", "slow-worker", "resize-during-checkpoint",
         "ps-change", "forged-request")
#: recovery groups and their goals (issue 14): a worker back within 10 s, a PS or master within 30 s
RECOVERY_GROUPS = {"kill-worker": "worker kill/OOM", "oom-worker": "worker kill/OOM", "slow-worker": "slow worker",
                   "kill-ps": "PS/master", "kill-master": "PS/master"}
RECOVERY_GOAL_S = {"worker kill/OOM": 10.0, "slow worker": 10.0, "PS/master": 30.0}
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
    current = Configuration(**launcher.read_job(job_id)["config"])
    target = dataclasses.replace(current, workers=3 if current.workers == 2 else 2)
    checkpoint = threading.Thread(target=lambda: launcher.master_call(job_id, "/checkpoint", {}))
    checkpoint.start()
    time.sleep(0.05)  # the checkpoint is quiescing the job when the resize arrives
    result = launcher.resize(job_id, target)
    checkpoint.join()
    return {"chaos": "resize-during-checkpoint", "workers": target.workers, "seconds": result["seconds"]}


def _ps_change(launcher: LocalLauncher, job_id: str) -> dict:
    current = Configuration(**launcher.read_job(job_id)["config"])
    target = dataclasses.replace(current, ps=2 if current.ps == 1 else 1, ps_cpu=0.3 if current.ps == 1 else 0.4)
    result = launcher.resize(job_id, target)
    return {"chaos": "ps-change", "ps": target.ps, "seconds": result["seconds"]}


def plan_faults(rng: random.Random, count: int, span_s: float, start_s: float = 30.0) -> list[tuple[float, str]]:
    """``count`` (time, kind): one at a random point of each of ``count`` equal slots; every kind at
    least once when ``count`` allows."""
    kinds = list(KINDS) * (count // len(KINDS)) + rng.sample(KINDS, count % len(KINDS))
    rng.shuffle(kinds)
    slot = span_s / count
    return [(start_s + i * slot + rng.uniform(0.2, 0.8) * slot, kind) for i, kind in enumerate(kinds)]


def run_seed(seed: int, samples: int, faults: int, span_s: float, out: Path) -> dict:
    rng = random.Random(seed)
    spec = JobSpec(job_id=f"chaos-{seed}", samples=samples, seed=seed)
    plan = plan_faults(rng, faults, span_s)
    launcher = LocalLauncher(out / "jobs", CgroupManager())
    fired: list[dict] = []

    def action(kind: str):
        def act(launcher: LocalLauncher, job_id: str) -> dict:
            now = time.time() - started
            if kind == "forged-request":
                event = _forge(launcher, job_id, rng)
            elif kind == "resize-during-checkpoint":
                event = _resize_during_checkpoint(launcher, job_id)
            elif kind == "ps-change":
                event = _ps_change(launcher, job_id)
            else:
                node = {"kill-ps": "ps-0", "kill-master": "master"}.get(kind)
                node = node or rng.choice(_running_workers(launcher, job_id) or ["worker-0"])
                event = {"chaos": kind, **inject(launcher, job_id, Fault(FaultKind(kind), now, node), now)}
            fired.append({"at_s": now, **event})
            return event
        return act

    started = time.time()
    summary = run_job(launcher, spec, START, out / "out", interventions=[(t, action(k)) for t, k in plan],
                      timeout_s=span_s * 4, series_points=None)
    series = pd.DataFrame(summary["throughput_series"])
    recoveries: dict[str, list[float]] = {group: [] for group in RECOVERY_GOAL_S}
    for event in fired:
        if event["chaos"] in RECOVERY_GROUPS:
            event["recovery_s"] = recovery_s(series, event["at_s"])
            recoveries[RECOVERY_GROUPS[event["chaos"]]].append(event["recovery_s"])
    failures = sum(1 for e in fired if e["chaos"] in RECOVERY_GROUPS)
    forged = [e for e in fired if e["chaos"] == "forged-request"]
    return {
        "seed": seed, "wall_s": summary["wall_s"], "faults": len(fired), "kinds": dict(Counter(e["chaos"] for e in fired)),
        "samples_expected": summary["samples_expected"], "samples_trained": summary["samples_trained"],
        "samples_lost": summary["samples_lost"], "samples_duplicated": summary["samples_duplicated"],
        "duplicated_by": summary["duplicated_by"], "duplicates_refused": summary["duplicates_refused"],
        "duplicate_limit": failures * spec.shard_size,
        "forged": sum(e["forged"] for e in forged), "forged_refused": sum(e["refused"] for e in forged),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--samples", type=int, default=34_000_000)
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--span-s", type=float, default=500.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="dlrover-chaos-"))
    rows = []
    for seed in args.seeds:
        try:
            rows.append(run_seed(seed, args.samples, args.faults, args.span_s, out / f"seed-{seed}"))
        except Exception as err:  # a run that does not complete is a result: report it
            rows.append({"seed": seed, "error": f"{type(err).__name__}: {err}"})
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("fired", "actions")}), flush=True)
    (out / "chaos.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'seed':>4} {'done':>4} {'wall s':>7} {'faults':>6} {'lost':>5} {'dup':>6} {'dup limit':>9} "
          f"{'refused dup':>11} {'forged refused':>14} "
          + " ".join(f"{group + ' rec. s med/max':>30}" for group in RECOVERY_GOAL_S) + f" {'AUC':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['seed']:>4} {'no':>4}  {r['error']}")
            continue
        print(f"{r['seed']:>4} {'yes':>4} {r['wall_s']:7.0f} {r['faults']:6d} {r['samples_lost']:5d} "
              f"{r['samples_duplicated']:6d} {r['duplicate_limit']:9d} {r['duplicates_refused']:11d} "
              f"{r['forged_refused']:>7d}/{r['forged']:<6d} "
              + " ".join(f"{_fmt(r['recovery_s'][group]):>30}" for group in RECOVERY_GOAL_S) + f" {r['eval_auc'] or 0:6.3f}")
    print("goals: lost 0; dup ≤ limit (one shard per failure); every forged request refused; recovery ≤ "
          + ", ".join(f"{goal:g} s ({group})" for group, goal in RECOVERY_GOAL_S.items()) + f". Output: {out}")


if __name__ == "__main__":
    main()
