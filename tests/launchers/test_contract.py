"""The trainer contract (launchers.contract): what a node gets, what is read back, what is refused."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_dlrover.launchers.contract import (
    ENV, PLACEHOLDERS, SCRAPED_FIELDS, TrainerSpec, job_progress, new_report, node_argv, node_env, node_report,
    parse_reports, scrape, scraped_report,
)
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError

pytestmark = pytest.mark.jobs

ALLREDUCE = Configuration(workers=3, ps=0, worker_cpu=1.5, ps_cpu=0, worker_memory_mb=2048, batch_size=256)
PS = Configuration(workers=2, ps=2, worker_cpu=1, ps_cpu=0.5, worker_memory_mb=1024, ps_memory_mb=512)


def env_of(trainer, config, node, **extra):
    names = [f"ps-{i}" for i in range(config.ps)] + [f"worker-{i}" for i in range(config.workers)]
    peers = {name: f"10.0.0.{i}:{2000 + i}" for i, name in enumerate(names)}
    return node_env(job_id="j", trainer=trainer, config=config, node=node, samples=1000, peers=peers,
                    rendezvous=("10.0.0.9", 29400), checkpoint_dir="/ck", metrics_file="/m/w.jsonl",
                    generation=2, job_key="s3cret", **extra)


def test_an_allreduce_rank_gets_the_torch_variables_and_its_allocation():
    trainer = TrainerSpec(command=("python", "train.py", "--rank={rank}", "--out={checkpoint_dir}/x"))
    env = env_of(trainer, ALLREDUCE, {"name": "worker-1", "role": "worker", "index": 1, "cpu": 1.5, "memory_mb": 2048})
    assert set(env) == set(ENV)
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("1", "3", "10.0.0.9", "29400")
    assert (env["DLROVER_CPU"], env["DLROVER_MEMORY_MB"], env["OMP_NUM_THREADS"], env["DLROVER_PS"]) == ("1.5", "2048", "1", "0")
    assert env["DLROVER_BATCH_SIZE"] == "256" and env["DLROVER_GENERATION"] == "2"
    assert json.loads(env["TF_CONFIG"]) == {"cluster": {"worker": ["10.0.0.0:2000", "10.0.0.1:2001", "10.0.0.2:2002"]},
                                            "task": {"type": "worker", "index": 1}}
    assert node_argv(trainer, env) == ["python", "train.py", "--rank=1", "--out=/ck/x"]


def test_a_ps_trainer_gets_its_cluster_spec():
    trainer = TrainerSpec(command=("train",), kind="ps")
    env = env_of(trainer, PS, {"name": "ps-1", "role": "ps", "index": 1, "cpu": 0.5, "memory_mb": 512})
    tf = json.loads(env["TF_CONFIG"])
    assert tf == {"cluster": {"worker": ["10.0.0.2:2002", "10.0.0.3:2003"], "ps": ["10.0.0.0:2000", "10.0.0.1:2001"]},
                  "task": {"type": "ps", "index": 1}}
    assert env["RANK"] == "" and env["DLROVER_ROLE"] == "ps"


@pytest.mark.parametrize("command, field, why", [
    ("python train.py", "trainer.command", "argv list"),
    ([], "trainer.command", "argv list"),
    (["python", "train.py", "--n={nodes}"], "trainer.command[2]", "'nodes'"),
    (["python", "{rank"], "trainer.command[1]", "balanced braces"),
])
def test_a_bad_command_is_refused_naming_the_argument(command, field, why):
    with pytest.raises(InvalidInputError) as err:
        TrainerSpec(command=command)
    assert err.value.field == field and why in str(err.value)


def test_bad_settings_are_refused():
    for changes, field in (({"kind": "horovod"}, "trainer.kind"), ({"log_regex": "speed ([0-9.]+)"}, "trainer.log_regex"),
                           ({"log_regex": "(?P<throughput>"}, "trainer.log_regex"), ({"grace_s": 0}, "trainer.grace_s"),
                           ({"max_restarts": -1}, "trainer.max_restarts"),
                           ({"max_restarts": 1.5}, "trainer.max_restarts"),
                           ({"restart_window_s": float("nan")}, "trainer.restart_window_s")):
        with pytest.raises(InvalidInputError) as err:
            TrainerSpec(command=("t",), **changes)
        assert err.value.field == field
    with pytest.raises(InvalidInputError) as err:
        TrainerSpec.from_dict({"command": ["t"], "metrics_file": "x"})
    assert err.value.field == "trainer.metrics_file"
    assert TrainerSpec.from_dict(TrainerSpec(command=("t", "{{literal}}")).to_dict()).command == ("t", "{{literal}}")
    assert node_argv(TrainerSpec(command=("t", "{{literal}}")), env_of(
        TrainerSpec(command=("t",)), ALLREDUCE, {"name": "worker-0", "role": "worker", "index": 0, "cpu": 1})) == ["t", "{literal}"]
    assert set(PLACEHOLDERS.values()) <= set(ENV)


def test_reports_are_read_from_json_lines_or_a_log():
    text = "\n".join([json.dumps({"throughput": 100.0, "samples_done": 500, "samples_total": 1000, "time": 1.0}),
                      "not json", json.dumps({"samples_done": 600}),  # no throughput: skipped
                      json.dumps({"throughput": 300, "samples_done": 900, "loss": 0.5, "time": 2.0}),
                      '{"throughput": 4'])  # being written
    reports = parse_reports(text)
    assert [r["throughput"] for r in reports] == [100.0, 300.0]
    entry = node_report(reports)
    assert entry == {"reports": 2, "throughput_sum": 400.0, "reported_at": 2.0, "samples_per_s": 300.0,
                     "samples_done": 900.0, "samples_total": 1000.0, "loss": 0.5}
    log = "step 1 speed=120.5 done=100/1000\nwarning\nstep 2 speed=130 done=200/1000 auc=0.7\n"
    regex = r"speed=(?P<throughput>[\d.]+) done=(?P<samples_done>\d+)/(?P<samples_total>\d+)(?: auc=(?P<auc>[\d.]+))?"
    parsed = parse_reports(log, regex, written_at=5.0)
    assert [(r["throughput"], r["samples_done"], r["time"]) for r in parsed] == [(120.5, 100, 5.0), (130, 200, 5.0)]
    assert parsed[1]["auc"] == 0.7 and "auc" not in parsed[0]


#: facebookresearch/dlrm's own progress line, read with no wrapper script
DLRM_REGEX = (r"Finished training it (?P<iteration>\d+)/(?P<iterations>\d+) of epoch (?P<epoch>\d+), "
              r"(?P<ms_per_it>[0-9.]+) ms/it, loss (?P<loss>[0-9.]+)")


@pytest.mark.unit
def test_facebookresearch_dlrms_own_log_lines_are_its_reports():
    """The fixture is ``dlrm_s_pytorch.py``'s real output (facebookresearch/dlrm at 090956e, run
    with --data-generation=random --mini-batch-size=512 --num-batches=60 --print-freq=20
    --print-time --nepochs=2): each ``Finished training it N/M of epoch E, T ms/it`` line is a
    report — the job's rate from the global batch and ms/it, its progress from the iterations."""
    output = (Path(__file__).parents[1] / "data" / "dlrm_s_pytorch_output.txt").read_text()
    spec = TrainerSpec(command=("python", "dlrm_s_pytorch.py", "--mini-batch-size={global_batch_size}"),
                       log_regex=DLRM_REGEX, reports_from="rank0")
    rank0 = {"name": "worker-0", "role": "worker", "index": 0, "cpu": 1}
    argv = node_argv(spec, env_of(spec, replace(ALLREDUCE, workers=2, batch_size=256), rank0))
    assert argv[-1] == "--mini-batch-size=512"
    reports = parse_reports(output, spec.log_regex, written_at=9.0, per_iteration=(512.0, 512.0))
    lines = [line for line in output.splitlines() if line.startswith("Finished training it")]
    assert len(reports) == len(lines) == 6
    ms = [float(line.split(", ")[1].split()[0]) for line in lines]
    assert [r["throughput"] for r in reports] == pytest.approx([512 * 1000 / t for t in ms])
    assert [r["samples_done"] for r in reports] == [20 * 512, 40 * 512, 60 * 512, 80 * 512, 100 * 512, 120 * 512]
    assert reports[-1]["loss"] == pytest.approx(float(lines[-1].rsplit(" ", 1)[1]))
    # each rank's own rate, when every rank reports: its share of the global batch
    ranks = parse_reports(output, spec.log_regex, per_iteration=(512.0, 256.0))
    assert [r["throughput"] for r in ranks] == pytest.approx([r["throughput"] / 2 for r in reports])
    with pytest.raises(InvalidInputError, match=r"\(\?P<ms_per_it>"):
        TrainerSpec(command=("t",), log_regex=r"it (?P<iteration>\d+)")


def test_the_job_is_done_only_when_every_worker_exited_0():
    reports = {"worker-0": {"samples_done": 1000, "samples_total": 1000, "samples_per_s": 0.0, "auc": 0.8},
               "worker-1": {"samples_done": 990, "samples_total": 1000, "samples_per_s": 50.0}}
    running = job_progress(reports, {"worker-0": "succeeded", "worker-1": "running"})
    assert running["state"] == "training" and running["samples_done"] == 1000 and running["throughput"] == 50.0
    done = job_progress(reports, {"worker-0": "succeeded", "worker-1": "succeeded", "worker-2": "stopped"})
    assert done["state"] == "done" and done["auc"] == 0.8
    assert job_progress({}, {"worker-0": "running"}) == {"state": "training", "samples_done": 0, "samples_total": None,
                                                         "throughput": 0.0}


@pytest.mark.parametrize("changes, field", [
    ({"metrics_port": 80}, "trainer.metrics_port"),
    ({"metrics_port": 2222}, "trainer.metrics_port"),  # the node's TF_CONFIG port
    ({"metrics_port": "9400"}, "trainer.metrics_port"),
    ({"metrics_port": 9400, "log_regex": "(?P<throughput>[0-9.]+)"}, "trainer.metrics_port"),
    ({"metrics_port": 9400, "metrics_path": "metrics"}, "trainer.metrics_path"),
    ({"metrics_port": 9400, "metrics_path": "/m?x=$(id)"}, "trainer.metrics_path"),
    ({"metrics_port": 9400, "metrics_names": {"speed": "x"}}, "trainer.metrics_names.speed"),
    ({"metrics_port": 9400, "metrics_names": {"throughput": "1x"}}, "trainer.metrics_names.throughput"),
])
def test_a_bad_metrics_endpoint_is_refused_naming_the_field(changes, field):
    with pytest.raises(InvalidInputError) as err:
        TrainerSpec(command=("t",), **changes)
    assert err.value.field == field


PAGE = """# HELP train_samples_per_second samples/s per device
# TYPE train_samples_per_second gauge
train_samples_per_second{device="0"} 400.5
train_samples_per_second{device="1"} 399.5
# HELP dlrover_samples_done samples trained
# TYPE dlrover_samples_done counter
dlrover_samples_done_total 12000.0
dlrover_samples_total 50000
dlrover_loss{head="ctr"} 0.4
dlrover_loss{head="cvr"} 0.6
"""


def test_a_prometheus_page_is_read_into_one_report():
    names = TrainerSpec(command=("t",), metrics_port=9400,
                        metrics_names={"throughput": "train_samples_per_second"}).metrics_names
    assert names == {**SCRAPED_FIELDS, "throughput": "train_samples_per_second"}
    # label sets summed for the rates and counts, averaged for the loss; a counter read from its _total sample
    assert scraped_report(PAGE, names, now=7.0) == {
        "throughput": 800.0, "samples_done": 12000.0, "samples_total": 50000.0, "loss": 0.5, "time": 7.0}
    assert scraped_report(PAGE, SCRAPED_FIELDS, now=7.0) is None  # no dlrover_throughput: no report
    assert scraped_report("dlrover_throughput{ 1", SCRAPED_FIELDS, now=7.0) is None  # not Prometheus text
    assert scraped_report("dlrover_throughput NaN\n", SCRAPED_FIELDS, now=7.0) is None
    # a report is kept only when the gauges changed since the last one kept
    first = new_report({"throughput": 1.0, "samples_done": 5.0, "time": 1.0}, "")
    assert json.loads(first) == {"throughput": 1.0, "samples_done": 5.0, "time": 1.0}
    assert new_report({"throughput": 1.0, "samples_done": 5.0, "time": 3.0}, first) is None
    assert new_report({"throughput": 1.0, "samples_done": 6.0, "time": 3.0}, first) is not None
    assert new_report(None, first) is None


def test_an_endpoint_is_scraped_over_http_and_a_silent_one_gives_nothing():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from airflow_dlrover.scrape import scrape_loop

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            body = (PAGE + "dlrover_throughput 3.5\n").encode() if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        assert scrape(f"{url}/metrics", SCRAPED_FIELDS)["throughput"] == 3.5
        assert scrape(f"{url}/other", SCRAPED_FIELDS) is None
        lines, stop = [], threading.Event()
        worker = threading.Thread(target=scrape_loop, args=(f"{url}/metrics", SCRAPED_FIELDS, 0.05, lines.append, stop))
        worker.start()
        import time

        time.sleep(0.3)
        stop.set()
        worker.join(2)
        assert not worker.is_alive() and len(lines) == 1  # the page did not change: one report
        assert json.loads(lines[0])["samples_done"] == 12000.0
    finally:
        server.shutdown()
    assert scrape(f"{url}/metrics", SCRAPED_FIELDS, timeout=0.5) is None  # gone


def test_the_reports_sidecar_imports_neither_pandas_nor_torch():
    """It lives in a 64 MiB container (SCRAPE_SIDECAR_MEMORY_MB): the optimizer's vocabulary
    (pandas) alone would take ~100 MiB."""
    import subprocess
    import sys

    code = "import sys, airflow_dlrover.scrape; print(sorted({'pandas', 'numpy', 'torch', 'scipy'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
