"""The contract between the launcher and a trainer that is not ours (``docs/trainers.md``).

A trainer is an argv list (``TrainerSpec.command``; on Kubernetes run in ``TrainerSpec.image``),
started once per node — ``worker-0 … worker-{w-1}`` and, for a PS trainer, ``ps-0 … ps-{p-1}`` —
with the node's allocation in its cgroup (its pod's requests = limits) and in the environment
(:func:`node_env`, names in :data:`ENV`). Placeholders ``{name}`` in the argv take the same values
(:data:`PLACEHOLDERS`); no shell ever parses them.

What it gives back, one line per report (every few seconds), in ``DLROVER_METRICS_FILE`` (JSON
lines), in its log (``TrainerSpec.log_regex``, named groups), or as Prometheus text served on
``DLROVER_METRICS_PORT`` (``TrainerSpec.metrics_port``; gauges named ``dlrover_<field>`` or as
``metrics_names`` maps them), which is scraped every ``TRAINER_SCRAPE_S`` into the same JSON lines
(``airflow_dlrover.scrape``; on Kubernetes by the pod's reports sidecar):

* ``throughput``: samples/s this node trains (a data-parallel rank: its own batch × steps/s; the
  job's throughput is the sum over the workers);
* ``samples_done`` / ``samples_total``: the job's progress as the node knows it, restored from its
  checkpoint after a restart (the launcher takes the largest over the workers);
* optionally ``loss``, ``auc``, ``time`` (Unix seconds; default: when the file was written).

Exit code 0 when done; on SIGTERM checkpoint within ``DLROVER_GRACE_S`` and exit; on start resume
from ``DLROVER_CHECKPOINT_DIR``. An ``allreduce`` trainer (``torch.distributed``, ``ps = 0``) is
restarted as a whole when a member fails or the job is resized, as torchrun's elastic agent
restarts its worker group; a ``ps`` trainer has only the failed node relaunched.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import string
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from airflow_dlrover import timings as T
from airflow_dlrover.optimizer import constants as C
from airflow_dlrover.optimizer.types import InvalidInputError
from airflow_dlrover.scrape import SCRAPED_FIELDS, new_report, scrape, scraped_report

#: The environment every node of a trainer gets (stable names: the contract).
ENV = (
    "DLROVER_JOB_ID", "DLROVER_ROLE", "DLROVER_INDEX", "DLROVER_WORKERS", "DLROVER_PS", "DLROVER_CPU",
    "DLROVER_MEMORY_MB", "DLROVER_GPU", "DLROVER_BATCH_SIZE", "DLROVER_GLOBAL_BATCH_SIZE", "DLROVER_SAMPLES",
    "DLROVER_CHECKPOINT_DIR", "DLROVER_METRICS_FILE", "DLROVER_METRICS_PORT", "DLROVER_SCRAPE_S", "DLROVER_GENERATION",
    "DLROVER_GRACE_S", "DLROVER_JOB_KEY", "TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
)
#: ``{placeholder}`` → the environment variable whose value it takes.
PLACEHOLDERS = {
    "job_id": "DLROVER_JOB_ID", "role": "DLROVER_ROLE", "index": "DLROVER_INDEX", "workers": "DLROVER_WORKERS",
    "ps": "DLROVER_PS", "cpu": "DLROVER_CPU", "memory_mb": "DLROVER_MEMORY_MB", "gpu": "DLROVER_GPU",
    "batch_size": "DLROVER_BATCH_SIZE", "global_batch_size": "DLROVER_GLOBAL_BATCH_SIZE", "samples": "DLROVER_SAMPLES",
    "checkpoint_dir": "DLROVER_CHECKPOINT_DIR", "metrics_file": "DLROVER_METRICS_FILE",
    "metrics_port": "DLROVER_METRICS_PORT", "generation": "DLROVER_GENERATION", "rank": "RANK",
    "world_size": "WORLD_SIZE", "master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT",
}
KINDS = ("allreduce", "ps")
#: who reports: every worker its own rate (the job's is their sum), or rank 0 (``worker-0``) alone
#: the job's rate and progress, as facebookresearch/dlrm, TorchRec's examples and Hugging Face's
#: Trainer log
REPORTS_FROM = ("every_node", "rank0")
METRIC_FIELDS = ("throughput", "samples_done", "samples_total", "loss", "auc", "time")
#: what a log line may give instead of a rate and a sample count (``log_regex``'s named groups), as
#: trainers log them — facebookresearch/dlrm's ``Finished training it N/M of epoch E, T ms/it``:
#: ``ms_per_it`` (the throughput is the samples of an iteration / its time) and ``iteration`` of
#: ``iterations`` in ``epoch`` (0-based) (samples done: the iterations done × the job's batch)
ITERATION_FIELDS = ("ms_per_it", "iteration", "iterations", "epoch")
#: A node's port in ``TF_CONFIG`` where it has one of its own (a pod; TensorFlow's customary server
#: port) and worker 0's ``torch.distributed`` rendezvous port there (torchrun's default): neither
#: may be a metrics port.
PEER_PORT, RENDEZVOUS_PORT = 2222, 29500
RESERVED_PORTS = (PEER_PORT, RENDEZVOUS_PORT)


@dataclass(frozen=True)
class TrainerSpec:
    """A trainer of the user's (see the module docstring).

    ``command``: the argv (placeholders allowed; numbers are taken as their text, as a DAG with
    ``render_template_as_native_obj`` renders them); ``image``: its container image (Kubernetes);
    ``kind``: ``allreduce`` (no PS; the group restarts as a whole) or ``ps``; ``log_regex``: read
    the reports from the node's log instead of its metrics file (a named group ``throughput``, and
    optionally ``samples_done``, ``samples_total``, ``loss``, ``auc``); ``metrics_port``: read them
    from the Prometheus text the node serves on this port at ``metrics_path`` instead (locally each
    node gets a free port of its own, in ``DLROVER_METRICS_PORT``), each field from the sample
    ``metrics_names`` maps it to (default ``dlrover_<field>``); ``grace_s``: SIGTERM to
    SIGKILL; ``report_timeout_s``: a node that reports nothing this long after its start is the
    user's mistake; ``checkpoint_dir``: where checkpoints survive relaunches, created before the
    first node starts (default: the job's folder locally; on Kubernetes a path on a mounted
    volume); ``workdir``: the local launcher's working folder for the nodes (default: the job's
    folder; on Kubernetes the image's); ``max_restarts`` within ``restart_window_s``: the restart
    budget, as torchrun's ``--max-restarts`` (``controller``: one failure more stops the job);
    ``reports_from``: ``every_node`` or ``rank0`` (:data:`REPORTS_FROM`)."""

    command: tuple[str, ...]
    image: str = ""
    kind: str = "allreduce"
    log_regex: str = ""
    metrics_port: int = 0
    metrics_path: str = "/metrics"
    metrics_names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    grace_s: float = T.TRAINER_GRACE_S
    report_timeout_s: float = T.TRAINER_REPORT_TIMEOUT_S
    checkpoint_dir: str = ""
    workdir: str = ""
    max_restarts: int = C.TRAINER_MAX_RESTARTS
    restart_window_s: float = C.TRAINER_RESTART_WINDOW_S
    reports_from: str = "every_node"

    def __post_init__(self) -> None:
        command = self.command
        if isinstance(command, (list, tuple)):  # a DAG rendering native objects turns "3" into 3
            command = [str(a) if isinstance(a, (int, float)) and not isinstance(a, bool) else a for a in command]
        if isinstance(command, str) or not isinstance(command, (list, tuple)) or not command \
                or not all(isinstance(arg, str) for arg in command):
            raise InvalidInputError("trainer.command", command, "a non-empty argv list of strings (never a shell line)")
        object.__setattr__(self, "command", tuple(command))
        for position, arg in enumerate(self.command):
            try:
                names = [name for _, name, _, _ in string.Formatter().parse(arg) if name is not None]
            except ValueError as err:
                raise InvalidInputError(f"trainer.command[{position}]", arg, f"balanced braces ({err}); write {{{{ for a brace")
            unknown = [name for name in names if name not in PLACEHOLDERS]
            if unknown:
                raise InvalidInputError(f"trainer.command[{position}]", arg,
                                        f"placeholders among {{{'}, {'.join(PLACEHOLDERS)}}}", f"Unknown: {unknown[0]!r}.")
        if self.kind not in KINDS:
            raise InvalidInputError("trainer.kind", self.kind, " | ".join(KINDS))
        if self.reports_from not in REPORTS_FROM:
            raise InvalidInputError("trainer.reports_from", self.reports_from, " | ".join(REPORTS_FROM))
        if self.log_regex:
            try:
                pattern = re.compile(self.log_regex)
            except re.error as err:
                raise InvalidInputError("trainer.log_regex", self.log_regex, f"a valid regular expression ({err})") from None
            if "throughput" not in pattern.groupindex and "ms_per_it" not in pattern.groupindex:
                raise InvalidInputError("trainer.log_regex", self.log_regex,
                                        "a regex with a named group (?P<throughput>…) or (?P<ms_per_it>…)")
        self._check_metrics_endpoint()
        for name in ("grace_s", "report_timeout_s", "restart_window_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise InvalidInputError(f"trainer.{name}", value, "seconds > 0")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise InvalidInputError("trainer.max_restarts", self.max_restarts, "an integer ≥ 0")

    def _check_metrics_endpoint(self) -> None:
        port = self.metrics_port
        if isinstance(port, bool) or not isinstance(port, int) or not (port == 0 or 1024 <= port <= 65535) \
                or port in RESERVED_PORTS:
            raise InvalidInputError("trainer.metrics_port", port,
                                    f"0 (no endpoint) or a port in 1024..65535 other than {RESERVED_PORTS}")
        if port and self.log_regex:
            raise InvalidInputError("trainer.metrics_port", port, "0 when trainer.log_regex is set (one report channel)")
        if not isinstance(self.metrics_path, str) or not re.fullmatch(r"/[A-Za-z0-9._~/-]*", self.metrics_path):
            raise InvalidInputError("trainer.metrics_path", self.metrics_path, "a URL path such as /metrics")
        names = self.metrics_names
        if not isinstance(names, Mapping):
            raise InvalidInputError("trainer.metrics_names", names, f"a mapping from {sorted(SCRAPED_FIELDS)} to sample names")
        for field, sample in names.items():
            if field not in SCRAPED_FIELDS:
                raise InvalidInputError(f"trainer.metrics_names.{field}", sample, f"a key among {sorted(SCRAPED_FIELDS)}")
            if not isinstance(sample, str) or not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", sample):
                raise InvalidInputError(f"trainer.metrics_names.{field}", sample, "a Prometheus sample name")
        object.__setattr__(self, "metrics_names", {**SCRAPED_FIELDS, **names})

    @property
    def reports_via(self) -> str:
        """Where the reports come from: ``file``, ``log`` or ``prometheus``."""
        return "log" if self.log_regex else "prometheus" if self.metrics_port else "file"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "command": list(self.command), "metrics_names": dict(self.metrics_names)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | "TrainerSpec") -> "TrainerSpec":
        if isinstance(data, TrainerSpec):
            return data
        if not isinstance(data, Mapping):
            raise InvalidInputError("trainer", data, "a mapping with a 'command' argv")
        allowed = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise InvalidInputError(f"trainer.{unknown[0]}", data[unknown[0]], f"one of the fields {sorted(allowed)}")
        if "command" not in data:
            raise InvalidInputError("trainer.command", None, "a non-empty argv list of strings")
        return cls(**data)


def trainer_signature(trainer: Mapping[str, Any], batch_size: int) -> dict[str, Any]:
    """A trainer's signature for a prior from similar jobs (``optimizer.similarity``): its kind,
    its program — the image and the command up to its first option (``python train.py``,
    ``python -m pkg``; what follows, the run's data and flags, is not the program) — and the batch."""
    command = tuple(str(part) for part in trainer.get("command", ()))
    first_option = next((i for i, part in enumerate(command) if part.startswith("--")), len(command))
    program = " ".join((trainer.get("image", ""), *command[:max(first_option, 1)])).strip()
    return {"trainer": str(trainer.get("kind", "")), "program": program, "batch": batch_size}


def node_env(*, job_id: str, trainer: TrainerSpec, config: Any, node: Mapping[str, Any], samples: int | None,
             peers: Mapping[str, str], rendezvous: tuple[str, int], checkpoint_dir: str, metrics_file: str,
             generation: int, job_key: str, metrics_port: int = 0) -> dict[str, str]:
    """The contract's environment for one node. ``peers``: node name → ``host:port`` of every node
    (the ``TF_CONFIG`` cluster); ``rendezvous``: worker 0's (host, port) for ``torch.distributed``
    (``MASTER_ADDR``/``MASTER_PORT``); ``config``: the job's :class:`Configuration`; ``job_key``:
    a secret the job's nodes share (``DLROVER_JOB_KEY``), to authenticate each other;
    ``metrics_port``: where the node serves Prometheus text (0: it does not)."""
    role, index = node["role"], int(node["index"])
    workers = [peers[n] for n in sorted((n for n in peers if n.startswith("worker-")), key=_index)]
    ps = [peers[n] for n in sorted((n for n in peers if n.startswith("ps-")), key=_index)]
    tf_config = {"cluster": {"worker": workers, **({"ps": ps} if ps else {})},
                 "task": {"type": role, "index": index}}
    return {
        "DLROVER_JOB_ID": job_id, "DLROVER_ROLE": role, "DLROVER_INDEX": str(index),
        "DLROVER_WORKERS": str(config.workers), "DLROVER_PS": str(config.ps),
        "DLROVER_CPU": f"{node['cpu']:g}", "DLROVER_MEMORY_MB": f"{node.get('memory_mb') or 0:g}",
        "DLROVER_GPU": str(node.get("gpu", 0)), "DLROVER_BATCH_SIZE": str(config.batch_size),
        "DLROVER_GLOBAL_BATCH_SIZE": str(config.batch_size * config.workers),
        "DLROVER_SAMPLES": "" if samples is None else str(samples), "DLROVER_CHECKPOINT_DIR": checkpoint_dir,
        "DLROVER_METRICS_FILE": metrics_file, "DLROVER_METRICS_PORT": str(metrics_port or ""),
        "DLROVER_SCRAPE_S": f"{T.TRAINER_SCRAPE_S:g}" if metrics_port else "", "DLROVER_GENERATION": str(generation),
        "DLROVER_GRACE_S": f"{trainer.grace_s:g}", "DLROVER_JOB_KEY": job_key, "TF_CONFIG": json.dumps(tf_config),
        "MASTER_ADDR": rendezvous[0], "MASTER_PORT": str(rendezvous[1]),
        "WORLD_SIZE": str(config.workers), "RANK": str(index) if role == "worker" else "",
        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "OMP_NUM_THREADS": str(max(1, math.floor(node["cpu"]))),
    }


def _index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def node_argv(trainer: TrainerSpec, env: Mapping[str, str]) -> list[str]:
    """The node's argv: each placeholder replaced by its environment value (no shell)."""
    values = {name: env[variable] for name, variable in PLACEHOLDERS.items()}
    return [arg.format(**values) for arg in trainer.command]


def parse_reports(text: str, log_regex: str = "", written_at: float | None = None,
                  per_iteration: tuple[float, float] | None = None) -> list[dict[str, float]]:
    """The reports in a metrics file (JSON lines) or, with ``log_regex``, in a log: dicts of the
    :data:`METRIC_FIELDS` given, ``throughput`` always. A line the trainer was writing when it was
    read, or one without a numeric throughput, is skipped. Lines without ``time`` get
    ``written_at`` (the file's modification time). A log line's :data:`ITERATION_FIELDS` become
    a throughput and samples done by ``per_iteration``: (samples the job trains an iteration,
    samples the reporting node's rate stands for an iteration)."""
    reports = []
    if log_regex:
        pattern = re.compile(log_regex)
        for match in pattern.finditer(text):
            found = {k: v for k, v in match.groupdict().items() if v is not None}
            fields = {k: v for k, v in found.items() if k in METRIC_FIELDS}
            if per_iteration is not None:
                fields = {**_from_iterations(found, *per_iteration), **fields}
            report = _numbers(fields)
            if report is not None:
                reports.append(report)
    else:
        for line in text.splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            report = _numbers({k: data.get(k) for k in METRIC_FIELDS if data.get(k) is not None}) if isinstance(data, dict) else None
            if report is not None:
                reports.append(report)
    for report in reports:
        report.setdefault("time", written_at if written_at is not None else 0.0)
    return reports


def _from_iterations(found: Mapping[str, str], job_samples: float, node_samples: float) -> dict[str, float]:
    """``throughput`` = node_samples · 1000 / ms_per_it; ``samples_done`` = (epoch · iterations +
    iteration) · job_samples (the iterations of the epochs before, then this one's)."""
    out: dict[str, float] = {}
    try:
        numbers = {k: float(found[k]) for k in ITERATION_FIELDS if k in found}
    except ValueError:
        return out
    if numbers.get("ms_per_it", 0) > 0:
        out["throughput"] = node_samples * 1000.0 / numbers["ms_per_it"]
    if "iteration" in numbers:
        before = numbers.get("epoch", 0.0) * numbers.get("iterations", 0.0)
        out["samples_done"] = (before + numbers["iteration"]) * job_samples
    return out


def _numbers(fields: Mapping[str, Any]) -> dict[str, float] | None:
    try:
        report = {k: float(v) for k, v in fields.items()}
    except (TypeError, ValueError):
        return None
    if not math.isfinite(report.get("throughput", math.nan)) or report["throughput"] < 0:
        return None
    return report


def node_report(reports: list[dict[str, float]]) -> dict[str, Any]:
    """What the launcher keeps of a node's reports since its start, in the shape of our runtime's
    ``/metrics`` node entries: ``reports`` (how many) and ``throughput_sum`` (Σ throughput: the
    window's mean is Δsum / Δreports, :func:`watch.job_throughput`), ``reported_at``,
    ``samples_per_s`` (the last), and the last ``samples_done``, ``samples_total``, ``loss``, ``auc``."""
    if not reports:
        return {"reports": 0, "throughput_sum": 0.0}
    last = reports[-1]
    entry: dict[str, Any] = {"reports": len(reports), "throughput_sum": float(sum(r["throughput"] for r in reports)),
                             "reported_at": last["time"], "samples_per_s": last["throughput"]}
    for name in ("samples_done", "samples_total", "loss", "auc"):
        values = [r[name] for r in reports if name in r]
        if values:
            entry[name] = values[-1]
    return entry


def read_node_report(path: Path, log_regex: str = "") -> dict[str, Any]:
    """:func:`node_report` of a metrics file or log (empty when there is none yet)."""
    try:
        stat = path.stat()
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return node_report([])
    return node_report(parse_reports(text, log_regex, written_at=stat.st_mtime))


def job_progress(reports: Mapping[str, Mapping[str, Any]], states: Mapping[str, str]) -> dict[str, Any]:
    """The job's ``/status`` from its workers' reports and states, as our master answers it:
    ``state`` (``done`` once every worker exited 0; ``training`` else), ``samples_done`` (the
    largest any worker reported), ``samples_total``, ``throughput`` (Σ of the last reports of the
    running workers), and the last ``loss`` / ``auc`` reported."""
    workers = {n: r for n, r in reports.items() if n.startswith("worker-")}
    worker_states = {n: s for n, s in states.items() if n.startswith("worker-") and s != "stopped"}
    done = bool(worker_states) and all(s == "succeeded" for s in worker_states.values())
    progress = [r for r in workers.values() if "samples_done" in r]
    totals = [r["samples_total"] for r in workers.values() if "samples_total" in r]
    status: dict[str, Any] = {
        "state": "done" if done else "training",
        "samples_done": int(max((r["samples_done"] for r in progress), default=0)),
        "samples_total": int(max(totals)) if totals else None,
        "throughput": float(sum(r.get("samples_per_s", 0.0) for n, r in workers.items()
                                if worker_states.get(n) == "running")),
    }
    chief = min(progress, key=lambda r: -r["samples_done"], default={})
    for name in ("loss", "auc"):
        if name in chief:
            status[name] = chief[name]
    return status


__all__ = ["ENV", "ITERATION_FIELDS", "KINDS", "PLACEHOLDERS", "REPORTS_FROM", "SCRAPED_FIELDS", "TrainerSpec",
           "job_progress", "new_report", "node_argv", "node_env", "node_report", "parse_reports", "read_node_report",
           "scrape", "scraped_report"]
