"""A data-parallel DLRM trained with ``torch.distributed`` (gloo on CPU), written only against the
launcher's contract (``docs/trainers.md``): it does not import airflow_dlrover.

The model: one embedding table per sparse feature (sum of one id), a bottom MLP over the dense
features, pairwise dot-product interaction, a top MLP. The tables are **replicated** on every
rank and wrapped in ``DistributedDataParallel`` with dense gradients: every step all-reduces
the whole model (tables included). That is the simplest correct choice for tables of a few MB;
tables of GB would be sharded (torchrec) — a PS trainer's job.

Data: a deterministic synthetic CTR stream, sample ``i`` a function of ``(seed, i)`` only, with
labels from a hidden logistic model, so that any rank at any world size reads exactly the
samples it is given. Step ``k`` of the group trains the global samples ``[done, done + W·B)``,
rank ``r`` the slice ``[done + r·B, done + (r+1)·B)``; ``done`` (``samples_done``) is saved with
the model, so a group restarted at another size resumes at the first sample not yet trained.

Checkpoint (rank 0, atomic rename): every ``--checkpoint-interval`` seconds and on SIGTERM. The
ranks agree every step on whether to stop and whether to checkpoint (an all-reduce of both flags),
so that a SIGTERM to any of them stops all at the same step, and every rank enters the
checkpoint's barrier at the same step (ranks that decided by their own clocks would wait in
different collectives until gloo's timeout). Reports: one JSON line a second in
``DLROVER_METRICS_FILE`` (``throughput`` of this rank, the job's ``samples_done`` and
``samples_total``, ``loss``; rank 0's last line adds the held-out ``auc``; with ``--reports-from
rank0`` rank 0 alone reports, the job's rate) — or, where the
launcher gives ``DLROVER_METRICS_PORT``, the same as Prometheus gauges ``dlrover_<field>`` served
there (``prometheus_client``), held for two scrapes (``DLROVER_SCRAPE_S``) after the last.

Usage (the launcher sets the environment): ``python train.py [--samples N] [--tables 8]
[--table-size 5000] [--dim 16] [--eval-samples 8192]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

DENSE = 13


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=int(os.environ.get("DLROVER_SAMPLES") or 400_000))
    p.add_argument("--batch-size", type=int, default=int(os.environ.get("DLROVER_BATCH_SIZE") or 512))
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--table-size", type=int, default=5000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--eval-samples", type=int, default=8192)
    p.add_argument("--checkpoint-interval", type=float, default=10.0)
    p.add_argument("--report-interval", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--reports-from", choices=("every_node", "rank0"), default="every_node",
                   help="rank0: rank 0 alone reports, the job's rate (the contract's reports_from='rank0')")
    return p.parse_args(argv)


class DLRM(nn.Module):
    def __init__(self, tables: int, table_size: int, dim: int):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(table_size, dim) for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(DENSE, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        pairs = (tables + 1) * tables // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        vectors = torch.stack([x] + [table(sparse[:, t]) for t, table in enumerate(self.embeddings)], dim=1)
        dots = vectors @ vectors.transpose(1, 2)
        i, j = torch.triu_indices(vectors.shape[1], vectors.shape[1], offset=1)
        return self.top(torch.cat([x, dots[:, i, j]], dim=1)).squeeze(1)


def batch(start: int, count: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Samples ``[start, start + count)`` of the stream: dense features, ids, labels."""
    index = torch.arange(start, start + count, dtype=torch.int64)
    generator = torch.Generator().manual_seed(args.seed)
    weights = torch.randn(DENSE, generator=generator)
    table_bias = torch.randn(args.tables, args.table_size, generator=generator) * 0.5
    ids = torch.stack([((index * 2654435761 + t * 40503) % 2147483647) % args.table_size
                       for t in range(args.tables)], dim=1)
    dense = torch.sin(index[:, None].double() * (torch.arange(1, DENSE + 1, dtype=torch.float64) * 0.6180339)).float()
    logit = dense @ weights + table_bias[torch.arange(args.tables), ids].sum(dim=1) - 0.5
    noise = torch.sin(index.double() * 12.9898).float() * 0.5 + 0.5
    labels = (torch.sigmoid(logit) > noise).float()
    return dense, ids, labels


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (Mann–Whitney U over ranks)."""
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=scores.dtype)
    positives = labels.sum()
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


class Reporter:
    """JSON lines in ``DLROVER_METRICS_FILE``, or gauges on ``DLROVER_METRICS_PORT``."""

    def __init__(self, environ: dict[str, str]):
        self.path, port = environ.get("DLROVER_METRICS_FILE", ""), environ.get("DLROVER_METRICS_PORT", "")
        self.scrape_s = float(environ.get("DLROVER_SCRAPE_S") or 0)
        self.gauges = None
        if port:
            import prometheus_client

            self.registry, self.gauges = prometheus_client.CollectorRegistry(), {}
            self.gauge = lambda name: prometheus_client.Gauge(f"dlrover_{name}", name, registry=self.registry)
            prometheus_client.start_http_server(int(port), addr="0.0.0.0", registry=self.registry)

    def __call__(self, **fields: float) -> None:
        if self.gauges is not None:  # a gauge appears once set: one never set would read 0
            for name, value in fields.items():
                if name not in self.gauges:
                    self.gauges[name] = self.gauge(name)
                self.gauges[name].set(value)
        elif self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps({"time": time.time(), **fields}) + "\n")

    def final(self, **fields: float) -> None:
        """The last report: an endpoint stays up for two scrapes, so that it is read."""
        self(**fields)
        if self.gauges is not None:
            time.sleep(2 * self.scrape_s)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if os.environ.get("MASTER_ADDR", "127.0.0.1") in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))

    torch.manual_seed(args.seed)
    model = DLRM(args.tables, args.table_size, args.dim)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    folder = os.environ.get("DLROVER_CHECKPOINT_DIR") or "checkpoint"
    path = os.path.join(folder, "ddp_dlrm.pt")
    done = 0
    if os.path.exists(path):
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        done = int(state["samples_done"])
    ddp = nn.parallel.DistributedDataParallel(model)
    loss_fn = nn.BCEWithLogitsLoss()
    report = Reporter(dict(os.environ))
    rank0_only = args.reports_from == "rank0"
    reports = rank == 0 or not rank0_only

    def checkpoint() -> None:
        if rank == 0:
            os.makedirs(folder, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "samples_done": done},
                       path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()

    window_start, window_samples, last_checkpoint = time.monotonic(), 0, time.monotonic()
    loss_value = float("nan")
    while done < args.samples:
        due = time.monotonic() - last_checkpoint >= args.checkpoint_interval
        flags = torch.tensor([1.0 if stop["asked"] else 0.0, 1.0 if due else 0.0])
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0].item() > 0:
            checkpoint()
            dist.destroy_process_group()
            return 128 + signal.SIGTERM
        if flags[1].item() > 0:
            checkpoint()
            last_checkpoint = time.monotonic()
        step = min(args.batch_size * world, args.samples - done)
        share = -(-step // world)
        start = done + rank * share
        count = max(0, min(share, done + step - start))
        dense, ids, labels = batch(start, max(count, 1), args)  # a rank past the end still joins the all-reduce
        optimizer.zero_grad()
        loss = loss_fn(ddp(dense, ids), labels) * (count / share)
        loss.backward()
        optimizer.step()
        done += step
        window_samples += step if rank0_only else count
        loss_value = float(loss.detach())
        now = time.monotonic()
        if now - window_start >= args.report_interval:
            if reports:
                report(throughput=window_samples / (now - window_start), samples_done=done, samples_total=args.samples,
                       loss=loss_value)
            window_start, window_samples = now, 0
    checkpoint()
    final = {"throughput": 0.0, "samples_done": done, "samples_total": args.samples, "loss": loss_value}
    if rank == 0:
        with torch.no_grad():
            dense, ids, labels = batch(args.samples, args.eval_samples, args)
            final["auc"] = auc(model(dense, ids), labels)
    dist.destroy_process_group()
    if reports:
        report.final(**final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
