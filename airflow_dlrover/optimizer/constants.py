"""Every tuning constant of the optimizer, with its reason and its source.

One place, so that a reviewer can audit the knobs and a user can see what a decision rests on.
Sources: "paper" = DLRover-RM (VLDB'24); "DLRover" = the open-source dlrover 0.6 defaults;
"VPA" = the Kubernetes Vertical Pod Autoscaler recommender; "ours" = our choice, with the reason.
"""

from __future__ import annotations

# --------------------------------------------------------------------------------------------
# Throughput model fit
# --------------------------------------------------------------------------------------------

#: Exponents q of the q-norm that combines the model's bottleneck terms (model.py), tried in
#: the fit. 1 = stages add up; larger = stages overlap and the knee is sharp. (ours, measured:
#: benchmarks/accuracy.py; docs/tuning.md#sharpness_candidates)
SHARPNESS_CANDIDATES = (1.0, 1.5, 2.0, 3.0, 4.0)
#: Exponents a of a node's effective cores λ^a, tried in the fit after q: a worker's or a PS's
#: threads rarely use added cores whole (a serial fraction, lock and memory-bandwidth limits).
#: 1 = every core counts. (ours, measured: the runtime, benchmarks/accuracy.py;
#: docs/tuning.md#scaling_candidates)
SCALING_CANDIDATES = (1.0, 0.85, 0.7, 0.55)
#: Throttle ℓ below one core: a node on λ < 1 core under a CFS quota works at λ·(1 − ℓ·(1 − λ))
#: of a core (model.effective_cores). (ours, measured: benchmarks/runtime.py grid;
#: docs/tuning.md#throttle_candidates)
THROTTLE_CANDIDATES = (0.0, 0.2, 0.4)
#: A core curve other than whole cores must cut the cross-validated MAPE of whole cores by this
#: fraction. (ours: the CV of a few tens of configurations scatters by a few per cent; the simpler
#: form wins a tie)
SCALING_CV_MARGIN = 0.05
#: The least number of configurations for the fit to choose a core curve at all: fewer, each an
#: extrapolation for the others, cannot tell a curve from noise; a grid or a history of twice the
#: parameters can. (ours, measured: benchmarks/fit_error.py; docs/tuning.md#scaling_min_configurations)
SCALING_MIN_CONFIGURATIONS = 20
#: Rounds of the coordinate descent over the core curve's three axes: a second round corrects an
#: exponent chosen while the throttle was still 0. (ours, measured: docs/tuning.md#scaling_rounds)
SCALING_ROUNDS = 3
#: The least number of CPU values of a role for its exponent to be tried. (with two, λ^a and
#: the terms constant in λ cannot be told apart)
SCALING_MIN_CPU_VALUES = 3
#: q when the samples are too few to choose (fewer than #free parameters + 2 configurations).
DEFAULT_SHARPNESS = 2.0
#: Up to this many configurations the fit measures its out-of-sample error leaving one
#: configuration out (one refit each); above, by grouped k-fold. (ours: ≤ 30 refits ≈ 0.1 s)
LOCO_MAX_CONFIGURATIONS = 30

#: Folds of the grouped (by configuration) cross-validation that chooses q. (ours)
SHARPNESS_CV_FOLDS = 5

#: Pull toward the prior when refitting from a warm start: a relative change of r in one parameter
#: costs this × r², as a relative error r would on this many sample rows. (ours, measured:
#: benchmarks/accuracy.py; docs/tuning.md#warm_start_prior_weight)
WARM_START_PRIOR_WEIGHT = 0.3

#: Half-life of a sample's weight when refitting, in number of newer samples. Recent samples
#: reflect the current data and cluster; older ones fade. (ours)
RECENCY_HALF_LIFE_SAMPLES = 50.0

#: Relative singular value below which a direction of the design is treated as unidentified and
#: its parameters pinned (to the prior, or to zero). (ours; numpy's default rcond is ~1e-15)
IDENTIFIABILITY_RCOND = 1e-6

#: Relative noise assumed when the fit has no residual degrees of freedom (as many
#: configurations as free parameters): the spread between repeated profiling windows of one
#: configuration on a shared machine. (ours, measured: docs/tuning.md#default_relative_noise)
DEFAULT_RELATIVE_NOISE = 0.10

#: Smallest relative noise the uncertainty band will claim, even for a perfect fit. (ours)
MIN_RELATIVE_NOISE = 0.01

#: σ of a normal error whose mean absolute value is 1: the band's noise is at least this times
#: the out-of-sample MAPE (leave-one-configuration-out, else the sharpness cross-validation), so
#: that model-form error, not only replicate noise, widens the band. (sqrt(π/2))
MAPE_TO_SIGMA = 1.2533

#: Reweighted NNLS rounds of the throughput fit (``model._solve``). Its linear residual
#: (X/X̂)^q − 1 weighs an under-prediction more than an over-prediction of the same size
#: ((1.1)^3 − 1 = 0.33 against 1 − 0.9^3 = 0.27 at q = 3), so one NNLS leans towards predicting
#: too much; weighting each row by log(ρ)/(ρ − 1) at the last round's ρ = (X/X̂)^q makes the
#: residual q·log(X/X̂): a symmetric error. 1 = plain NNLS. (ours: iteratively reweighted least
#: squares, Gauss–Newton on the log error; measured: docs/tuning.md#log_error_iterations)
LOG_ERROR_ITERATIONS = 3

#: z-value of the prediction band (two-sided 90 %). (ours)
BAND_Z = 1.645

# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------

#: Safety margin on the forecast peak memory of a node. VPA's recommender uses 15 %
#: (`safetyMarginFraction`). (VPA)
MEMORY_MARGIN_FRACTION = 0.15

#: Minimum absolute headroom of a worker above its forecast peak, MB: small nodes need more than
#: 15 %. It covers the largest short rise above a node's steady working set, the finishing
#: worker's (its held-out evaluation and the export); a PS's checkpoint is covered by its own term
#: (``MemoryModel.ps_request_mb``). (ours, measured: docs/tuning.md#memory_min_headroom_mb)
MEMORY_MIN_HEADROOM_MB = 96.0
#: ... and of a PS, MB: its checkpoint and restore have their own term (``PS_TABLE_COPY_FACTOR``)
#: and its request covers the most a measured peak passed the fit (``MemoryModel.ps_peak_excess_mb``);
#: what is left is a steady node's wander between windows, ±5 MB, and 32 MB is a rise as
#: ``OOM_MIN_RISE_MB`` reads one. (ours, measured: the demo; docs/tuning.md#ps_min_headroom_mb)
PS_MIN_HEADROOM_MB = 32.0
#: A role's margin grows with each of the job's last this many runs in which one of its nodes was
#: OOM-killed (``memory.margin_after_ooms``), and is VPA's again this many runs after the last.
#: VPA's recommender keeps 8 days of memory peaks and OOM events ("N = 8 to capture weekly peaks",
#: its design proposal). (VPA)
MEMORY_OOM_HISTORY_RUNS = 8

#: What a PS holds above its tables while it restores a checkpoint, one table
#: at a time, as a multiple of that table's share (``MemoryModel.ps_transient_mb``): the file's
#: ids, rows and accumulators beside the table it fills, and their index temporaries. (ours,
#: measured by tracemalloc: tests/runtime/test_ps_master.py; docs/tuning.md#ps_table_copy_factor)
PS_TABLE_COPY_FACTOR = 1.25

#: Memory requests are rounded up to this granularity, MB. VPA rounds nothing (its recommendations
#: are bytes; ``--humanize-memory`` shows them in MiB to 0.01); 16 keeps a request a readable
#: quantity ("272Mi") and costs a node at most 16 MB. (VPA; ours, measured:
#: benchmarks/demo_accuracy.py; docs/tuning.md#memory_granularity_mb)
MEMORY_GRANULARITY_MB = 16
#: The least memory a node is given: less holds no Python process with numpy (a bare
#: interpreter ~10 MB, numpy's import ~30 MB). (ours)
NODE_MIN_MEMORY_MB = 64

#: The PS tables' curve (``memory.fit_memory``) is fitted, beside the line, only on samples that
#: were measured at this many distinct ``samples_seen``: through two points every line fits, and
#: a bend needs a third. (ours: the least that identifies a curvature)
MEMORY_CURVE_MIN_POINTS = 3
#: ... over which the line rises at least this much a node, MB: a steady node's memory wanders
#: ±5 MB between 3 s windows (the measurement behind ``OOM_MIN_RISE_MB``), and a bend within that
#: wander is noise. (ours, measured)
MEMORY_CURVE_MIN_RISE_MB = 32.0
#: The curve is kept where an F-test of it against the line (one parameter more: the asymptote)
#: rejects the line at this level: a curve that under-predicts the growth costs an OOM kill, so
#: the growth must be seen slowing, not guessed. (ours: the usual 1 % level)
MEMORY_CURVE_SIGNIFICANCE = 0.01
#: The F-test's noise is at least this, MB per row: a window's mean RSS is not repeatable below a
#: few allocator pages, and on noise-free rows a curve would "beat" a line by rounding. (ours)
MEMORY_NOISE_FLOOR_MB = 1.0
#: The controller refits the memory model alone once the job has trained this many times the
#: samples of the newest row the model was fitted on (``MemoryModel.fitted_samples_seen``): the
#: refits of the throughput model come with a configuration's first windows, and a run that keeps
#: its configuration would otherwise never show the memory model its tables slowing. Doubling
#: spreads the refits evenly in log(samples), where the curve bends. (ours)
MEMORY_REFIT_SAMPLES_GROWTH = 2.0

# --------------------------------------------------------------------------------------------
# Planner
# --------------------------------------------------------------------------------------------

#: The planner's search range (``planner.search_range``): as many workers and PS as the quota's
#: cores allow at the smallest node size, up to these: the production DLRM jobs DLRover-RM
#: optimises run with hundreds of workers, and a PS-heavy job with tables of hundreds of GB needs
#: hundreds of PS. CPU per node from ``GRID_CPU_VALUES``, in cores.
PLAN_MAX_WORKERS = 1024
PLAN_MAX_PS = 256
GRID_CPU_VALUES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: GPUs per worker searched when the quota has GPUs.
GRID_GPU_VALUES = (1, 2, 4, 8)
#: Relative slack on the planner's bound of a box of configurations where its continuous
#: relaxation (the best worker/PS ratio between two integers) stands in for the integers: float
#: rounding must never prune the box that holds the optimum. (ours: rounding is ~1e-15, and a box
#: kept for nothing is only split again)
PLAN_BOUND_SLACK = 1e-9
#: A box of at most this many configurations is split into its rows (one worker count each, whose
#: bound is exact), and a row of at most ``PLAN_EXPAND_ROW`` PS counts into its configurations,
#: rather than halved again: the vectorised evaluations cost less than the rounds that would split
#: them. (ours, measured: benchmarks/planner_scale.py; docs/tuning.md#plan_rows_box)
PLAN_ROWS_BOX = 128
PLAN_EXPAND_ROW = 16

#: Efficiency objective (knee rule): keep adding cores while an extra core still buys at least
#: this fraction of the throughput per core of the most efficient configuration. (ours; the
#: same shape as DLRover's marginal-speed rule, which stops adding workers when the marginal
#: speed-up per worker falls below a fraction of the average)
KNEE_MARGINAL_FRACTION = 0.5

#: The planner considers node sizes (``worker_cpu``, ``ps_cpu``) up to this multiple of the
#: largest the model was fitted on, no further: a fit on probes of ≤ 4 cores that plans one PS of
#: 32 cores extrapolates 8×. The fine-tune's measurements extend the range as the job grows.
#: (ours, measured: benchmarks/simulate.py; docs/tuning.md#node_cpu_trust_multiple)
NODE_CPU_TRUST_MULTIPLE = 2.0

#: The throughput objective's near-ties: of the fastest configurations (the plan and its
#: alternatives), those predicted within this fraction of the fastest are ranked by the band's
#: lower end, so that the plan goes to the one the model is surest of (in practice the one
#: nearest the probes). The fraction is the gain the fine-tune never resizes for
#: (``MIN_RESIZE_SPEEDUP``): below it two plans are alike. (ours)
PLAN_TIE_FRACTION = 0.05

#: A cold launch whose plan extrapolates past the probes (``Plan.extrapolation``) first measures
#: it for ``PLAN_CHECK_WINDOWS`` probe windows on the running job, refits and plans again, at most this many times
#: (``controller.plan_needs_check``): the plan is then an interpolation, and its prediction rests
#: on a measurement of it. The job trains at the plan meanwhile, so a check costs a resize, not
#: lost samples. (ours)
PLAN_CHECK_PROBES = 2

#: Failures of one node a task before training (the profile, the plan's check) recovers at once (a
#: probe is no task's try); one more fails the task, retryably: its retry starts the phase again, and
#: Airflow's retries bound a node that keeps failing. (ours: a probe OOM-killed twice is grown
#: ×1.5² = 2.25, past what any probe's share of the quota needed)
FAILURES_BEFORE_TRAINING = 3

#: A trainer of the user's fails for good past this many failures within
#: ``TRAINER_RESTART_WINDOW_S`` (its ``max_restarts``, ``restart_window_s``): a crash that survives
#: restarts is the trainer's, and restarting it for ever hides it. (DLRover's elastic agent's
#: ``max_restarts`` default, 3; torchrun's is 0)
TRAINER_MAX_RESTARTS = 3
TRAINER_RESTART_WINDOW_S = 600.0
#: Backoff before the k-th relaunch within ``TRAINER_RESTART_WINDOW_S``: none for the first (a
#: killed node comes back at once), then ``RESTART_BACKOFF_S · 2^(k-2)`` up to
#: ``RESTART_BACKOFF_MAX_S``, so a node that keeps failing for a reason outside the job (a bad host,
#: a registry, a full disk) is retried ever more slowly. (Kubernetes' CrashLoopBackOff: 10 s doubling
#: to 300 s; shorter here, where restarts within the window are bounded by ``max_restarts``)
RESTART_BACKOFF_S = 5.0
RESTART_BACKOFF_MAX_S = 60.0
#: A plan check's window, in probe windows: the job trains on its plan meanwhile, so a longer
#: window costs no training, and a short one adds its own noise to the check. (ours, measured:
#: the cold demo; docs/tuning.md#plan_check_windows)
PLAN_CHECK_WINDOWS = 4

#: Number of alternative plans reported beside the chosen one. (ours)
PLAN_ALTERNATIVES = 5

#: Default prices when the quota gives none: per core-hour and per GB-hour. The ratio is about
#: that of on-demand vCPU-hour and GB-hour prices on the large clouds (~$0.04 vs ~$0.005). (ours)
DEFAULT_PRICE_PER_CORE_HOUR = 1.0
DEFAULT_PRICE_PER_GB_HOUR = 0.125

# --------------------------------------------------------------------------------------------
# Probe design
# --------------------------------------------------------------------------------------------

#: Probes use at most this fraction of the quota's cores, so profiling is cheap ... (ours)
PROBE_QUOTA_FRACTION = 0.5
#: Resident memory of a PS process before any embedding row: the interpreter, numpy and the
#: runtime's imports (ours, measured: a PS of the default job; docs/tuning.md#ps_process_base_mb).
#: A cold probe's PS gets at least this plus its share of the layout's tables, with the usual margin.
PS_PROCESS_BASE_MB = 136.0
#: ... but at least this many cores (or the whole quota, if smaller): under half of a small quota
#: too few distinct probes fit to identify the model (2 cores: 1 probe against 9). (ours)
PROBE_MIN_BUDGET_CORES = 4.0
#: Candidate values for probe configurations: powers of two over the planner's whole range
#: (``PLAN_MAX_WORKERS``, ``PLAN_MAX_PS``), of which the budget keeps those that fit, so that the
#: design can reach the region a large quota's plan lies in. (ours, measured:
#: benchmarks/cluster_sim.py's large families; docs/tuning.md#probe_workers)
PROBE_WORKERS = tuple(2**k for k in range(PLAN_MAX_WORKERS.bit_length()))
PROBE_PS = tuple(2**k for k in range(PLAN_MAX_PS.bit_length()))
PROBE_CPU = (0.5, 1.0, 2.0, 4.0)
#: A cold start profiles at least this many configurations (the product's floor for a cold profile) ...
MIN_PROBES_COLD = 4
#: ... and this many more than the parameters to identify, so that the fit can choose its
#: sharpness by cross-validation and measure its own out-of-sample error. (ours, measured:
#: benchmarks/accuracy.py; docs/tuning.md#probes_beyond_parameters)
PROBES_BEYOND_PARAMETERS = 2
#: A job with no history of its own but a prior from jobs like it (``optimizer.similarity``)
#: profiles at least this many configurations: two points rescale a prior's level on the two
#: bottlenecks a PS job has (its workers' and its PS's), and show where the prior is wrong. (ours)
MIN_PROBES_SIMILAR = 2
#: ... from jobs at least this alike (``similarity.similarity``: ½ is a factor 2 in the lookups a
#: sample makes, or in their width); a job less alike starts cold. (ours)
SIMILAR_PRIOR_MIN_SIMILARITY = 0.5
#: A warm start (a prior throughput and memory model of the same job exist) profiles this many:
#: none. The prior plans, and the fine-tune re-scales it from the job's own windows at the
#: planned configuration, which cost no relaunch and train at full speed. (paper: recurring jobs
#: are pre-tuned from history; ours, measured: benchmarks/simulate.py; docs/tuning.md#min_probes_warm)
MIN_PROBES_WARM = 0
#: A cold profile measures the design's probes beyond those that identify the parameters
#: (``probes.probes_always_measured``), the most informative first, while one more keeps it within
#: this fraction of the job's run time as it looks so far (``probes.next_probe_in_budget``): the
#: paper profiles ~3 minutes of an hours-long job, 5 % of one hour; not tuned on the simulation.
PROFILE_BUDGET_FRACTION = 0.05
#: ... and the probes that identify the model's parameters while it stays within this fraction:
#: past it the job is too short to pay for them, and it runs on a partial fit that no later run
#: takes as its prior (``probes.profile_is_partial``). (ours, not tuned: a cold plan's gain over
#: a plan from four probes is a few tens of per cent of the run — the cluster simulation's cold
#: JCTs, docs/evaluation.md —, so probes past a quarter of it cannot pay for themselves)
PROFILE_SHORT_JOB_FRACTION = 0.25
#: Up to this many probes their visiting order is the exact cheapest path (Held–Karp, 2ⁿ·n²:
#: ~10 ms at 10); past it, nearest-neighbour. (ours: a profile always measures ~6–10)
PROBE_ORDER_EXACT_MAX = 12
#: Two candidate probes whose information gain is within this fraction count as equal, and the
#: cheaper one (fewer cores) wins. (ours)
PROBE_TIE_FRACTION = 0.02

# --------------------------------------------------------------------------------------------
# Fine-tune policy
# --------------------------------------------------------------------------------------------

#: Never resize more often than this, seconds. DLRover's job-level optimizer re-plans on a
#: period of minutes; 5 minutes also leaves time to measure the last resize. (ours, after DLRover)
MIN_RESIZE_INTERVAL_S = 300.0

#: Resize only when the predicted saving of job time exceeds this multiple of the resize cost
#: (hysteresis against noise and model error). (ours)
RESIZE_GAIN_MULTIPLE = 2.0

#: ...and only when the predicted speed-up, taken at the pessimistic end of the band, is at least
#: this. On a flat curve the speed-up is ~1 and the policy keeps. (ours)
MIN_RESIZE_SPEEDUP = 1.05

#: What a resize costs is not a constant: ``optimizer.transitions`` holds the runtime's measured
#: table (``benchmarks/runtime.py transitions``), Kubernetes' pod start added on pods.

#: Revert a resize when the measured speed-up delivered less than this fraction of the predicted
#: gain (speed-up − 1). (ours)
REVERT_DELIVERED_FRACTION = 0.25

#: Exploration (``finetune.decide``): a resize to the model's best plan that the pessimistic test
#: refuses is still tried when the model is unsure there (its 90 % band at least
#: ``EXPLORE_MIN_BAND`` of the prediction: a shape far from what was measured), its predicted
#: speed-up is at least ``EXPLORE_MIN_SPEEDUP``, and the saving at that speed-up is at least
#: ``RESIZE_GAIN_MULTIPLE`` × the cost of the resize *and* of its revert; at most
#: ``EXPLORE_MAX_PER_RUN`` a run. It is judged and reverted as any resize (the revert excludes the
#: shape), and its windows teach the refit what the probes could not. Where the mean's plan does not
#: qualify (or already runs), the plan of one draw of the fit's posterior is tried on the same
#: terms, its speed-up the draw's (``finetune.posterior_draw``: Thompson sampling). An efficiency
#: run past a knee it is as unsure of explores the knee on the same band, when the core-hours its
#: mean saves pay for the resize and its revert (``finetune._knee_exploration``). (ours: act on
#: a plausible model where the band is wide and the stake pays; measured: benchmarks/simulate.py;
#: docs/tuning.md#explore_min_band)
EXPLORE_MIN_BAND = 0.3
EXPLORE_MIN_SPEEDUP = 1.15
EXPLORE_MAX_PER_RUN = 2

#: Observations of the new configuration needed before judging a resize. (ours)
MIN_OBSERVATIONS_TO_JUDGE = 3

#: A refit uses the profile plus this many most recent windows of each configuration the job ran:
#: hundreds of windows of one configuration would otherwise out-weigh the probes and the model
#: would forget every other configuration. The controller refits on a configuration's first
#: windows and once it has this many; later ones replace earlier windows of the same configuration
#: and move the fit by less than its noise. (ours)
REFIT_WINDOWS_PER_CONFIGURATION = 6

# --------------------------------------------------------------------------------------------
# Instability detectors
# --------------------------------------------------------------------------------------------

#: After healing, target this utilisation for the hot PS. (ours)
HOT_PS_TARGET_UTILISATION = 0.7
#: A PS is hot when its CPU use is at least this fraction of its allocation ... Below DLRover's
#: 0.9 (its ``ps_cpu_hot_threshold``): a synchronous step waits for every PS's reply, and a PS's
#: reply time grows as S/(1 − ρ) (M/M/1) long before its limit — 2× its service time S at half
#: its limit, where the others, at 1/``HOT_PS_SKEW`` of its load, reply within 1.5× theirs —; and
#: a PS whose threads cannot use its whole allocation never reaches 0.9 (the cluster simulation's
#: queueing PS hold their job back at 62–73 % of their limit). (ours: the tuning seeds of
#: benchmarks/simulate.py, 0.5 against 0.7 and 0.9; docs/tuning.md#hot_ps_utilisation)
HOT_PS_UTILISATION = 0.5
#: ... and at least this multiple of the median PS utilisation (skew), when there are ≥ 2 PS.
HOT_PS_SKEW = 1.5

#: A worker straggles when its speed over the window is below this fraction of the median worker
#: speed. (ours; DLRover flags workers much slower than the median)
STRAGGLER_SPEED_FRACTION = 0.6
#: Straggler detection needs this many speed observations per worker. (ours)
STRAGGLER_MIN_OBSERVATIONS = 3

#: OOM risk when the memory forecast crosses the limit within this horizon, seconds. (ours: time
#: to checkpoint and relaunch with more memory before the kernel kills the process)
OOM_HORIZON_S = 600.0
#: ... or when usage is already above this fraction of the limit. (ours)
OOM_USAGE_FRACTION = 0.95
#: A measurement window of the running job: profile samples, fine-tune windows and the detectors'
#: rows. (ours: ≥ 3 worker reports per window)
MEASUREMENT_WINDOW_S = 3.0
#: The detectors look at this many most recent windows of each node: 30 s of 3 s windows. (ours)
DETECTOR_HISTORY_WINDOWS = 10
#: ... leaving out each node's first seconds: its memory ramps while it imports torch and
#: touches its first rows, which a trend reads as a leak. (ours, measured on the runtime)
NODE_WARMUP_S = 10.0
#: The hot-PS rule judges the rows of this many last seconds: the detectors' history, in time. A
#: hot PS is a level, not a trend: a guard that observes less often than every window (a sensor's
#: poke, the cluster simulation's control period) judges its latest rows, not a mean that reaches
#: back to before the PS ran hot. (ours; docs/tuning.md#hot_ps_utilisation)
HOT_PS_WINDOW_S = DETECTOR_HISTORY_WINDOWS * MEASUREMENT_WINDOW_S
#: After a real OOM kill the node comes back with this factor more memory (once per kill),
#: rounded up to ``MEMORY_GRANULARITY_MB``. (ours; DLRover doubles, which overshoots a PS whose
#: tables grow slowly)
OOM_MEMORY_GROWTH = 1.5
#: Memory forecasts need at least this many points. (ours)
OOM_MIN_POINTS = 3
#: ... and a trend counts only once it has risen this much over the series (slope × span): a
#: steady worker's memory wanders ±5 MB between 3 s windows, which a 3-point Theil–Sen slope reads
#: as 70 MB/min. (ours, measured: the runtime; docs/tuning.md#oom_min_rise_mb)
OOM_MIN_RISE_MB = 32.0
#: ... and forecasts at most this multiple of its own span ahead (a 3-window line 90 s, the
#: detectors' full 30 s history 300 s): a node starved of CPU (its quota cut, a busy machine)
#: ramps through its warm-up for longer than ``NODE_WARMUP_S``, and a line through that ramp
#: forecasts a crossing of the limit that never comes. A real leak is still caught with the
#: trusted span's time to spare. The new limit of a node at risk covers the trend as far ahead, no
#: further. (ours, measured: the runtime; docs/tuning.md#oom_trend_extrapolation)
OOM_TREND_EXTRAPOLATION = 10.0

# --------------------------------------------------------------------------------------------
# Probe windows, restart costs and exit codes the controller decides on
# --------------------------------------------------------------------------------------------

#: Seconds each probe is measured for: each second costs every probe, and beyond 1 s the median
#: error barely moves. (ours, measured: benchmarks/probe_window.py; docs/tuning.md#probe_window_s)
PROBE_WINDOW_S = 2.0
#: A probe window ends early once its mean rate is this tight: the ~95 % interval of the mean of its
#: intervals' rates (each every worker's rate between two of its reports), t₀.₉₇₅,ₙ₋₁·s/√n, within
#: this fraction of it (sequential stopping, the Chow–Robbins fixed-width rule; 0: never early).
#: (ours: below the spread of repeated windows on a shared machine, DEFAULT_RELATIVE_NOISE, and of
#: the fit's residuals, 5–8 %: a tighter window buys the fit nothing)
PROBE_STOP_HALFWIDTH = 0.03
#: ... and it has at least this many intervals (a sample standard deviation of fewer says little).
PROBE_MIN_INTERVALS = 3
#: A probe's measurement starts at every worker's first report this long after the resize: the
#: window's rate counts samples from that report on (``launchers.watch``: cumulative counters), so
#: it needs the change in effect, not a whole report interval past it. A CFS quota applies within
#: its 0.1 s period, and an in-place CPU change costs the running job 0.0–0.2 s (the transition table);
#: a joining worker's first report comes after its first steps ...
PROBE_REPORT_AFTER_S = 0.25
#: A probe window waits for every worker's report past its length, up to this factor (ours:
#: a window in which a worker did not report has no rate for it).
PROBE_WINDOW_REPORT_FACTOR = 5.0
#: ... waiting at most this long for it.
PROBE_SETTLE_TIMEOUT_S = 60.0
#: Exit code of a job's node that found a mistake of the user's — its data past the bad-row limit,
#: its model module broken (sysexits' EX_DATAERR). The node writes why to its termination file
#: (a pod's ``/dev/termination-log``); the controller fails the attempt without retry.
USER_ERROR_EXIT_CODE = 65
#: Exit codes of a node that SIGKILL ended (128 + 9 as a shell and the kubelet report it, −9 as
#: ``Popen`` does): something outside the node killed it — the kernel's OOM killer, a lost node,
#: a preemption, an operator's kill — so it is the cluster's failure at any time, even before a
#: trainer's first report, and never a broken contract.
SIGKILL_EXIT_CODES = (137, -9)
#: Exit code of a node of our runtime that gave up on its master or a PS, unreachable past its
#: retries (sysexits' EX_TEMPFAIL): the cluster's failure, never a crash loop — the workers of a
#: job whose master stays down exit one after another, and that is not one crash repeated.
UNREACHABLE_EXIT_CODE = 75
#: Seconds each probe of a trainer of the user's is measured: it reports about once a second, and
#: a mean of ~10 reports per worker damps its step-time noise (ours; cf. PROBE_WINDOW_S, which
#: reads our runtime's exact counters).
TRAINER_PROBE_WINDOW_S = 10.0
#: Cost of restarting a trainer's group (SIGTERM → checkpoint → start → first report) charged by
#: the fine-tune until the job has measured its own (``FineTuneState`` keeps the measured one). (ours)
TRAINER_RESTART_COST_S = 60.0
