"""A synthetic history for the UI's tests: runs recorded as the operators record them, each in
the DAG of its choice."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from airflow_dlrover.history.control import action_event, decision_record, failure_record
from airflow_dlrover.history.identity import JobIdentity
from airflow_dlrover.history.store import HistoryStore
from airflow_dlrover.optimizer.controller import Fail, Heal, Keep, Relaunch, Resize
from airflow_dlrover.optimizer.job_model import fit_job_model
from airflow_dlrover.optimizer.planner import plan
from airflow_dlrover.optimizer.types import Configuration, NodeState, NodeStatus, Quota, Reason
from sim.synthetic import model_samples

QUOTA = Quota(cpu=16, memory_mb=64 * 1024)
T0 = 1_800_000_000.0


def hot_evidence() -> dict[str, Any]:
    return {"node": "ps-0", "utilisation": 0.97, "cpu_used": 1.94, "cpu_limit": 2.0, "skew": 2.0, "value": 3.0}


def record_run(store: HistoryStore, job: str, run_key: str, dag_id: str = "", seed: int = 3):
    """A finished run: profile samples, a model, a plan, training windows with usage, a keep and a
    resize decision, a failure, its recovery, a healed hot PS. Returns (run id, model, plan)."""
    run = store.start_run(JobIdentity(dag_id, "", job), run_key)
    profile = model_samples(noise=0.03, seed=seed).assign(timestamp=lambda t: T0 + 5.0 * np.arange(len(t)))
    store.add_samples(run, profile, stage="profile")
    model = fit_job_model(profile)
    store.save_model(run, model)
    chosen = plan(model.throughput, model.memory, QUOTA)
    baseline = Configuration(4, 4, 2.0, 2.0, 4096, 4096)
    store.add(run, "plan", {**chosen.to_dict(), "time": T0 + 60, "baseline": {**baseline.to_row(),
                                                                              "predicted_throughput": 1234.0}})
    c = chosen.config
    windows = pd.DataFrame([{**c.to_row(), "throughput": 1000.0 + 10 * i, "worker_cpu_used": 0.8 * c.worker_cpu,
                             "ps_cpu_used": 0.5 * c.ps_cpu, "worker_memory_used_mb": 0.4 * c.worker_memory_mb,
                             "ps_memory_used_mb": None if i == 3 else 0.3 * c.ps_memory_mb,
                             "timestamp": T0 + 70 + 3 * i} for i in range(12)])
    store.add_samples(run, windows, stage="finetune")
    store.save_model(run, fit_job_model(pd.concat([profile, windows]), model))
    # The records the fine-tune and the guard leave, from the controller's actions.
    store.add(run, "decision", decision_record(Keep(Reason.AT_BEST), c, [1000.0], 1e5) | {"time": T0 + 80})
    pays = {"speedup": 1.2, "speedup_low": 1.1, "saving_s": 900.0, "keep_s": 5000.0, "cost_s": 30.0}
    resize = Resize(Reason.PAYS, pays, config=replace(c, workers=c.workers + 1), expected_speedup=1.2)
    store.add(run, "decision", decision_record(resize, c, [1000.0, 1010.0], 2e5,
                                               {"actions": ["worker-9 added"], "seconds": 1.0}) | {"time": T0 + 100})
    store.add(run, "event", {"event": "launched", "time": T0 + 62, "adopted": False})
    killed = (NodeStatus("worker-1", "worker", 1, NodeState.OOM_KILLED, 1.0, 512, reason="OOM"),)
    fail = Fail(Reason.NODE_FAILED, {"node": "worker-1", "state": "oom_killed", "detail": "OOM"}, nodes=("worker-1",))
    store.add(run, "event", failure_record(fail, killed, 1) | {"time": T0 + 90})
    relaunch = Relaunch(Reason.OOM_KILLED, {"node": "worker-1", "memory_limit_mb": 512, "memory_mb": 768},
                        node="worker-1", memory_mb=768)
    store.add(run, "event", action_event({**relaunch.to_record(), "done": ["worker-1 relaunched"], "seconds": 2.5},
                                         killed, 2) | {"time": T0 + 95})
    heal = Heal(Reason.HOT_PS, hot_evidence(), node="ps-0", cpu=3.0)
    store.add(run, "event", action_event({**heal.to_record(), "done": ["ps-0 set to 3 CPU in place"], "seconds": 0.1},
                                         (), 1) | {"time": T0 + 97})
    store.finish_run(run, "succeeded", {"measured_throughput": 1050.0, "predicted_throughput": chosen.predicted_throughput,
                                        "resizes": 1, "recoveries": [{"node": "worker-1"}]})
    return run, model, chosen
