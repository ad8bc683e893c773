import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from airflow_dlrover.cli import main
from airflow_dlrover.optimizer.job_model import JobModel
from sim.synthetic import model_samples

pytestmark = pytest.mark.jobs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture()
def samples_csv(tmp_path):
    path = tmp_path / "samples.csv"
    model_samples(noise=0.03, windows=2, seed=4).to_csv(path, index=False)
    return path


def test_a_model_of_throughput_only_plans_with_memory_as_given_or_an_equal_share(tmp_path, samples_csv, capsys):
    """A user who measured throughput by hand (no *_memory_used_mb columns) still gets a plan."""
    table = pd.read_csv(samples_csv)
    table[[c for c in table.columns if not c.endswith("_used_mb")]].to_csv(tmp_path / "x.csv", index=False)
    assert main(["fit", str(tmp_path / "x.csv"), "-o", str(tmp_path / "m.json")]) == 0
    assert "memory model: none" in capsys.readouterr().out
    assert main(["plan", str(tmp_path / "m.json"), "--cpu", "32", "--memory", "64Gi"]) == 0
    shared = json.loads(capsys.readouterr().out)
    assert shared["worker_memory_mb"] == shared["ps_memory_mb"] and 0.9 * 65536 < shared["memory_mb"] <= 65536
    assert "equal share of the quota's memory" in shared["reason"]
    assert main(["plan", str(tmp_path / "m.json"), "--cpu", "32", "--memory", "64Gi",
                 "--worker-memory", "2Gi", "--ps-memory", "3Gi"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert (given["worker_memory_mb"], given["ps_memory_mb"]) == (2048, 3072) and "as given" in given["reason"]
    assert main(["plan", str(tmp_path / "m.json"), "--cpu", "32", "--memory", "64Gi", "--ps-memory", "lots"]) == 2
    assert "ps_memory='lots' is invalid" in capsys.readouterr().err


def test_fit_predict_plan_round_trip(tmp_path, samples_csv, capsys):
    model_path = tmp_path / "model.json"
    assert main(["fit", str(samples_csv), "-o", str(model_path)]) == 0
    out = capsys.readouterr().out
    assert "in-sample MAPE" in out and "leave-one-configuration-out MAPE" in out and "ps_service" in out
    model = JobModel.load(model_path)
    assert model.memory is not None

    configs = tmp_path / "configs.csv"
    pd.DataFrame({"workers": [1, 8], "ps": [1, 2], "worker_cpu": [1, 2], "ps_cpu": [1, 2]}).to_csv(configs, index=False)
    assert main(["predict", str(model_path), str(configs)]) == 0
    table = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert list(table.columns[-3:]) == ["predicted_throughput", "lower_throughput", "upper_throughput"]
    assert (table.lower_throughput < table.predicted_throughput).all()
    assert table.predicted_throughput[1] > table.predicted_throughput[0]

    assert main(["plan", str(model_path), "--cpu", "64", "--memory", "256Gi", "--max-nodes", "40"]) == 0
    plan = json.loads(capsys.readouterr().out)
    for column in ("workers", "ps", "worker_cpu", "ps_cpu", "worker_memory_mb", "ps_memory_mb", "worker_gpu",
                   "batch_size", "predicted_throughput", "reason"):
        assert column in plan
    assert plan["cores"] <= 64 and plan["workers"] + plan["ps"] <= 40 and plan["memory_mb"] <= 256 * 1024

    assert main(["plan", str(model_path), "--cpu", "64", "--memory", "256Gi", "--objective", "deadline",
                 "--samples", "1e8", "--deadline", "2h"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert 1e8 / plan["predicted_throughput"] <= 7200


def test_probes_then_no_warm_probes(tmp_path, samples_csv, capsys):
    assert main(["probes", "--cpu", "32", "--memory", "128Gi"]) == 0
    cold = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert len(cold) >= 4
    model_path = tmp_path / "model.json"
    main(["fit", str(samples_csv), "-o", str(model_path), "--no-loco"])
    capsys.readouterr()
    assert main(["probes", "--cpu", "32", "--memory", "128Gi", "--prior", str(model_path)]) == 0
    out = capsys.readouterr()
    warm = pd.read_csv(pd.io.common.StringIO(out.out))
    assert warm.empty and list(warm.columns) == list(cold.columns)  # a warm start profiles nothing
    assert "warm start profiles nothing" in out.err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "{model}", "--cpu", "64", "--memory", "12XB"], "memory='12XB' is invalid"),
        (["plan", "{model}", "--cpu", "lots", "--memory", "1Gi"], "cpu='lots' is invalid"),
        (["plan", "{model}", "--cpu", "0.5", "--memory", "256Gi"], "cpu=0.5 is invalid: allowed a quota of at least cpu=1"),
        (["plan", "{model}", "--cpu", "64", "--memory", "256Gi", "--objective", "deadline", "--samples", "1e8",
          "--deadline", "soon"], "deadline='soon' is invalid"),
        (["plan", "{missing}", "--cpu", "64", "--memory", "1Gi"], "an existing model file"),
        (["fit", "{bad_csv}", "-o", "{out}"], "samples.throughput"),
        (["predict", "{model}", "{bad_configs}"], "CONFIGS.ps_cpu"),
    ],
)
def test_user_mistakes_exit_2_with_a_clear_message(tmp_path, samples_csv, capsys, argv, message):
    model_path = tmp_path / "model.json"
    main(["fit", str(samples_csv), "-o", str(model_path), "--no-loco"])
    bad_csv = tmp_path / "bad.csv"
    model_samples().assign(throughput=-1).to_csv(bad_csv, index=False)
    bad_configs = tmp_path / "bad_configs.csv"
    pd.DataFrame({"workers": [1], "ps": [1], "worker_cpu": [1], "ps_cpu": ["x"]}).to_csv(bad_configs, index=False)
    capsys.readouterr()
    paths = dict(model=model_path, missing=tmp_path / "nope.json", bad_csv=bad_csv, out=tmp_path / "o.json",
                 bad_configs=bad_configs)
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_report_names_a_job_shared_by_two_dags_by_its_dag_and_group(tmp_path, capsys):
    from airflow_dlrover.history.identity import JobIdentity
    from airflow_dlrover.history.store import HistoryStore

    url = f"sqlite:///{tmp_path / 'history.db'}"
    store = HistoryStore(url)
    for dag_id, group in (("dag_a", ""), ("dag_b", "nightly")):
        run = store.start_run(JobIdentity(dag_id, group, "ctr"), "scheduled__2026-11-29")
        store.finish_run(run, "succeeded", {"status": "succeeded", "run_seconds": 60.0, "jct_s": 50.0, "profile_s": 5.0,
                                            "profile_share": 0.1, "probes": 3, "warm_start": False,
                                            "plan": {"workers": 2, "ps": 1, "worker_cpu": 1.0, "ps_cpu": 1.0,
                                                     "worker_memory_mb": 2048, "ps_memory_mb": 2048,
                                                     "reason": dag_id},
                                            "predicted_throughput": None, "baseline": None,
                                            "measured_throughput": None, "utilisation": {}, "decisions": [],
                                            "resizes": 0, "recoveries": [], "instability": [], "failures": [],
                                            "job": None, "samples_lost": None})
    assert main(["report", "ctr", "--history-url", url]) == 2
    err = capsys.readouterr().err
    assert "job='ctr' is invalid" in err and "dag_a//ctr, dag_b/nightly/ctr" in err
    assert main(["report", "ctr", "--dag-id", "dag_b", "--history-url", url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dag_b/nightly/ctr (dag_id/task_group/name), run 2") and "reason: dag_b" in out
    assert main(["report", "ctr", "--dag-id", "dag_b", "--task-group", "", "--history-url", url]) == 2
    assert "a job with a reported run" in capsys.readouterr().err


def test_demo_runs_the_bundled_pipeline(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "== fit" in out and out.count("== plan") == 3
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["cores"] <= 64 and plan["pareto_front"]
    assert JobModel.load(tmp_path / "model.json").throughput.report.out_of_sample_mape < 0.10


def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "airflow_dlrover.cli", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "plan" in result.stdout


def test_train_runs_a_local_job_and_writes_its_files(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--workers", "1", "--ps", "1", "--worker-cpu", "1", "--ps-cpu", "0.5",
                 "--worker-memory", "2Gi", "--ps-memory", "1Gi", "--batch-size", "256", "--samples", "40000",
                 "--table-size", "5000", "--embedding-dim", "8", "--job-id", "cli", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.split("\nwrote")[0])
    assert printed["samples_expected"] == printed["samples_trained"] == 40_000 and printed["samples_lost"] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["batch_size"] == 256 and summary["eval_auc"] > 0.5
    spec = json.loads((out / "jobs" / "cli" / "spec.json").read_text())
    assert spec["table_sizes"] == [5000] * 26 and spec["embedding_dim"] == 8
    assert (out / "samples.csv").exists()
    assert main(["train", "--inject", "kill-everything@3s", "--out", str(tmp_path / "bad")]) == 2
    assert "inject='kill-everything@3s' is invalid" in capsys.readouterr().err


def test_train_takes_a_parquet_dataset_a_layout_file_and_an_export(tmp_path, capsys):
    from airflow_dlrover.runtime.datasets import write_synthetic
    from airflow_dlrover.runtime.export import load_export

    write_synthetic(str(tmp_path / "day"), 50_000, files=2, row_group_rows=[9000, 4000], table_sizes=(2000,) * 26)
    layout = {"label": "label", "dense": [f"I{j + 1}" for j in range(13)],
              "sparse": [{"name": f"C{t + 1}", "table_size": 2000, "dim": 8} for t in range(26)]}
    (tmp_path / "layout.json").write_text(json.dumps(layout))
    out = tmp_path / "run"
    assert main(["train", "--workers", "1", "--ps", "1", "--data", str(tmp_path / "day"), "--layout",
                 str(tmp_path / "layout.json"), "--export", str(tmp_path / "model"), "--eval-files", "1",
                 "--job-id", "cli-pq", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.split("\nwrote")[0])
    assert printed["samples_expected"] == printed["samples_trained"] == 25_000 and printed["samples_lost"] == 0
    assert printed["export"] == str(tmp_path / "model") and printed["bad_rows"] == 0
    assert load_export(printed["export"]).manifest["metrics"]["samples"] == 25_000  # the last file, held out
    assert main(["train", "--data", str(tmp_path / "day"), "--layout", str(tmp_path / "nope.json"),
                 "--out", str(tmp_path / "bad")]) == 2
    assert "layout=" in capsys.readouterr().err


def test_run_trainer_finishes_a_ddp_job_through_a_resize(tmp_path, capsys):
    # The resize comes 6 s after the launch: a core trains up to ~175,000 samples/s (an idle EPYC
    # core), so the job is sized to last past it, twice over, on a fast machine.
    script = EXAMPLES / "ddp_dlrm" / "train.py"
    out = tmp_path / "ddp"
    assert main(["run-trainer", "--workers", "1", "--worker-cpu", "1", "--worker-memory", "1Gi", "--samples", "2000000",
                 "--resize", "6s:workers=2,worker_cpu=0.5", "--grace", "10", "--out", str(out), "--",
                 sys.executable, str(script), "--checkpoint-interval", "2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples_done"] == summary["samples_total"] == 2_000_000
    assert summary["resizes"] == 1 and summary["restarts"] == 0 and summary["config"]["workers"] == 2
    assert summary["median_throughput"] > 0 and summary["auc"] > 0.6


@pytest.mark.parametrize("command, status, expected", [
    ([], 2, "the trainer's argv after `--`"),
    (["python", "train.py", "--world={nodes}"], 2, "trainer.command[2]"),
    ([sys.executable, "-c", "raise SystemExit('no such table: clicks')"], 1, "exited 1 before its first report"),
])
def test_run_trainer_refuses_a_broken_contract_in_one_message(tmp_path, capsys, command, status, expected):
    assert main(["run-trainer", "--workers", "1", "--worker-memory", "512Mi", "--out", str(tmp_path), "--", *command]) == status
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    if status == 1:
        assert "no such table: clicks" in err and "no retry fixes" in err


@pytest.mark.parametrize("option, expected", [
    (["--metrics-name", "throughput"], "metrics-name='throughput'"),
    (["--metrics-port", "9400", "--metrics-name", "speed=x"], "trainer.metrics_names.speed"),
    (["--metrics-port", "22"], "trainer.metrics_port=22"),
])
def test_run_trainer_refuses_a_bad_metrics_endpoint_before_starting(tmp_path, capsys, option, expected):
    assert main(["run-trainer", "--workers", "1", "--out", str(tmp_path), *option, "--", "python", "t.py"]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


CRASHES_AFTER_ONE_REPORT = """
import json, os, time
folder = os.environ["DLROVER_CHECKPOINT_DIR"]
with open(os.path.join(folder, "ckpt.json"), "w") as f:  # the folder exists: the contract says so
    json.dump({"samples_done": 512}, f)
with open(os.environ["DLROVER_METRICS_FILE"], "a") as f:
    f.write(json.dumps({"throughput": 1000.0, "samples_done": 512, "samples_total": 10**6}) + "\\n")
time.sleep(0.5)
raise ValueError("embedding row 7 is out of range: the trainer's own bug")
"""


def test_run_trainer_stops_a_trainer_that_crashes_the_same_way_on_every_start(tmp_path, capsys):
    """It saved into its checkpoint folder without creating it, reported once, then raised: the
    second identical crash before any progress ends the run, with the exit code and traceback."""
    script = tmp_path / "train.py"
    script.write_text(CRASHES_AFTER_ONE_REPORT)
    started = time.monotonic()
    assert main(["run-trainer", "--workers", "1", "--worker-memory", "512Mi", "--samples", "1000000",
                 "--out", str(tmp_path / "out"), "--", sys.executable, str(script)]) == 1
    assert time.monotonic() - started < 120
    err = capsys.readouterr().err
    assert "exited 1 again before the job trained any sample more" in err
    assert "ValueError: embedding row 7 is out of range" in err and "no restart fixes" in err
    checkpoint = next((tmp_path / "out").rglob("checkpoint"))
    assert (checkpoint / "ckpt.json").exists() and checkpoint.stat().st_mode & 0o777 == 0o700


@pytest.mark.unit
@pytest.mark.parametrize("value", ["nan", "-1"])
def test_train_refuses_a_setting_only_a_worker_would_notice_before_anything_starts(tmp_path, capsys, value):
    assert main(["train", "--zipf-skew", value, "--out", str(tmp_path)]) == 2
    assert "zipf_skew=" in capsys.readouterr().err and not any(tmp_path.iterdir())


#: A torch.distributed trainer as people write one: rank 0 logs the job's progress and rate (a log
#: line, as facebookresearch/dlrm's), every rank trains its slice of each step, and rank 0 saves
#: into DLROVER_CHECKPOINT_DIR without creating it; it resumes from there after any restart.
RANK0_TRAINER = r"""
import os, signal, sys, time
import torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
torch.set_num_threads(1)
total, batch = int(os.environ["DLROVER_SAMPLES"]), int(os.environ["DLROVER_BATCH_SIZE"])
path = os.path.join(os.environ["DLROVER_CHECKPOINT_DIR"], "model.pt")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
done = torch.load(path)["done"] if os.path.exists(path) else 0
if os.path.exists(path):
    model.module.load_state_dict(torch.load(path)["model"])
stop = torch.zeros(1)
signal.signal(signal.SIGTERM, lambda *_: stop.fill_(1.0))
started, trained, last_log = time.time(), 0, 0.0
while done < total:
    g = torch.Generator().manual_seed(done + rank * batch)
    x = torch.randn(batch, 16, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x[:, :1])
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    done, trained = min(done + world * batch, total), trained + world * batch
    flag = stop.clone(); dist.all_reduce(flag)
    if rank == 0 and (time.time() - last_log > 0.5 or done >= total or flag.item()):
        rate = trained / (time.time() - started)
        print(f"step done={done} of {total}, {rate:.1f} samples/s, loss {loss.item():.4f}", flush=True)
        last_log = time.time()
        torch.save({"done": done, "model": model.module.state_dict()}, path + ".tmp"); os.replace(path + ".tmp", path)
    if flag.item():
        break
dist.barrier()
dist.destroy_process_group()
"""
RANK0_REGEX = r"done=(?P<samples_done>\d+) of (?P<samples_total>\d+), (?P<throughput>[0-9.]+) samples/s"


RANK0 = ["--reports-from", "rank0", "--log-regex", RANK0_REGEX, "--grace", "10", "--", sys.executable]


def test_a_rank0_trainer_is_profiled_on_worker_counts_and_fitted(tmp_path):
    """Read from rank 0's log alone: one row per probe (a 1-core quota: three probes, one of two
    workers), every one measured, and a model fitted from them."""
    script = tmp_path / "train.py"
    script.write_text(RANK0_TRAINER)
    samples = tmp_path / "samples.csv"
    assert main(["profile", "--cpu", "1", "--memory", "4Gi", "--ps", "0", "--samples", "30000000", "--window", "2",
                 "--out", str(samples), *RANK0, str(script)]) == 0
    table = pd.read_csv(samples)
    assert len(table) >= 3 and (table.ps == 0).all() and (table.workers > 1).any() and (table.throughput > 0).all()
    assert main(["fit", str(samples), "-o", str(tmp_path / "model.json")]) == 0
    assert json.loads((tmp_path / "model.json").read_text())["throughput"]["params"]["worker_compute"] > 0


def test_a_rank0_trainer_recovers_a_killed_rank_to_the_last_sample(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(RANK0_TRAINER)
    out = tmp_path / "run"
    assert main(["run-trainer", "--workers", "2", "--worker-cpu", "0.5", "--worker-memory", "1Gi",
                 "--samples", "1500000", "--inject", "kill-worker@5s", "--out", str(out), *RANK0, str(script)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples_done"] == summary["samples_total"] == 1_500_000
    assert summary["restarts"] >= 1 and summary["median_throughput"] > 0


FINISHED_TRAINER = r"""
import os, pathlib, sys, time
total = int(os.environ["DLROVER_SAMPLES"])
done = pathlib.Path(os.environ["DLROVER_CHECKPOINT_DIR"], "done")
if done.exists():
    sys.exit(0)  # resumed with nothing left to train: nothing to report
print(f"step done={total} of {total}, 1000.0 samples/s", flush=True)
done.write_text(str(total))
time.sleep(60)
"""


def test_a_rank_killed_after_the_last_sample_resumes_with_nothing_left_and_the_job_is_done(tmp_path):
    """Killed after it reported every sample trained, rank 0 comes back, finds nothing left and
    exits 0 without a report: the job is done, with every sample counted, not the user's mistake."""
    script = tmp_path / "train.py"
    script.write_text(FINISHED_TRAINER)
    out = tmp_path / "run"
    assert main(["run-trainer", "--workers", "1", "--worker-cpu", "0.5", "--worker-memory", "512Mi",
                 "--samples", "1000", "--inject", "kill-worker@4s", "--out", str(out), "--timeout", "60",
                 *RANK0, str(script)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples_done"] == summary["samples_total"] == 1000 and summary["restarts"] == 1


TORCHREC = EXAMPLES / "torchrec_dlrm" / "train.py"


def test_the_torchrec_trainer_resumes_its_sharded_state_at_another_world_size_and_after_a_killed_rank(tmp_path):
    """Two ranks resized to one (the tables' shards gathered and restored at another world size),
    then the one rank killed: every sample trained, and the held-out AUC of a model that learned."""
    pytest.importorskip("torchrec", reason="the torchrec extra (make installs it)")
    out = tmp_path / "run"
    assert main(["run-trainer", "--workers", "2", "--worker-cpu", "1", "--worker-memory", "2Gi", "--kind", "allreduce",
                 "--reports-from", "rank0", "--samples", "1000000", "--resize", "10s:workers=1,worker_cpu=2",
                 "--inject", "kill-worker@18s", "--out", str(out), "--timeout", "300", "--",
                 sys.executable, str(TORCHREC), "--checkpoint-interval", "2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples_done"] == summary["samples_total"] == 1_000_000
    # the resize asked for, at least (the fine-tune may explore one of its own), and the one kill
    assert summary["resizes"] >= 1 and summary["restarts"] == 1 and summary["config"]["workers"] == 1
    assert summary["auc"] > 0.7
