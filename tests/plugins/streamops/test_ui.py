"""The streams' pages in the Airflow UI: served by the plugin on Airflow's own API server app,
behind its login, over a real stream's checkpoint; actions trigger real DAG runs."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import time
from pathlib import Path

import pytest
import yaml
from ui_client import login, streams_client  # tests/plugins/streamops/ui_client.py


@pytest.fixture
def data_root(data_root: Path) -> Path:
    """The copy of the run (conftest), with a quality report, Data Docs and a file outside them."""
    root = data_root
    quality = root / "quality" / "sensors"
    (quality / "gx" / "site").mkdir(parents=True)
    (quality / "gx" / "site" / "index.html").write_text("<h1>Data Docs</h1>")
    (quality / "docs").symlink_to("gx/site", target_is_directory=True)
    (quality / "index.html").write_text("<h1>Data quality of stream sensors</h1>")
    (quality / "summary.json").write_text(json.dumps({
        "ok": True, "accounting": {"ok": True},
        "last_run": {"at": "2026-01-01T00:10:00Z", "units": 3, "failed": 0, "ok": True}}))
    (root / "secret.txt").write_text("not for the browser")
    return root


@pytest.fixture
def client(data_root: Path, monkeypatch, metadata_db):  # a fastapi TestClient
    monkeypatch.setenv("STREAMS_DATA_DIR", str(data_root))
    with streams_client(monkeypatch) as c:
        yield c


def page_token(client) -> str:
    """The CSRF token the stream's page puts in its forms, read from the page as a browser would."""
    match = re.search(r"name='csrf_token' value='([0-9a-f]{64})'", client.get("/streams/sensors/").text)
    assert match, "the stream's page has no CSRF token in its forms"
    return match.group(1)


def post(client, path: str, data: dict | None = None, **kwargs):
    """A post from the stream's own page: with the CSRF token its forms carry."""
    return client.post(path, data={**(data or {}), "csrf_token": page_token(client)}, **kwargs)


def test_anonymous_requests_are_refused(client) -> None:
    for path in ("/streams/", "/streams/api/status", "/streams/sensors/", "/streams/sensors/quality/",
                 "/streams/sensors/quality/docs/index.html", "/streams/dag/stream_sensors_quality"):
        response = client.get(path, follow_redirects=False)
        assert (response.status_code, response.json()) == (401, {"detail": "Not authenticated"}), path
    assert client.post("/streams/sensors/actions/stop", data={"mode": "graceful"}).status_code == 401
    assert client.get("/streams/", headers={"Authorization": "Bearer forged"}).status_code in (401, 403)


STREAM_PAGES = ("/streams/", "/streams/api/status", "/streams/sensors/", "/streams/sensors/quality/",
                "/streams/sensors/quality/docs/index.html", "/streams/dag/stream_sensors_quality",
                "/streams/api/trends", "/streams/sensors/api/charts", "/streams/sensors/api/flow",
                "/streams/sensors/row")


def test_a_logged_in_user_without_read_access_gets_403(client) -> None:
    """A user the simple auth manager knows without a role: logged in, but with no permission at all
    (SimpleAuthManagerUser: "If not provided, the user has no permission"), so no read access to
    the streams' DAGs, which every page requires."""
    login(client, role=None)
    for path in STREAM_PAGES:
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 403, (path, response.status_code, response.text)
        assert "no read access" in response.json()["detail"], path
    token = hmac.new(client.cookies["_token"].encode(), b"streams-ui-actions", hashlib.sha256).hexdigest()
    refused = client.post("/streams/sensors/actions/stop", data={"mode": "graceful", "csrf_token": token})
    assert refused.status_code == 403 and refused.json() == {"detail": "no read access to stream_sensors"}


def test_a_user_of_another_team_gets_403(client, monkeypatch) -> None:
    """Multi-team Airflow: a stream DAG whose bundle belongs to a team is readable only by its members,
    as on Airflow's own pages (which look the team up with DagModel.get_team_name, patched here)."""
    from airflow.models.dag import DagModel

    monkeypatch.setattr(DagModel, "get_team_name", staticmethod(lambda dag_id, **_: "sensors_team"))
    login(client, role="op", teams=["clicks_team"])
    for path in STREAM_PAGES:
        assert client.get(path, follow_redirects=False).status_code == 403, path
    login(client, role="viewer", teams=["sensors_team"])
    assert client.get("/streams/sensors/").status_code == 200


def test_the_status_page_shows_what_the_checkpoint_says(client, data_root: Path) -> None:
    from spark_jobs.runtime.checkpoint import last_batch

    login(client)
    status = {s["stream"]: s for s in client.get("/streams/api/status").json()}
    sensors = status["sensors"]
    assert sensors["status"] == "dead" and sensors["reason"] == "no live driver holds the checkpoint"
    committed = last_batch(data_root / "checkpoints" / "sensors" / "_ingest", "commits")
    assert sensors["last_committed"]["_ingest"] == committed is not None
    assert "readings" not in sensors["last_committed"]  # written by the ingestion: no query of its own
    assert sensors["backlog_files"] == 0 and sensors["restarts_last_day"] == 0
    assert sensors["validation"] == {"ok": True, "at": "2026-01-01T00:10:00Z", "units": 3, "failed_units": 0,
                                     "accounting_ok": True}
    assert status["clicks"]["validation"] is None
    page = client.get("/streams/").text
    assert "<td class='status dead'>dead" in page and f"_ingest: {committed}" in page
    assert "<a href='sensors/quality/docs/index.html'>Data Docs</a>" in page
    stream = client.get("/streams/sensors/").text
    for action in ("start", "stop", "restart", "backfill", "validate"):
        assert f"<form method='post' action='actions/{action}'>" in stream
    assert "Data quality of stream sensors" in client.get("/streams/sensors/quality/").text
    assert client.get("/streams/sensors/quality/docs/index.html").text.endswith("<h1>Data Docs</h1>")
    tab = client.get("/streams/dag/stream_sensors_quality", follow_redirects=False)
    assert tab.status_code == 307 and tab.headers["location"] == "../sensors/"


def test_the_pages_show_on_which_worker_a_stream_runs(client, data_root: Path) -> None:
    """A driver on another machine (a Celery worker), as its lease names it."""
    import time

    lease = data_root / "checkpoints" / "sensors" / "_control" / "lease"
    lease.mkdir(parents=True)
    now = time.time()
    (lease / "00000003.json").write_text(json.dumps({"host": "worker-7", "pid": 4242, "started_at": now - 60,
                                                     "heartbeat_at": now, "epoch": 3, "ttl": 30}))
    login(client)
    sensors = {s["stream"]: s for s in client.get("/streams/api/status").json()}["sensors"]
    assert (sensors["driver_host"], sensors["driver_pid"]) == ("worker-7", 4242)
    assert "<th>driver (worker)</th>" in client.get("/streams/").text
    assert "<td>worker-7<br><span class='muted'>pid 4242</span></td>" in client.get("/streams/sensors/").text


def test_actions_trigger_the_dags_with_their_params(client) -> None:
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun

    login(client, role="user")
    response = post(client, "/streams/sensors/actions/stop", {"mode": "immediate"}, follow_redirects=False)
    assert response.status_code == 303 and "triggered=stream_sensors_stop" in response.headers["location"]
    response = post(client, "/streams/sensors/actions/backfill", {"start": "2026-01-01T00:00:00Z",
                                                                  "end": "2026-01-01T06:00:00Z"},
                    follow_redirects=False)
    assert response.status_code == 303
    runs = {r.dag_id: r.conf for r in DagRun.find(dag_id=["stream_sensors_stop", "stream_sensors_backfill"])}
    assert runs["stream_sensors_stop"] == {"mode": "immediate"}
    assert not DagModel.get_dagmodel("stream_sensors_stop").is_paused  # else the run would never start
    assert runs["stream_sensors_backfill"] == {"start": "2026-01-01T00:00:00+00:00", "end": "2026-01-01T06:00:00+00:00"}


def test_bad_action_params_are_refused_and_trigger_nothing(client) -> None:
    from airflow.models.dagrun import DagRun

    login(client, role="user")
    before = len(DagRun.find(dag_id="stream_sensors_backfill"))
    bad_mode = post(client, "/streams/sensors/actions/stop", {"mode": "sometimes"})
    assert bad_mode.status_code == 400 and "mode must be graceful or immediate" in bad_mode.json()["detail"]
    backwards = post(client, "/streams/sensors/actions/backfill", {"start": "2026-01-02T00:00:00Z",
                                                                   "end": "2026-01-01T00:00:00Z"})
    assert backwards.status_code == 400 and "must be after start" in backwards.json()["detail"]
    assert post(client, "/streams/sensors/actions/explode").status_code == 404
    assert len(DagRun.find(dag_id="stream_sensors_backfill")) == before


def test_a_backfill_outside_what_the_accepted_rows_hold_is_refused_naming_the_bounds(client, data_root) -> None:
    from datetime import date, timedelta

    from airflow.models.dagrun import DagRun

    login(client, role="user")
    before = len(DagRun.find(dag_id="stream_sensors_backfill"))
    # the run's accepted rows (the readings sink, which the ingestion writes), by event date
    days = sorted(date.fromisoformat(p.name.removeprefix("event_date="))
                  for p in (data_root / "sinks" / "sensors" / "readings").glob("event_date=*"))
    first, end = days[0].isoformat(), (days[-1] + timedelta(days=1)).isoformat()
    held = f"accepted rows hold: [{first}T00:00:00+00:00, {end}T00:00:00+00:00)"
    for start, stop in (("0001-01-01T00:00:00Z", "9999-12-31T00:00:00Z"),
                        (f"{(days[0] - timedelta(days=1)).isoformat()}T23:00:00Z", f"{first}T01:00:00Z"),
                        (f"{days[-1].isoformat()}T23:00:00Z", f"{end}T00:00:01Z")):
        refused = post(client, "/streams/sensors/actions/backfill", {"start": start, "end": stop})
        assert refused.status_code == 400, (start, stop, refused.text)
        assert held in refused.json()["detail"], refused.json()
    assert len(DagRun.find(dag_id="stream_sensors_backfill")) == before
    everything = post(client, "/streams/sensors/actions/backfill", {"start": f"{first}T00:00:00Z",
                                                                    "end": f"{end}T00:00:00Z"},
                      follow_redirects=False)
    assert everything.status_code == 303 and len(DagRun.find(dag_id="stream_sensors_backfill")) == before + 1


def test_a_viewer_may_look_but_not_act(client) -> None:
    login(client, role="viewer")
    assert client.get("/streams/sensors/").status_code == 200
    refused = post(client, "/streams/sensors/actions/restart")
    assert refused.status_code == 403 and "no permission to run stream_sensors_restart" in refused.json()["detail"]


def test_nothing_outside_a_streams_quality_folder_is_served(client) -> None:
    login(client)
    assert client.get("/streams/sensors/quality/..%2F..%2F..%2Fsecret.txt").status_code == 404
    assert client.get("/streams/nope/").status_code == 404
    assert client.get("/streams/clicks/quality/").status_code == 404  # not validated yet
    assert client.get("/streams/dag/some_other_dag").status_code == 404


def test_an_application_stream_offers_only_the_actions_its_dags_have() -> None:
    from spark_jobs.stream_spec.layout import default_spec_dir
    from spark_jobs.stream_spec.loading import parse_spec
    from streamops.ui import ACTIONS, _actions

    app = parse_spec({"name": "rate_counts", "checkpoint": "checkpoints/rate_counts",
                      "application": {"path": "applications/rate_counts.py", "queries": ["counts"]}})
    assert list(_actions(app)) == ["start", "stop", "restart"]  # no backfill or quality DAG to trigger
    data = yaml.safe_load((default_spec_dir() / "sensors.yaml").read_text())
    assert list(_actions(parse_spec(data))) == [a for a in ACTIONS if a != "maintain"]  # no Delta table to keep up
    data["outputs"][1]["sink"] = {"type": "delta", "path": "delta/sensors/windows"}
    assert _actions(parse_spec(data)) == ACTIONS


def test_a_stream_with_delta_tables_shows_them_and_their_upkeep(client, tmp_path: Path, monkeypatch) -> None:
    import shutil

    from spark_jobs.stream_spec.layout import default_spec_dir

    specs = tmp_path / "streams"
    shutil.copytree(default_spec_dir(), specs)
    data = yaml.safe_load((specs / "sensors.yaml").read_text())
    data["outputs"][1]["sink"] = {"type": "delta", "path": "delta/sensors/windows"}
    (specs / "sensors.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("STREAMS_SPEC_DIR", str(specs))
    login(client)
    page = client.get("/streams/sensors/").text
    assert "<h2 id='tables'>Delta tables</h2>" in page
    assert "<td>site_temperature_10m</td>" in page and "no table yet" in page
    assert "Upkeep: <code>stream_sensors_maintenance</code>: no run yet" in page
    assert "<form method='post' action='actions/maintain'>" in page
    sensors = {**data, "outputs": [o for o in data["outputs"] if o["sink"]["type"] != "delta"]}
    (specs / "sensors.yaml").write_text(yaml.safe_dump(sensors))
    assert "Delta tables" not in client.get("/streams/sensors/").text  # none left


def test_actions_from_another_site_are_refused_and_trigger_nothing(client) -> None:
    """Cross-site request forgery: the browser sends the session cookie with a form another site
    posts, so an action needs the token of our own page, and an Origin that is this server's."""
    from airflow.models.dagrun import DagRun

    login(client, role="user")
    before = len(DagRun.find(dag_id="stream_sensors_stop"))
    token = page_token(client)
    forged = {
        "cookie alone": ({"mode": "immediate"}, {}),
        "a wrong token": ({"mode": "immediate", "csrf_token": "0" * 64}, {}),
        "another site's Origin": ({"mode": "immediate", "csrf_token": token}, {"Origin": "https://evil.example"}),
        "Origin null": ({"mode": "immediate", "csrf_token": token}, {"Origin": "null"}),
        "another site's Referer": ({"mode": "immediate", "csrf_token": token},
                                   {"Referer": "https://evil.example/page"}),
        "Sec-Fetch-Site cross-site": ({"mode": "immediate", "csrf_token": token}, {"Sec-Fetch-Site": "cross-site"}),
    }
    for what, (data, headers) in forged.items():
        response = client.post("/streams/sensors/actions/stop", data=data, headers=headers, follow_redirects=False)
        assert response.status_code == 403 and response.json()["detail"].startswith("refused: "), what
    assert len(DagRun.find(dag_id="stream_sensors_stop")) == before
    # the same post from our own page goes through; so does the token as a header (a script of ours)
    own = client.post("/streams/sensors/actions/stop", data={"mode": "graceful", "csrf_token": token},
                      headers={"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}, follow_redirects=False)
    assert own.status_code == 303, own.text
    header = client.post("/streams/sensors/actions/stop", data={"mode": "graceful"},
                         headers={"X-CSRF-Token": token}, follow_redirects=False)
    assert header.status_code == 303, header.text
    assert len(DagRun.find(dag_id="stream_sensors_stop")) == before + 2
    # a new session (login) has a new token: the old one is refused
    login(client, role="op")
    stale = client.post("/streams/sensors/actions/stop", data={"mode": "graceful", "csrf_token": token})
    assert stale.status_code == 403


def test_pages_say_what_they_may_load_and_the_data_docs_are_sandboxed(client, data_root: Path) -> None:
    login(client)
    page = client.get("/streams/sensors/")
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'self'" in policy and "sandbox" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    site = data_root / "quality" / "sensors" / "gx" / "site"
    (site / "index.html").write_text(
        '<html><head><link href="https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css" '
        'rel="stylesheet"><script src="https://code.jquery.com/jquery-3.7.1.min.js"></script>'
        "<script>inline()</script></head><body><table><tr><td>unit 1 passed</td></tr></table></body></html>")
    for path in ("/streams/sensors/quality/docs/index.html", "/streams/sensors/quality/gx/site/index.html"):
        docs = client.get(path)
        assert docs.status_code == 200, path
        assert docs.headers["content-security-policy"].startswith("sandbox;"), path
        assert "default-src 'none'" in docs.headers["content-security-policy"]
        assert "bootstrapcdn" not in docs.text and "code.jquery.com" not in docs.text
        assert "unit 1 passed" in docs.text and "<style>" in docs.text
    summary = client.get("/streams/sensors/quality/")  # our own page, not sandboxed
    assert "sandbox" not in summary.headers["content-security-policy"]


def test_a_streams_page_draws_its_charts_and_flow_from_its_own_json(client) -> None:
    for path in ("/streams/static/plotly.min.js", "/streams/sensors/api/charts", "/streams/sensors/api/flow",
                 "/streams/api/trends", "/streams/sensors/row"):
        assert client.get(path).status_code == 401, path  # behind the login like every page
    login(client)
    page = client.get("/streams/sensors/?range=15m").text
    assert "<script src='../static/plotly.min.js'></script>" in page and "data-url='api/charts?range=15m'" in page
    for chart in ("rates", "durations", "backlog", "lag", "state", "quarantine"):
        assert f"id='chart-{chart}'" in page
    plotly = client.get("/streams/static/plotly.min.js")
    assert plotly.status_code == 200 and "plotly.js v" in plotly.text[:200]
    assert plotly.headers["content-type"].startswith("text/javascript")
    assert "Plotly.react" in client.get("/streams/static/streams.js").text
    assert client.get("/streams/static/../ui.py").status_code == 404
    assert client.get("/streams/static/ui.py").status_code == 404
    charts = client.get("/streams/sensors/api/charts?range=24h").json()
    assert charts["range"] == "24h" and [c["id"] for c in charts["charts"]][0] == "rates"
    flow = client.get("/streams/sensors/api/flow?range=1h").json()
    nodes = {n["key"] for n in flow["nodes"]}
    assert {"landing", "ingestion", "accepted", "quarantine", "output:readings", "sink:device_status"} <= nodes
    bad = client.get("/streams/sensors/api/charts?range=forever")
    assert bad.status_code == 400 and "range must be one of 15m, 1h, 24h" in bad.json()["detail"]
    assert client.get("/streams/sensors/?range=forever").status_code == 400
    assert {t["stream"] for t in client.get("/streams/api/trends").json()} == {"sensors", "clicks"}
    assert client.get("/streams/sensors/row").text.startswith("<tr data-stream='sensors' data-row-url='row'>")
    assert "class='trend' data-stream='sensors'" in client.get("/streams/").text


def test_the_driver_cell_shows_the_standby_and_its_state() -> None:
    from streamops.ui import _driver_cell

    status = {"driver_pid": 4242, "driver_host": "worker-7",
              "standby": [{"host": "worker-7", "pid": 4343, "state": "ready", "since": 0.0}]}
    assert _driver_cell(status) == ("worker-7<br><span class='muted'>pid 4242</span>"
                                    "<br><span class='muted'>standby: worker-7, pid 4343: ready</span>")
    assert "standby: none yet" in _driver_cell({**status, "standby": []})  # asked for, not launched yet
    assert "standby" not in _driver_cell({**status, "standby": None})  # not asked for


def test_the_driver_cell_says_when_a_scheduled_stream_runs() -> None:
    from streamops.ui import _driver_cell

    between_runs = {"driver_pid": None, "standby": None,
                    "execution": "scheduled (when input arrives; freshness 15 minutes)"}
    assert _driver_cell(between_runs) == ("<span class='muted'>none</span><br><span class='muted'>scheduled (when "
                                          "input arrives; freshness 15 minutes)</span>")
    assert _driver_cell({**between_runs, "execution": "continuous"}) == "<span class='muted'>none</span>"
    cost = {"cpu_seconds": 18.0, "cpu_seconds_per_hour": 18.0, "peak_memory_mb": 1100, "rows": 12000,
            "cpu_seconds_per_1000_rows": 1.5}
    assert _driver_cell({**between_runs, "cost": cost}).endswith(
        "<br><span class='muted'>last hour: 18.0 CPU s (1.5 per 1,000 rows), 1100 MB at most</span>")


def test_a_stream_whose_runs_go_to_the_shared_driver_shows_it_and_its_queue(tmp_path: Path) -> None:
    """The row says whether the data root's shared driver serves (where, whether it is on a run,
    how many runs wait) or that runs get JVMs of their own."""
    from spark_jobs.plan import compile_plan
    from spark_jobs.runtime.run_queue import RunQueue, RunRequest
    from spark_jobs.stream_spec.layout import Layout, default_spec_dir
    from spark_jobs.stream_spec.loading import parse_spec
    from streamops.ui import _driver_cell, stream_status

    data = yaml.safe_load((default_spec_dir() / "sensors.yaml").read_text())
    spec = parse_spec({**data, "execution": {"mode": "scheduled", "on_input": True, "freshness": "5 minutes",
                                     "shared_driver": True}})
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    plan = compile_plan(spec, layout)
    status = stream_status(plan, layout)
    assert status["execution"].endswith("runs in the shared driver)")
    assert status["shared_driver"] == {"serving": False, "pid": None, "host": None, "on_run": False, "waiting": 0}
    assert "no shared driver serves: runs get JVMs of their own" in _driver_cell(status)
    queue = RunQueue(layout.shared_driver_queue)
    queue.beat(time.time(), serving="r-1")  # this process serves it, on a run
    queue.ask(RunRequest(spec="a.yaml"))
    queue.ask(RunRequest(spec="b.yaml"))
    status = stream_status(plan, layout)
    assert status["shared_driver"]["pid"] == os.getpid() and status["shared_driver"]["waiting"] == 2
    assert f"shared driver: {status['shared_driver']['host']}, pid {os.getpid()}, on a run; 2 run(s) waiting" in \
        _driver_cell(status)
    continuous = compile_plan(parse_spec(data), layout)
    assert "shared_driver" not in stream_status(continuous, layout)
