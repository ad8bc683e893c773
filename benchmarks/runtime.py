"""Measurements of the training runtime on this machine (run alone: they time real processes).

    python benchmarks/runtime.py grid [--out benchmarks/sim/data/local_grid.csv] [--repeats 1]
    python benchmarks/runtime.py overhead
    python benchmarks/runtime.py recovery
    python benchmarks/runtime.py memory
    python benchmarks/runtime.py transitions [--repeats 3] [--write]
    python benchmarks/runtime.py versus-torchrec [--layouts 26x20000x16 …] [--cores 1 2] [--repeats 3]
    python benchmarks/runtime.py transport

grid      throughput over w, p, λw, λp and batch (total cores ≤ this machine's), each configuration
          measured in each of ``--repeats`` passes, written as a sample table, then the optimizer's
          fit on it: in-sample and leave-one-configuration-out MAPE.
overhead  1 PS + 1 worker against the same DLRM trained in one process on the same cores.
recovery  time from kill-worker / kill-ps to throughput back at 90 %, and the stall of a worker
          add / remove and of a PS change.
memory    peak memory per role against the memory model's prediction.
transitions  what each transition costs a running job (``optimizer.transitions``: an equivalent
          pause), the median over repeats; ``--write`` stores it as the table the controller and
          the simulator read.
versus-torchrec  samples/s per core of the runtime (the best of a few configurations within the
          cores, as cgroup quotas; its synthetic data made as it trains) against TorchRec's DLRM with
          fbgemm's fused kernels (examples/torchrec_dlrm's model and optimisers: row-wise Adagrad in
          the backward), pinned to the same cores, one thread each, on batches made beforehand; per
          layout (tables × rows × dim), the median of the repeats.
transport  what a batch's messages cost to encode and decode: the PS protocol's frame (pickle 5,
          buffers out of band, one array per direction) against a protocol-4 pickle of one array per
          table, on the demo's batches.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from chaos import recovery_s

from airflow_dlrover.launchers.cgroups import CgroupManager
from airflow_dlrover.launchers.local import LocalLauncher
from airflow_dlrover.lifecycle.run import run_job
from airflow_dlrover.optimizer.types import Configuration, parse_faults
from airflow_dlrover.runtime.spec import JobSpec

WARMUP_S = 4.0
MEASURE_S = 8.0


def measure(launcher: LocalLauncher, config: Configuration, job_id: str, batch: int = 512,
            spec: JobSpec | None = None) -> dict:
    """Launch, wait for training to warm up, measure throughput and per-node usage, stop.
    ``spec``: the job (default: synthetic, long enough not to finish)."""
    spec = spec or JobSpec(job_id=job_id, samples=50_000_000, batch_size=batch, checkpoint_interval_s=3600)
    job_id = spec.job_id
    launcher.launch(spec, config)
    try:
        deadline = time.monotonic() + 60
        while launcher.master_call(job_id, "/status")["samples_done"] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{job_id} did not start training")
            time.sleep(0.2)
        time.sleep(WARMUP_S)
        before, t0 = launcher.metrics(job_id), time.monotonic()
        time.sleep(MEASURE_S)
        after, t1 = launcher.metrics(job_id), time.monotonic()
        seconds = t1 - t0
        # the master counts whole shards: use the workers' own sample counters
        trained = sum(after["nodes"][n]["samples"] - before["nodes"].get(n, {}).get("samples", 0)
                      for n in after["nodes"] if after["nodes"][n].get("role") == "worker")
        usage = {role: [] for role in ("worker", "ps")}
        for name, u in after["usage"].items():
            if u["role"] in usage:
                cpu = (u["cpu_seconds"] - before["usage"][name]["cpu_seconds"]) / seconds
                usage[u["role"]].append((cpu, u["memory_mb"], u["memory_peak_mb"] or u["memory_mb"]))
        return {**config.to_row(), "batch_size": batch, "throughput": trained / seconds,
                "worker_cpu_used": float(np.mean([c for c, _, _ in usage["worker"]])),
                "ps_cpu_used": float(np.mean([c for c, _, _ in usage["ps"]])),
                "worker_memory_used_mb": float(np.mean([m for _, m, _ in usage["worker"]])),
                "ps_memory_used_mb": float(np.mean([m for _, m, _ in usage["ps"]])),
                "worker_memory_peak_mb": float(max(p for _, _, p in usage["worker"])),
                "ps_memory_peak_mb": float(max(p for _, _, p in usage["ps"]))}
    finally:
        launcher.stop(job_id)


GRID = [(w, p, lw, lp) for w in (1, 2, 3) for p in (1, 2) for lw in (0.5, 1.0) for lp in (0.25, 0.5, 1.0)
        if w * lw + p * lp <= 2.0]
BATCH_VARIANTS = [((1, 1, 1.0, 0.5), 256), ((1, 1, 1.0, 0.5), 1024), ((2, 1, 0.5, 0.5), 1024)]


def cmd_grid(args) -> None:
    from airflow_dlrover.optimizer.model import fit_throughput

    runs = [(c, 512) for c in GRID] + BATCH_VARIANTS
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        launcher = LocalLauncher(tmp, CgroupManager())
        for repeat, (i, ((w, p, lw, lp), batch)) in itertools.product(range(args.repeats), enumerate(runs)):
            config = Configuration(w, p, lw, lp, 2048, 1024, 0, batch)
            row = measure(launcher, config, f"grid-{repeat}-{i}", batch)
            rows.append(row)
            print(f"{repeat + 1}.{i + 1:2d}/{len(runs)} w={w} p={p} λw={lw:g} λp={lp:g} B={batch}: "
                  f"{row['throughput']:8.0f} samples/s  worker cpu {row['worker_cpu_used']:.2f}  "
                  f"ps cpu {row['ps_cpu_used']:.2f}", flush=True)
    table = pd.DataFrame(rows)
    table.round(3).to_csv(args.out, index=False)
    print_ps_scaling(table)
    model = fit_throughput(table, leave_one_out=True)
    report = model.report
    print(f"\nwrote {len(table)} samples to {args.out}")
    print(f"fit: q={model.sharpness:g}  in-sample MAPE {report.in_sample_mape:.1%}  "
          f"leave-one-configuration-out MAPE {report.out_of_sample_mape:.1%}  pinned {sorted(report.pinned)}")


def ps_scaling(table: pd.DataFrame) -> pd.DataFrame:
    """PS scaling efficiency, X(p PS) / (p · X(1 PS)), for each grid configuration with p > 1 whose
    one-PS twin (same workers, worker and PS CPU, batch) was measured: 1 is linear scaling."""
    keys = ["workers", "worker_cpu", "ps_cpu", "batch_size"]
    one = table[table.ps == 1].groupby(keys).throughput.median().rename("one_ps")
    many = table[table.ps > 1].join(one, on=keys, how="inner")
    many = many.assign(efficiency=many.throughput / (many.ps * many.one_ps))
    return many[[*keys, "ps", "one_ps", "throughput", "efficiency"]].reset_index(drop=True)


def print_ps_scaling(table: pd.DataFrame) -> None:
    scaling = ps_scaling(table)
    print("\nPS scaling efficiency, X(p PS) / (p · X(1 PS)), same workers, CPU per node and batch")
    print(scaling.round(3).to_string(index=False) if len(scaling) else "(no configuration measured at 1 and p PS)")
    if len(scaling):
        print(f"median efficiency {scaling.efficiency.median():.2f}")


def cmd_ps_scaling(args) -> None:
    print_ps_scaling(pd.read_csv(args.grid))


def single_process_throughput(spec: JobSpec, threads: int, seconds: float) -> float:
    """The same DLRM (embeddings as local torch EmbeddingBags, same optimizers) in one process."""
    import torch

    from airflow_dlrover.runtime.dlrm import build_model
    from airflow_dlrover.runtime.worker import source_for

    torch.set_num_threads(threads)
    model = build_model(spec)
    tables = torch.nn.ModuleList(torch.nn.Embedding(n, spec.embedding_dim, sparse=True) for n in spec.table_sizes)
    dense_opt = torch.optim.Adam(model.parameters(), lr=spec.dense_learning_rate)
    sparse_opt = torch.optim.Adagrad(tables.parameters(), lr=spec.learning_rate)  # as the PS: sparse Adagrad
    source = source_for(spec)
    done, start, offset = 0, time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        batch = source.samples(offset, offset + spec.batch_size)
        offset += spec.batch_size
        embedded = [tables[t](torch.from_numpy(ids)) for t, ids in enumerate(batch.sparse)]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(torch.from_numpy(batch.dense), embedded), torch.from_numpy(batch.label))
        dense_opt.zero_grad()
        sparse_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        sparse_opt.step()
        done += len(batch)
    return done / (time.perf_counter() - start)


def cmd_overhead(args) -> None:
    """1 worker (1 core) + 1 PS (0.5 core) against one process with 1.5 cores (same cgroup quota)."""
    from airflow_dlrover.launchers.cgroups import Limits

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        launcher = LocalLauncher(tmp, CgroupManager())
        for repeat in range(args.repeats):
            ps_row = measure(launcher, Configuration(1, 1, 1.0, 0.5, 2048, 1024), f"overhead-{repeat}")
            # the single process gets the same 1.5 cores through its own cgroup
            manager = CgroupManager("dlrover-bench")
            group = manager.create("single", f"r{repeat}", Limits(1.5, 4096))
            group.add_pid(os.getpid())
            spec = JobSpec(job_id="single", samples=10**9)
            single = single_process_throughput(spec, threads=1, seconds=MEASURE_S + WARMUP_S)
            results.append((ps_row["throughput"], single))
            print(f"repeat {repeat + 1}: PS architecture {ps_row['throughput']:.0f} samples/s, single process {single:.0f}")
    ratios = [a / b for a, b in results]
    print(f"median ratio PS/single = {statistics.median(ratios):.2f} (target ≥ 0.7) over {len(ratios)} repeats")


def cmd_recovery(args) -> None:
    """Time from a kill to throughput back at 90 % of its pre-fault median; resize stalls."""
    with tempfile.TemporaryDirectory() as tmp:
        for fault in ("kill-worker@12s", "kill-ps@12s"):  # each: throughput back at 90 % after the dip
            launcher = LocalLauncher(Path(tmp) / fault, CgroupManager())
            spec = JobSpec(job_id="rec", samples=600_000, checkpoint_interval_s=5)
            summary = run_job(launcher, spec, Configuration(2, 1, 0.75, 0.5, 2048, 1024), Path(tmp) / fault / "out",
                              parse_faults(fault), series_points=None)
            series = pd.DataFrame(summary["throughput_series"])
            at = parse_faults(fault)[0].at_s
            before = series[(series.time_s > at - 6) & (series.time_s < at)].throughput.median()
            back = recovery_s(series, at)
            print(f"{fault:16s} throughput before {before:7.0f}; back to 90 % after {back:5.1f} s; "
                  f"lost {summary['samples_lost']}, duplicated {summary['samples_duplicated']}")
        launcher = LocalLauncher(Path(tmp) / "resize", CgroupManager())
        spec = JobSpec(job_id="resize", samples=1_500_000, checkpoint_interval_s=5)
        resizes = [(8.0, Configuration(3, 1, 0.5, 0.5, 2048, 1024)), (14.0, Configuration(2, 1, 0.5, 0.5, 2048, 1024)),
                   (20.0, Configuration(2, 2, 0.5, 0.25, 2048, 1024))]
        summary = run_job(launcher, spec, Configuration(2, 1, 0.5, 0.5, 2048, 1024), Path(tmp) / "resize" / "out",
                          resizes=resizes)
        for event in (e for e in summary["events"] if "resize" in e):
            print(f"resize {', '.join(event['actions'])}: the call took {event['seconds']:.2f} s")
        print(f"lost {summary['samples_lost']}, duplicated {summary['samples_duplicated']}")


#: The rate after a window is its mean over this many seconds (each transition leaves room for it).
TAIL_S = 8.0


def equivalent_pause_s(series: pd.DataFrame, at: float, window_s: float, tail_s: float = TAIL_S) -> float:
    """``W − S / r`` (``optimizer.transitions``): ``S`` the samples trained in ``[at, at + W]``,
    ``r`` the rate over the ``tail_s`` after it. A restore's fall back to its checkpoint is lost
    work, charged apart: only progress counts (the positive steps of ``samples_done``)."""
    t = series.time_s.to_numpy(float)
    progress = np.concatenate([[0.0], np.cumsum(np.maximum(np.diff(series.samples_done.to_numpy(float)), 0.0))])
    trained = np.interp(at + window_s, t, progress) - np.interp(at, t, progress)
    rate = (np.interp(at + window_s + tail_s, t, progress) - np.interp(at + window_s, t, progress)) / tail_s
    return float(max(window_s - trained / rate, 0.0)) if rate > 0 else float("nan")


#: The transitions in the order one job goes through them: (name, seconds after the launch call,
#: its measurement window, the change). The job starts as 2 workers × 0.5 + 1 PS × 0.5 CPU.
BASE = Configuration(2, 1, 0.5, 0.5, 2048, 1024)
TRANSITIONS = [
    ("worker_join_s", 34.0, 10.0, Configuration(3, 1, 0.5, 0.5, 2048, 1024)),
    ("worker_leave_s", 54.0, 10.0, BASE),
    ("cpu_in_place_s", 74.0, 8.0, Configuration(2, 1, 0.75, 0.5, 2048, 1024)),
    ("cpu_in_place_s", 92.0, 8.0, BASE),
    ("memory_in_place_s", 110.0, 8.0, Configuration(2, 1, 0.5, 0.5, 3072, 1536)),
    ("node_relaunch_s", 128.0, 14.0, "worker-0"),
    ("ps_change_s", 152.0, 18.0, Configuration(2, 2, 0.5, 0.25, 3072, 1536)),
    ("ps_change_s", 180.0, 18.0, Configuration(2, 1, 0.5, 0.5, 3072, 1536)),
    ("ps_recovery_s", 208.0, 20.0, "kill ps-0"),
    ("relaunch_s", 238.0, 20.0, "relaunch"),
]
COLD_WINDOW_S = 24.0


def _transition(change):
    """The intervention ``run_job`` makes at its time: a resize, a node relaunch, a kill, or the
    whole job stopped and launched again (it resumes from its checkpoint)."""
    def intervene(launcher: LocalLauncher, job_id: str) -> dict:
        if isinstance(change, Configuration):
            return {"transition": launcher.resize(job_id, change)["actions"]}
        if change == "kill ps-0":
            launcher.kill_node(job_id, "ps-0")
        elif change == "relaunch":
            spec, config = launcher.spec(job_id), Configuration(**launcher.read_job(job_id)["config"])
            launcher.stop(job_id)
            launcher.launch(spec, config)
        else:
            launcher.relaunch(job_id, change)
        return {"transition": change}
    return intervene


class _Finished(Exception):
    """The last intervention ends the measured run."""


def _sample_progress(launcher: LocalLauncher, job_id: str, started: float, rows: list, stop: threading.Event) -> None:
    """Every 0.2 s the master's ``samples_done`` (none while no master answers)."""
    while not stop.wait(0.2):
        try:
            status = launcher.master_call(job_id, "/status", timeout=1.0)
        except (ConnectionError, OSError, ValueError, KeyError):
            continue
        rows.append({"time_s": time.time() - started, "samples_done": status["samples_done"]})


def state_bandwidth_mb_per_s(root: Path, train_s: float = 25.0) -> tuple[float, float, float]:
    """(checkpoint MB/s, restore MB/s, MB) of a job with wide tables (26 × 2M rows × dim 64) after
    ``train_s`` of training: the rows it touched, with their accumulators, written and read back."""
    launcher = LocalLauncher(root, CgroupManager())
    spec = JobSpec(job_id="state", samples=10**9, checkpoint_interval_s=3600, table_sizes=(2_000_000,) * 26,
                   embedding_dim=64, bottom_mlp=(64, 64))
    launcher.launch(spec, Configuration(1, 1, 1.0, 1.0, 4096, 8192))
    try:
        deadline = time.monotonic() + 120
        while launcher.master_call(spec.job_id, "/status")["samples_done"] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the wide-table job did not start training")
            time.sleep(0.5)
        time.sleep(train_s)
        started = time.monotonic()
        manifest = launcher.master_call(spec.job_id, "/checkpoint", {"hold": False}, timeout=600)
        saved_s = time.monotonic() - started
        megabytes = sum(Path(f).stat().st_size for f in manifest["files"]) / 2**20
        started = time.monotonic()
        launcher.master_call(spec.job_id, "/restore", {}, timeout=600)
        restored_s = time.monotonic() - started
    finally:
        launcher.stop(spec.job_id)
    return megabytes / saved_s, megabytes / restored_s, megabytes


def cmd_transitions(args) -> None:
    from airflow_dlrover.optimizer.transitions import MEASURED_PATH, TransitionCosts

    def finish(launcher, job_id):
        raise _Finished

    measured: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            launcher = LocalLauncher(Path(tmp) / f"r{repeat}", CgroupManager())
            spec = JobSpec(job_id=f"transitions-{repeat}", samples=10**9, checkpoint_interval_s=5)
            rows: list[dict] = []
            stop = threading.Event()
            started = time.time()
            sampler = threading.Thread(target=_sample_progress, args=(launcher, spec.job_id, started, rows, stop))
            sampler.start()
            end = TRANSITIONS[-1][1] + TRANSITIONS[-1][2] + TAIL_S + 1.0
            try:  # the supervisor recovers what a transition kills, as it does for any job
                run_job(launcher, spec, BASE, Path(tmp) / f"r{repeat}" / "out", series_points=None,
                        interventions=[(at, _transition(change)) for _, at, _, change in TRANSITIONS] + [(end, finish)])
            except _Finished:
                pass
            finally:
                stop.set()
                sampler.join()
            series = pd.DataFrame(rows)
            costs = [("cold_launch_s", equivalent_pause_s(series, 0.0, COLD_WINDOW_S))]
            costs += [(name, equivalent_pause_s(series, at, window)) for name, at, window, _ in TRANSITIONS]
            for name, cost in costs:
                measured.setdefault(name, []).append(cost)
            print(f"repeat {repeat + 1}: " + ", ".join(f"{name} {cost:.1f}" for name, cost in costs), flush=True)
        for repeat in range(args.repeats):
            saved, restored, megabytes = state_bandwidth_mb_per_s(Path(tmp) / f"state-{repeat}")
            measured.setdefault("checkpoint_mb_per_s", []).append(saved)
            measured.setdefault("restore_mb_per_s", []).append(restored)
            print(f"state {megabytes:.0f} MB: checkpoint {saved:.0f} MB/s, restore {restored:.0f} MB/s", flush=True)
    medians = {name: round(float(np.nanmedian(values)), 1) for name, values in measured.items()}
    table = TransitionCosts(**medians, source=f"benchmarks/runtime.py transitions --repeats {args.repeats}: "
                                              f"medians, local launcher, {os.cpu_count()} cores")
    print(f"\n{'transition':20s} {'median s':>9s}  each run")
    for name, values in measured.items():
        print(f"{name:20s} {medians[name]:9.1f}  {', '.join(f'{v:.1f}' for v in values)}")
    kubernetes = table.on_kubernetes()
    print("on Kubernetes (+ pod start where a pod starts): " + ", ".join(
        f"{name} {getattr(kubernetes, name):.1f}" for name in medians))
    if args.write:
        MEASURED_PATH.write_text(table.to_json())
        print(f"wrote {MEASURED_PATH}")


#: configurations of the runtime tried within a number of cores: (workers, PS, λw, λp)
CORE_CONFIGS = {1: [(1, 1, 0.5, 0.5), (2, 1, 0.3, 0.4)],
                2: [(3, 1, 0.5, 0.5), (2, 1, 0.7, 0.6), (3, 1, 0.45, 0.65)]}
TORCHREC_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torchrec_dlrm" / "train.py"


def parse_layout(text: str) -> tuple[int, int, int]:
    """``"26x20000x16"`` → (tables, rows, dim)."""
    tables, rows, dim = (int(x) for x in text.lower().split("x"))
    return tables, rows, dim


def torchrec_throughput(layout: tuple[int, int, int], cores: int, seconds: float) -> float:
    """TorchRec's fused DLRM (``examples/torchrec_dlrm``'s model and optimisers) in its own process
    pinned to ``cores`` CPUs with one torch thread each, on 64 batches of the example's generator made
    beforehand (its most favourable case: no data cost, no CPU quota): samples/s over ``seconds``
    after a warm-up."""
    import subprocess
    import sys

    tables, rows, dim = layout
    command = [sys.executable, __file__, "_torchrec", str(tables), str(rows), str(dim), str(cores), str(seconds)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 300)
    if done.returncode:
        raise RuntimeError(f"the TorchRec measurement exited {done.returncode}:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def _torchrec_child(tables: int, rows: int, dim: int, cores: int, seconds: float) -> None:
    import importlib.util
    import socket

    import torch
    import torch.distributed as dist

    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    spec = importlib.util.spec_from_file_location("torchrec_example", TORCHREC_EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.set_num_threads(cores)
    dist.init_process_group("gloo")
    args = example.parse_args(["--tables", str(tables), "--rows", str(rows), "--dim", str(dim)])
    model, optimizer = example.build(args)
    loss_fn, stream = torch.nn.BCEWithLogitsLoss(), example.Stream(args)
    batches = [stream(i * args.batch_size, args.batch_size) for i in range(64)]
    steps, started, measured_from = 0, time.perf_counter(), None
    while measured_from is None or time.perf_counter() - measured_from < seconds:
        if measured_from is None and time.perf_counter() - started >= WARMUP_S:
            measured_from, steps = time.perf_counter(), 0
        dense, sparse, labels = batches[steps % len(batches)]
        optimizer.zero_grad()
        loss_fn(model(dense, sparse).squeeze(1), labels).backward()
        optimizer.step()
        steps += 1
    print(steps * args.batch_size / (time.perf_counter() - measured_from), flush=True)
    dist.destroy_process_group()


def cmd_versus_torchrec(args) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        launcher = LocalLauncher(tmp, CgroupManager())
        for text in args.layouts:
            tables, table_rows, dim = parse_layout(text)
            for cores in args.cores:
                ours, theirs = [], []
                for repeat in range(args.repeats):
                    tried = []
                    for i, (w, p, lw, lp) in enumerate(CORE_CONFIGS[cores]):
                        spec = JobSpec(job_id=f"vs-{tables}-{dim}-{cores}-{repeat}-{i}", samples=50_000_000,
                                       checkpoint_interval_s=3600, table_sizes=(table_rows,) * tables,
                                       embedding_dim=dim, bottom_mlp=(64, dim))
                        tried.append(measure(launcher, Configuration(w, p, lw, lp, 4096, 4096), spec.job_id, spec=spec))
                    best = max(tried, key=lambda row: row["throughput"])
                    ours.append(best["throughput"])
                    theirs.append(torchrec_throughput((tables, table_rows, dim), cores, MEASURE_S))
                    print(f"{text} {cores} core(s) repeat {repeat + 1}: ours {ours[-1]:.0f} samples/s "
                          f"(w={best['workers']} p={best['ps']} λw={best['worker_cpu']:g} λp={best['ps_cpu']:g}), "
                          f"TorchRec fused {theirs[-1]:.0f}", flush=True)
                rows.append({"layout": text, "cores": cores, "ours": statistics.median(ours),
                             "torchrec": statistics.median(theirs)})
    table = pd.DataFrame(rows)
    table["ours_per_core"] = table.ours / table.cores
    table["torchrec_per_core"] = table.torchrec / table.cores
    table["ratio"] = table.ours / table.torchrec
    print("\nsamples/s, the median of the repeats (ratio: ours / TorchRec fused on the same cores)")
    print(table.round(2).to_string(index=False))
    for text in args.layouts:
        one = table[(table.layout == text) & (table.cores == 1)]
        two = table[(table.layout == text) & (table.cores == 2)]
        if len(one) and len(two):
            target = 0.8 * 2 * float(one.torchrec.iloc[0])
            print(f"{text}: ours on 2 cores {float(two.ours.iloc[0]):.0f} against 0.8 × 2 × TorchRec on 1 core "
                  f"= {target:.0f}: {float(two.ours.iloc[0]) / target:.2f} of it")


def cmd_transport(args) -> None:
    import pickle

    from airflow_dlrover.runtime.accounting import batch_starts
    from airflow_dlrover.runtime.lookup import route
    from airflow_dlrover.runtime.transport import decode, encode
    from airflow_dlrover.runtime.worker import source_for

    spec = JobSpec(job_id="transport", samples=5_000_000)
    source, starts = source_for(spec), batch_starts(spec)
    pushes = []
    for start in starts[:200]:
        uniques, _, _ = route(source.samples(int(start), int(start) + spec.batch_size).sparse, 1)
        grads = [np.ones((len(u), spec.embedding_dim), np.float32) for u in uniques]
        pushes.append((uniques, grads))

    def timed(run) -> float:
        times = []
        for uniques, grads in pushes:
            started = time.perf_counter()
            run(uniques, grads)
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e3

    def pickled(uniques, grads):
        pickle.loads(pickle.dumps(("push", {"ids": uniques, "grads": grads}), protocol=4))

    def framed(uniques, grads):
        frame = b"".join(bytes(part) for part in encode(("push", {
            "ids": np.concatenate(uniques), "lengths": [len(u) for u in uniques], "grads": np.concatenate(grads)})))
        decode(bytearray(frame))

    rows = np.median([sum(len(u) for u in uniques) for uniques, _ in pushes])
    print(f"a push of {len(spec.table_sizes)} tables' ids and gradients ({rows:.0f} rows × "
          f"{spec.embedding_dim} floats), the median of {len(pushes)} batches:")
    print(f"  protocol-4 pickle, one array per table: {timed(pickled):.3f} ms to encode and decode")
    print(f"  frame (pickle 5, out of band), one array: {timed(framed):.3f} ms")


def cmd_memory(args) -> None:
    from airflow_dlrover.optimizer.memory import fit_memory

    grid = pd.read_csv(args.grid)
    model = fit_memory(grid)
    print(f"memory model from {args.grid}: PS {model.ps_base_mb:.0f} + {model.table_mb:.0f}/p MB, "
          f"worker {model.worker_base_mb:.0f} + {model.activation_mb_per_sample:.3f}×B MB")
    print(f"{'config':28s} {'PS peak':>8s} {'predicted':>9s} {'worker peak':>11s} {'predicted':>9s}")
    for _, row in grid.iterrows():
        label = f"w={row.workers} p={row.ps} λw={row.worker_cpu:g} λp={row.ps_cpu:g} B={row.batch_size}"
        print(f"{label:28s} {row.ps_memory_peak_mb:8.0f} {float(model.ps_peak_mb(row.ps)):9.0f} "
              f"{row.worker_memory_peak_mb:11.0f} {float(model.worker_peak_mb(row.batch_size)):9.0f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("grid")
    p.add_argument("--out", default="benchmarks/sim/data/local_grid.csv")
    p.add_argument("--repeats", type=int, default=1, help="passes over the grid; every window is kept as a sample")
    p.set_defaults(func=cmd_grid)
    p = sub.add_parser("overhead")
    p.add_argument("--repeats", type=int, default=3)
    p.set_defaults(func=cmd_overhead)
    sub.add_parser("recovery").set_defaults(func=cmd_recovery)
    p = sub.add_parser("memory")
    p.add_argument("--grid", default="benchmarks/sim/data/local_grid.csv")
    p.set_defaults(func=cmd_memory)
    p = sub.add_parser("transitions")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--write", action="store_true", help="store the medians as optimizer/transition_costs.json")
    p.set_defaults(func=cmd_transitions)
    p = sub.add_parser("versus-torchrec")
    p.add_argument("--layouts", nargs="+", default=["26x20000x16"], help="tables×rows×dim, e.g. 100x1000000x64")
    p.add_argument("--cores", nargs="+", type=int, default=[1, 2], choices=sorted(CORE_CONFIGS))
    p.add_argument("--repeats", type=int, default=3)
    p.set_defaults(func=cmd_versus_torchrec)
    sub.add_parser("transport").set_defaults(func=cmd_transport)
    p = sub.add_parser("ps-scaling", help="the PS scaling efficiency of a measured grid (``grid --out``)")
    p.add_argument("--grid", default="benchmarks/sim/data/local_grid.csv")
    p.set_defaults(func=cmd_ps_scaling)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["_torchrec"]:  # the TorchRec measurement's own process
        tables, rows, dim, threads = (int(x) for x in sys.argv[2:6])
        _torchrec_child(tables, rows, dim, threads, float(sys.argv[6]))
    else:
        main()
