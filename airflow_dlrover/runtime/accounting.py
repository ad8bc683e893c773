"""Exactly-once accounting from evidence the model's state cannot roll back or net out.

Every PS process appends to its own journal (``journal/ps<k>-<pid>-<ns>.jsonl``, append-only, one
file per incarnation) one line per event, written where the event happens:

    {"e": "start",   "g": g, "ps": k, "of": p}          served generation g (state unchanged)
    {"e": "restore", "g": g, "ps": k, "of": p, "from": [files]}   state := those checkpoint files
    {"e": "apply",   "g": g, "b": first sample, "n": samples, "w": worker}   a batch's update applied
    {"e": "refused", "g": g, "b": ..., "n": ..., "w": ...}    the same batch again: not applied
    {"e": "save",    "g": g, "path": file}              state written to a checkpoint file

each with its time ``t``. The job's master persists the shards it requeued and why
(``requeues.jsonl``). :func:`reconcile` replays the journals in time order and follows the
model's lineage: a PS's state is its last restore's files plus the batches it applied since; a
checkpoint file holds the state of the PS that saved it. For every batch b of the job it counts,
over the PS that serve the final generation,

    lo(b) = min over those PS of the applications of b in the state they hold
    hi(b) = max over the same

(through a re-partition a checkpoint's lo/hi are the min/max over its files), and reports

    samples_trained    = Σ_b n(b)·hi(b)
    samples_lost       = Σ_b n(b)·[lo(b) = 0]          (a part of b is on no PS of the model)
    samples_duplicated = Σ_b n(b)·max(hi(b) − 1, 0)    (b's update is in the model twice on some PS)

per batch, so a duplicate never nets out a loss, and an update applied twice on *any* PS counts;
the same per epoch (a batch of epoch e starts in ``[e·samples, (e+1)·samples)``: ``JobSpec``).
Each duplicate (applied or refused) is attributed to the last requeue of its shard before it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

JOURNAL_DIR = "journal"
REQUEUES_FILE = "requeues.jsonl"


def batch_starts(spec) -> np.ndarray:
    """The first sample of every batch of the job, in order (a shard splits into batches from its
    start, the last one short)."""
    starts = [np.arange(start, stop, spec.batch_size)
              for start, stop in (spec.shard_range(s) for s in range(spec.num_shards))]
    return np.concatenate(starts) if starts else np.empty(0, np.int64)


def _read_lines(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # the tail of a process killed mid-line
            continue
    return events


class _Stream:
    """One PS incarnation's state as the journal describes it."""

    def __init__(self, batches: int):
        self.generation, self.ps, self.started = -1, None, None
        self.base_lo = self.base_hi = np.zeros(batches, np.int64)
        self.applied = np.zeros(batches, np.int64)

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        return self.base_lo + self.applied, self.base_hi + self.applied


def reconcile(workdir: Path, spec, generation: int) -> dict[str, Any]:
    """The job's exactly-once figures (see the module docstring) for a job that ended in
    ``generation``; ``workdir`` is the master's folder."""
    workdir = Path(workdir)
    starts = batch_starts(spec)
    bounds = np.asarray(spec.shard_bounds)
    shard_of = np.searchsorted(bounds, starts, side="right") - 1  # the shard each batch is in
    sizes = np.minimum(starts + spec.batch_size, bounds[shard_of + 1]) - starts
    index = {int(b): i for i, b in enumerate(starts)}
    events = []
    for path in sorted((workdir / JOURNAL_DIR).glob("*.jsonl")):
        events += [(e["t"], path.name, e) for e in _read_lines(path)]
    events.sort(key=lambda item: item[0])
    streams: dict[str, _Stream] = {}
    saved: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    unknown_files: set[str] = set()
    last_apply = np.zeros(len(starts))
    refusals: list[tuple[float, int, int]] = []  # (time, batch, samples)
    for t, name, event in events:
        stream = streams.setdefault(name, _Stream(len(starts)))
        kind = event["e"]
        if stream.started is None:
            stream.started = t
        if kind in ("start", "restore"):
            stream.generation, stream.ps = event["g"], event["ps"]
        if kind == "restore":
            states = [saved[f] for f in event["from"] if f in saved]
            unknown_files.update(f for f in event["from"] if f not in saved)
            zero = np.zeros(len(starts), np.int64)
            stream.base_lo = np.min([s[0] for s in states], axis=0) if states else zero
            stream.base_hi = np.max([s[1] for s in states], axis=0) if states else zero
            stream.applied = np.zeros(len(starts), np.int64)
        elif kind == "apply":
            i = index[event["b"]]
            stream.applied[i] += 1
            last_apply[i] = t
        elif kind == "refused":
            refusals.append((t, index[event["b"]], event["n"]))
        elif kind == "save":
            saved[event["path"]] = stream.state()
    finals: dict[int, _Stream] = {}
    for stream in streams.values():
        if stream.generation == generation and stream.ps is not None:
            if stream.ps not in finals or stream.started > finals[stream.ps].started:
                finals[stream.ps] = stream
    if finals:
        lo = np.min([s.state()[0] for s in finals.values()], axis=0)
        hi = np.max([s.state()[1] for s in finals.values()], axis=0)
    else:
        lo = hi = np.zeros(len(starts), np.int64)
    requeues = _requeues(workdir)
    duplicated = np.maximum(hi - 1, 0)
    refused_by_cause: Counter[str] = Counter()
    for t, i, n in refusals:
        refused_by_cause[_cause(requeues, int(shard_of[i]), t)] += n
    epoch = starts // spec.samples
    by_epoch = [{"epoch": e, "samples_expected": int(sizes[epoch == e].sum()),
                 "samples_lost": int((sizes * (lo == 0))[epoch == e].sum()),
                 "samples_duplicated": int((sizes * duplicated)[epoch == e].sum())} for e in range(spec.epochs)]
    in_model: Counter[str] = Counter()
    for i in np.flatnonzero(duplicated):
        in_model[_cause(requeues, int(shard_of[i]), last_apply[i])] += int(sizes[i] * duplicated[i])
    return {
        "samples_expected": int(sizes.sum()),
        "samples_trained": int((sizes * hi).sum()),
        "samples_lost": int((sizes * (lo == 0)).sum()),
        "samples_duplicated": int((sizes * duplicated).sum()),
        "duplicated_by": dict(in_model),
        "samples_by_epoch": by_epoch,
        "duplicates_refused": int(sum(refused_by_cause.values())),
        "duplicates_refused_by": dict(refused_by_cause),
        "ps_in_final_model": len(finals),
        "checkpoint_files_without_journal": sorted(unknown_files),
        "journals": len(streams),
    }


def _requeues(workdir: Path) -> dict[int, list[tuple[float, str]]]:
    """Each shard's requeues, ``(time, reason)`` in time order."""
    path = workdir / REQUEUES_FILE
    out: dict[int, list[tuple[float, str]]] = {}
    if path.exists():
        for row in _read_lines(path):
            out.setdefault(row["shard"], []).append((row["t"], row["reason"]))
    return out


def _cause(requeues: dict[int, list[tuple[float, str]]], shard: int, t: float) -> str:
    earlier = [reason for when, reason in requeues.get(shard, []) if when <= t]
    return earlier[-1] if earlier else "no requeue of its shard"
