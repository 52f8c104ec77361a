"""The streams' pages inside the Airflow UI: data-quality summaries and Data Docs.

A FastAPI app that the plugin ``plugins/streams_ui.py`` mounts on Airflow's API server
at :data:`~streamops.operators.quality.QUALITY_URL`:

* ``/``: every stream with its last validation and accounting;
* ``/<stream>/``: the stream's summary (every validated unit, pass or fail, rows, accounting);
* ``/<stream>/docs/...``: its Great Expectations Data Docs;
* ``/dag/<dag_id>``: the summary of the stream a DAG belongs to (the tab on DAG pages).

Airflow does not guard plugin apps, so every route checks the caller itself with
Airflow's own authentication (the UI's session token, or a bearer token): anonymous
requests get 401, and a stream's pages need read access to its DAG.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from spark_jobs.spec import default_data_root, default_spec_dir, load_specs

DAG_SUFFIXES = ("", "_stop", "_restart", "_backfill", "_quality")

app = FastAPI(title="Streams", description="Data quality of the streams", docs_url=None, redoc_url=None)


async def current_user(request: Request):  # noqa: ANN201 - Airflow's BaseUser
    """The caller, authenticated by Airflow; 401 (or 403 for a bad token) otherwise."""
    from airflow.api_fastapi.core_api.security import get_user

    header = request.headers.get("authorization", "")
    bearer = None
    if header.lower().startswith("bearer "):
        from fastapi.security import HTTPAuthorizationCredentials

        bearer = HTTPAuthorizationCredentials(scheme="Bearer", credentials=header[7:].strip())
    return await get_user(request, None, bearer)


User = Annotated[object, Depends(current_user)]


def _may_read(user: object, dag_id: str) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    return get_auth_manager().is_authorized_dag(method="GET", details=DagDetails(id=dag_id), user=user)


def _streams() -> list[str]:
    specs, _errors = load_specs(default_spec_dir())
    return sorted(specs)


def _quality_root() -> Path:
    return (default_data_root() / "quality").resolve()


@app.get("/", response_class=HTMLResponse)
def index(user: User) -> str:
    rows = []
    for name in _streams():
        if not _may_read(user, f"stream_{name}"):
            continue
        try:
            s = json.loads((_quality_root() / name / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            rows.append(f"<tr><td>{escape(name)}</td><td colspan=4>not validated yet</td></tr>")
            continue
        last = s.get("last_run") or {}
        acc = s.get("accounting") or {}
        units = sum(o["validated"] for o in s["outputs"].values())
        failed = sum(o["failed"] for o in s["outputs"].values())
        rows.append(f"<tr><td><a href='{escape(name)}/'>{escape(name)}</a></td>"
                    f"<td>{'passed' if s.get('ok') else 'FAILED'} ({escape(str(last.get('at', '')))})</td>"
                    f"<td>{units} validated, {failed} failed</td>"
                    f"<td>{'balances' if acc.get('ok') else 'does not balance' if acc else '-'}</td>"
                    f"<td><a href='{escape(name)}/docs/index.html'>Data Docs</a></td></tr>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>Stream quality</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:1.5rem}td,th{border:1px solid #ccc;"
            "padding:.3rem .6rem}table{border-collapse:collapse}</style></head><body><h1>Stream quality</h1>"
            "<table><tr><th>stream</th><th>last validation</th><th>units</th><th>accounting</th><th></th></tr>"
            + "".join(rows) + "</table></body></html>")


@app.get("/dag/{dag_id}")
def dag_page(dag_id: str, user: User) -> RedirectResponse:
    for name in _streams():
        if dag_id in {f"stream_{name}{suffix}" for suffix in DAG_SUFFIXES}:
            if not _may_read(user, dag_id):
                raise HTTPException(403, "no read access to this DAG")
            return RedirectResponse(f"../{name}/", status_code=307)
    raise HTTPException(404, f"{dag_id} is not a stream's DAG")


@app.get("/{stream}/{path:path}")
def stream_file(stream: str, path: str, user: User) -> FileResponse:
    if stream not in _streams():
        raise HTTPException(404, f"no stream {stream!r}")
    if not _may_read(user, f"stream_{stream}"):
        raise HTTPException(403, f"no read access to stream_{stream}")
    root = (_quality_root() / stream).resolve()
    target = (root / (path or "index.html")).resolve()
    if target.is_dir():
        target = target / "index.html"
    if not target.is_relative_to(root):
        raise HTTPException(404, "not found")
    if not target.is_file():
        raise HTTPException(404, "not validated yet" if not path else "not found")
    return FileResponse(target)
