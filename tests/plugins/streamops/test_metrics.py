"""The streams' metrics for Prometheus (``GET /streams/metrics``), served by the plugin on Airflow's
own API server app over a real stream's checkpoint: behind the login or the scrapers' token, and
the same figures as the Streams page shows at the same moment, parsed with prometheus-client's
own parser."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_pages import CREDENTIAL, _streams, site  # noqa: F401 - every kind of stream (tests/plugins/streamops/test_pages.py)
from ui_client import login, streams_client  # tests/plugins/streamops/ui_client.py

from spark_jobs.runtime.clock import epoch_seconds
from streamops.metrics import METRICS, NAMES, STATUSES

TOKEN = "scrape-" + "0123456789abcdef" * 2
URL = "/streams/metrics"
VALIDATED_AT = "2026-01-01T00:10:00Z"


@pytest.fixture
def data_root(data_root: Path) -> Path:
    """The copy of the run (conftest), with a validation's summary, and the events its driver would
    have written (the run of the conftest has no driver): three batches of every flow in the last
    hour and one before it, folded into the stream's history as a driver's are."""
    from spark_jobs.runtime.clock import iso
    from spark_jobs.runtime.history import History
    from spark_jobs.runtime.progress import EventLog
    from spark_jobs.stream_spec.layout import Layout, default_spec_dir
    from spark_jobs.stream_spec.loading import load_spec

    quality = data_root / "quality" / "sensors"
    quality.mkdir(parents=True)
    (quality / "summary.json").write_text(json.dumps({
        "ok": False, "accounting": {"ok": True},
        "last_run": {"at": VALIDATED_AT, "units": 3, "failed": 1, "ok": False}}))
    spec = load_spec(default_spec_dir() / "sensors.yaml")
    layout = Layout(spec, data_root, default_spec_dir())
    log = EventLog(layout.events_file, history=History(layout.history_file))
    now = time.time()
    for i, at in enumerate((now - 4000, now - 900, now - 600, now - 300)):
        log.write({"event": "ingested", "logged_at": at - 1, "query": "_ingest", "rows": 95 + i, "accepted": 80 + i,
                   "quarantined": 10, "late": 5})
        log.write({"event": "progress", "logged_at": at, "query": "_ingest", "batch_id": i, "input_rows": 100 + i,
                   "input_rows_per_second": 10.0 + i, "processed_rows_per_second": 40.0 + i, "timestamp": iso(at),
                   "watermark": iso(at - 120 - i), "duration_ms": {"triggerExecution": 2500 + i},
                   "state_rows": 300 + i, "state_bytes": 40_000 + i, "sink_rows": -1, "dropped_duplicates": 5})
        for output in ("site_temperature_10m", "device_status"):
            log.write({"event": "progress", "logged_at": at + 2, "query": output, "batch_id": i, "input_rows": 80 + i,
                       "input_rows_per_second": 8.0, "processed_rows_per_second": 90.0 + i, "timestamp": iso(at),
                       "watermark": iso(at - 600 - i), "duration_ms": {"triggerExecution": 900 + i},
                       "state_rows": 20 + i, "state_bytes": 9_000 + i, "sink_rows": 7 + i})
    return data_root


@pytest.fixture
def client(data_root: Path, monkeypatch, metadata_db):  # a fastapi TestClient
    monkeypatch.setenv("STREAMS_DATA_DIR", str(data_root))
    monkeypatch.setenv("STREAMS_METRICS_TOKEN", TOKEN)
    monkeypatch.delenv("STREAMS_METRICS_TOKEN_FILE", raising=False)
    with streams_client(monkeypatch) as c:
        yield c


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape, by name and labels, read with prometheus-client's parser."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge" and family.name in NAMES, family.name
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, f"two series {key}"
            samples[key] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def of_stream(samples: Samples, stream: str) -> Samples:
    return {k: v for k, v in samples.items() if ("stream", stream) in k[1]}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_logged_out_request_is_refused_and_the_token_reads_the_metrics_only(client) -> None:
    anonymous = client.get(URL)
    assert (anonymous.status_code, anonymous.json()) == (401, {"detail": "Not authenticated"})
    assert client.get(URL, headers=bearer("scrape-" + "f" * 32)).status_code in (401, 403)  # a wrong token
    assert client.get(URL, headers=bearer(TOKEN[:-1])).status_code in (401, 403)
    assert client.get(URL, headers={"Authorization": TOKEN}).status_code == 401  # not as a bearer token
    scraped = client.get(URL, headers=bearer(TOKEN))
    assert scraped.status_code == 200, scraped.text
    assert scraped.headers["content-type"].startswith("text/plain; version=")
    assert scraped.headers["cache-control"] == "no-store"
    current = {dict(k[1])["stream"]: dict(k[1])["status"] for k, v in parse(scraped.text).items()
               if k[0] == "streams_status" and v == 1}
    assert current == {"sensors": "dead", "clicks": "dead"}  # every stream's, for the scraper
    # the token opens nothing else: not the pages, their JSON, nor an action
    for path in ("/streams/", "/streams/api/status", "/streams/sensors/", "/streams/sensors/api/flow",
                 "/api/v2/dags"):
        assert client.get(path, headers=bearer(TOKEN)).status_code in (401, 403), path
    stop = client.post("/streams/sensors/actions/stop", data={"mode": "immediate"}, headers=bearer(TOKEN))
    assert stop.status_code in (401, 403)
    assert client.get(URL + "/").status_code == 401  # the stream page's route, behind the login as ever


def test_without_a_token_configured_only_the_login_reads_them(client, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STREAMS_METRICS_TOKEN")
    assert client.get(URL, headers=bearer(TOKEN)).status_code in (401, 403)
    monkeypatch.setenv("STREAMS_METRICS_TOKEN", "short")  # too short to be used
    assert client.get(URL, headers=bearer("short")).status_code in (401, 403)
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    monkeypatch.setenv("STREAMS_METRICS_TOKEN_FILE", str(secret))  # the file wins over the variable
    assert client.get(URL, headers=bearer(TOKEN)).status_code == 200
    secret.unlink()  # unreadable: no token at all
    assert client.get(URL, headers=bearer(TOKEN)).status_code in (401, 403)
    login(client, role="viewer")
    assert client.get(URL).status_code == 200


def test_a_user_sees_the_streams_they_may_read(client, monkeypatch) -> None:
    from airflow.models.dag import DagModel

    login(client, role=None)  # logged in, no permission at all
    refused = client.get(URL)
    assert refused.status_code == 403 and "no read access" in refused.json()["detail"]
    monkeypatch.setattr(DagModel, "get_team_name",
                        staticmethod(lambda dag_id, **_: "sensors_team" if dag_id.startswith("stream_sensors")
                                     else "clicks_team"))
    login(client, role="viewer", teams=["sensors_team"])
    shown = {dict(k[1])["stream"] for k in parse(client.get(URL).text)}
    assert shown == {"sensors"}
    assert {dict(k[1])["stream"] for k in parse(client.get(URL, headers=bearer(TOKEN)).text)} == {"sensors", "clicks"}


def test_a_scrape_says_what_the_streams_page_says_at_the_same_moment(client, data_root: Path) -> None:
    login(client, role="viewer")
    began = time.time()
    page = {s["stream"]: s for s in client.get("/streams/api/status").json()}
    flow = client.get("/streams/sensors/api/flow?range=1h").json()
    charts = {c["id"]: c for c in client.get("/streams/sensors/api/charts?range=1h").json()["charts"]}
    scraped = client.get(URL)
    took = time.time() - began
    assert scraped.status_code == 200, scraped.text
    samples = parse(scraped.text)
    assert parse(client.get(URL, headers=bearer(TOKEN)).text).keys() == samples.keys()  # the scraper's too

    for name, s in page.items():
        mine = of_stream(samples, name)
        statuses = {dict(k[1])["status"]: v for k, v in mine.items() if k[0] == "streams_status"}
        assert set(statuses) == set(STATUSES) and statuses[s["status"]] == 1 and sum(statuses.values()) == 1
        for query, batch in s["last_committed"].items():
            flow_label = "ingestion" if query == "_ingest" else query
            assert value(samples, "streams_last_committed_batch", stream=name, flow=flow_label) == batch, query
        assert value(samples, "streams_restarts_last_day", stream=name) == s["restarts_last_day"]
        assert value(samples, "streams_failures_in_a_row", stream=name) == s["failures_in_a_row"]
        assert value(samples, "streams_stopped_on_purpose", stream=name) == float(s["stopped_on_purpose"])
        assert value(samples, "streams_driver_running", stream=name) == float(s["driver_pid"] is not None)
        assert value(samples, "streams_standby", stream=name, state="ready") is None  # no standby asked for

    sensors = page["sensors"]
    assert sensors["status"] == "dead" and sensors["last_committed"]["_ingest"] >= 2  # three micro-batches
    assert value(samples, "streams_backlog_files", stream="sensors") == sensors["backlog_files"] == 0
    assert value(samples, "streams_backlog_bytes", stream="sensors") == sensors["backlog_bytes"]
    assert value(samples, "streams_backlog_records", stream="sensors") is None  # a file source
    age = value(samples, "streams_last_commit_age_seconds", stream="sensors")
    assert sensors["last_commit_age_seconds"] <= age <= sensors["last_commit_age_seconds"] + took
    assert value(samples, "streams_input_rows_per_second", stream="sensors") == sensors["input_rows_per_second"]
    assert value(samples, "streams_processed_rows_per_second", stream="sensors") == \
        sensors["processed_rows_per_second"]
    assert value(samples, "streams_watermark_timestamp_seconds", stream="sensors") == \
        epoch_seconds(sensors["watermark"]) is not None
    assert sensors["input_rows_per_second"] == 8.0 and sensors["processed_rows_per_second"] is not None
    # the last validation: its result, counts and age
    assert sensors["validation"] == {"ok": False, "at": VALIDATED_AT, "units": 3, "failed_units": 1,
                                     "accounting_ok": True}
    assert value(samples, "streams_validation_ok", stream="sensors") == 0
    assert value(samples, "streams_accounting_ok", stream="sensors") == 1
    assert (value(samples, "streams_validation_units", stream="sensors"),
            value(samples, "streams_validation_failed_units", stream="sensors")) == (3, 1)
    validated_age = value(samples, "streams_validation_age_seconds", stream="sensors")
    assert began - epoch_seconds(VALIDATED_AT) <= validated_age <= time.time() - epoch_seconds(VALIDATED_AT)
    assert page["clicks"]["validation"] is None and value(samples, "streams_validation_ok", stream="clicks") is None

    # the rows of the last hour: the flow graph's links over its 1-hour range
    nodes = [n["key"] for n in flow["nodes"]]
    links = {(nodes[link["source"]], nodes[link["target"]]): link["value"] for link in flow["links"]}
    rows = {"streams_read_rows_last_hour": ("landing", "ingestion"),
            "streams_accepted_rows_last_hour": ("ingestion", "accepted"),
            "streams_quarantined_rows_last_hour": ("ingestion", "quarantine"),
            "streams_duplicate_rows_last_hour": ("ingestion", "duplicates"),
            "streams_late_rows_last_hour": ("ingestion", "late")}
    for metric, link in rows.items():
        assert value(samples, metric, stream="sensors", flow="ingestion") == links[link], metric
    assert links[("landing", "ingestion")] == 101 + 102 + 103  # the batch before the hour left out
    assert links[("ingestion", "quarantine")] == 30
    for output in ("site_temperature_10m", "device_status"):  # outputs with queries of their own
        assert value(samples, "streams_read_rows_last_hour", stream="sensors", flow=output) == \
            links[("accepted", f"output:{output}")] == 81 + 82 + 83, output
        assert value(samples, "streams_written_rows_last_hour", stream="sensors", flow=output) == \
            links[(f"output:{output}", f"sink:{output}")] == 8 + 9 + 10, output
    assert value(samples, "streams_written_rows_last_hour", stream="sensors", flow="ingestion") is None  # unknown
    # each flow's newest batch: duration, watermark delay, state rows, as the charts draw them
    for chart, metric in (("durations", "streams_batch_duration_seconds"),
                          ("lag", "streams_watermark_delay_seconds"), ("state", "streams_state_rows")):
        traces = {t["name"]: t["y"] for t in charts[chart]["traces"] if not t["name"].startswith("trigger")}
        assert traces, chart
        assert set(traces) == {"ingestion", "site_temperature_10m", "device_status"}, chart
        for flow_label, ys in traces.items():
            assert round(value(samples, metric, stream="sensors", flow=flow_label), 3) == ys[-1], (chart, flow_label)
    assert value(samples, "streams_batch_duration_seconds", stream="sensors", flow="ingestion") == 2.503
    # and the bytes of the state, which Spark reports beside its rows
    assert value(samples, "streams_state_bytes", stream="sensors", flow="ingestion") == 40_003
    assert value(samples, "streams_state_bytes", stream="sensors", flow="device_status") == 9_003


def test_every_kind_of_stream_has_its_metrics_and_no_broker_is_asked(site: Path, monkeypatch, metadata_db) -> None:  # noqa: F811
    """Kafka (its broker down; one blocked, with the supervisor's measurement), a warm standby, a stop
    on purpose, Delta tables, a corrupt checkpoint, an application: each has its series, from its
    files alone."""
    import confluent_kafka
    import confluent_kafka.admin

    def no_broker(*_args, **_kwargs) -> None:
        raise AssertionError("the metrics asked a Kafka broker on a scrape's path")

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", no_broker)
    monkeypatch.setattr(confluent_kafka, "Consumer", no_broker)
    monkeypatch.setenv("STREAMS_METRICS_TOKEN", TOKEN)
    with streams_client(monkeypatch) as client:
        scraped = client.get(URL, headers=bearer(TOKEN))
        assert scraped.status_code == 200, scraped.text
        assert CREDENTIAL not in scraped.text and "127.0.0.1:9" not in scraped.text
        samples = parse(scraped.text)
        login(client, role="admin")
        page = {s["stream"]: s for s in client.get("/streams/api/status").json()}
    for stream in (s["name"] for s in _streams()):
        current = [dict(k[1])["status"] for k, v in of_stream(samples, stream).items()
                   if k[0] == "streams_status" and v == 1]
        assert current == [page[stream]["status"]], stream
    assert page["broken"]["status"] == "corrupt" and page["lost"]["status"] == "blocked"
    assert value(samples, "streams_backlog_records", stream="lost") == 7
    assert 20 <= value(samples, "streams_backlog_measurement_age_seconds", stream="lost") < 120
    assert value(samples, "streams_backlog_files", stream="lost") is None  # a Kafka source
    assert value(samples, "streams_stopped_on_purpose", stream="parts") == 1
    assert {state: value(samples, "streams_standby", stream="parts", state=state)
            for state in ("warming", "ready", "taking over")} == {"warming": 0, "ready": 1, "taking over": 0}
    assert value(samples, "streams_last_committed_batch", stream="clicks", flow="ingestion") == 0
    assert value(samples, "streams_status", stream="rate_counts", status="dead") == 1


def test_every_metric_is_documented() -> None:
    """Each metric has a line in docs/operating.md's metrics section, and the alert rules of the
    compose file's Prometheus use those names (tests/test_deployment.py checks the rules)."""
    docs = (Path(__file__).resolve().parents[3] / "docs" / "operating.md").read_text(encoding="utf-8")
    section = docs[docs.index("## Metrics for Prometheus"):]
    missing = [m.name for m in METRICS if f"`{m.name}`" not in section]
    assert not missing, missing
