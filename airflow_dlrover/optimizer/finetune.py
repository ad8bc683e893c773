"""Fine-tune policy: while the job trains, keep, resize, or revert the last resize.

DLRover's own rule is marginal: add workers while each added worker still raises the measured
speed by enough. Ours asks the refitted model for the best plan and resizes only when it pays:

    T_keep   = remaining / X_now                        (X_now: measured, median of recent windows)
    T_resize = cost + remaining / (X_now · s_low)       (s_low: pessimistic predicted speed-up,
                                                          lower band of the target / current)
    resize  ⇔  s_low ≥ MIN_RESIZE_SPEEDUP  and  T_keep − T_resize ≥ RESIZE_GAIN_MULTIPLE · cost

with at least ``MIN_RESIZE_INTERVAL_S`` between resizes. The target is the refitted model's plan for
the run's own objective (``planner.plan``): the highest throughput under the quota, the knee of the
Pareto front (``efficiency``), or the cheapest plan that still meets what is left of the deadline
(``deadline``; once no plan can, the fastest one). The cost depends on the change: workers
only (the others keep training), a per-node CPU/memory change (that node relaunches), or a PS
count change (checkpoint → re-partition → restart). After ``MIN_OBSERVATIONS_TO_JUDGE`` windows
on the new configuration, a resize that delivered less than ``REVERT_DELIVERED_FRACTION`` of its
predicted gain is reverted, and its target is returned in ``reject`` so the caller excludes it
from later plans: the policy cannot oscillate between two configurations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import MemoryModel
from airflow_dlrover.optimizer.model import ThroughputModel, features
from airflow_dlrover.optimizer.planner import OBJECTIVES, plan
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError, Plan, Quota


@dataclass(frozen=True)
class ResizeRecord:
    """A resize that happened: when, from what, to what, and what it was expected to deliver."""

    at_s: float
    before: Configuration
    after: Configuration
    throughput_before: float
    predicted_speedup: float
    is_revert: bool = False


@dataclass(frozen=True)
class Decision:
    action: str  # "keep" | "resize" | "revert"
    reason: str
    target: Configuration | None = None
    predicted_speedup: float | None = None
    predicted_saving_s: float | None = None
    resize_cost_s: float | None = None
    reject: Configuration | None = None

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("target", "reject")}
        out["target"] = self.target.to_row() if self.target else None
        out["reject"] = self.reject.to_row() if self.reject else None
        return out


def _shape(config: Configuration) -> tuple:
    return (config.workers, config.ps, config.worker_cpu, config.ps_cpu, config.worker_gpu)


def resize_cost_s(current: Configuration, target: Configuration) -> float:
    """Seconds of lost training for changing ``current`` into ``target`` (see constants)."""
    if target.ps != current.ps:
        return C.PS_RESIZE_COST_S
    per_node = (target.worker_cpu, target.ps_cpu, target.worker_memory_mb, target.ps_memory_mb, target.worker_gpu)
    if per_node != (current.worker_cpu, current.ps_cpu, current.worker_memory_mb, current.ps_memory_mb, current.worker_gpu):
        return C.NODE_RELAUNCH_COST_S
    return C.WORKER_RESIZE_COST_S


def decide(
    model: ThroughputModel,
    memory: MemoryModel,
    quota: Quota,
    current: Configuration,
    recent_throughput: Sequence[float],
    remaining_samples: float,
    now_s: float,
    last_resize: ResizeRecord | None = None,
    rejected: Iterable[Configuration] = (),
    *,
    objective: str = "throughput",
    deadline_s: float | None = None,
) -> Decision:
    """Keep, resize or revert; ``recent_throughput`` = measured windows since the last resize.
    ``objective`` is the plan's (``planner.OBJECTIVES``); ``deadline_s``: the seconds left until
    the deadline, for the ``deadline`` objective."""
    if objective not in OBJECTIVES:
        raise InvalidInputError("objective", objective, " | ".join(OBJECTIVES))
    if objective == "deadline" and deadline_s is None:
        raise InvalidInputError("deadline_s", None, "the seconds left until the deadline, with the deadline objective")
    measured = np.asarray(recent_throughput, dtype=float)
    if measured.size and not (np.isfinite(measured).all() and (measured >= 0).all()):
        raise InvalidInputError("recent_throughput", list(measured), "finite samples/s ≥ 0")
    if not remaining_samples > 0:
        return Decision("keep", "no samples remain")
    if measured.size == 0 or np.median(measured) <= 0:
        return Decision("keep", "no throughput measured on the current configuration yet")
    x_now = float(np.median(measured))

    if last_resize is not None:
        since = now_s - last_resize.at_s
        if since < C.MIN_RESIZE_INTERVAL_S:
            return Decision("keep", f"last resize {since:.0f}s ago, minimum interval {C.MIN_RESIZE_INTERVAL_S:.0f}s")
        if not last_resize.is_revert and _shape(last_resize.after) == _shape(current):
            if measured.size < C.MIN_OBSERVATIONS_TO_JUDGE:
                return Decision("keep", f"judging the last resize: {measured.size}/{C.MIN_OBSERVATIONS_TO_JUDGE} windows measured")
            delivered = x_now / last_resize.throughput_before
            wanted = 1.0 + C.REVERT_DELIVERED_FRACTION * (last_resize.predicted_speedup - 1.0)
            if delivered < wanted:
                return Decision(
                    "revert",
                    f"last resize delivered ×{delivered:.2f} of a predicted ×{last_resize.predicted_speedup:.2f} "
                    f"(needed ×{wanted:.2f}): back to {last_resize.before.describe()}",
                    target=last_resize.before,
                    predicted_speedup=last_resize.throughput_before / x_now,
                    resize_cost_s=resize_cost_s(current, last_resize.before),
                    reject=last_resize.after,
                )

    best = _target(model, memory, quota, objective, remaining_samples, deadline_s, current.batch_size, tuple(rejected))
    target = best.config
    if _shape(target) == _shape(current):
        return Decision("keep", "the current configuration is the model's best under the quota")
    x_current = float(model.predict_features(_features(current), band=False)[0])
    speedup = best.predicted_throughput / x_current
    speedup_low = best.lower_throughput / x_current
    cost = resize_cost_s(current, target)
    keep_s = remaining_samples / x_now
    resize_s = cost + remaining_samples / (x_now * max(speedup_low, 1e-9))
    saving = keep_s - resize_s
    if speedup_low < C.MIN_RESIZE_SPEEDUP or saving < C.RESIZE_GAIN_MULTIPLE * cost:
        return Decision(
            "keep",
            f"best alternative {target.workers}w×{target.worker_cpu:g} + {target.ps}ps×{target.ps_cpu:g} "
            f"predicts ×{speedup:.2f} (pessimistic ×{speedup_low:.2f}), saving {saving:.0f}s against a "
            f"{cost:.0f}s resize: not worth it (needs ×{C.MIN_RESIZE_SPEEDUP} and {C.RESIZE_GAIN_MULTIPLE:g}× the cost)",
            target=target, predicted_speedup=speedup, predicted_saving_s=saving, resize_cost_s=cost,
        )
    return Decision(
        "resize",
        f"{target.describe()} predicts ×{speedup:.2f} (pessimistic ×{speedup_low:.2f}): saves "
        f"{saving:.0f}s of {keep_s:.0f}s for a {cost:.0f}s resize",
        target=target, predicted_speedup=speedup, predicted_saving_s=saving, resize_cost_s=cost,
    )


def _target(model, memory, quota, objective, remaining_samples, deadline_s, batch_size, rejected) -> Plan:
    """The refitted model's plan for the objective; a deadline that can no longer be met (or has
    passed) asks for the fastest plan instead."""
    if objective == "deadline":
        try:
            if deadline_s > 0:
                return plan(model, memory, quota, "deadline", samples=remaining_samples, deadline_s=deadline_s,
                            batch_size=batch_size, exclude=rejected)
        except InvalidInputError as err:
            if err.field != "deadline":
                raise
        objective = "throughput"
    return plan(model, memory, quota, objective, samples=remaining_samples, batch_size=batch_size, exclude=rejected)


def _features(config: Configuration) -> np.ndarray:
    return features(config.workers, config.ps, config.worker_cpu, config.ps_cpu, config.worker_gpu, config.batch_size)[None, :]
