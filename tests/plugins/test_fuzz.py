"""The /dlrover JSON API under a property-based fuzzer: schemathesis generates requests from the
app's own OpenAPI document, valid and invalid ones, for every operation, and sends them to the app
in process (mounted as the API server mounts it), logged in, over a store with runs in it. No
request may answer a server error (an exception in process), nor a status, content type or body
that its OpenAPI does not declare."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings, strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from airflow_dlrover.plugins import URL_PREFIX
from airflow_dlrover.plugins.app import get_store
from airflow_dlrover.history.store import HistoryStore
from history_data import record_run
from ui_settings import DAG_A

pytestmark = pytest.mark.unit

#: Generated requests per operation: 13 operations, about 1,000 requests, ~40 s on two shared cores.
EXAMPLES = 80
#: schemathesis' stateless response checks. Left out: ``negative_data_rejection``, which expects a
#: repeated scalar query parameter (``?event=a&event=b``) to be refused where FastAPI takes the last.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
#: The what-if's quota set to one the planner can plan in, so that its other parameters are fuzzed past it.
PLANNABLE = {"cpu": "16", "memory": "64Gi"}


@pytest.fixture(scope="module")
def fuzzed(dlrover_client, tmp_path_factory, ui_dags):
    """The app over a store with a run of ``DAG_A`` and one outside any DAG; the path parameters
    that name them (the runs' ids, their jobs' ids, the DAG run)."""
    store = HistoryStore(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'history.db'}")
    run_key = "scheduled__2026-11-29"
    runs = [record_run(store, "ctr", run_key, DAG_A)[0], record_run(store, "cli", "cli__1", "", seed=5)[0]]
    jobs = [store.run(run)["job_ref"] for run in runs]  # the store's ids of the two jobs
    dlrover_client.app_state.dependency_overrides[get_store] = lambda: store
    yield dlrover_client, {"job": jobs, "run": runs, "dag_id": [DAG_A], "run_id": [run_key]}
    dlrover_client.app_state.dependency_overrides.clear()


def strategies(operation, known: dict[str, list]) -> list:
    """For each generation mode (valid and invalid data): every parameter generated, and the path
    parameters set to what the store holds (the what-if's quota too, once plannable), so that part
    of the requests reach past the lookups: the curves, the planner, a DAG run's runs."""
    names = [p.name for p in operation.path_parameters]
    fixed = [{"path_parameters": {n: known[n][i % len(known[n])] for n in names}}
             for i in range(max((len(known[n]) for n in names), default=0))]
    if PLANNABLE.keys() <= {p.name for p in operation.query}:
        fixed += [{**f, "query": PLANNABLE} for f in fixed]
    return [operation.as_strategy(mode, **kwargs) for mode in GenerationMode for kwargs in [{}, *fixed]]


def test_no_generated_request_answers_a_server_error(fuzzed):
    client, known = fuzzed
    schema = schemathesis.openapi.from_asgi(f"{URL_PREFIX}/openapi.json", client.app)
    schema.config.update(base_url=f"http://localhost{URL_PREFIX}")
    headers = {"Authorization": f"Bearer {client.token}"}
    statuses: Counter = Counter()
    failures = []
    started = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None, report_multiple_bugs=False,
                  suppress_health_check=list(HealthCheck))
        @given(case=st.one_of(strategies(operation, known)))
        def send(case):
            try:
                response = case.call(headers=headers)
            except Exception as err:  # the app raised: a 500 behind the API server
                statuses[operation.label, 500] += 1
                raise AssertionError(f"{type(err).__name__}: {err}\n{case.as_curl_command()}") from err
            statuses[operation.label, response.status_code] += 1
            case.validate_response(response, checks=CHECKS)

        try:
            send()
        except (Exception, BaseExceptionGroup) as err:  # every operation's failures, not the first one's only
            failures.append(f"{operation.label}: {err}")
    print(f"{sum(statuses.values())} requests in {time.monotonic() - started:.1f} s")
    for (label, status), n in sorted(statuses.items()):
        print(f"  {label} {status}: {n}")
    assert {label for label, _ in statuses} == {f"GET {r}" for r in schema.raw_schema["paths"]}  # every operation
    assert sum(statuses.values()) >= 12 * EXAMPLES
    assert not failures, "\n\n".join(failures)
