"""The streams' pages inside the Airflow UI: status, actions, data quality and Data Docs.

A FastAPI app that the plugin ``plugins/streams_ui.py`` mounts on Airflow's API server
at :data:`streamops.STREAMS_URL` (``/streams``):

* ``/``: every stream: its status (the checkpoint sensor's classification), a trend of
  its last 15 minutes, last committed batch and when, rates, backlog, watermark, restarts
  in the last day, last validation;
* ``/api/status`` and ``/api/trends``: the same as JSON;
* ``/<stream>/?range=15m|1h|24h``: one stream: its charts over the range (rows per second
  in and processed, batch duration against the trigger, backlog, event-time lag, state
  rows, quarantined share; restarts, stops and validations marked), its flow graph
  (landing directory, ingestion, outputs, sinks, quarantine: rows in and out, status,
  latest data-quality result), and forms that trigger its DAGs with their params (start,
  stop graceful or immediate, restart, backfill a range, validate); the charts' and the
  graph's data at ``/<stream>/api/charts`` and ``/<stream>/api/flow`` (``streamops.page_data``);
* ``/static/``: the pages' script and Plotly's, installed with the project;
* ``/<stream>/quality/``: its data-quality summary, and ``/<stream>/quality/docs/`` its
  Great Expectations Data Docs;
* ``/dag/<dag_id>``: the page of the stream a DAG belongs to (the tab on DAG pages).
* ``/metrics``: every stream's figures in Prometheus' text format (``streamops.metrics``),
  readable with the login or with the scrapers' token, which opens no other route.

Airflow does not guard plugin apps, so every route checks the caller itself
(``streamops.ui_guard``): anonymous requests get 401; reading needs read access to the
stream's DAG (403 otherwise; the list of streams shows those the caller may read, and is a
403 if that is none of them), an action needs the right to run the DAG it triggers. As on
Airflow's own pages, a DAG whose bundle belongs to a team (multi-team Airflow) is only for
that team's members. Actions are POSTs that must come from our own page (a CSRF token bound
to the session, and the server's own Origin). Every response carries a Content-Security-Policy;
the Data Docs are served sandboxed, without the scripts and styles they would load from CDNs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.clock import ago
from spark_jobs.runtime.history import History
from spark_jobs.runtime.session import uses_delta
from spark_jobs.runtime.standby import standbys
from spark_jobs.stream_spec.layout import (
    Layout,
    default_data_root,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import load_specs
from spark_jobs.stream_spec.models import StreamSpec
from streamops import DAG_ROLES, dag_id, metrics, page_data
from streamops.cost import summary as cost_summary
from streamops.ui_guard import (
    CSRF_FIELD,
    DOCS_POLICY,
    HEADERS,
    PAGE_POLICY,
    action_caller,
    csrf_token,
    current_user,
    offline_docs,
)

DAY = 86400.0
HOUR = 3600.0

app = FastAPI(title="Streams", description="Status, actions and data quality of the streams",
              docs_url=None, redoc_url=None, openapi_url=None)

#: the pages' HTML (``templates/``); every value put in is escaped
TEMPLATES = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                        autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True,
                        undefined=StrictUndefined)
TEMPLATES.filters["ago"] = ago


User = Annotated[object, Depends(current_user)]
Actor = Annotated[object, Depends(action_caller)]


@app.middleware("http")
async def security_headers(request: Request, call_next):  # Starlette's middleware
    response = await call_next(request)
    response.headers.setdefault("Content-Security-Policy", PAGE_POLICY)
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _allowed(user: object, dag: str, run: bool = False) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.models.dag import DagModel

    # with the DAG's team, as Airflow's own routes ask (requires_access_dag): without it, the
    # auth manager would let a member of any team read another team's stream
    return get_auth_manager().is_authorized_dag(
        method="POST" if run else "GET", access_entity=DagAccessEntity.RUN if run else None,
        details=DagDetails(id=dag, team_name=DagModel.get_team_name(dag)), user=user)


def _specs() -> dict[str, StreamSpec]:
    specs, _errors = load_specs(default_spec_dir())
    return specs


def _readable(user: object) -> list[StreamSpec]:
    """The streams whose DAG the caller may read. None of them (while there are streams) is a
    403: a logged-in user without read access is told so, not shown an empty page."""
    specs = _specs()
    readable = [spec for name, spec in sorted(specs.items()) if _allowed(user, dag_id(name))]
    if specs and not readable:
        raise HTTPException(403, "no read access to any stream's DAG")
    return readable


def _spec(stream: str, user: object) -> StreamSpec:
    spec = _specs().get(stream)
    if spec is None:
        raise HTTPException(404, f"no stream {stream!r}")
    if not _allowed(user, dag_id(stream)):
        raise HTTPException(403, f"no read access to stream_{stream}")
    return spec


def _layout(spec: StreamSpec) -> Layout:
    return Layout(spec, default_data_root(), default_spec_dir())


def _compiled(spec: StreamSpec) -> tuple[StreamPlan, Layout]:
    """The stream's plan, compiled once for a request, and its layout (its control files)."""
    layout = _layout(spec)
    return compile_plan(spec, layout), layout


def _status(spec: StreamSpec, now: float | None = None) -> dict[str, Any]:
    """:func:`stream_status` of a stream whose plan the request needs for nothing else."""
    return stream_status(*_compiled(spec), now, description=spec.description)


def stream_status(plan: StreamPlan, layout: Layout, now: float | None = None, description: str = "") -> dict[str, Any]:
    """What an operator wants to know about a stream, from its plan and files (no Spark);
    ``description``: its spec's."""
    from streamops.health import assess
    from streamops.restarts import RestartBudget

    now = time.time() if now is None else now
    status: dict[str, Any] = {"stream": plan.stream, "description": description}
    try:
        health = assess(plan, layout, now, measure=False)  # a broker's figures as the supervisor measured them
        status.update(health.to_dict())
    except (OSError, ValueError) as exc:
        status.update(status="unknown", reason=f"cannot read the checkpoint: {exc}")
    try:
        budget = RestartBudget(layout.runs_file, plan.supervision.restart)
        status["restarts_last_day"] = budget.restarts_since(now - DAY)
        status["failures_in_a_row"] = budget.consecutive_failures()
        status["failures_in_period"] = budget.failures_in_period(now)
    except ValueError as exc:
        status["restarts_last_day"], status["restart_history_problem"] = None, str(exc)
    status["stopped_on_purpose"] = layout.hold_marker.exists()
    status["execution"] = plan.execution.describe()
    if plan.execution.scheduled and plan.execution.shared_driver:
        status["shared_driver"] = shared_driver_status(layout)
    status["cost"] = cost_summary(History(layout.history_file), now - HOUR, now)  # what its drivers used
    status["standby"] = [{"host": s.host, "pid": s.pid, "state": s.state, "since": s.since}
                         for s in standbys(layout.lease_dir)] if plan.supervision.standby else None
    try:
        summary = json.loads((layout.quality_dir / "summary.json").read_text(encoding="utf-8"))
        last = summary.get("last_run") or {}
        status["validation"] = {"ok": summary.get("ok"), "at": last.get("at"), "units": last.get("units"),
                                "failed_units": last.get("failed"),
                                "accounting_ok": (summary.get("accounting") or {}).get("ok")}
    except (OSError, ValueError):
        status["validation"] = None
    return status


def shared_driver_status(layout: Layout) -> dict[str, Any]:
    """The data root's shared driver, for a stream whose runs go there: whether one serves (its
    pid, host and the run it is on), and how many runs wait for it."""
    from spark_jobs.runtime.run_queue import RunQueue

    queue = RunQueue(layout.shared_driver_queue)
    serving = queue.serving()
    return {"serving": serving is not None, "pid": serving and serving.get("pid"),
            "host": serving and serving.get("host"), "on_run": bool(serving and serving.get("run")),
            "waiting": queue.waiting()}


def _driver_cell(s: dict[str, Any]) -> str:
    """Where the stream's driver runs, and its standby's state if the spec asks for one."""
    return str(TEMPLATES.get_template("rows.html").module.driver_cell(s))


@app.get("/", response_class=HTMLResponse)
def index(user: User) -> str:
    return TEMPLATES.get_template("index.html").render(
        statuses=[_status(spec) for spec in _readable(user)], refresh=True, static="")


@app.get("/api/status")
def status_json(user: User) -> JSONResponse:
    return JSONResponse([_status(spec) for spec in _readable(user)])


@app.get("/api/trends")
def trends_json(user: User) -> JSONResponse:
    return JSONResponse([page_data.trend(*_compiled(spec)) for spec in _readable(user)])


#: what ``/static/`` serves: the pages' script, and Plotly's from the plotly package
STATIC = {"streams.js": Path(__file__).parent / "static" / "streams.js"}


def _plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


@app.get("/static/{name}")
def static_file(name: str, user: User) -> FileResponse:
    path = _plotly_js() if name == "plotly.min.js" else STATIC.get(name)
    if path is None or not path.is_file():
        raise HTTPException(404, "not found")
    return FileResponse(path, media_type="text/javascript", headers={"Cache-Control": "private, max-age=3600"})


def _range(value: str) -> str:
    try:
        page_data.range_seconds(value)
    except page_data.RangeError as exc:
        raise HTTPException(400, str(exc)) from None
    return value


@app.get("/{stream}/api/charts")
def charts_json(stream: str, user: User, range: str = page_data.DEFAULT_RANGE) -> JSONResponse:
    plan, layout = _compiled(_spec(stream, user))
    return JSONResponse(page_data.charts(plan, layout, _range(range)))


@app.get("/{stream}/api/flow")
def flow_json(stream: str, user: User, range: str = page_data.DEFAULT_RANGE) -> JSONResponse:
    spec = _spec(stream, user)
    plan, layout = _compiled(spec)
    return JSONResponse(page_data.flow(plan, layout, stream_status(plan, layout, description=spec.description),
                                   _range(range)))


@app.get("/{stream}/row", response_class=HTMLResponse)
def stream_row(stream: str, user: User) -> str:
    """The stream's status row, which its page refreshes."""
    return TEMPLATES.get_template("row.html").render(s=_status(_spec(stream, user)), prefix="../", row_url="row")


@app.get("/dag/{dag}")
def dag_page(dag: str, user: User) -> RedirectResponse:
    for name in _specs():
        if dag in {dag_id(name, role) for role in DAG_ROLES}:
            if not _allowed(user, dag):
                raise HTTPException(403, "no read access to this DAG")
            return RedirectResponse(f"../{name}/", status_code=307)
    raise HTTPException(404, f"{dag} is not a stream's DAG")


#: the charts of a stream's page, in order (streamops.page_data.charts)
CHARTS = ("rates", "durations", "backlog", "lag", "state", "quarantine", "cost")

#: action -> (the role of the DAG it triggers, what it does)
ACTIONS = {
    "start": ("", "deploy and supervise the stream"),
    "stop": ("stop", "stop it (it stays stopped)"),
    "restart": ("restart", "graceful stop, then resume from the checkpoint"),
    "backfill": ("backfill", "recompute an event-time range from the accepted rows, then validate it"),
    "validate": ("quality", "validate the units closed since the last validation"),
    "maintain": ("maintenance", "compact and vacuum the stream's Delta tables"),
    "inspect": ("state", "read what the state holds (open windows, deduplication keys) at the last committed batch"),
    "upgrade": ("upgrade", "carry the spec's pending change out: the changed outputs rebuilt beside their sinks "
                           "while the others run, each swapped in in one step, rolled back on failure"),
    "rollback": ("rollback", "roll the newest upgrade back to its savepoint and the spec the stream ran before"),
}
#: The actions of a stream that is an application of the user's own: its DAGs (dag_factory)
APPLICATION_ACTIONS = ("start", "stop", "restart")


def _actions(spec: StreamSpec) -> dict[str, tuple[str, str]]:
    has_tables = uses_delta(spec)  # the maintenance DAG exists for a stream with Delta tables only
    return {a: v for a, v in ACTIONS.items()
            if (spec.application is None or a in APPLICATION_ACTIONS) and (a != "maintain" or has_tables)}


#: runs of the maintenance DAG shown on a stream's page
RECENT_RUNS = 5


def _recent_runs(dag: str) -> list[dict[str, Any]]:
    """The DAG's latest runs: id, state, start and end."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runs = session.scalars(select(DagRun).where(DagRun.dag_id == dag)
                               .order_by(DagRun.run_after.desc()).limit(RECENT_RUNS)).all()
        return [{"run_id": r.run_id, "state": str(r.state), "start": r.start_date.isoformat() if r.start_date else None,
                 "end": r.end_date.isoformat() if r.end_date else None} for r in runs]


@app.get("/{stream}/", response_class=HTMLResponse)
def stream_page(stream: str, request: Request, user: User, triggered: str | None = None,
                range: str = page_data.DEFAULT_RANGE) -> str:
    spec = _spec(stream, user)
    plan, layout = _compiled(spec)
    chosen = _range(range)
    actions = [{"name": action, "what": what, "dag": dag_id(stream, role)}
               for action, (role, what) in _actions(spec).items()]
    tables = page_data.delta_tables(plan) if uses_delta(spec) else []
    maintenance = dag_id(stream, "maintenance")
    runs = _recent_runs(maintenance) if tables and _allowed(user, maintenance) else []
    status = stream_status(plan, layout, description=spec.description)
    held = page_data.state(layout, status.get("last_committed") or {}) if plan.application is None else None
    history = page_data.plans(plan, layout) if plan.application is None else None
    return TEMPLATES.get_template("stream.html").render(
        stream=stream, description=spec.description, triggered=triggered, status=status, state=held, plans=history,
        ranges=page_data.RANGES, chosen=chosen, charts=CHARTS, actions=actions, csrf_field=CSRF_FIELD,
        csrf_token=csrf_token(request), refresh=False, static="../", tables=tables, maintenance=maintenance,
        maintenance_runs=runs)


@app.post("/{stream}/actions/{action}")
def act(stream: str, action: str, user: Actor, mode: Annotated[str | None, Form()] = None,
        start: Annotated[str | None, Form()] = None, end: Annotated[str | None, Form()] = None) -> RedirectResponse:
    """Trigger the DAG behind an action with its params; bad params get 400 and trigger nothing."""
    spec = _spec(stream, user)
    if action not in _actions(spec):
        raise HTTPException(404, f"no action {action!r}; actions: {sorted(_actions(spec))}")
    dag = dag_id(spec.name, ACTIONS[action][0])
    if not _allowed(user, dag, run=True):
        raise HTTPException(403, f"no permission to run {dag}")
    conf: dict[str, Any] = {}
    if action == "stop":
        if mode not in ("graceful", "immediate"):
            raise HTTPException(400, f"mode must be graceful or immediate, not {mode!r}")
        conf["mode"] = mode
    if action == "backfill":
        from spark_jobs.backfill import BackfillError, check_held, parse_range

        try:
            lo, hi = parse_range(start or "", end or "")
            check_held(_compiled(spec)[0], lo, hi, spec.name)
        except BackfillError as exc:
            raise HTTPException(400, str(exc)) from None
        conf.update(start=lo.isoformat(), end=hi.isoformat())
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    try:
        run = trigger_dag(dag, triggered_by=DagRunTriggeredByType.UI, conf=conf,
                          triggering_user_name=getattr(user, "get_name", lambda: None)())
    except Exception as exc:  # Airflow's own errors (unknown DAG, bad params) are the user's answer
        raise HTTPException(400, f"could not trigger {dag}: {exc}") from None
    _unpause(dag)  # as Airflow's own trigger form does: a run of a paused DAG would never start
    run_id = getattr(run, "run_id", None) if run is not None else None
    return RedirectResponse(f"../?triggered={dag}%20{run_id or ''}", status_code=303)


def _unpause(dag: str) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        model = session.get(DagModel, dag)
        if model is not None and model.is_paused:
            model.is_paused = False


@app.get("/{stream}/quality/{path:path}")
def quality_file(stream: str, path: str, user: User) -> Response:
    spec = _spec(stream, user)
    root = _layout(spec).quality_dir.resolve()
    target = (root / (path or "index.html")).resolve()
    if target.is_dir():
        target = target / "index.html"
    if not target.is_relative_to(root):
        raise HTTPException(404, "not found")
    if not target.is_file():
        raise HTTPException(404, "not validated yet" if not path else "not found")
    if target.parent == root:  # the summary page and its JSON (spark_jobs.quality.report)
        return FileResponse(target)
    # anything deeper is Great Expectations' output (the Data Docs site): sandboxed
    headers = {"Content-Security-Policy": DOCS_POLICY}
    if target.suffix.lower() in (".html", ".htm"):
        return HTMLResponse(offline_docs(target.read_text(encoding="utf-8", errors="replace")), headers=headers)
    return FileResponse(target, headers=headers)


@app.get(metrics.PATH)
def metrics_text(reader: Annotated[object, Depends(metrics.reader)]) -> Response:
    """The streams' figures in Prometheus' text format (``streamops.metrics``): the streams the
    caller may read, or every stream for the scrapers' token; the page's figures at one moment."""
    now = time.time()
    specs = [spec for _, spec in sorted(_specs().items())] if reader is metrics.SCRAPER else _readable(reader)
    figures = []
    for spec in specs:
        plan, layout = _compiled(spec)
        figures.append(metrics.figures(plan, layout, stream_status(plan, layout, now, spec.description), now))
    return metrics.response(figures, now)
