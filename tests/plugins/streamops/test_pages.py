"""Every page of every stream renders, whatever parts the stream has, for every role.

The streams below have between them every part a stream can have: a Kafka source (its broker
down, a credential in the variable that names it), Delta tables (one that exists, one that does
not yet), a relational table, a Kafka sink, a Delta accepted-rows table, a quarantine, a warm
standby, a stop on purpose, a backfill run and a maintenance run, an application of the user's
own, a corrupt checkpoint and a blocked one. Each page, its JSON and every action's form is
asked for as an admin, an op, a user and a viewer: no answer may be a server error (the test
client raises a page's exception, a template's undefined value among them), no answer may hold
the credential, and no page may ask a broker anything on its request's path.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from examples import example_spec, include_with
from ui_client import login, streams_client

ROLES = ("admin", "op", "user", "viewer")
#: what the bootstrap variable holds while the broker is down: a credential no answer may show
CREDENTIAL = "streams-user:hunter2-s3cret"
BOOTSTRAP = f"{CREDENTIAL}@127.0.0.1:9"


def _spark_log(path: Path, entries: list[str]) -> None:
    """A file of Spark's checkpoint logs (offsets, commits): ``v1``, then its JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["v1", *entries]))


def _kafka_checkpoint(root: Path, topic: str, offsets: dict[str, int]) -> None:
    """An ingestion checkpoint of a Kafka stream that committed one batch, as Spark writes it."""
    _spark_log(root / "offsets" / "0", ['{"batchWatermarkMs":0,"batchTimestampMs":1767225600000,"conf":{}}',
                                        json.dumps({topic: offsets})])
    _spark_log(root / "commits" / "0", ['{"nextBatchWatermarkMs":0}'])
    (root / "metadata").write_text('{"id":"8c1f0b7e-4b8e-4c55-9d4b-4f0d9b3f2a10"}')


def _renamed(spec: dict, name: str) -> dict:
    """``spec`` as another stream's: its paths and tables its own (a path is one stream's)."""
    text = json.dumps(spec).replace(f"/{spec['name']}", f"/{name}").replace(f"{spec['name']}_", f"{name}_")
    return json.loads(text) | {"name": name}


def _streams() -> list[dict]:
    """The example streams, and streams with the parts they lack."""
    sensors, clicks = example_spec("sensors"), example_spec("clicks")
    parts = _renamed(sensors, "parts") | {"accepted": {"format": "delta"}}
    parts["outputs"] = [
        {"name": "readings", "query": {"type": "passthrough"}, "mode": "append",
         "sink": {"type": "kafka", "topic": "readings", "bootstrap_servers": "${KAFKA_BOOTSTRAP_SERVERS}"}},
        {"name": "hot", "query": {"type": "sql", "sql": "SELECT device_id, temperature FROM accepted "
                                                        "WHERE temperature > 30"},
         "mode": "append", "sink": {"type": "delta", "path": "delta/parts/hot"}}]
    parts["supervision"] = {"standby": True}
    lost, broken = _renamed(clicks, "lost"), _renamed(sensors, "broken")
    app = {"name": "rate_counts", "checkpoint": "checkpoints/rate_counts",
           "application": {"path": "applications/rate_counts.py", "queries": ["counts"]}}
    return [sensors, clicks, parts, lost, broken, app]


@pytest.fixture
def site(spark, data_root: Path, tmp_path: Path, monkeypatch) -> Path:
    """The streams' specs and data: sensors' real run (conftest), the others' parts on disk."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from spark_jobs.runtime.atomic import write_atomically
    from spark_jobs.runtime.lease import host_id, process_start

    specs = include_with(tmp_path / "include", *_streams())
    monkeypatch.setenv("STREAMS_SPEC_DIR", str(specs))
    monkeypatch.setenv("STREAMS_DATA_DIR", str(data_root))
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", BOOTSTRAP)
    checkpoints = data_root / "checkpoints"
    # sensors: what its state holds, as its _state DAG's job reads it
    from spark_jobs import state
    from spark_jobs.plan import compile_plan
    from spark_jobs.stream_spec.layout import Layout
    from spark_jobs.stream_spec.loading import load_spec

    sensors = load_spec(specs / "sensors.yaml")
    layout = Layout(sensors, data_root, specs)
    write_atomically(layout.state_file, json.dumps(state.inspect(spark, compile_plan(sensors, layout), layout)))
    # and the plan of its last start had another window: the page shows the pending change's verdicts
    ran = json.loads(compile_plan(sensors, layout).to_json())
    ran["outputs"][1]["query"]["window"] = {"duration": "15 minutes", "slide": "5 minutes"}
    write_atomically(layout.plan_file, json.dumps(ran))
    # clicks: a committed batch, a Delta table that exists (the page that answered 500) and one row
    _kafka_checkpoint(checkpoints / "clicks" / "_ingest", "clicks", {"0": 5})
    views = pa.table({"window_start": pa.array([0], pa.timestamp("us", "UTC")), "category": ["news"],
                      "views": pa.array([3], pa.int64())})
    write_deltalake(str(data_root / "delta" / "clicks" / "views_per_minute"), views)
    write_deltalake(str(data_root / "delta" / "clicks" / "views_per_minute"), views, mode="append")
    # lost: the supervisor found records deleted before the stream read them (blocked)
    _kafka_checkpoint(checkpoints / "lost" / "_ingest", "clicks", {"0": 2})
    write_atomically(checkpoints / "lost" / "_control" / "records_behind.json", json.dumps({
        "measured_at": time.time() - 20, "backlog_records": 7, "records_behind": {"clicks/0": 7},
        "notes": [], "records_per_trigger": 5000,
        "blocked": ["records were deleted from the topic before the stream read them (offsets 2 to 4 of clicks/0)"]}))
    # parts: stopped on purpose, with a standby that is alive (this process) and quarantined rows
    control = checkpoints / "parts" / "_control"
    (control / "standby").mkdir(parents=True)
    (control / "standby" / "d1.json").write_text(json.dumps({
        "driver_id": "d1", "host": host_id(), "pid": os.getpid(), "pid_start": process_start(os.getpid()),
        "state": "ready", "since": time.time() - 5}))
    (control / "hold").write_text("{}")
    # broken: a torn offsets file behind its commits
    broken = checkpoints / "broken" / "_ingest"
    _spark_log(broken / "offsets" / "0", ['{"batchWatermarkMs":0}', "{}"])
    _spark_log(broken / "commits" / "0", ['{"nextBatchWatermarkMs":0}'])
    (broken / "offsets" / "1").write_text("v1\n{\"batchWat")
    (broken / "metadata").write_text('{"id":"0b0f5b39-1c1e-43a5-9b0b-3f4b8a1f6a11"}')
    return specs


@pytest.fixture
def client(site: Path, monkeypatch, metadata_db):  # a fastapi TestClient
    with streams_client(monkeypatch) as c:
        yield c


def _supervisor_measures(stream: str) -> None:
    """What a stream's supervisor does at each check (streamops.hooks.stream): ask the broker."""
    from spark_jobs.plan import compile_plan
    from spark_jobs.stream_spec.layout import Layout, default_data_root, default_spec_dir
    from spark_jobs.stream_spec.loading import load_spec
    from streamops.health import assess

    spec = load_spec(default_spec_dir() / f"{stream}.yaml")
    layout = Layout(spec, default_data_root(), default_spec_dir())
    assess(compile_plan(spec, layout), layout)


def _paths(stream: str) -> list[str]:
    base = f"/streams/{stream}"
    return [f"{base}/", f"{base}/?range=15m", f"{base}/?range=24h", f"{base}/api/charts", f"{base}/api/flow",
            f"{base}/api/charts?range=24h", f"{base}/row", f"{base}/quality/", f"/streams/dag/stream_{stream}"]


def test_every_page_of_every_stream_renders_for_every_role(client, monkeypatch) -> None:
    from airflow.models.dagrun import DagRun

    names = [s["name"] for s in _streams()]
    _supervisor_measures("clicks")  # the broker is down: the supervisor's check says so, and keeps it
    # runs of the backfill and maintenance DAGs, triggered from the pages as an operator would
    login(client, role="admin")
    for stream, action, data in (("sensors", "backfill", {"start": "2026-01-01T00:00:00Z",
                                                          "end": "2026-01-01T06:00:00Z"}),
                                 ("clicks", "maintain", {})):
        token = client.get(f"/streams/{stream}/").text.split("name='csrf_token' value='")[1][:64]
        done = client.post(f"/streams/{stream}/actions/{action}", data=data | {"csrf_token": token},
                           follow_redirects=False)
        assert done.status_code == 303, done.text
    assert DagRun.find(dag_id="stream_clicks_maintenance") and DagRun.find(dag_id="stream_sensors_backfill")

    # no page asks a broker: a client of one made on a request's path fails the request
    import confluent_kafka
    import confluent_kafka.admin

    def no_broker(*_args, **_kwargs) -> None:
        raise AssertionError("a page asked a Kafka broker on its request's path")

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", no_broker)
    monkeypatch.setattr(confluent_kafka, "Consumer", no_broker)
    paths = ["/streams/", "/streams/api/status", "/streams/api/trends"] + [p for n in names for p in _paths(n)]
    for role in ROLES:
        login(client, role=role)
        for path in paths:
            response = client.get(path, follow_redirects=False)
            assert response.status_code < 500, (role, path, response.status_code, response.text[:500])
            assert response.status_code in (200, 307) or path.endswith("/quality/"), (role, path, response.text)
            assert CREDENTIAL not in response.text and "127.0.0.1:9" not in response.text, (role, path)
            assert "hunter2" not in json.dumps(dict(response.headers)), (role, path)

    login(client, role="viewer")
    status = {s["stream"]: s for s in client.get("/streams/api/status").json()}
    assert status["broken"]["status"] == "corrupt"
    assert status["lost"]["status"] == "blocked" and "offsets 2 to 4 of clicks/0" in status["lost"]["reason"]
    assert any(re.fullmatch(r"records behind as measured \d+s ago", n) for n in status["lost"]["notes"])
    clicks = status["clicks"]
    assert clicks["backlog_measured_at"] is not None
    assert any("no Kafka broker answered at ${KAFKA_BOOTSTRAP_SERVERS}" in n for n in clicks["notes"]), clicks["notes"]
    assert status["parts"]["stopped_on_purpose"] and status["parts"]["standby"][0]["state"] == "ready"

    # what each page shows of its parts
    page = client.get("/streams/clicks/").text
    assert "<h2 id='tables'>Delta tables</h2>" in page
    row = page[page.index("<td>views_per_minute</td>"):]
    assert "<td>2</td>" in row[:row.index("</tr>")]  # two files, version 1
    assert "Upkeep: <code>stream_clicks_maintenance</code>, latest runs:" in page
    parts = client.get("/streams/parts/").text
    assert "<td>_accepted</td>" in parts and "no table yet" in parts  # neither Delta table written yet
    assert "standby:" in parts
    state = client.get("/streams/sensors/").text
    assert "<h2 id='state'>State</h2>" in state and "open window(s): oldest" in state and "key(s); the oldest" in state
    assert "Not read yet" in client.get("/streams/clicks/").text
    assert "The spec has changed since the last start" in state and "a driver refuses to start with it" in state
    assert "<td class='failed'>rebuild</td>" in state and "query.window" in state
    forms = {"sensors": ("start", "stop", "restart", "backfill", "validate", "inspect"),
             "clicks": ("start", "stop", "restart", "backfill", "validate", "maintain", "inspect"),
             "rate_counts": ("start", "stop", "restart")}
    for stream, actions in forms.items():
        page = client.get(f"/streams/{stream}/").text
        assert [a for a in actions if f"action='actions/{a}'" in page] == list(actions), stream
