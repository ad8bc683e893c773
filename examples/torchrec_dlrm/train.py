"""A TorchRec DLRM on CPU (gloo) with fbgemm's fused embedding kernels, written only against the
launcher's contract (``docs/trainers.md``, ``reports_from="rank0"``).

Model: ``torchrec.models.dlrm.DLRM`` over an ``EmbeddingBagCollection`` of 26 tables (one id each),
sharded by ``DistributedModelParallel``; the tables train with fbgemm's row-wise Adagrad fused into
the backward (``apply_optimizer_in_backward``), the dense part (DDP) with ``torch.optim.Adagrad``.
Data: a synthetic CTR stream, Zipf-skewed ids; sample ``i`` is a function of ``(seed, i)`` only.
Step ``k`` trains the job's samples ``[done, done + W·B)``, rank ``r`` the slice ``[done + r·B, …)``.
Checkpoint (every ``--checkpoint-interval`` s and on SIGTERM): the sharded tables and their
optimiser state are gathered to rank 0, which saves full tensors (atomic rename); every rank
restores its own shards from them, so a group may resume at another world size.
Reports: rank 0 writes one JSON line a second to ``DLROVER_METRICS_FILE`` with the job's
``throughput``, ``samples_done``, ``samples_total`` and its ``loss``; its last adds the held-out
``auc`` (torchmetrics' ``binary_auroc``) on the ``--eval-samples`` after the job's, which every
rank scores a slice of (the sharded tables answer every rank's lookups) and rank 0 gathers.
"""

import argparse
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchmetrics.functional.classification import binary_auroc
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.models.dlrm import DLRM
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

DENSE, PRIME = 13, 2147483647


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=int(os.environ.get("DLROVER_SAMPLES") or 2_000_000))
    p.add_argument("--batch-size", type=int, default=int(os.environ.get("DLROVER_BATCH_SIZE") or 512))
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--eval-samples", type=int, default=8192)
    p.add_argument("--checkpoint-interval", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args(argv)


class Stream:
    """Samples ``[start, start + count)``: dense features, ids (Zipf by inverse CDF), labels."""

    def __init__(self, args):
        g = torch.Generator().manual_seed(args.seed)
        self.weights = torch.randn(DENSE, generator=g)
        self.table_bias = torch.randn(args.tables, args.rows, generator=g) * 0.5
        self.cdf = torch.cumsum(torch.arange(1, args.rows + 1, dtype=torch.float64) ** -args.zipf, 0)
        self.cdf /= self.cdf[-1].clone()
        self.args = args

    def __call__(self, start, count):
        a = self.args
        index = torch.arange(start, start + count, dtype=torch.int64)[:, None]
        x = (index * 40503 + torch.arange(a.tables) * 69069 + a.seed * 7919 + 1) % PRIME
        for _ in range(3):  # Lehmer steps: x < 2^31, 48271 < 2^16, so no overflow in int64
            x = x * 48271 % PRIME
        ids = torch.searchsorted(self.cdf, x.double() / PRIME).clamp_(max=a.rows - 1)
        dense = torch.sin(index.double() * (torch.arange(1, DENSE + 1, dtype=torch.float64) * 0.6180339)).float()
        logit = dense @ self.weights + self.table_bias[torch.arange(a.tables), ids].sum(1) - 0.5
        labels = (torch.sigmoid(logit) > torch.sin(index[:, 0].double() * 12.9898).float() * 0.5 + 0.5).float()
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"f{t}" for t in range(a.tables)], values=ids.t().reshape(-1),
            lengths=torch.ones(a.tables * count, dtype=torch.int32))
        return dense, sparse, labels


def local_tensors(obj, path=""):
    """``(path, whole size, offsets, tensor)`` of each tensor this rank holds in a state dict: the local
    shards of a ShardedTensor (views of the live state), a plain tensor whole. Each rank holds the
    ShardedTensors of every table (with or without shards) but the optimiser state of its own only."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from local_tensors(value, f"{path}/{key}")
    elif isinstance(obj, ShardedTensor):
        for shard in obj.local_shards():
            yield path, obj.size(), shard.metadata.shard_offsets, shard.tensor
    elif isinstance(obj, torch.Tensor):
        yield path, obj.shape, [0] * obj.dim(), obj


def region(offsets, tensor):
    return tuple(slice(o, o + n) for o, n in zip(offsets, tensor.shape))


def build(args):
    """The sharded DLRM and its optimiser: fused row-wise Adagrad (tables) + Adagrad (dense)."""
    torch.manual_seed(args.seed)
    ebc = EmbeddingBagCollection(device=torch.device("meta"), tables=[
        EmbeddingBagConfig(name=f"t{t}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f"f{t}"])
        for t in range(args.tables)])
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=DENSE,
                 dense_arch_layer_sizes=[64, args.dim], over_arch_layer_sizes=[64, 32, 1])
    apply_optimizer_in_backward(RowWiseAdagrad, model.sparse_arch.parameters(), {"lr": args.lr})
    model = DistributedModelParallel(model, device=torch.device("cpu"))
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                      lambda params: torch.optim.Adagrad(params, lr=args.lr))
    return model, CombinedOptimizer([model.fused_optimizer, dense_opt])


def evaluate(model, stream, args, rank, world):
    """Held-out AUC over samples ``[samples, samples + eval_samples)``: each rank scores its slice,
    rank 0 gathers scores and labels (``None`` on the other ranks)."""
    share = max(1, args.eval_samples // world)
    model.eval()
    with torch.no_grad():
        dense, sparse, labels = stream(args.samples + rank * share, share)
        scored = torch.stack([model(dense, sparse).squeeze(1), labels])
    pieces = [torch.empty_like(scored) for _ in range(world)]
    dist.all_gather(pieces, scored)
    scores, labels = torch.cat(pieces, dim=1)
    return float(binary_auroc(torch.sigmoid(scores), labels.long())) if rank == 0 else None


def main():
    try:
        args = parse_args()
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        assert args.batch_size > 0 and args.samples >= 0
    except (KeyError, ValueError, AssertionError, SystemExit) as e:
        print(f"bad input: {e!r}", file=sys.stderr)
        return 65
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    if os.environ.get("MASTER_ADDR", "127.0.0.1") in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    stop = torch.zeros(2)  # [SIGTERM seen, checkpoint due], all-reduced every step
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, 1.0))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))

    model, optimizer = build(args)
    if rank == 0:
        print(model.plan, flush=True)

    folder = os.environ.get("DLROVER_CHECKPOINT_DIR") or "checkpoint"
    path = os.path.join(folder, "torchrec_dlrm.pt")
    done = 0
    if os.path.exists(path):
        saved = torch.load(path, weights_only=True)
        live = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        for key, _, offsets, tensor in local_tensors(live):  # each rank its own shards, any world size
            tensor.detach().copy_(saved["state"][key][region(offsets, tensor)])
        model.load_state_dict(live["model"])
        optimizer.load_state_dict(live["optimizer"])
        done = int(saved["samples_done"])
        print(f"rank {rank}: resumed at samples_done={done}", flush=True)

    def checkpoint():  # rank 0 gathers every rank's pieces and saves whole tensors
        live = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        parts = [None] * world if rank == 0 else None
        dist.gather_object([(k, s, o, t.detach().clone()) for k, s, o, t in local_tensors(live)], parts)
        if rank == 0:
            os.makedirs(folder, exist_ok=True)
            whole = {}
            for key, size, offsets, tensor in (piece for part in parts for piece in part):
                whole.setdefault(key, torch.empty(size, dtype=tensor.dtype))[region(offsets, tensor)] = tensor
            torch.save({"state": whole, "samples_done": done}, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()

    def report(**fields):
        if rank == 0 and os.environ.get("DLROVER_METRICS_FILE"):
            with open(os.environ["DLROVER_METRICS_FILE"], "a") as f:
                f.write(json.dumps({"time": time.time(), "samples_total": args.samples, **fields}) + "\n")

    stream, loss_fn = Stream(args), torch.nn.BCEWithLogitsLoss()
    window, trained, last_checkpoint, loss = time.monotonic(), 0, time.monotonic(), float("nan")
    while done < args.samples:
        stop[1] = float(time.monotonic() - last_checkpoint >= args.checkpoint_interval)
        flags = stop.clone()
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # every rank stops and saves at the same step
        if flags.any():
            checkpoint()
            last_checkpoint = time.monotonic()
            if flags[0]:  # SIGTERM (a resize): checkpointed; exit as ddp_dlrm does
                dist.destroy_process_group()
                return 128 + signal.SIGTERM
        dense, sparse, labels = stream(done + rank * args.batch_size, args.batch_size)
        optimizer.zero_grad()
        out = loss_fn(model(dense, sparse).squeeze(1), labels)
        out.backward()  # the tables' row-wise Adagrad runs here, inside fbgemm's backward
        optimizer.step()
        step = world * args.batch_size
        done, trained, loss = min(done + step, args.samples), trained + step, out.item()
        if time.monotonic() - window >= 1.0:
            report(throughput=trained / (time.monotonic() - window), samples_done=done, loss=loss)
            window, trained = time.monotonic(), 0
    checkpoint()
    report(throughput=0.0, samples_done=done, loss=loss, auc=evaluate(model, stream, args, rank, world))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
