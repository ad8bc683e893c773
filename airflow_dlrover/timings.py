"""Time-outs, poll intervals and sizes of the machinery that runs a job: the launchers, the
supervising loops, the Airflow tasks and triggers, a trainer's reports. None of them decides
anything about the job (``optimizer/constants.py`` holds what the controller decides on); each
states its reason and its source (ours: measured on our runtime, as the comment says).
"""

# --------------------------------------------------------------------------------------------
# Launchers and supervisors
# --------------------------------------------------------------------------------------------


#: The master only hands out shards and checkpoints (our measurement: < 0.1 core, < 200 MB).
MASTER_CPU = 0.5
MASTER_MEMORY_MB = 512.0
#: A local node (a process) must listen within this long of its start (torch import ≈ 3 s).
NODE_START_TIMEOUT_S = 60.0
#: A pod must be Ready within this long: pulling a multi-GB torch image and starting it.
POD_START_TIMEOUT_S = 600.0
#: A pod the scheduler cannot place for this long is unschedulable (cluster-autoscaler usually
#: adds a node within 1–3 min; beyond 5 min the job should shrink or be told).
PENDING_TIMEOUT_S = 300.0
#: A draining worker finishes its shard (``JobSpec.shard_timeout_s``) and exits within this long;
#: after it, it is stopped.
DRAIN_TIMEOUT_S = 120.0
#: ``stop()`` waits this long for a job's pods to disappear.
STOP_TIMEOUT_S = 120.0
#: A Kubernetes launcher's lock on a job (a Lease) not renewed for this long is taken over: its
#: holder died. A holder renews it every ``JOB_LOCK_RENEW_S`` while it holds it, however long its
#: operation (a PS resize whose new pods wait for a node: up to a drain, a pod start and a pending
#: time-out, 120 + 600 + 300 s); four renewals may fail (an API server's brief outage) before it is
#: lost. (ours; the Lease pattern of client-go's leader election, which renews every 2 s of 15)
JOB_LOCK_TTL_S = 60.0
JOB_LOCK_RENEW_S = 12.0
#: A node being replaced gets this long between SIGTERM and SIGKILL (a relaunch: it is replaced
#: from the checkpoint anyway) ...
RELAUNCH_GRACE_S = 2.0
#: ... and this long when the job stops or a node is stopped for good.
STOP_GRACE_S = 5.0
#: A call to a job's master is retried this long while the master is unreachable (a relaunched
#: master reloads its state within seconds; a pod's restart takes longer) ...
MASTER_CALL_TIMEOUT_S = 120.0
#: ... and a watcher's poll of it this long, so that a down master does not stall the watch.
MASTER_POLL_TIMEOUT_S = 5.0
#: Seconds between the polls of a supervising loop (``dlrover-rm train``, profiling).
SUPERVISOR_POLL_S = 0.25
#: Polls of pod / process state while waiting (API-server friendly for pods).
LOCAL_POLL_S = 0.05
POD_POLL_S = 1.0
#: A worker of our runtime reports its rate to the master at most this often while it trains (the
#: fine-tune's windows, ``MEASUREMENT_WINDOW_S``, each hold about three) ...
REPORT_INTERVAL_S = 1.0
#: ... and this often while its job is profiled (``lifecycle.profiling.advance`` sets it on the
#: master for the phase, and the master passes it on in its replies): a probe waits for every
#: worker's report past its change (``PROBE_REPORT_AFTER_S`` + up to an interval), and its window
#: ends early once ``PROBE_MIN_INTERVALS`` interval rates settle (``PROBE_STOP_HALFWIDTH``), which
#: reports a second apart never reach within a window. (ours, measured: three cold demos each, the
#: profile's median 44 → 40 s; each probe's wait for its first report 0.5–1.0 → 0.5 s; no
#: throughput lost that 60 s runs of the demo's plan could see)
PROBE_REPORT_INTERVAL_S = 0.25
#: The report intervals the master accepts (seconds).
REPORT_INTERVAL_RANGE_S = (0.05, 10.0)

# --------------------------------------------------------------------------------------------
# Airflow tasks and triggers
# --------------------------------------------------------------------------------------------

#: A task watching a job (fine-tune, guard) hands its worker slot back once a sibling watching
#: the same job has waited this long for one (``triggers.job.Turns``): ``airflow dags test`` runs
#: one task at a time, a deferred task's trigger inline, and a full pool holds a sibling back the
#: same way. Under a scheduler with a triggerer a resumed sibling waits ~1–3 s. (ours)
SIBLING_WAIT_S = 10.0
#: ... and asks Airflow for its siblings' states this often (one API call each).
SIBLING_CHECK_S = 2.0
#: A task that hands its slot back is rescheduled this long later.
TURN_RESCHEDULE_S = 1.0

# --------------------------------------------------------------------------------------------
# A trainer's reports
# --------------------------------------------------------------------------------------------

#: A trainer of the user's (``launchers.contract``) gets this long between SIGTERM and SIGKILL to
#: write its checkpoint (Kubernetes' default ``terminationGracePeriodSeconds``) ...
TRAINER_GRACE_S = 30.0
#: ... and must write its first report within this long of its start (torch import, rendezvous,
#: data loading); a node that never reports is the user's mistake, not the cluster's. (ours)
TRAINER_REPORT_TIMEOUT_S = 120.0
#: A trainer that serves Prometheus text (``TrainerSpec.metrics_port``) is scraped this often by its
#: pod's reports sidecar (locally: at each of the launcher's reads, at most this often), each scrape
#: given this long. Its reports come about once a second; 2 s keeps ~5 per probe window. (ours;
#: Prometheus' own default interval, 1 min, would see nothing of a 10 s probe)
TRAINER_SCRAPE_S = 2.0
TRAINER_SCRAPE_TIMEOUT_S = 2.0
#: What a trainer's reports sidecar (the launcher's image, stdlib + prometheus_client) gets on
#: Kubernetes, requests = limits: measured 24 MiB RSS and 0.5 % of a core (its start included) over
#: 30 s at one scrape per 2 s (``python -m airflow_dlrover.scrape``, this machine).
SCRAPE_SIDECAR_CPU = 0.05
SCRAPE_SIDECAR_MEMORY_MB = 64
