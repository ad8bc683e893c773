"""Fine-tune policy: while the job trains, keep, resize, or revert the last resize.

DLRover's own rule is marginal: add workers while each added worker still raises the measured
speed by enough. Ours asks the refitted model for the best plan and resizes only when it pays:

    T_keep   = remaining / X_now                        (X_now: measured, median of recent windows)
    T_resize = cost + remaining / (X_now · s_low)       (s_low: pessimistic predicted speed-up,
                                                          lower band of the target / current)
    resize  ⇔  s_low ≥ MIN_RESIZE_SPEEDUP  and  T_keep − T_resize ≥ RESIZE_GAIN_MULTIPLE · cost

with at least ``MIN_RESIZE_INTERVAL_S`` between resizes. Where the pessimistic test refuses but
the model is unsure (a wide band) and its mean says the resize and a possible revert pay, the
policy *explores* (``EXPLORE_*``): it resizes, judges the shape on its own windows, keeps it
(``explored``) or reverts it; the windows teach the refit a shape the probes never ran. When
the mean's plan is not worth exploring (or the job runs it already), the policy plans on one
draw of the fit's posterior (Thompson sampling, ``posterior_draw``) and explores that plan on the
same terms: a shape is tried about as often as it is plausibly the best, so a model wrong past
its probes can still learn. The
target is the refitted model's plan for the run's own objective (``planner.plan``): the highest throughput under the quota, the knee of the
Pareto front (``efficiency``), or the cheapest plan that still meets what is left of the deadline
(``deadline``; once no plan can, the fastest one). The time rule never gives cores back, as a
knee is slower than what runs past it: the efficiency objective resizes down to its knee when
the cores past it pay neither their throughput nor the resize (``_past_the_knee``), and explores
that knee where only the band's doubt refuses it (``_knee_exploration``). The cost
depends on the change: workers only (the others keep training), a per-node CPU/memory change
(that node relaunches), or a PS count change (checkpoint → re-partition → restart); an
all-reduce job's worker-count change restarts its whole ring. The target is always of the job's
own kind (``types.is_allreduce``): the model must be of the running configuration's kind, and its plans are (``planner``). After ``MIN_OBSERVATIONS_TO_JUDGE`` windows
on the new configuration, a resize that delivered less than ``REVERT_DELIVERED_FRACTION`` of its
predicted gain is reverted, and its target is returned in ``reject`` so the caller excludes it
from later plans: the policy cannot oscillate between two configurations. Where the configuration
before no longer fits the quota it plans in (a hot PS healed since holds the rest), the job is
planned anew there without the target instead. ``decide`` is one part
of ``controller.step``, which every caller goes through.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Iterable, Sequence

import numpy as np

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.memory import MemoryModel
from airflow_dlrover.optimizer.model import PARAMETERS, ThroughputModel
from airflow_dlrover.optimizer.planner import plan, throughput_ceiling
from airflow_dlrover.optimizer.transitions import TransitionCosts, measured as measured_transitions
from airflow_dlrover.optimizer.types import (
    Configuration, InfeasibleQuotaError, InvalidInputError, Objective, Plan, Quota, Reason, check_kind, is_allreduce,
)


@dataclass(frozen=True)
class ResizeRecord:
    """A resize that happened: when, from what, to what, and what it was expected to deliver."""

    at_s: float
    before: Configuration
    after: Configuration
    throughput_before: float
    predicted_speedup: float
    is_revert: bool = False
    exploring: bool = False  # an exploration not judged yet


@dataclass(frozen=True)
class Decision:
    """The fine-tune's verdict: ``keep``, ``resize`` or ``revert``, with its typed reason and the
    numbers it rests on (``Reason.describe`` renders them)."""

    action: str  # "keep" | "resize" | "revert"
    reason: Reason
    numbers: dict = field(default_factory=dict)
    target: Configuration | None = None
    predicted_speedup: float | None = None
    predicted_saving_s: float | None = None
    resize_cost_s: float | None = None
    reject: Configuration | None = None

def shape(config: Configuration | dict) -> tuple:
    """What a resize changes the speed of: (workers, ps, worker_cpu, ps_cpu, worker_gpu) of a
    configuration or of a sample row (memory changes no throughput)."""
    if isinstance(config, dict):
        get = config.get
        return (int(get("workers")), int(get("ps")), float(get("worker_cpu")), float(get("ps_cpu")),
                int(get("worker_gpu") or 0))
    return (int(config.workers), int(config.ps), float(config.worker_cpu), float(config.ps_cpu),
            int(config.worker_gpu or 0))


def resize_cost_s(current: Configuration, target: Configuration, restart_cost_s: float | None = None, *,
                  transitions: TransitionCosts | None = None, in_place: bool = True, state_mb: float = 0.0) -> float:
    """Seconds of lost training for changing ``current`` into ``target``: ``restart_cost_s`` for a
    job that every resize restarts as a whole (measured), else the transition's cost in the
    backend's measured table (``transitions``; default the runtime's, ``transitions.measured``),
    ``in_place``: the backend changes a node's CPU and memory without a restart; ``state_mb``: the
    PS state a re-partition moves."""
    if restart_cost_s is not None:
        return float(restart_cost_s)
    return (transitions or measured_transitions()).of(current, target, in_place=in_place, state_mb=state_mb)


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
    objective: Objective | str = Objective.THROUGHPUT,
    deadline_s: float | None = None,
    restart_cost_s: float | None = None,
    transitions: TransitionCosts | None = None,
    in_place: bool = True,
    may_explore: bool = False,
    samples_done: float = 0.0,
) -> Decision:
    """Keep, resize or revert; ``recent_throughput`` = measured windows since the last resize.
    ``objective`` is the plan's; ``deadline_s``: the seconds left until the deadline, for the
    ``deadline`` objective; ``restart_cost_s``: what a resize costs a job that restarts as a
    whole, ``transitions`` and ``in_place`` what any other resize costs (:func:`resize_cost_s`);
    ``samples_done``: those trained so far (the memory model's
    tables grow on a curve of the samples trained); ``may_explore``: an exploration is allowed
    (the run has not used its ``EXPLORE_MAX_PER_RUN``)."""
    objective = Objective.parse(objective)
    check_kind(model, is_allreduce(current), "model", "the running configuration is")
    state_mb = 0.0 if memory.allreduce else float(memory.ps_tables_mb(1, samples_done))
    cost_of = partial(resize_cost_s, restart_cost_s=restart_cost_s, transitions=transitions, in_place=in_place,
                      state_mb=state_mb)
    if objective == Objective.DEADLINE and deadline_s is None:
        raise InvalidInputError("deadline_s", None, "the seconds left until the deadline, with the deadline objective")
    measured = np.asarray(recent_throughput, dtype=float)
    if measured.size and not (np.isfinite(measured).all() and (measured >= 0).all()):
        raise InvalidInputError("recent_throughput", list(measured), "finite samples/s ≥ 0")
    if not remaining_samples > 0:
        return Decision("keep", Reason.NO_SAMPLES_REMAIN)
    if measured.size == 0 or np.median(measured) <= 0:
        return Decision("keep", Reason.NOT_MEASURED)
    x_now = float(np.median(measured))

    if last_resize is not None:
        since = now_s - last_resize.at_s
        if since < C.MIN_RESIZE_INTERVAL_S:
            return Decision("keep", Reason.MIN_INTERVAL, {"since_s": since, "interval_s": C.MIN_RESIZE_INTERVAL_S})
        if not last_resize.is_revert and shape(last_resize.after) == shape(current):
            if measured.size < C.MIN_OBSERVATIONS_TO_JUDGE:
                return Decision("keep", Reason.JUDGING, {"windows": int(measured.size),
                                                         "needed": C.MIN_OBSERVATIONS_TO_JUDGE})
            delivered = x_now / last_resize.throughput_before
            wanted = 1.0 + C.REVERT_DELIVERED_FRACTION * (last_resize.predicted_speedup - 1.0)
            judged = {"delivered": delivered, "predicted": last_resize.predicted_speedup}
            if last_resize.predicted_speedup < 1.0:  # cores given back past the knee: judged as the knee is
                wanted = _knee_floor(last_resize.before.cores, current.cores)
            back = last_resize.before
            if delivered < wanted and (quota is None or (back.cores <= quota.cpu + 1e-9
                                                         and back.memory_mb <= quota.memory_mb + 1e-9)):
                return Decision(
                    "revert", Reason.DID_NOT_DELIVER, judged | {"needed": wanted, "explored": last_resize.exploring},
                    target=back,
                    predicted_speedup=last_resize.throughput_before / x_now,
                    resize_cost_s=cost_of(current, back),
                    reject=last_resize.after,
                )
            if delivered < wanted:  # no way back in the quota (a heal since holds the rest): planned anew without it
                rejected = (*rejected, last_resize.after)
            elif last_resize.exploring:
                return Decision("keep", Reason.EXPLORED, judged)

    plan_args = (memory, quota, objective, remaining_samples, deadline_s, current.batch_size, tuple(rejected),
                 samples_done)
    best = _target(model, *plan_args)

    def explore(mean_best: Plan | None) -> Decision | None:
        """The mean's plan explored, else the plan of one posterior draw (Thompson sampling). No
        exploration pays when keeping takes ≤ (2·RESIZE_GAIN_MULTIPLE + 1) × the cheapest resize
        (its saving < keep time − cost): then nothing is planned."""
        table = transitions or measured_transitions()
        cheapest = restart_cost_s if restart_cost_s is not None else min(table.worker_join_s, table.worker_leave_s)
        if not may_explore or remaining_samples / x_now <= (2 * C.RESIZE_GAIN_MULTIPLE + 1) * cheapest:
            return None
        explored = None
        if mean_best is not None:
            explored = _exploration(mean_best, model, model, current, x_now, remaining_samples, cost_of)
        if explored is None:
            seed = _draw_seed(now_s, samples_done, current)
            drawn = posterior_draw(model, seed)
            x_drawn = float(drawn.predict_features(drawn.features(current), band=False)[0])
            if throughput_ceiling(drawn, quota, current.batch_size) < C.EXPLORE_MIN_SPEEDUP * x_drawn * (1 - 1e-9):
                return None  # no plan of the draw is fast enough to explore (_exploration): none is made
            try:
                explored = _exploration(_target(drawn, *plan_args, brief=True), drawn, model, current, x_now,
                                        remaining_samples, cost_of, seed)
            except InfeasibleQuotaError:  # the draw's tables fit no plan: nothing to explore
                return None
        return explored

    target = best.config
    if shape(target) == shape(current):
        return explore(None) or Decision("keep", Reason.AT_BEST)
    x_current = float(model.predict_features(model.features(current), band=False)[0])
    speedup = best.predicted_throughput / x_current
    speedup_low = best.lower_throughput / x_current
    cost = cost_of(current, target)
    keep_s = remaining_samples / x_now
    resize_s = cost + remaining_samples / (x_now * max(speedup_low, 1e-9))
    saving = keep_s - resize_s
    numbers = {"speedup": speedup, "speedup_low": speedup_low, "saving_s": saving, "keep_s": keep_s, "cost_s": cost}
    if speedup_low < C.MIN_RESIZE_SPEEDUP or saving < C.RESIZE_GAIN_MULTIPLE * cost:
        if objective == Objective.EFFICIENCY and target.cores < current.cores:
            given_back = _past_the_knee(current, target, speedup, speedup_low, keep_s, cost)
            if given_back is None and may_explore:
                given_back = _knee_exploration(current, best, speedup, speedup_low, keep_s, cost)
            if given_back is not None:
                return given_back
        explored = explore(best)
        if explored is not None:
            return explored
        return Decision("keep", Reason.NOT_WORTH_IT,
                        numbers | {"min_speedup": C.MIN_RESIZE_SPEEDUP, "gain_multiple": C.RESIZE_GAIN_MULTIPLE,
                                   "target": target.describe()},
                        target=target, predicted_speedup=speedup, predicted_saving_s=saving, resize_cost_s=cost)
    return Decision("resize", Reason.PAYS, numbers, target=target, predicted_speedup=speedup,
                    predicted_saving_s=saving, resize_cost_s=cost)


def _knee_floor(cores: float, knee_cores: float) -> float:
    """The least speed-up (< 1) at which ``knee_cores`` keep the knee over ``cores``: the cores
    past it add less than ``KNEE_MARGINAL_FRACTION`` of the knee's throughput per core,

        X·(1 − s)/(c − c_k) < f · X·s/c_k   ⇔   s > 1 / (1 + f·(c − c_k)/c_k)

    (``planner.knee``'s rule, with the knee's own throughput per core for the front's best)."""
    return 1.0 / (1.0 + C.KNEE_MARGINAL_FRACTION * (cores - knee_cores) / knee_cores)


def _past_the_knee(current: Configuration, target: Configuration, speedup: float, speedup_low: float, keep_s: float,
                   cost: float) -> Decision | None:
    """The efficiency objective's resize to a knee with fewer cores than the job runs: the cores
    past it do not pay, even at the pessimistic end of the band (``speedup_low`` above
    :func:`_knee_floor`), and the core-seconds they save pay ``RESIZE_GAIN_MULTIPLE`` × the
    core-seconds the resize costs:

        c·T_keep − (c·cost + c_k·T_keep / s_low)  ≥  RESIZE_GAIN_MULTIPLE · c · cost

    else None. Once it runs, the resize is judged the same way: back, if the cores turn out to
    have paid."""
    cores, knee_cores = current.cores, target.cores
    floor = _knee_floor(cores, knee_cores)
    saving_core_s = cores * keep_s - (cores * cost + knee_cores * keep_s / max(speedup_low, 1e-9))
    if speedup_low <= floor or saving_core_s < C.RESIZE_GAIN_MULTIPLE * cores * cost:
        return None
    numbers = {"target": target.describe(), "cores": cores, "knee_cores": knee_cores, "speedup": speedup,
               "speedup_low": speedup_low, "floor": floor, "saving_core_h": saving_core_s / 3600.0, "cost_s": cost}
    return Decision("resize", Reason.PAST_THE_KNEE, numbers, target=target, predicted_speedup=speedup,
                    resize_cost_s=cost)


def _knee_exploration(current: Configuration, knee: Plan, speedup: float, speedup_low: float, keep_s: float,
                      cost: float) -> Decision | None:
    """The knee tried where :func:`_past_the_knee` refuses it only for the model's doubt: at the
    mean the cores past the knee do not pay (``speedup`` above :func:`_knee_floor`), the model is
    unsure at the knee (its plan's 90 % band at least ``EXPLORE_MIN_BAND`` of the prediction: a shape it
    never measured), and the core-seconds the mean saves pay ``RESIZE_GAIN_MULTIPLE`` × those of
    the resize and of its revert,

        c·T_keep − (c·cost + c_k·T_keep / s)  ≥  2 · RESIZE_GAIN_MULTIPLE · c · cost

    else None. It is judged as a give-back is (back, if the cores turn out to have paid), and its
    windows teach the refit the knee's speed: without them a run resumed on its last configuration
    is refused the knee by the same doubt every day."""
    target, cores, knee_cores = knee.config, current.cores, knee.config.cores
    floor = _knee_floor(cores, knee_cores)
    band = (knee.upper_throughput - knee.lower_throughput) / knee.predicted_throughput
    saving_core_s = cores * keep_s - (cores * cost + knee_cores * keep_s / speedup)
    if speedup <= floor or band < C.EXPLORE_MIN_BAND or saving_core_s < 2 * C.RESIZE_GAIN_MULTIPLE * cores * cost:
        return None
    numbers = {"target": target.describe(), "cores": cores, "knee_cores": knee_cores, "speedup": speedup,
               "speedup_low": speedup_low, "floor": floor, "band": band, "saving_core_h": saving_core_s / 3600.0,
               "cost_s": cost}
    return Decision("resize", Reason.EXPLORE_KNEE, numbers, target=target, predicted_speedup=speedup,
                    resize_cost_s=cost)


def _exploration(option: Plan, predictor: ThroughputModel, model: ThroughputModel, current: Configuration,
                 x_now: float, remaining_samples: float, cost_of: Callable[[Configuration, Configuration], float],
                 draw_seed: int | None = None) -> Decision | None:
    """An exploration of ``option`` (``EXPLORE_*``), the plan of ``predictor`` (the model, or its
    posterior draw ``draw_seed``): where the model is unsure at the option (its band), the
    predictor's speed-up is at least ``EXPLORE_MIN_SPEEDUP`` and its saving pays for the resize and
    its revert (``cost_of``: :func:`resize_cost_s` for the job); else None. The resize is judged
    against the predictor's speed-up."""
    target = option.config
    if shape(target) == shape(current):
        return None
    x_target, lower, upper = (float(v[0]) for v in model.predict_features(model.features(target)))
    x_current = float(model.predict_features(model.features(current), band=False)[0])
    band = (upper - lower) / x_target
    x_predictor = float(predictor.predict_features(predictor.features(current), band=False)[0])
    speedup = option.predicted_throughput / x_predictor
    cost = cost_of(current, target)
    keep_s = remaining_samples / x_now
    expected_saving = keep_s - (cost + keep_s / speedup)
    pays = expected_saving >= C.RESIZE_GAIN_MULTIPLE * 2 * cost
    if band < C.EXPLORE_MIN_BAND or speedup < C.EXPLORE_MIN_SPEEDUP or not pays:
        return None
    source = "the model" if draw_seed is None else f"a draw of the fit's posterior (seed {draw_seed})"
    numbers = {"source": source, "draw_seed": draw_seed, "speedup": speedup, "mean_speedup": x_target / x_current,
               "speedup_low": lower / x_current, "band": band, "expected_saving_s": expected_saving, "keep_s": keep_s,
               "cost_s": cost, "target": target.describe()}
    return Decision("resize", Reason.EXPLORE, numbers, target=target, predicted_speedup=speedup,
                    predicted_saving_s=expected_saving, resize_cost_s=cost)


def posterior_draw(model: ThroughputModel, seed: int) -> ThroughputModel:
    """One plausible model from the fit's posterior: φ = θ^q ~ N(φ̂, Σ) (the fit's covariance of
    φ), clipped at 0 as the NNLS bounds it, θ = φ^(1/q). Planning on a draw is Thompson sampling:
    it explores a shape in proportion to the chance that it is the best one."""
    q = model.sharpness
    variances, axes = np.linalg.eigh(model.covariance)  # Σ = U diag(s) Uᵀ; rounding's s < 0 taken as 0
    z = np.random.default_rng(seed).standard_normal(len(variances))
    draw = model.theta ** q + axes @ (np.sqrt(np.maximum(variances, 0.0)) * z)
    return replace(model, params=dict(zip(PARAMETERS, np.maximum(draw, 0.0) ** (1.0 / q))))


def _draw_seed(now_s: float, samples_done: float, current: Configuration) -> int:
    """A decision's draw, reproducible from what the decision saw."""
    return zlib.crc32(repr((round(now_s, 3), round(samples_done), shape(current))).encode())


def _target(model, memory, quota, objective, remaining_samples, deadline_s, batch_size, rejected, samples_done,
            brief: bool = False) -> Plan:
    """The refitted model's plan for the objective; a deadline that can no longer be met (or has
    passed) asks for the fastest plan instead. ``brief``: ``planner.plan``'s."""
    if objective == Objective.DEADLINE:
        try:
            if deadline_s > 0:
                return plan_within_quota(model, memory, quota, "deadline", samples=remaining_samples,
                                         deadline_s=deadline_s, batch_size=batch_size, exclude=rejected,
                                         samples_done=samples_done, brief=brief)
        except InvalidInputError as err:
            if err.field != "deadline":
                raise
        objective = Objective.THROUGHPUT
    return plan_within_quota(model, memory, quota, objective, samples=remaining_samples, batch_size=batch_size,
                             exclude=rejected, samples_done=samples_done, brief=brief)


def plan_within_quota(model: ThroughputModel, memory: MemoryModel | None, quota: Quota, objective: Objective | str,
                      **kwargs) -> Plan:
    """``planner.plan``; when the PS tables' growth forecast for the samples to train does not fit
    the quota, the plan is made without the growth (and says so): the guard's OOM-risk forecast
    grows the PS memory while the job runs, as far as the quota allows."""
    try:
        return plan(model, memory, quota, objective, **kwargs)
    except InfeasibleQuotaError as err:
        if err.field != "memory" or memory is None or memory.table_growth_mb_per_m_samples <= 0:
            raise
        chosen = plan(model, memory.with_table_growth(0.0), quota, objective, **kwargs)
        return replace(chosen, reason=f"{chosen.reason}; planned without the PS tables' growth, which does not "
                                      f"fit the quota ({err.detail or err})")

