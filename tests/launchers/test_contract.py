"""The trainer contract (launchers.contract): what a node gets, what is read back, what is refused."""

import json

import pytest

from airflow_dlrover.launchers.contract import (
    ENV, PLACEHOLDERS, TrainerSpec, job_progress, node_argv, node_env, node_report, parse_reports,
)
from airflow_dlrover.optimizer.types import Configuration, InvalidInputError

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
                           ({"log_regex": "(?P<throughput>"}, "trainer.log_regex"), ({"grace_s": 0}, "trainer.grace_s")):
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


def test_the_job_is_done_only_when_every_worker_exited_0():
    reports = {"worker-0": {"samples_done": 1000, "samples_total": 1000, "samples_per_s": 0.0, "auc": 0.8},
               "worker-1": {"samples_done": 990, "samples_total": 1000, "samples_per_s": 50.0}}
    running = job_progress(reports, {"worker-0": "succeeded", "worker-1": "running"})
    assert running["state"] == "training" and running["samples_done"] == 1000 and running["throughput"] == 50.0
    done = job_progress(reports, {"worker-0": "succeeded", "worker-1": "succeeded", "worker-2": "stopped"})
    assert done["state"] == "done" and done["auc"] == 0.8
    assert job_progress({}, {"worker-0": "running"}) == {"state": "training", "samples_done": 0, "samples_total": None,
                                                         "throughput": 0.0}
