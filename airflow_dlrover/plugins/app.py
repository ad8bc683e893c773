"""The ``/dlrover`` FastAPI app: a JSON API over the history store, and the HTML views that draw it.

Every data route and every page requires an authenticated Airflow user (the API server's
``requires_authenticated()``: a bearer token, or the UI's ``_token`` cookie); a page opened
without one redirects to the auth manager's login. Only the OpenAPI document
(``/dlrover/openapi.json``) and the static files (the vendored Chart.js, our script and style)
are public. The history store is the one the ``dlrover_default`` connection names (SQLite under
``AIRFLOW_HOME`` by default), as for the operators.

Each user sees only the runs of the DAGs they may read (:class:`DagReader`, the auth manager's
answer): a run, a job, a DAG they may not read answers 404 exactly as one that does not exist
(never 403, which would tell that it exists), and the job list, a job's runs, a DAG run's runs
and the what-if page's jobs leave them out.
"""

from __future__ import annotations

from functools import cached_property, lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from airflow.api_fastapi.core_api.security import GetUserDep, requires_authenticated
from fastapi import APIRouter, Depends, FastAPI, Path as PathParam, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException

from airflow_dlrover.history.identity import JobIdentity, task_group_of
from airflow_dlrover.optimizer.types import InvalidInputError, Objective
from airflow_dlrover.plugins import queries
from airflow_dlrover.plugins.queries import NotFound

HERE = Path(__file__).parent
#: Which section of the run view a task's page opens on, by the task's operator (see ``task_section``).
SECTIONS = {
    "DLRoverProfileOperator": "curves", "DLRoverFitOperator": "curves", "DLRoverLaunchOperator": "plan",
    "DLRoverFineTuneOperator": "throughput", "DLRoverInstabilitySensor": "instability",
    "DLRoverReportOperator": "summary",
}


@lru_cache(maxsize=8)
def _store(url: str | None):
    from airflow_dlrover.history.store import HistoryStore

    return HistoryStore(url)


def get_store():
    """The history store of the ``dlrover_default`` connection (one engine per URL)."""
    from airflow_dlrover.hooks.dlrover import DLRoverHook

    return _store(DLRoverHook().settings.history_url)


def _authenticated():
    return Depends(requires_authenticated())


class DagReader:
    """May the request's user read the runs of a DAG (``queries.MayRead``)?

    A DAG's runs: when the auth manager lets the user read the DAG, i.e. it is among
    ``get_authorized_dag_ids(method="GET")``, the set behind the API server's own
    ``ReadableDagsFilterDep`` (so a DAG no longer in the metadata DB is readable by no one, as in
    Airflow's UI). A job run outside any DAG (dag_id '', e.g. ``dlrover-rm``): when the user may read
    every DAG, ``is_authorized_dag(method="GET")`` without a DAG (FAB: the global DAG read
    permission; SimpleAuthManager: any role, teams or not). Asked once per request, when needed.
    """

    def __init__(self, user: Any):
        self.user = user

    @cached_property
    def _auth_manager(self) -> Any:
        from airflow.api_fastapi.app import get_auth_manager

        return get_auth_manager()

    @cached_property
    def dags(self) -> set[str]:
        return set(self._auth_manager.get_authorized_dag_ids(user=self.user, method="GET"))

    @cached_property
    def every_dag(self) -> bool:
        return bool(self._auth_manager.is_authorized_dag(method="GET", user=self.user))

    def __call__(self, dag_id: str) -> bool:
        return dag_id in self.dags if dag_id else self.every_dag


def dag_reader(user: GetUserDep) -> DagReader:
    return DagReader(user)


Reader = Annotated[DagReader, Depends(dag_reader)]
#: A run id as the routes take it: a positive id a store can hold (``queries.MAX_ID``).
RunId = Annotated[int, PathParam(ge=1, le=queries.MAX_ID, description="a run id (GET /dlrover/api/jobs lists them)")]


def readable_run(run: RunId, reader: Reader, store=Depends(get_store)) -> dict[str, Any]:
    """The run of the path, if the user may read its DAG (else 404, as for an unknown id)."""
    return _call(queries.readable_run, store, run, reader)


ReadableRun = Annotated[dict[str, Any], Depends(readable_run)]
#: A job id as the routes take it (``/jobs`` lists them).
JobId = Annotated[int, PathParam(ge=1, le=queries.MAX_ID, description="a job id (GET /dlrover/api/jobs lists them)")]


def _error(status: int, err: NotFound | InvalidInputError) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": {
        "field": err.field, "value": queries.clean(err.value), "allowed": err.allowed, "message": str(err)}})


def _call(function, *args: Any, **kwargs: Any) -> Any:
    try:
        return function(*args, **kwargs)
    except NotFound as err:
        raise _Failure(404, err) from None
    except InvalidInputError as err:
        raise _Failure(422, err) from None


class _Failure(Exception):
    def __init__(self, status: int, err: NotFound | InvalidInputError):
        self.status, self.err = status, err


def api_router() -> APIRouter:
    """``/dlrover/api``: jobs, runs, samples, models, curves, plans, decisions, events, what-if."""
    api = APIRouter(prefix="/api", dependencies=[_authenticated()], tags=["DLRover"])
    errors = {404: {"description": "Unknown job, run or DAG, or one of a DAG the user may not read "
                         "(the message names it and what exists)"},
              422: {"description": "Bad input (the message names the field, the value and what is allowed)"},
              401: {"description": "Not authenticated"}}

    @api.get("/jobs", summary="Jobs, each with its last run's plan, throughput, utilisation and status")
    def jobs(reader: Reader, store=Depends(get_store)) -> list[dict[str, Any]]:
        return queries.jobs(store, reader)

    @api.get("/jobs/{job}/runs", summary="The runs of a job (its id in /jobs), oldest first", responses=errors)
    def runs(job: JobId, reader: Reader, store=Depends(get_store)) -> list[dict[str, Any]]:
        return _call(queries.runs, store, job, reader)

    @api.get("/jobs/{job}/what-if", summary="Plan the job (its id in /jobs) under another quota and objective",
             responses=errors)
    def what_if(job: JobId, reader: Reader, cpu: str = Query(..., description="cores, e.g. 8"),
                memory: str = Query(..., description="e.g. 16Gi, 512Mi, 64GB"), gpu: str = "0",
                max_nodes: str | None = None, objective: Objective = Objective.THROUGHPUT,
                samples: str | None = Query(None, description="samples to train (deadline objective; PS growth)"),
                deadline: str | None = Query(None, description="e.g. 2h, 45m (deadline objective)"),
                store=Depends(get_store)) -> dict[str, Any]:
        return _call(queries.what_if, store, job, reader, cpu=cpu, memory=memory, gpu=gpu, max_nodes=max_nodes,
                     objective=objective.value, samples=samples, deadline=deadline)

    @api.get("/dag-runs/{dag_id}/{run_id}", summary="The history runs an Airflow DAG run (dag id and run id) recorded",
             responses=errors)
    def dag_run(dag_id: str, run_id: str, reader: Reader, store=Depends(get_store)) -> list[dict[str, Any]]:
        return _call(queries.runs_of_dag_run, store, dag_id, run_id, reader)

    @api.get("/runs/{run}", summary="A run, its report and the number of its records", responses=errors)
    def run(row: ReadableRun, store=Depends(get_store)) -> dict[str, Any]:
        return _call(queries.run, store, row["id"])

    @api.get("/runs/{run}/samples", summary="Profile and fine-tune samples (the vocabulary's columns)",
             responses=errors)
    def samples(row: ReadableRun, stage: Literal["profile", "finetune"] | None = None,
                store=Depends(get_store)) -> list[dict[str, Any]]:
        return _call(queries.samples, store, row["id"], stage)

    @api.get("/runs/{run}/models", summary="Every model fitted in the run (fit task first)", responses=errors)
    def models(row: ReadableRun, store=Depends(get_store)) -> list[dict[str, Any]]:
        return _call(queries.models, store, row["id"])

    @api.get("/runs/{run}/curves", summary="Fitted throughput along w, p, λw, λp with its band and the samples",
             responses=errors)
    def curves(row: ReadableRun, model: int = Query(0, description="index of the run's model: 0 = fit task's, -1 = latest"),
               store=Depends(get_store)) -> dict[str, Any]:
        return _call(queries.curves, store, row["id"], model)

    @api.get("/runs/{run}/plans", summary="Chosen plan, alternatives, Pareto front, baseline", responses=errors)
    def plans(row: ReadableRun, store=Depends(get_store)) -> dict[str, Any]:
        return _call(queries.plans, store, row["id"])

    @api.get("/runs/{run}/decisions", summary="Fine-tune decisions with their reasons", responses=errors)
    def decisions(row: ReadableRun, store=Depends(get_store)) -> list[dict[str, Any]]:
        return _call(queries.decisions, store, row["id"])

    @api.get("/runs/{run}/events", summary="Events of the run (optionally of one kind)", responses=errors)
    def events(row: ReadableRun, event: str | None = Query(None, description="e.g. profiled, launched, node_failed, "
                                                   "recovered, instability"),
               store=Depends(get_store)) -> list[dict[str, Any]]:
        return _call(queries.events, store, row["id"], event)

    @api.get("/runs/{run}/instability", summary="Instability, failures and recoveries: evidence and action",
             responses=errors)
    def instability(row: ReadableRun, store=Depends(get_store)) -> list[dict[str, Any]]:
        return _call(queries.instability, store, row["id"])

    @api.get("/runs/{run}/timeline", summary="Throughput and utilisation over time, decisions and events",
             responses=errors)
    def timeline(row: ReadableRun, store=Depends(get_store)) -> dict[str, Any]:
        return _call(queries.timeline, store, row["id"])

    return api


def serialized_task(dag_id: str, task_id: str) -> Any:
    """The task of the serialized DAG, None when it cannot be had."""
    try:
        from airflow.models.serialized_dag import SerializedDagModel

        dag = SerializedDagModel.get_dag(dag_id)
        return dag.get_task(task_id) if dag is not None else None
    except Exception:  # an unknown DAG or task, or no metadata DB
        return None


def task_section(task: Any) -> str | None:
    """The run-view section of a task, by its operator (None: the whole view)."""
    return SECTIONS.get(getattr(task, "task_type", None) or type(task).__name__) if task is not None else None


def views_router(templates: Jinja2Templates) -> APIRouter:
    """The HTML pages (their data comes from the API, fetched by ``static/dlrover.js``)."""
    views = APIRouter(dependencies=[_authenticated()], include_in_schema=False)

    def page(request: Request, name: str, **context: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")
        return templates.TemplateResponse(request, name, {"base": base, **context})

    @views.get("/", response_class=HTMLResponse)
    def job_list(request: Request) -> HTMLResponse:
        return page(request, "jobs.html")

    @views.get("/jobs/{job}", response_class=HTMLResponse)
    def job_runs(request: Request, job: JobId, reader: Reader, store=Depends(get_store)) -> HTMLResponse:
        identity = _call(queries.get_job, store, job, reader)
        return page(request, "runs.html", job=job, identity=identity)

    @views.get("/runs/{run}", response_class=HTMLResponse)
    def run_view(request: Request, row: ReadableRun, section: str | None = None) -> HTMLResponse:
        return page(request, "run.html", run=row, section=section)

    @views.get("/dag-runs/{dag_id}/{run_id}", response_class=HTMLResponse)
    def dag_run_view(request: Request, dag_id: str, run_id: str, reader: Reader,
                     store=Depends(get_store)) -> HTMLResponse:
        return _dag_run_page(request, store, reader, dag_id, run_id, None)

    @views.get("/dag-runs/{dag_id}/{run_id}/tasks/{task_id}", response_class=HTMLResponse)
    def task_view(request: Request, dag_id: str, run_id: str, task_id: str, reader: Reader,
                  store=Depends(get_store)) -> HTMLResponse:
        """The run of the task's job: the DAG's, in the task's group (any group when the DAG is unknown)."""
        if not reader(dag_id):  # refused before the serialized DAG is read
            raise _Failure(404, NotFound("dag_id", dag_id, "the id of a DAG you may read"))
        task = serialized_task(dag_id, task_id)
        group = task_group_of(task) if task is not None else None
        return _dag_run_page(request, store, reader, dag_id, run_id, task_section(task), group)

    def _dag_run_page(request: Request, store: Any, reader: DagReader, dag_id: str, run_id: str,
                      section: str | None, task_group: str | None = None) -> HTMLResponse:
        found = _call(queries.runs_of_dag_run, store, dag_id, run_id, reader, task_group)
        if len(found) == 1:
            return page(request, "run.html", run=store.run(found[0]["id"]), section=section)
        return page(request, "dag_run.html", dag_id=dag_id, run_id=run_id, found=found)

    @views.get("/what-if", response_class=HTMLResponse)
    def what_if_view(request: Request, reader: Reader, job: int | None = Query(None, ge=1, le=queries.MAX_ID),
                     store=Depends(get_store)) -> HTMLResponse:
        jobs = [{**j, "identity": str(JobIdentity(j["dag_id"], j["task_group"], j["job"]))}
                for j in store.jobs() if reader(j["dag_id"])]
        return page(request, "what_if.html", jobs=jobs, job=job)

    return views


def create_app() -> FastAPI:
    """The app the plugin mounts at ``/dlrover``."""
    from airflow_dlrover import __version__

    app = FastAPI(title="DLRover-RM", version=__version__, docs_url=None, redoc_url=None,
                  description="What the DLRover-RM optimizer did, and why: profile samples, fitted models, "
                  "plans, fine-tune decisions and instability events from the history store. Every route "
                  "under /api requires an authenticated Airflow user (Authorization: Bearer <JWT from "
                  "POST /auth/token>, or the UI's _token cookie).")
    templates = Jinja2Templates(directory=HERE / "templates")
    app.include_router(api_router())
    app.include_router(views_router(templates))
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @app.exception_handler(_Failure)
    def failure(request: Request, exc: _Failure) -> JSONResponse:
        return _error(exc.status, exc.err)

    @app.exception_handler(HTTPException)
    def unauthenticated(request: Request, exc: HTTPException):
        """A page without a login goes to the login page; the API answers with the status."""
        page = request.method == "GET" and not request.url.path.startswith(f"{request.scope.get('root_path', '')}/api")
        if exc.status_code in (401, 403) and page:
            from airflow.api_fastapi.app import get_auth_manager

            return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=303)
        return JSONResponse(status_code=exc.status_code, content={"detail": exc.detail}, headers=exc.headers)

    return app
