"""Reading a trainer's Prometheus endpoint (``TrainerSpec.metrics_port``, ``launchers.contract``),
and the reports sidecar of such a trainer's pods: every ``--every`` seconds it scrapes the
trainer's endpoint on the pod's loopback and prints each new report as a JSON line
(:func:`scrape` / :func:`new_report`), so that the reports are in the sidecar's log: read by the
launcher through the API as a metrics file's lines are, kept with the pod after the trainer
exits, and the same for every process that reads them.

It runs as a native sidecar (an init container with ``restartPolicy: Always``, Kubernetes ≥ 1.29):
the kubelet starts it before the trainer and stops it (SIGTERM) once the trainer has exited.
It imports only the standard library, ``prometheus_client`` and the constants (not pandas, not
torch): it lives in a 64 MiB container (``SCRAPE_SIDECAR_MEMORY_MB``).

    python -m airflow_dlrover.scrape --url http://127.0.0.1:9100/metrics --every 2 \\
        --names '{"throughput": "dlrover_throughput", ...}'
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from airflow_dlrover import timings as T

#: The fields a Prometheus endpoint gives, and the sample each is read from by default.
SCRAPED_FIELDS = {name: f"dlrover_{name}" for name in ("throughput", "samples_done", "samples_total", "loss", "auc")}


def scraped_report(text: str, names: Mapping[str, str], now: float) -> dict[str, float] | None:
    """One report from a Prometheus text page (``prometheus_client``'s parser): each field from its
    sample in ``names``, or that name + ``_total`` (a counter's sample), summed over label sets
    for ``throughput`` and the sample counts and averaged for ``loss``/``auc``; ``time`` = ``now``.
    None without a numeric ``throughput`` or when the page is not Prometheus text."""
    by_sample: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                by_sample.setdefault(sample.name, []).append(float(sample.value))
    except (ValueError, TypeError, IndexError):
        return None
    fields: dict[str, float] = {}
    for field, sample in names.items():
        values = [v for v in by_sample.get(sample) or by_sample.get(f"{sample}_total", []) if math.isfinite(v)]
        if values:
            fields[field] = sum(values) / (len(values) if field in ("loss", "auc") else 1)
    if not math.isfinite(fields.get("throughput", math.nan)) or fields["throughput"] < 0:
        return None
    return {**fields, "time": now}


def scrape(url: str, names: Mapping[str, str], timeout: float = T.TRAINER_SCRAPE_TIMEOUT_S) -> dict[str, float] | None:
    """GET a node's Prometheus endpoint and read one report from it (:func:`scraped_report`); None
    when it does not answer (not serving yet, or gone) or gives no throughput."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read(1 << 22).decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return scraped_report(text, names, time.time())


def new_report(report: Mapping[str, float] | None, last_line: str) -> str | None:
    """The JSON line to keep for a scraped ``report``, or None when it repeats the last line kept
    (the trainer has not updated its gauges since: no new report)."""
    if report is None:
        return None
    try:
        last = json.loads(last_line) if last_line.strip() else {}
    except json.JSONDecodeError:
        last = {}
    values = {k: v for k, v in report.items() if k != "time"}
    if isinstance(last, dict) and values == {k: v for k, v in last.items() if k != "time"}:
        return None
    return json.dumps(dict(report), sort_keys=True)


def scrape_loop(url: str, names: Mapping[str, str], every_s: float, write: Callable[[str], None],
                stop: threading.Event) -> None:
    """Scrape ``url`` every ``every_s`` until ``stop``; ``write`` each new report's JSON line."""
    last = ""
    while True:
        line = new_report(scrape(url, names, timeout=min(every_s, T.TRAINER_SCRAPE_TIMEOUT_S)), last)
        if line is not None:
            write(line)
            last = line
        if stop.wait(every_s):
            return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m airflow_dlrover.scrape", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--every", type=float, default=T.TRAINER_SCRAPE_S)
    parser.add_argument("--names", default=json.dumps(SCRAPED_FIELDS), help="field → sample name (JSON)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def write(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    scrape_loop(args.url, json.loads(args.names), args.every, write, stop)


if __name__ == "__main__":
    main()
