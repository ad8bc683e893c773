"""A parameter-server DLRM of its own, written only against the launcher's contract
(``docs/trainers.md``): it reads ``TF_CONFIG`` and the ``DLROVER_*`` variables, reports through
``DLROVER_METRICS_FILE`` and nothing else, and does not import airflow_dlrover.

Roles. A **PS** holds the embedding rows whose id ``% p`` is its index (sparse Adagrad on the
rows pushed to it); PS 0 also holds the dense MLP's weights (Adam, in numpy: a PS never imports
torch). It serves pulls and pushes over
``multiprocessing.connection`` authenticated with ``DLROVER_JOB_KEY``. A **worker** pulls the
rows and dense weights a batch needs, runs forward/backward in torch, pushes the gradients —
asynchronous PS training, as TensorFlow's ParameterServerStrategy does.

Data and progress. The synthetic CTR stream (sample ``i`` a function of ``(seed, i)``) is cut
into ``--shards`` fixed shards; worker ``w`` of ``W`` trains the shards ``s ≡ w (mod W)``, each
from the position its progress file (``<checkpoint>/shard-<s>.json``, written every
``--flush-interval`` and on SIGTERM) says. So a relaunched worker — or a new number of workers —
resumes every shard where it was flushed: samples after the last flush are trained twice,
none is skipped. ``samples_done`` is the sum over the shards' files.

Checkpoints. Each PS writes ``ps-<i>.npz`` (the global ids it holds, their rows and Adagrad state)
every ``--checkpoint-interval`` and on SIGTERM, and on start loads every PS file of the last
complete set, keeping its own ids: a new PS count re-partitions the rows. A PS killed without
SIGTERM restarts from its last periodic checkpoint (the updates since are lost, as in any
asynchronous PS job).

Usage (the launcher sets the environment): ``python train.py [--samples N] [--tables 8]
[--table-size 5000] [--dim 16]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Client, Listener

import numpy as np

DENSE = 13


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=int(os.environ.get("DLROVER_SAMPLES") or 400_000))
    p.add_argument("--batch-size", type=int, default=int(os.environ.get("DLROVER_BATCH_SIZE") or 512))
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--table-size", type=int, default=5000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--shards", type=int, default=32)
    p.add_argument("--eval-samples", type=int, default=8192)
    p.add_argument("--checkpoint-interval", type=float, default=10.0)
    p.add_argument("--flush-interval", type=float, default=1.0)
    p.add_argument("--learning-rate", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args(argv)


def batch(start: int, count: int, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples ``[start, start + count)`` of the stream: dense features, global row ids, labels."""
    index = np.arange(start, start + count, dtype=np.int64)
    rng = np.random.default_rng(args.seed)
    weights = rng.standard_normal(DENSE)
    table_bias = rng.standard_normal((args.tables, args.table_size)) * 0.5
    ids = np.stack([((index * 2654435761 + t * 40503) % 2147483647) % args.table_size for t in range(args.tables)], 1)
    dense = np.sin(index[:, None] * (np.arange(1, DENSE + 1) * 0.6180339))
    logit = dense @ weights + table_bias[np.arange(args.tables), ids].sum(axis=1) - 0.5
    labels = (1 / (1 + np.exp(-logit)) > np.sin(index * 12.9898) * 0.5 + 0.5).astype(np.float32)
    rows = ids + np.arange(args.tables) * args.table_size  # one id space over the tables
    return dense.astype(np.float32), rows, labels


def dense_model(tables: int, dim: int):
    """The dense part (bottom MLP, dot interaction, top MLP), in torch: only workers import it, so
    that a PS starts in a fraction of a second."""
    import torch
    from torch import nn

    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.bottom = nn.Sequential(nn.Linear(DENSE, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
            self.top = nn.Sequential(nn.Linear(dim + (tables + 1) * tables // 2, 64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, dense, embedded):
            x = self.bottom(dense)
            vectors = torch.cat([x[:, None], embedded], dim=1)
            dots = vectors @ vectors.transpose(1, 2)
            i, j = torch.triu_indices(vectors.shape[1], vectors.shape[1], offset=1)
            return self.top(torch.cat([x, dots[:, i, j]], dim=1)).squeeze(1)

    torch.manual_seed(0)
    return Dense()


class Adam:
    """Adam (Kingma & Ba, 2015) over numpy arrays: the dense weights PS 0 keeps."""

    def __init__(self, params: list[np.ndarray], lr: float = 0.002, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def step(self, grads: list[np.ndarray]) -> None:
        self.t += 1
        b1, b2 = self.betas
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            p -= self.lr * (m / (1 - b1 ** self.t)) / (np.sqrt(v / (1 - b2 ** self.t)) + self.eps)

    def state(self) -> dict:
        return {"t": self.t, **{f"p{i}": p for i, p in enumerate(self.params)},
                **{f"m{i}": m for i, m in enumerate(self.m)}, **{f"v{i}": v for i, v in enumerate(self.v)}}

    @classmethod
    def load(cls, state) -> "Adam":
        n = sum(1 for k in state.files if k.startswith("p"))
        adam = cls([state[f"p{i}"].copy() for i in range(n)])
        adam.t = int(state["t"])
        adam.m = [state[f"m{i}"].copy() for i in range(n)]
        adam.v = [state[f"v{i}"].copy() for i in range(n)]
        return adam


def atomic_write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


# -- the parameter server ----------------------------------------------------------------------
class ParameterServer:
    def __init__(self, index: int, count: int, args: argparse.Namespace, folder: str):
        self.index, self.count, self.args, self.folder = index, count, args, folder
        self.lock = threading.Lock()
        ids = np.arange(args.tables * args.table_size)
        self.ids = ids[ids % count == index]
        rng = np.random.default_rng(args.seed + 1)
        every = rng.standard_normal((args.tables * args.table_size, args.dim)).astype(np.float32) * 0.05
        self.rows, self.accum = every[self.ids], np.zeros((len(self.ids), args.dim), np.float32)
        self.dense: Adam | None = None  # PS 0: set by the first worker (its initial weights) or the checkpoint
        self.restore()

    def local(self, rows: np.ndarray) -> np.ndarray:
        return rows // self.count  # position of a global id among this PS's ids

    def restore(self) -> None:
        manifest = os.path.join(self.folder, "ps-manifest.json")
        if not os.path.exists(manifest):
            return
        old = json.load(open(manifest))["count"]
        for j in range(old):
            path = os.path.join(self.folder, f"ps-{j}.npz")
            if not os.path.exists(path):  # that PS never checkpointed: its rows start afresh
                continue
            saved = np.load(path)
            mine = saved["ids"] % self.count == self.index
            positions = self.local(saved["ids"][mine])
            self.rows[positions], self.accum[positions] = saved["rows"][mine], saved["accum"][mine]
        dense = os.path.join(self.folder, "dense.npz")
        if self.index == 0 and os.path.exists(dense):
            self.dense = Adam.load(np.load(dense))

    def checkpoint(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        with self.lock:
            path = os.path.join(self.folder, f"ps-{self.index}.npz")
            np.savez(path + ".tmp.npz", ids=self.ids, rows=self.rows, accum=self.accum)
            os.replace(path + ".tmp.npz", path)
            if self.dense is not None:
                dense = os.path.join(self.folder, "dense.npz")
                np.savez(dense + ".tmp.npz", **self.dense.state())
                os.replace(dense + ".tmp.npz", dense)
        if self.index == 0:
            atomic_write(os.path.join(self.folder, "ps-manifest.json"), json.dumps({"count": self.count}))

    def handle(self, request: tuple) -> object:
        kind = request[0]
        with self.lock:
            if kind == "pull":
                return self.rows[self.local(request[1])]
            if kind == "push":
                rows, grads = request[1], request[2]
                positions = self.local(rows)
                np.add.at(self.accum, positions, grads * grads)
                np.add.at(self.rows, positions, -self.args.learning_rate * grads / np.sqrt(self.accum[positions] + 1e-8))
                return True
            if kind == "dense_pull":  # None until a worker gave the initial weights
                return None if self.dense is None else [p.copy() for p in self.dense.params]
            if kind == "dense_init":
                if self.dense is None:
                    self.dense = Adam([np.array(p, np.float32) for p in request[1]])
                return [p.copy() for p in self.dense.params]
            if kind == "dense_push":
                self.dense.step(request[1])
                return True
        raise ValueError(f"unknown request {kind!r}")


def serve(index: int, cluster: dict, args: argparse.Namespace, key: bytes, folder: str) -> int:
    server = ParameterServer(index, len(cluster["ps"]), args, folder)
    server.checkpoint()  # the new partition is on disk before any worker trains on it
    port = int(cluster["ps"][index].rsplit(":", 1)[1])
    listener = Listener(("0.0.0.0", port), authkey=key)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def connection(conn) -> None:
        with conn:
            while True:
                try:
                    request = conn.recv()
                except (EOFError, OSError):
                    return
                conn.send(server.handle(request))

    def accept() -> None:
        while True:
            try:
                conn = listener.accept()
            except Exception:  # a peer without the job's key, or the listener closed
                if stop.is_set():
                    return
                continue
            threading.Thread(target=connection, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    last = time.monotonic()
    while not stop.wait(0.2):
        if time.monotonic() - last >= args.checkpoint_interval:
            server.checkpoint()
            last = time.monotonic()
    server.checkpoint()
    return 128 + signal.SIGTERM


# -- the worker --------------------------------------------------------------------------------
def connect(address: str, key: bytes, timeout_s: float = 60.0):
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Client((host, int(port)), authkey=key)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Shards:
    """The shards of the stream and their progress files (the job's progress)."""

    def __init__(self, args: argparse.Namespace, folder: str):
        self.args, self.folder = args, folder
        size = -(-args.samples // args.shards)
        self.bounds = [(s * size, min(args.samples, (s + 1) * size)) for s in range(args.shards)]

    def path(self, shard: int) -> str:
        return os.path.join(self.folder, f"shard-{shard}.json")

    def position(self, shard: int) -> int:
        try:
            return json.load(open(self.path(shard)))["position"]
        except (FileNotFoundError, json.JSONDecodeError):
            return self.bounds[shard][0]

    def save(self, shard: int, position: int) -> None:
        atomic_write(self.path(shard), json.dumps({"position": position}))

    def done(self) -> int:
        return sum(self.position(s) - a for s, (a, _) in enumerate(self.bounds))


def work(index: int, cluster: dict, args: argparse.Namespace, key: bytes, folder: str) -> int:
    import torch
    from torch import nn

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.makedirs(folder, exist_ok=True)
    workers = len(cluster["worker"])
    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    ps = [connect(a, key) for a in cluster["ps"]]

    def call(j: int, request: tuple) -> object:
        """A request to PS ``j``; a PS that went away (relaunched) is reconnected and asked again."""
        for attempt in range(2):
            try:
                ps[j].send(request)
                return ps[j].recv()
            except (EOFError, OSError):
                if attempt or stop["asked"]:  # the whole group is stopping: its PS go first
                    raise SystemExit(128 + signal.SIGTERM)
                ps[j] = connect(cluster["ps"][j], key)
    shards = Shards(args, folder)
    mine = [s for s in range(args.shards) if s % workers == index]
    positions = {s: shards.position(s) for s in mine}
    metrics = os.environ.get("DLROVER_METRICS_FILE", "")
    model = dense_model(args.tables, args.dim)
    loss_fn = nn.BCEWithLogitsLoss()

    def load_dense() -> None:
        params = call(0, ("dense_pull",))
        if params is None:
            params = call(0, ("dense_init", [p.detach().numpy() for p in model.parameters()]))
        with torch.no_grad():
            for parameter, value in zip(model.parameters(), params):
                parameter.copy_(torch.from_numpy(value))

    def report(**fields) -> None:
        if metrics:
            with open(metrics, "a") as f:
                f.write(json.dumps({"time": time.time(), "samples_done": shards.done(),
                                    "samples_total": args.samples, **fields}) + "\n")

    def pull(rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), args.dim), np.float32)
        owners = rows % len(ps)
        for j in range(len(ps)):
            mask = owners == j
            if mask.any():
                out[mask] = call(j, ("pull", rows[mask]))
        return out

    def flush() -> None:
        for s, position in positions.items():
            shards.save(s, position)

    window, samples, last_flush, loss_value = time.monotonic(), 0, time.monotonic(), float("nan")
    for shard in mine:
        end = shards.bounds[shard][1]
        while positions[shard] < end and not stop["asked"]:
            count = min(args.batch_size, end - positions[shard])
            dense, rows, labels = batch(positions[shard], count, args)
            load_dense()
            flat = rows.reshape(-1)
            embedded = torch.tensor(pull(flat).reshape(count, args.tables, args.dim), requires_grad=True)
            loss = loss_fn(model(torch.from_numpy(dense), embedded), torch.from_numpy(labels))
            model.zero_grad()
            loss.backward()
            grads = embedded.grad.numpy().reshape(-1, args.dim)
            owners = flat % len(ps)
            for j in range(len(ps)):
                mask = owners == j
                if mask.any():
                    call(j, ("push", flat[mask], grads[mask]))
            call(0, ("dense_push", [p.grad.numpy() for p in model.parameters()]))
            positions[shard] += count
            samples += count
            loss_value = float(loss.detach())
            now = time.monotonic()
            if now - last_flush >= args.flush_interval:
                flush()
                report(throughput=samples / (now - window), loss=loss_value)
                window, samples, last_flush = now, 0, now
    flush()
    if stop["asked"]:
        return 128 + signal.SIGTERM
    final = {"throughput": 0.0, "loss": loss_value}
    if index == 0:  # once every shard is trained: the held-out AUC
        while shards.done() < args.samples and not stop["asked"]:
            time.sleep(0.5)
        dense, rows, labels = batch(args.samples, args.eval_samples, args)
        load_dense()
        with torch.no_grad():
            embedded = torch.from_numpy(pull(rows.reshape(-1)).reshape(len(labels), args.tables, args.dim))
            final["auc"] = auc(model(torch.from_numpy(dense), embedded).numpy(), labels)
    report(**final)
    return 0


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann–Whitney U over ranks)."""
    ranks = np.empty(len(scores))
    ranks[np.argsort(scores)] = np.arange(1, len(scores) + 1)
    positives = labels.sum()
    negatives = len(labels) - positives
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = json.loads(os.environ["TF_CONFIG"])
    key = os.environ.get("DLROVER_JOB_KEY", "").encode()
    folder = os.environ.get("DLROVER_CHECKPOINT_DIR") or "checkpoint"
    os.makedirs(folder, exist_ok=True)
    role, index = config["task"]["type"], int(config["task"]["index"])
    if "ps" not in config["cluster"]:
        print("this trainer needs parameter servers (DLROVER_PS ≥ 1)", file=sys.stderr)
        return 65  # the user's configuration: no retry fixes it
    if role == "ps":
        return serve(index, config["cluster"], args, key, folder)
    return work(index, config["cluster"], args, key, folder)


if __name__ == "__main__":
    sys.exit(main())
