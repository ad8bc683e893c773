"""The DLRover-RM controller: every decision of a job's life, in one pure function.

    step(state, observation) -> (state, actions)

in the shape of Ray autoscaler v2's ``schedule(request) -> reply``: plain dataclasses in, plain
dataclasses out, no I/O. The profile, fit and launch tasks, the fine-tune and the guard,
``dlrover-rm`` and the simulator's ``ours`` policy all observe their job, call ``step`` and apply
what it returns; none of them decides anything itself.

The state carries the job's phase (``types.Phase``); :func:`begin` starts it profiling:

0. **Before training.** *Profiling*: the next probe (``Probe``) in ``probes.visiting_order``,
   sized to what the earlier ones used, while the probe's cost keeps the profile within its share
   of the job's run time (``probes.next_probe_in_budget``); on the job's stand-in, without the
   tables it starts from, where its PS changes would move more than the stand-in throws away
   (``probes.profile_apart``). *Fitting*: the model on the profile,
   warm-started from the prior (``job_model.choose_prior``); a warm start plans on the prior.
   *Planning*: :func:`initial_plan` for what remains of the job; a plan that extrapolates past the
   probes is measured first (``Probe``, at most ``PLAN_CHECK_PROBES`` times) and planned again on
   the refit; a warm start, which measures nothing, launches on the configuration its last run
   ended on; then ``Launch``, and the job is *training* until no sample remains (*done*).

While training, one step looks at the observation in this order (failed nodes first in every
phase: a probe's are recovered at once, as it is no task's try):

1. **Failed nodes** (``NodeStatus.failed``). Recovery is an Airflow retry: a failure no step has
   reported yet gives ``Fail(retryable=True)`` (the guard's try fails); a reported one is
   recovered — ``Relaunch`` (an OOM-killed node with ``OOM_MEMORY_GROWTH`` × its limit, rounded
   up to ``MEMORY_GRANULARITY_MB``, once per kill: ``(name, restarts)`` names the killed
   incarnation; the memory model's forecast for the job when that is more), or, for a worker the
   cluster cannot place, a ``Resize`` without it. An OOM kill the quota leaves no room to grow is
   ``Fail(retryable=False)``, as are the same crash again before any progress (``CRASH_LOOP``) and
   a trainer past its restart budget (``RESTART_BUDGET``). A repeated failure is recovered after a
   backoff (:func:`restart_backoff_s`; ``Keep(RESTART_BACKOFF)`` meanwhile). An all-reduce job
   (``ps = 0``) restarts as a group: its ranks that fail while a reported failure awaits that
   restart (gloo's "connection reset by peer") are part of that failure, and one ``Relaunch``
   restarts the group.
2. **Usage** (per-node rows): the instability detectors (``instability``) on the last
   ``DETECTOR_HISTORY_WINDOWS`` windows of each node. A hot PS gets CPU in place (``Heal``; the
   most the quota leaves it, when that is less than it asks but more than it has), a
   straggler is replaced (``Relaunch`` with the planned CPU), a node at OOM risk gets the
   forecast memory for its whole role (``Resize``: nodes of a role are alike). A PS's memory is
   forecast on the memory model's curve from its measured level (``_ps_curve``) where the model
   has a tables' growth and the job's size and speed are known, else by its trend. A change that would
   take the job past its quota is not made: ``Keep(PAST_QUOTA)``. An all-reduce job has no PS: a
   row of a PS is not one of its nodes, and is ignored (no hot PS, no PS memory).
3. **Windows** (clean measurement windows in the vocabulary's columns): refit on the first windows
   of a configuration and once it has ``REFIT_WINDOWS_PER_CONFIGURATION`` of them (the memory
   model alone, besides, each time the samples trained pass ``MEMORY_REFIT_SAMPLES_GROWTH`` × those
   it was fitted on; the layout's table capacity kept through every refit), then
   the fine-tune policy (``finetune.decide``) for the plan's objective and what is left of its
   deadline: ``Keep`` or ``Resize`` (a revert is a ``Resize`` with ``revert=True``). A resize never
   gives a role less memory than the running configuration has (tables only grow in a run).
   A resize is of the job's own kind: an all-reduce job (``ps = 0``) is only ever resized to
   ``ps = 0``, a PS job to ``ps ≥ 1`` (the model must be of the job's kind: ``finetune.decide``).

Every action carries a ``Reason`` (an enum) and the numbers it rests on; ``describe()`` renders
the sentence, and nothing parses it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Iterable

import numpy as np
import pandas as pd

from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.finetune import ResizeRecord, decide, plan_within_quota, shape
from airflow_dlrover.optimizer.instability import METRIC_COLUMNS, detect
from airflow_dlrover.optimizer.job_model import JobModel, fit_job_model
from airflow_dlrover.optimizer.memory import fit_memory
from airflow_dlrover.optimizer.planner import plan_at
from airflow_dlrover.optimizer.probes import (
    design_probes, next_probe_in_budget, probes_always_measured, profile_apart, profile_is_partial, visiting_order,
)
from airflow_dlrover.optimizer.similarity import SimilarPrior
from airflow_dlrover.optimizer.transitions import TransitionCosts
from airflow_dlrover.optimizer.types import (
    CONFIG_COLUMNS, EXPLORATIONS, SAMPLE_TABLE_COLUMNS, Configuration, InvalidInputError, NodeState, NodeStatus,
    Objective, Phase, Plan, Quota, Reason, is_allreduce,
)

# ---------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    kind: ClassVar[str] = "action"
    reason: Reason
    numbers: dict = field(default_factory=dict)

    def describe(self) -> str:
        return self.reason.describe(self.numbers)

    def to_record(self) -> dict[str, Any]:
        """A JSON-able record for the history store: the kind, the reason and its numbers."""
        out = {"action": self.kind, "reason": self.reason.value, "numbers": _jsonable(self.numbers),
               "text": self.describe()}
        for name, value in self.__dict__.items():
            if name in ("reason", "numbers"):
                continue
            out[name] = value.to_row() if isinstance(value, Configuration) else _jsonable(value)
        return out


@dataclass(frozen=True)
class Keep(Action):
    kind: ClassVar[str] = "keep"


@dataclass(frozen=True)
class Resize(Action):
    """Change the job to ``config``; ``remove``: nodes that leave first (the others keep their
    places); ``revert``: back to the configuration before a resize that did not deliver, which
    ``reject`` names."""

    kind: ClassVar[str] = "resize"
    config: Configuration | None = None
    expected_speedup: float | None = None
    revert: bool = False
    reject: Configuration | None = None
    remove: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.config.describe()}: {super().describe()}" if self.reason == Reason.PAYS else super().describe()


@dataclass(frozen=True)
class NodeAction(Action):
    """An action on one node, with its new resources (None: unchanged)."""

    node: str = ""
    cpu: float | None = None
    memory_mb: float | None = None


@dataclass(frozen=True)
class Heal(NodeAction):
    """New limits for one node in place (it keeps running, and its state)."""

    kind: ClassVar[str] = "heal"


@dataclass(frozen=True)
class Relaunch(NodeAction):
    """Restart one node from the job's checkpoint, optionally with new resources."""

    kind: ClassVar[str] = "relaunch"


@dataclass(frozen=True)
class Probe(Action):
    """Measure the job on ``config`` for up to ``window_s`` (a probe of the profile, or the plan's
    check), starting the job on it when it does not run yet; the window ends early once its rate is
    within ``halfwidth`` (``probes.window_settled``; 0: never early). ``apart``: measure the job's
    stand-in instead (``probes.profile_apart``), which the launch on the plan then stops."""

    kind: ClassVar[str] = "probe"
    config: Configuration | None = None
    window_s: float = C.PROBE_WINDOW_S
    halfwidth: float = C.PROBE_STOP_HALFWIDTH
    apart: bool = False


@dataclass(frozen=True)
class Launch(Action):
    """Train on ``plan``: start the job on it, or resize the running job to it (and stop the job's
    stand-in, after a profile apart)."""

    kind: ClassVar[str] = "launch"
    plan: Plan | None = None


@dataclass(frozen=True)
class Fail(Action):
    """The attempt fails: ``retryable`` — the cluster's fault, the retry recovers; otherwise a
    failure no retry can fix."""

    kind: ClassVar[str] = "fail"
    retryable: bool = True
    nodes: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# State and observation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ControllerState:
    """What the controller knows between steps. ``quota`` None: no limit (healing only).
    ``deadline_at_s``: the deadline on the observation's clock. ``profile``: the run's profile
    samples; ``windows``: the measurement windows since the launch (rows of the vocabulary);
    ``since_s``: when the running configuration was planned or resized to (its windows judge
    it). ``failures_reported``: the ``(node, restarts)`` failures a step has reported.
    ``node_history``: the detectors' rows (``instability.METRIC_COLUMNS`` + ``throughput``).
    ``prior_weight``: how hard the fit pulls toward ``prior``; ``prior_sources``: the jobs (name,
    similarity) a prior from similar jobs came from (:func:`prior_fields`; empty: the job's own).
    ``explorations``: the fine-tune's explorations so far (``EXPLORE_MAX_PER_RUN``).

    Before training (see :func:`begin`): ``phase``; ``probes``: the profile's probes in their
    visiting order, of which ``probes_issued`` were asked for, each measured for up to ``window_s``;
    ``batch_size`` and the layout's tables (``table_mb``, ``largest_table_mb``; None: unknown) the
    probes and the fit are sized by; ``table_start_mb``: the tables as the job starts (the export it
    continues: ``init_from``; None: empty), the least the memory model's T₀ may be — a prior or a
    profile of a job that started empty says less; ``plan``: the plan chosen last, measured
    ``plan_checks`` times before launch; ``apart``: the probes and checks are measured on the job's
    stand-in (``probes.profile_apart``), the job itself starts on its plan. ``failure_log``: each
    report of failed nodes (``time_s``, ``samples_done`` and the nodes' ``exit_codes``);
    ``restart_budget``: (failures, seconds) a trainer of the user's may have before it stops (None:
    no budget). ``last_run_config``: the configuration the job's newest earlier run ended on (its
    launch, or its last resize), which a warm start launches on (:func:`_last_run_plan`)."""

    quota: Quota | None
    objective: Objective = Objective.THROUGHPUT
    deadline_at_s: float | None = None
    model: JobModel | None = None
    prior: JobModel | None = None
    prior_weight: float = C.WARM_START_PRIOR_WEIGHT
    prior_sources: tuple[tuple[str, float], ...] = ()
    profile: tuple[dict, ...] = ()
    windows: tuple[dict, ...] = ()
    since_s: float = -math.inf
    last_resize: ResizeRecord | None = None
    rejected: tuple[Configuration, ...] = ()
    explorations: int = 0
    failures_reported: frozenset = frozenset()
    node_history: tuple[dict, ...] = ()
    phase: Phase = Phase.TRAINING
    probes: tuple[Configuration, ...] = ()
    probes_issued: int = 0
    window_s: float = C.PROBE_WINDOW_S
    batch_size: int = 512
    table_mb: float | None = None
    largest_table_mb: float | None = None
    table_start_mb: float | None = None
    plan: Plan | None = None
    plan_checks: int = 0
    apart: bool = False
    failure_log: tuple[dict, ...] = ()
    restart_budget: tuple[int, float] | None = None
    last_run_config: Configuration | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "objective", Objective.parse(self.objective))
        object.__setattr__(self, "phase", Phase(self.phase))


@dataclass(frozen=True)
class Observation:
    """What the job showed since the last step, on one clock (``now_s``; window ``timestamp`` and
    usage ``time_s`` on the same clock). ``config``: what runs; ``windows``: new clean windows
    (the configuration's columns + ``throughput``, ``timestamp``, optionally usage and
    ``samples_seen``); ``nodes``: every node's status with its exit reason; ``usage``: new per-node
    rows for the detectors (``instability.METRIC_COLUMNS``, ``throughput`` for workers, ``age_s``
    since the node started). ``restart_cost_s``: for a job that every resize restarts as a whole
    (a trainer of the user's), what one restart costs it, as measured (SIGTERM → training again);
    ``transitions``: what each other transition costs on the job's backend (None: the runtime's
    measured table, ``transitions.measured``); ``in_place``: the backend changes a node's CPU and
    memory without restarting it."""

    now_s: float
    config: Configuration | None = None
    samples_done: float = 0.0
    samples_total: float | None = None
    windows: tuple[dict, ...] = ()
    nodes: tuple[NodeStatus, ...] = ()
    usage: tuple[dict, ...] = ()
    restart_cost_s: float | None = None
    transitions: TransitionCosts | None = None
    in_place: bool = True

    @property
    def remaining(self) -> float | None:
        return None if self.samples_total is None else max(self.samples_total - self.samples_done, 0.0)


# ---------------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------------


def step(state: ControllerState, observation: Observation) -> tuple[ControllerState, list[Action]]:
    """One decision (see the module docstring): the new state and the actions to apply, in order."""
    failed = [n for n in observation.nodes if n.failed]
    if failed:
        if state.phase != Phase.TRAINING:  # a probe is not a task's try: its failures are recovered now
            state = replace(state, failures_reported=state.failures_reported | {(n.name, n.restarts) for n in failed})
            # a node's failures (its incarnations), not the nodes that failed: a probe's 64 workers
            # killed for memory together are one too-small probe, grown once
            most = max(Counter(name for name, _ in state.failures_reported).values())
            if most > C.FAILURES_BEFORE_TRAINING:
                numbers = {"node": ", ".join(n.name for n in failed), "state": _value(failed[0].state),
                           "detail": f"{failed[0].reason} (failure {most} of a node before training)"}
                return state, [Fail(Reason.NODE_FAILED, numbers, retryable=True, nodes=tuple(n.name for n in failed))]
        return _recover(state, observation, failed)
    if state.phase in _BEFORE_TRAINING:
        return _BEFORE_TRAINING[state.phase](state, observation)
    if state.phase == Phase.DONE or observation.remaining == 0:
        # Nothing left to train: the finishing worker evaluates and exports for seconds, a phase whose
        # memory ramp is no trend of the job's; a real OOM kill there is recovered as a failure.
        return replace(state, phase=Phase.DONE), [Keep(Reason.NO_SAMPLES_REMAIN)]
    actions: list[Action] = []
    if observation.usage:
        state, actions = _guard(state, observation)
        if any(not isinstance(a, Keep) for a in actions):
            return state, actions
    if observation.windows:
        state, action = _finetune(state, observation)
        actions.append(action)
    return state, actions


def begin(quota: Quota, objective: Objective | str = Objective.THROUGHPUT, *, prior: JobModel | None = None,
          deadline_at_s: float | None = None, batch_size: int = 512, worker_gpu: int = 0,
          table_mb: float | None = None, largest_table_mb: float | None = None, allreduce: bool | None = None,
          window_s: float = C.PROBE_WINDOW_S, table_start_mb: float | None = None,
          similar: SimilarPrior | None = None, last_run_config: Configuration | None = None) -> ControllerState:
    """A job's state before its first step: profiling the probes ``probes.design_probes`` chooses
    under ``quota`` (none for a warm start: a ``prior`` with a memory model; fewer the more alike
    the prior from ``similar`` jobs, taken where the job has none of its own), in
    ``probes.visiting_order``."""
    fields = prior_fields(prior, similar)
    prior = fields["prior"]
    design = design_probes(quota, batch_size=batch_size, worker_gpu=worker_gpu,
                           prior=prior.throughput if prior else None, memory=prior.memory if prior else None,
                           table_mb=table_mb, largest_table_mb=largest_table_mb, allreduce=allreduce,
                           similarity=similar.similarity if fields["prior_sources"] else None)
    return ControllerState(quota, objective, deadline_at_s, phase=Phase.PROFILING,
                           probes=tuple(visiting_order(design)) if len(design) else (), window_s=window_s,
                           batch_size=batch_size, table_mb=table_mb, largest_table_mb=largest_table_mb,
                           table_start_mb=table_start_mb, last_run_config=last_run_config, **fields)


def prior_fields(prior: JobModel | None, similar: SimilarPrior | None) -> dict[str, Any]:
    """The state's prior: the job's own; else one from ``similar`` jobs (their throughput model, no
    memory model: the tables are the job's own), pulled toward with ``WARM_START_PRIOR_WEIGHT`` × s."""
    if prior is not None or similar is None:
        return {"prior": prior, "prior_weight": C.WARM_START_PRIOR_WEIGHT, "prior_sources": ()}
    return {"prior": JobModel(similar.throughput, None), "prior_weight": C.WARM_START_PRIOR_WEIGHT * similar.similarity,
            "prior_sources": similar.sources}


def initial_plan(model: JobModel, quota: Quota, objective: Objective | str, *, samples: float | None,
                 deadline_s: float | None = None, batch_size: int = 512) -> Plan:
    """The pre-tune plan: ``finetune.plan_within_quota`` for the objective."""
    return plan_within_quota(model.throughput, model.memory, quota, objective, samples=samples,
                             deadline_s=deadline_s, batch_size=batch_size)


def plan_needs_check(plan: Plan) -> bool:
    """Whether a cold launch measures its plan before it launches it (``PLAN_CHECK_PROBES``): the
    plan extrapolates past the probes (``Plan.extrapolation``)."""
    return bool(plan.extrapolation)


# -- 0. before training: profile, fit, plan ----------------------------------------------------


def _profile(state: ControllerState, obs: Observation) -> tuple[ControllerState, list[Action]]:
    """The next probe (``probes.next_probe_in_budget``: in the visiting order — ordered, before the
    first, at the transition costs of the observation's backend —, sized to what the probes so far
    used) while what it costs keeps the profile in its budget; the windows observed
    are the last probe's measurement (rows with ``probe_s``, the seconds it took). A job that
    trained every sample ends its profile."""
    state = replace(state, profile=state.profile + tuple(dict(w) for w in obs.windows))
    if state.probes_issued == 0 and state.probes:  # ordered at the costs of the backend the observation knows
        design = pd.DataFrame([c.to_row() for c in state.probes])
        state = replace(state, apart=profile_apart(design, obs.transitions, in_place=obs.in_place,
                                                   state_mb=state.table_start_mb or 0.0, window_s=state.window_s))
        state = replace(state, probes=tuple(visiting_order(design, obs.transitions, in_place=obs.in_place,
                                                           state_mb=_probe_state_mb(state))))
    rows = pd.DataFrame(list(state.profile))
    index = state.probes_issued
    elapsed_s = float(np.nansum(rows["probe_s"].to_numpy(float))) if "probe_s" in rows else 0.0
    why = "every probe measured"
    if index and obs.remaining == 0:
        why = "the job trained every sample"
    else:
        order, probe, over_budget = next_probe_in_budget(
            state.probes, index, rows, state.quota, samples_left=obs.remaining if index else None,
            run_throughput=_run_throughput(state, obs), transitions=obs.transitions, in_place=obs.in_place,
            state_mb=_probe_state_mb(state))
        state = replace(state, probes=order)
        if probe is not None:
            numbers = {"index": index + 1, "designed": len(order), "window_s": state.window_s}
            return replace(state, probes_issued=index + 1), [Probe(Reason.PROBE, numbers, config=probe,
                                                                   window_s=state.window_s, apart=state.apart)]
        if over_budget:
            why = (f"the job is too short to pay for the probes that identify the model (more would pass "
                   f"{C.PROFILE_SHORT_JOB_FRACTION:.0%} of its run time): a partial fit, which plans this run and "
                   f"is not the job's next prior" if profile_is_partial(index, len(order)) else
                   f"one more would pass {C.PROFILE_BUDGET_FRACTION:.0%} of the job's run time")
    numbers = {"measured": len(rows), "designed": len(state.probes), "elapsed_s": elapsed_s, "why": why}
    if rows.empty and (state.prior is None or state.prior_sources):
        return state, [Fail(Reason.NOT_PROFILED, numbers, retryable=True)]
    return replace(state, phase=Phase.FITTING), [Keep(Reason.PROFILED, numbers)]


def _probe_state_mb(state: ControllerState) -> float:
    """The state a PS change of a probe writes and reads back: the job's tables as it starts, none
    on its stand-in (whose own rows, grown from none, are few)."""
    return 0.0 if state.apart else state.table_start_mb or 0.0


def _fit(state: ControllerState, obs: Observation) -> tuple[ControllerState, list[Action]]:
    """The run's model: fitted on the profile (``fit_job_model``, warm-started from the prior, the
    PS tables bounded by the layout's); a warm start, which profiled nothing, plans on its prior."""
    if not state.profile:
        if state.prior is None or state.prior_sources:  # a similar job's prior does not size this job's memory
            return state, [Fail(Reason.NOT_PROFILED, retryable=True)]
        return replace(state, model=_with_start(state.prior, state), phase=Phase.PLANNING), [
            Keep(Reason.FITTED, {"samples": 0, "warm": ": a warm start plans on its prior"})]
    model = _fit_profile(state)
    warm = " (warm-started from the prior)" if state.prior is not None else ""
    return replace(state, model=model, phase=Phase.PLANNING), [
        Keep(Reason.FITTED, {"samples": len(state.profile), "warm": warm})]


def _run_throughput(state: ControllerState, obs: Observation) -> float | None:
    """The rate the run's plan is predicted at, on the fit of the probes measured so far, once they
    include those that identify the model (``probes.probes_always_measured``): the run the budget
    of the probes beyond them is a share of. None before (the best probe's rate stands in), for a
    job of unknown size, once every probe is measured, or where no plan fits."""
    measured, designed = state.probes_issued, len(state.probes)
    if not obs.remaining or not probes_always_measured(designed) <= measured < designed:
        return None
    deadline_s = None if state.deadline_at_s is None else state.deadline_at_s - obs.now_s
    try:
        return initial_plan(_fit_profile(state), state.quota, state.objective, samples=obs.remaining,
                            deadline_s=deadline_s, batch_size=state.batch_size).predicted_throughput
    except InvalidInputError:
        return None


def _fit_profile(state: ControllerState) -> JobModel:
    """The profile's fit; marked partial (``FitReport.partial``) when the profile ended before the
    probes that identify the model (``probes.profile_is_partial``)."""
    model = fit_job_model(pd.DataFrame(list(state.profile)), state.prior, table_capacity_mb=state.table_mb,
                          largest_table_mb=state.largest_table_mb, prior_weight=state.prior_weight)
    if state.prior is None and profile_is_partial(state.probes_issued, len(state.probes)):
        throughput = model.throughput
        model = replace(model, throughput=replace(throughput, report=replace(throughput.report, partial=True)))
    return _with_start(model, state)


def _with_start(model: JobModel, state: ControllerState) -> JobModel:
    """``model`` with its tables at least as large as the job's are at its start (``table_start_mb``):
    every fit and refit. Windows of near PS counts (89 and 87) cannot tell the tables from a PS's
    base: within the memory's noise the fit puts them in the base (T₀ = 0), and a plan on it
    would size fewer PS for no tables at all."""
    memory = model.memory
    if state.table_start_mb is None or memory is None or memory.table_mb is None:
        return model
    return replace(model, memory=replace(memory, table_mb=max(memory.table_mb, state.table_start_mb)))


def _plan(state: ControllerState, obs: Observation) -> tuple[ControllerState, list[Action]]:
    """The plan for what remains of the job (:func:`initial_plan`; of an unknown size once none
    remains). A plan that extrapolates past
    the probes (:func:`plan_needs_check`) of a job that profiled is measured first
    (``PLAN_CHECK_WINDOWS`` probe windows), at most ``PLAN_CHECK_PROBES`` times: the check's
    windows join the profile, the model is refitted and the job planned again."""
    if obs.windows:
        state = replace(state, profile=state.profile + tuple(dict(w) for w in obs.windows))
        state = replace(state, model=_fit_profile(state))
    deadline_s = None if state.deadline_at_s is None else state.deadline_at_s - obs.now_s
    plan = initial_plan(state.model, state.quota, state.objective, samples=obs.remaining or None,
                        deadline_s=deadline_s, batch_size=state.batch_size)
    if not state.profile:
        plan = _last_run_plan(state, plan, obs.remaining or None) or plan
    if (state.profile and state.plan_checks < C.PLAN_CHECK_PROBES and plan_needs_check(plan)
            and obs.remaining != 0):
        window_s = C.PLAN_CHECK_WINDOWS * state.window_s
        numbers = {"extrapolation": ", ".join(f"{k} ×{v:.2g}" for k, v in plan.extrapolation.items()),
                   "window_s": window_s, "check": state.plan_checks + 1, "limit": C.PLAN_CHECK_PROBES}
        return replace(state, plan=plan, plan_checks=state.plan_checks + 1), [
            Probe(Reason.PLAN_CHECK, numbers, config=plan.config, window_s=window_s, apart=state.apart)]
    return replace(state, plan=plan, phase=Phase.TRAINING, since_s=obs.now_s), [
        Launch(Reason.PLANNED, {"reason": plan.reason}, plan=plan)]


def _last_run_plan(state: ControllerState, plan: Plan, samples: float | None) -> Plan | None:
    """A warm start's launch on the configuration its job's last run ended on
    (``last_run_config``: measured, and where that run's fine-tune left it), sized for this run,
    in place of its prior's ``plan``. The prior is the
    newest cold fit (``job_model.choose_prior``): its plan forgets what the fine-tunes since
    measured, and each warm run would climb again from it (measured in the cluster simulation:
    ``docs/evaluation.md``). The fine-tune goes on from here toward the model's plan. None (the
    plan stands): no such run, the same shape, another kind of job, a deadline (the last
    configuration may not meet it), or it does not fit the quota."""
    last = state.last_run_config
    if (last is None or state.objective == Objective.DEADLINE or shape(last) == shape(plan.config)
            or is_allreduce(last) != is_allreduce(plan.config)):
        return None
    why = f"the configuration the last run ended on, measured there, over the prior's plan ({plan.config.describe()})"
    return plan_at(state.model.throughput, state.model.memory, state.quota, state.objective,
                   replace(last, batch_size=state.batch_size), why, samples=samples)


_BEFORE_TRAINING = {Phase.PROFILING: _profile, Phase.FITTING: _fit, Phase.PLANNING: _plan}


# -- 1. failed nodes --------------------------------------------------------------------------


def _recover(state: ControllerState, obs: Observation, failed: list[NodeStatus]) -> tuple[ControllerState, list[Action]]:
    wrong_input = next((n for n in failed if n.exit_code == C.USER_ERROR_EXIT_CODE), None)
    if wrong_input is not None:
        return state, [Fail(Reason.USER_ERROR, {"node": wrong_input.name, "detail": wrong_input.reason},
                            retryable=False, nodes=(wrong_input.name,))]
    keys = {(n.name, n.restarts) for n in failed}
    new = [n for n in failed if (n.name, n.restarts) not in state.failures_reported]
    group = obs.config is not None and is_allreduce(obs.config)  # one failure restarts the whole group
    if group and len(new) < len(failed):  # peers of a reported failure, failed while the group awaits its restart
        state, new = replace(state, failures_reported=state.failures_reported | keys), []
    if new:
        report = {"time_s": obs.now_s, "samples_done": obs.samples_done,
                  "exit_codes": {n.name: n.exit_code for n in new if n.state == NodeState.FAILED}}
        stop = _stop_restarting(state, report, new)
        state = replace(state, failures_reported=state.failures_reported | keys,
                        failure_log=state.failure_log + (report,))
        if stop is not None:
            return state, [stop]
        numbers = {n.name: {"state": _value(n.state), "reason": n.reason} for n in new}
        fail = Fail(Reason.NODE_FAILED, {"node": ", ".join(n.name for n in new), "state": _value(new[0].state),
                                         "detail": new[0].reason, "nodes": numbers, "samples_done": obs.samples_done},
                    retryable=True, nodes=tuple(n.name for n in new))
        return state, [fail]
    wait = _backoff(state, obs, failed)
    if wait is not None:
        return state, [wait]
    actions: list[Action] = []
    config = obs.config
    killed = [n for n in failed if n.state == NodeState.OOM_KILLED and n.memory_mb]
    grown = _grown_memory(state.quota, obs.nodes, killed, _forecast_mb(state, obs))
    for node in failed:
        numbers = {"node": node.name, "state": _value(node.state), "detail": node.reason}
        if node.state == NodeState.UNSCHEDULABLE and node.role == "worker" and config is not None and config.workers > 1:
            actions.append(Resize(Reason.UNSCHEDULABLE, numbers, config=replace(config, workers=config.workers - 1),
                                  remove=(node.name,)))
        elif node.name in grown:
            memory, cap = grown[node.name]
            oom = {**numbers, "memory_limit_mb": node.memory_mb, "cap_mb": cap}
            if memory <= node.memory_mb:
                actions.append(Fail(Reason.OOM_PAST_QUOTA, oom, retryable=False, nodes=(node.name,)))
            else:
                actions.append(Relaunch(Reason.OOM_KILLED, {**oom, "memory_mb": memory}, node=node.name,
                                        memory_mb=memory))
        elif not (group and any(isinstance(a, Relaunch) for a in actions)):  # a group restarts once
            actions.append(Relaunch(Reason.NODE_FAILED, numbers, node=node.name))
    # The detectors' rows of a failed node describe the incarnation that died (an OOM kill's ramp
    # read as a trend would size the next one for a leak): its next incarnation is judged afresh.
    gone = {n.name for n in failed}
    return replace(state, node_history=tuple(r for r in state.node_history if r["node"] not in gone)), actions


def _stop_restarting(state: ControllerState, report: dict, new: list[NodeStatus]) -> Fail | None:
    """``Fail(retryable=False)`` when restarting again cannot help: a node exits with the code a
    node exited with at the last failure, and the job trained nothing since (``CRASH_LOOP``: the
    same crash before any progress, as a bad input or a bug in the trainer fails every start; a
    kill, an OOM kill or a master out of reach (``UNREACHABLE_EXIT_CODE``) is the cluster's, never
    one), or a trainer of the user's passed its ``restart_budget`` (``RESTART_BUDGET``: more failure
    reports within its window)."""
    nodes = tuple(n.name for n in new)
    cluster = (None, 0, *C.SIGKILL_EXIT_CODES, C.UNREACHABLE_EXIT_CODE)
    codes = {code for code in report["exit_codes"].values() if code not in cluster}
    last = state.failure_log[-1] if state.failure_log else None
    if last is not None and report["samples_done"] <= last["samples_done"]:
        again = next((n for n in new if n.exit_code in codes & set(last["exit_codes"].values())), None)
        if again is not None:
            return Fail(Reason.CRASH_LOOP, {"node": again.name, "exit_code": again.exit_code,
                                            "samples_done": report["samples_done"], "detail": again.reason},
                        retryable=False, nodes=nodes)
    if state.restart_budget is not None:
        most, window_s = state.restart_budget
        recent = [r for r in (*state.failure_log, report) if r["time_s"] > report["time_s"] - window_s]
        if len(recent) > most:
            return Fail(Reason.RESTART_BUDGET, {"node": new[0].name, "failures": len(recent), "window_s": window_s,
                                                "max_restarts": most, "detail": new[0].reason},
                        retryable=False, nodes=nodes)
    return None


def restart_backoff_s(failures: int) -> float:
    """The wait before relaunching after the ``failures``-th failure within the restart window:
    0 for the first, then ``RESTART_BACKOFF_S · 2^(failures-2)`` up to ``RESTART_BACKOFF_MAX_S``."""
    return 0.0 if failures <= 1 else min(C.RESTART_BACKOFF_MAX_S, C.RESTART_BACKOFF_S * 2 ** (failures - 2))


def _backoff(state: ControllerState, obs: Observation, failed: list[NodeStatus]) -> Keep | None:
    """``Keep`` while the last failure's backoff (``restart_backoff_s`` of the failures within the
    trainer's restart window, else ``TRAINER_RESTART_WINDOW_S``) has not passed; ``None`` to recover now."""
    if not state.failure_log:
        return None
    window_s = state.restart_budget[1] if state.restart_budget is not None else C.TRAINER_RESTART_WINDOW_S
    last_s = state.failure_log[-1]["time_s"]
    failures = sum(1 for r in state.failure_log if r["time_s"] > last_s - window_s)
    backoff_s = restart_backoff_s(failures)
    if obs.now_s >= last_s + backoff_s:
        return None
    return Keep(Reason.RESTART_BACKOFF, {"node": ", ".join(n.name for n in failed), "failures": failures,
                                         "window_s": window_s, "backoff_s": backoff_s,
                                         "wait_s": last_s + backoff_s - obs.now_s})


def _forecast_mb(state: ControllerState, obs: Observation) -> dict[str, float]:
    """The memory model's request per role for the running configuration over the whole job
    (PS tables at the samples the job trains), where the controller has a model."""
    memory = state.model.memory if state.model is not None else None
    config = obs.config
    if memory is None or config is None:
        return {}
    samples = obs.samples_total if obs.samples_total is not None else obs.samples_done
    forecast = {"worker": float(memory.worker_request_mb(config.batch_size, samples))}
    if not is_allreduce(config):
        forecast["ps"] = float(memory.ps_request_mb(config.ps, samples))
    return forecast


def _grown_memory(quota: Quota | None, nodes: Iterable[NodeStatus], killed: list[NodeStatus],
                  forecast_mb: dict[str, float]) -> dict[str, tuple]:
    """(new memory, cap) of each OOM-killed node: ``OOM_MEMORY_GROWTH`` × its limit, or the memory
    model's forecast for its role over the job when that is more, rounded up to
    ``MEMORY_GRANULARITY_MB``. The nodes killed together share what the quota leaves beside the
    job's other PS and workers, in proportion to their growth, each on the granularity."""
    want = {n.name: _round_up_mb(max(n.memory_mb * C.OOM_MEMORY_GROWTH, forecast_mb.get(n.role, 0.0)))
            for n in killed}
    if quota is None or not want:
        return {name: (mb, math.inf) for name, mb in want.items()}
    others = sum(n.memory_mb or 0.0 for n in nodes
                 if n.role in ("ps", "worker") and n.state != NodeState.STOPPED and n.name not in want)
    room = quota.memory_mb - others
    scale = min(1.0, room / sum(want.values()))
    out = {}
    for name, mb in want.items():
        cap = mb * scale
        out[name] = (float(math.floor(cap / C.MEMORY_GRANULARITY_MB) * C.MEMORY_GRANULARITY_MB) if scale < 1 else mb, cap)
    return out


def _round_up_mb(mb: float) -> float:
    return float(math.ceil(mb / C.MEMORY_GRANULARITY_MB) * C.MEMORY_GRANULARITY_MB)


# -- 2. usage: the instability detectors --------------------------------------------------------


def _guard(state: ControllerState, obs: Observation) -> tuple[ControllerState, list[Action]]:
    fresh = [row for row in obs.usage if row.get("age_s", math.inf) >= C.NODE_WARMUP_S]
    if obs.config is not None and is_allreduce(obs.config):  # no PS: a row that says "ps" is no node of it
        fresh = [row for row in fresh if row.get("role") != "ps"]
    history = _recent(state.node_history + tuple(fresh))
    if obs.nodes:  # a node that left the job (a PS set replaced, a worker removed) is not judged
        running = {n.name for n in obs.nodes if n.state == NodeState.RUNNING}
        history = tuple(r for r in history if r["node"] in running)
    state = replace(state, node_history=history)
    if not history:
        return state, []
    table = {c: [r.get(c) for r in history] for c in (*METRIC_COLUMNS, "throughput")}
    measured = measured_since_resize(state, obs.config)
    growth, transient = _ps_curve(state, obs, measured)
    events = detect(table, remaining_s=_remaining_s(obs, measured), ps_growth_mb=growth, ps_transient_mb=transient)
    actions: list[Action] = []
    acted: set[str] = set()
    for event in events:
        numbers = {"node": event.node, "event": event.kind, **event.evidence, **_event_numbers(event)}
        action = _heal(state, obs, event, numbers)
        if not isinstance(action, Keep):
            acted.add(event.node)
            if isinstance(action, Resize):  # a whole role changes: judge every node of it afresh
                acted |= {r["node"] for r in history if r["role"] == _role(event.node)}
        actions.append(action)
    if acted:  # healed nodes are judged afresh
        state = replace(state, node_history=tuple(r for r in history if r["node"] not in acted))
    return state, actions


def _heal(state: ControllerState, obs: Observation, event: Any, numbers: dict) -> Action:
    quota, config = state.quota, obs.config
    if event.kind == "hot_ps":
        cpu = _hot_ps_cpu(quota, obs.nodes, event.node, float(event.action.value), event.evidence["cpu_limit"])
        over = _past_quota(quota, obs.nodes, event.node, "cpu", cpu, numbers)
        return over or Heal(Reason.HOT_PS, numbers | {"value": cpu}, node=event.node, cpu=cpu)
    if event.kind == "straggler":
        cpu = config.worker_cpu if config is not None else None
        over = _past_quota(quota, obs.nodes, event.node, "cpu", cpu, numbers) if cpu is not None else None
        return over or Relaunch(Reason.STRAGGLER, numbers, node=event.node, cpu=cpu)
    role = _role(event.node)
    if config is None or role not in ("ps", "worker") or (role == "ps" and is_allreduce(config)):
        return Keep(Reason.OOM_RISK, numbers)
    memory = float(event.action.value)
    target = replace(config, **{f"{role}_memory_mb": max(memory, getattr(config, f"{role}_memory_mb"))})
    if quota is not None and target.memory_mb > quota.memory_mb + 1e-9:
        return Keep(Reason.PAST_QUOTA, {**numbers, "value": memory, "total": target.memory_mb, "unit": "MB",
                                         "limit": quota.memory_mb})
    return Resize(Reason.OOM_RISK, numbers, config=target)


def _hot_ps_cpu(quota: Quota | None, nodes: Iterable[NodeStatus], name: str, asked: float, limit: float) -> float:
    """A hot PS's new CPU: ``asked`` where the quota has room for it, else the most, in half cores,
    that the quota leaves it past its ``limit`` (a partial heal still shortens every step), else
    ``asked`` (which :func:`_past_quota` then refuses)."""
    if quota is None:
        return asked
    room = math.floor((quota.cpu - _held_by_others(nodes, name, "cpu")) * 2 + 1e-9) / 2
    return asked if room >= asked or room <= limit else room


def _past_quota(quota: Quota | None, nodes: Iterable[NodeStatus], name: str, resource: str, value: float,
                numbers: dict) -> Keep | None:
    """``Keep(PAST_QUOTA)`` (with the event's ``numbers``) when giving node ``name`` ``value``
    would take the job's PS and workers past the quota (the master is not planned, so it does
    not count)."""
    if quota is None:
        return None
    attribute, limit, unit = ("cpu", quota.cpu, "cores") if resource == "cpu" else ("memory_mb", quota.memory_mb, "MB")
    total = _held_by_others(nodes, name, attribute) + value
    if total <= limit + 1e-9:
        return None
    return Keep(Reason.PAST_QUOTA, {**numbers, "node": name, "value": value, "total": total, "unit": unit,
                                    "limit": limit})


def _held_by_others(nodes: Iterable[NodeStatus], name: str, attribute: str) -> float:
    """The ``attribute`` (``cpu``, ``memory_mb``) the job's PS and workers other than ``name`` hold
    (the master is not planned, so it does not count)."""
    return sum(getattr(n, attribute) or 0.0 for n in nodes
               if n.role in ("ps", "worker") and n.state != NodeState.STOPPED and n.name != name)


def _recent(rows: tuple[dict, ...]) -> tuple[dict, ...]:
    """The rows of the last ``DETECTOR_HISTORY_WINDOWS`` windows (distinct ``time_s``)."""
    times = sorted({r["time_s"] for r in rows})
    if len(times) <= C.DETECTOR_HISTORY_WINDOWS:
        return rows
    cut = times[-C.DETECTOR_HISTORY_WINDOWS]
    return tuple(r for r in rows if r["time_s"] >= cut)


def _event_numbers(event: Any) -> dict:
    if event.kind == "oom_risk":
        seconds = event.evidence.get("seconds_to_limit")
        near = event.evidence["memory_used_mb"] >= C.OOM_USAGE_FRACTION * event.evidence["memory_limit_mb"]
        return {"when": "now" if near or seconds is None else f"in {seconds:.0f}s", "value": event.action.value}
    return {"value": event.action.value}


def _remaining_s(obs: Observation, measured: list[float]) -> float | None:
    """Seconds to train what remains at the median of ``measured`` (``measured_since_resize``)."""
    if obs.remaining is None or not measured:
        return None
    return obs.remaining / max(float(np.median(measured)), 1e-9)


def _ps_curve(state: ControllerState, obs: Observation,
              measured: list[float]) -> tuple[Callable[[float], float] | None, float]:
    """The OOM forecast's PS terms from the memory model, for the running configuration: a PS's
    growth from now to ``s`` seconds ahead, ``ps_peak_mb(p, n(s)) − ps_peak_mb(p, n(now))`` with
    n(s) = samples done + the measured throughput × s, at most the samples of the job; 0 where the
    samples showed the tables not growing (g fitted as 0: a PS's rise is its allocator's wander, and
    a line through a few seconds of it, extrapolated, once asked a 215 MB PS for 624 MB); None where
    the growth is unknown (pinned), or the job's size or speed is: the trend forecasts. And what a
    PS holds twice for a moment at the job's end (``MemoryModel.ps_transient_mb``; 0 without a
    model). ``measured``: ``measured_since_resize`` of the running configuration."""
    memory = state.model.memory if state.model is not None else None
    config = obs.config
    if memory is None or memory.allreduce or config is None or is_allreduce(config):
        return None, 0.0
    end = obs.samples_total if obs.samples_total is not None else obs.samples_done
    transient = float(memory.ps_transient_mb(config.ps, end))
    if "table_growth_mb_per_m_samples" in memory.pinned:
        return None, transient
    if memory.table_growth_mb_per_m_samples <= 0:
        return (lambda seconds: 0.0), transient
    if obs.samples_total is None or not measured:
        return None, transient
    speed, done = float(np.median(measured)), obs.samples_done
    now_mb = float(memory.ps_peak_mb(config.ps, done))

    def growth(seconds: float) -> float:
        return float(memory.ps_peak_mb(config.ps, min(done + speed * seconds, max(end, done)))) - now_mb

    return growth, transient


def _role(node: str) -> str:
    return node.split("-")[0]


# -- 3. windows: refit and fine-tune ------------------------------------------------------------


def _finetune(state: ControllerState, obs: Observation) -> tuple[ControllerState, Action]:
    config = obs.config
    new = tuple(dict(w) for w in obs.windows)
    refit = _needs_refit(state.windows, new)
    state = replace(state, windows=state.windows + new)
    if config is None or state.model is None:
        return state, Keep(Reason.NOT_MEASURED)
    if refit:
        state = replace(state, model=refit_model(state))
    if _memory_refit_due(state):
        state = replace(state, model=refit_memory(state))
    remaining = obs.remaining
    if remaining is None:
        return state, Keep(Reason.NOT_MEASURED)
    measured = measured_since_resize(state, config)
    deadline_s = None if state.deadline_at_s is None else state.deadline_at_s - obs.now_s
    model = state.model
    decision = decide(model.throughput, model.memory, _less_heals(state.quota, obs), config, measured, remaining, obs.now_s,
                      state.last_resize, state.rejected, objective=state.objective, deadline_s=deadline_s,
                      restart_cost_s=obs.restart_cost_s, transitions=obs.transitions, in_place=obs.in_place,
                      may_explore=state.explorations < C.EXPLORE_MAX_PER_RUN,
                      samples_done=obs.samples_done)
    if decision.reason == Reason.EXPLORED:  # judged once: from now on a resize like any other
        state = replace(state, last_resize=replace(state.last_resize, exploring=False))
    if decision.action == "keep":
        return state, Keep(decision.reason, decision.numbers)
    target = replace(decision.target,  # a running job's tables only grow: never less memory than now
                     worker_memory_mb=max(decision.target.worker_memory_mb, config.worker_memory_mb),
                     ps_memory_mb=max(decision.target.ps_memory_mb, config.ps_memory_mb))
    if state.quota is not None and target.memory_mb > state.quota.memory_mb + 1e-9:
        target = decision.target
    revert = decision.action == "revert"
    exploring = decision.reason in EXPLORATIONS
    record = ResizeRecord(obs.now_s, config, target, float(np.median(measured)), decision.predicted_speedup or 1.0,
                          is_revert=revert, exploring=exploring)
    rejected = state.rejected + ((decision.reject,) if decision.reject is not None else ())
    state = replace(state, last_resize=record, rejected=rejected, since_s=obs.now_s,
                    explorations=state.explorations + exploring)
    return state, Resize(decision.reason, decision.numbers, config=target, expected_speedup=decision.predicted_speedup,
                         revert=revert, reject=decision.reject)


def _less_heals(quota: Quota | None, obs: Observation) -> Quota | None:
    """The quota a resize may plan in: the job's, less what healed nodes hold above their role's
    size (a heal in place survives a resize that does not touch its role, so the resized job
    with it must still fit)."""
    config = obs.config
    if quota is None or config is None:
        return quota
    size = {"ps": (config.ps_cpu, config.ps_memory_mb), "worker": (config.worker_cpu, config.worker_memory_mb)}
    active = [n for n in obs.nodes if n.role in size and n.state != NodeState.STOPPED]
    cpu = sum(max((n.cpu or 0.0) - size[n.role][0], 0.0) for n in active)
    memory = sum(max((n.memory_mb or 0.0) - size[n.role][1], 0.0) for n in active)
    if cpu <= 0 and memory <= 0:
        return quota
    return replace(quota, cpu=quota.cpu - cpu, memory_mb=quota.memory_mb - memory)


def measured_since_resize(state: ControllerState, config: Configuration | None) -> list[float]:
    """Throughput of the windows on the running configuration since it was planned / resized to."""
    if config is None:
        return []
    running = shape(config)
    return [float(w["throughput"]) for w in state.windows
            if w.get("timestamp", math.inf) >= state.since_s and shape(w) == running]


def _needs_refit(windows: tuple[dict, ...], new: tuple[dict, ...]) -> bool:
    """Refit on the first windows of a configuration, and once it has a full block of
    ``REFIT_WINDOWS_PER_CONFIGURATION`` (the refit keeps that many of each): later windows of it
    replace earlier ones of the same configuration and barely move the fit."""
    before = Counter(map(shape, windows))
    after = before + Counter(map(shape, new))
    block = C.REFIT_WINDOWS_PER_CONFIGURATION
    return any(before.get(k, 0) == 0 or before.get(k, 0) < block <= n for k, n in after.items())


def refit_table(state: ControllerState) -> pd.DataFrame:
    """The refit's samples: the profile, plus the last ``REFIT_WINDOWS_PER_CONFIGURATION`` windows
    of each configuration the job ran (hundreds of windows of one configuration would out-weigh
    the probes, and the model would forget every other configuration)."""
    return _samples(_refit_rows(state))


def _refit_rows(state: ControllerState) -> list[dict]:
    kept: dict[tuple, list[dict]] = {}
    for w in state.windows:
        kept.setdefault(shape(w), []).append(w)
    return list(state.profile) + [w for group in kept.values() for w in group[-C.REFIT_WINDOWS_PER_CONFIGURATION:]]


def _samples(rows: list[dict]) -> pd.DataFrame:
    """The rows' sample columns, in the order the rows name them (built from those columns alone)."""
    named = dict.fromkeys(key for row in rows for key in row)
    return pd.DataFrame(rows, columns=[c for c in named if c in _SAMPLE_COLUMNS])


_SAMPLE_COLUMNS = (*CONFIG_COLUMNS, *SAMPLE_TABLE_COLUMNS)


def memory_refit_table(state: ControllerState) -> pd.DataFrame:
    """The memory refit's samples: ``refit_table``'s, and the window of the run with the most
    ``samples_seen`` in each doubling of it that measured the model's memory column: the tables' curve bends
    over the whole run, which the last windows of each configuration do not span."""
    rows = _refit_rows(state)
    spread: dict[int, dict] = {}
    for w in _memory_windows(state):
        doubling = int(np.log2(float(w["samples_seen"])))
        if doubling not in spread or float(w["samples_seen"]) >= float(spread[doubling]["samples_seen"]):
            spread[doubling] = w
    return _samples(rows + [w for w in spread.values() if not any(w is r for r in rows)])


def _memory_windows(state: ControllerState) -> list[dict]:
    """The windows that measured the memory model's column (the PS's; an all-reduce job's
    workers') at a known ``samples_seen`` ≥ 1."""
    allreduce = state.model is not None and state.model.allreduce
    column = "worker_memory_used_mb" if allreduce else "ps_memory_used_mb"
    return [w for w in state.windows
            if _finite(w.get(column)) and _finite(w.get("samples_seen")) and w["samples_seen"] >= 1]


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _layout_bounds(state: ControllerState) -> dict[str, float | None]:
    """The layout's bounds on the tables (all of them, the largest), as the job's current (else
    prior) memory model carries them: the keyword arguments of a memory fit."""
    for model in (state.model, state.prior):
        if model is not None and model.memory is not None and model.memory.table_capacity_mb is not None:
            return {"table_capacity_mb": model.memory.table_capacity_mb,
                    "largest_table_mb": model.memory.largest_table_mb}
    return {"table_capacity_mb": None, "largest_table_mb": None}


def refit_model(state: ControllerState) -> JobModel:
    """The model refitted on ``refit_table`` (memory on ``memory_refit_table``, its tables bounded
    by the layout's capacity the model carries), warm-started from the job's prior (this run's own
    earlier refits saw these samples already and would count them twice), its tables at least the
    job's starting ones (:func:`_with_start`); the current model when the samples cannot be fitted
    (too few configurations and no prior)."""
    try:
        return _with_start(fit_job_model(refit_table(state), state.prior, leave_one_out=False,
                                         prior_weight=state.prior_weight, memory_samples=memory_refit_table(state),
                                         **_layout_bounds(state)), state)
    except InvalidInputError:
        return state.model


def _memory_refit_due(state: ControllerState) -> bool:
    """Whether the job has trained ``MEMORY_REFIT_SAMPLES_GROWTH`` × the samples of the newest row
    its memory model was fitted on, in windows that measured its memory."""
    if state.model is None:
        return False
    newest = max((float(w["samples_seen"]) for w in _memory_windows(state)), default=0.0)
    fitted = state.model.memory.fitted_samples_seen if state.model.memory is not None else 0.0
    return newest > fitted and newest >= C.MEMORY_REFIT_SAMPLES_GROWTH * fitted


def refit_memory(state: ControllerState) -> JobModel:
    """The current model with its memory refitted alone on ``memory_refit_table``, its PS base the
    current model's (else the prior's) where the windows' PS count never varies, its tables at
    least the job's starting ones (:func:`_with_start`; unchanged when those samples cannot be
    fitted)."""
    try:
        memory = fit_memory(memory_refit_table(state), base_from=state.model.memory or (
            state.prior.memory if state.prior else None), **_layout_bounds(state))
        return _with_start(replace(state.model, memory=memory), state)
    except InvalidInputError:
        return state.model


def _value(value: Any) -> Any:
    return getattr(value, "value", value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Configuration):
        return value.to_row()
    if isinstance(value, Plan):
        return value.to_dict(details=False)
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return _value(value)
