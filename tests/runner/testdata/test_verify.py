"""The verifier against real sinks that differ from the ground truth by one row.

Every "sink equals the ground truth" assertion of the end-to-end tests rests on
``verify.compare``. Here each kind of sink is built for real, equal to a given manifest
(the report must be ok), then with one row dropped, duplicated or altered (the report
must name exactly that row): a Parquet file sink written by a streaming query, table
sinks in SQLite and PostgreSQL written by the table writer and changed with the
database's own driver, and the quarantine written by the stream's quarantine query.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from examples import clicks_csv_spec

from runner.testdata import generate, verify
from spark_jobs import analysis
from spark_jobs.flows import queries as flows
from spark_jobs.plan import StreamPlan, compile_plan, input_columns
from spark_jobs.sinks.table import TableWriter
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import (
    load_spec,
    parse_spec,
)
from spark_jobs.stream_spec.models import (
    INGEST_FLOW,
    SPARK_TYPES,
    Trigger,
)

COLUMNS = [("event_id", "string"), ("ts", "timestamp"), ("day", "date"), ("temperature", "double"),
           ("readings", "long"), ("active", "boolean")]
#: The sink's rows in the manifest's representation (what the ground truth lists).
ROWS = [
    {"event_id": "e1", "ts": "2026-01-01T00:00:01.250Z", "day": "2026-01-01", "temperature": 20.5,
     "readings": 3, "active": True},
    {"event_id": "e2", "ts": "2026-01-01T23:59:59.999Z", "day": "2026-01-01", "temperature": 19.25,
     "readings": 1, "active": False},
    {"event_id": "e3", "ts": "2026-01-02T00:00:00.000Z", "day": "2026-01-02", "temperature": -3.5,
     "readings": 7, "active": True},
    {"event_id": "e4", "ts": "2026-01-02T08:30:00.001Z", "day": "2026-01-02", "temperature": None,
     "readings": 0, "active": None},
]
EXPECTED = {"kind": "rows", "mode": "append", "key": ["event_id"], "approximate": [],
            "columns": [c for c, _ in COLUMNS], "rows": ROWS}
MANIFEST = {"counts": {"quarantined": 0}, "outputs": {"rows": EXPECTED}, "quarantine": []}
#: One value changed per column type: (column, new value in the manifest's representation).
ALTERATIONS = [("temperature", 99.0), ("ts", "2026-01-01T12:00:00.000Z"), ("day", "2026-01-03"),
               ("active", True), ("readings", 2)]


def make_spec(sink: dict[str, Any]) -> Any:
    return parse_spec({
        "name": "verified",
        "source": {"type": "files", "path": "landing", "format": "json",
                   "columns": [{"name": n, "type": t, "required": n == "event_id"} for n, t in COLUMNS]},
        "quarantine": {"path": "quarantine"},  # never written: empty, as the manifest expects
        "outputs": [{"name": "rows", "query": {"type": "passthrough"}, "mode": "append", "sink": sink}],
        "checkpoint": "checkpoints",
    })


def the_output(report: verify.StreamReport) -> verify.OutputReport:
    assert [o.name for o in report.outputs] == ["rows"]
    return report.outputs[0]


def assert_only(report: verify.StreamReport, **found: Any) -> None:
    """The report is not ok, and lists exactly ``found`` (e.g. ``missing=[("e2",)]``)."""
    output = the_output(report)
    assert not report.ok and not output.ok
    for label in ("missing", "unexpected", "duplicated", "different"):
        assert getattr(output, label) == found.get(label, []), (label, report.describe())
    for label in found:
        assert f"1 {label}" in report.describe()


def test_verify_reads_sinks_without_the_flows_or_the_table_writer() -> None:
    code = ("import sys, runner.testdata.verify; "
            "print(sorted(m for m in ('spark_jobs.flows.queries', 'spark_jobs.frames', 'spark_jobs.sinks.table', 'pyspark') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---- Parquet: a file sink written by a streaming query ---------------------------------------------------


def write_parquet_sink(spark, root: Path, rows: list[dict[str, Any]], layout: Layout) -> None:
    """``rows`` through Spark's file sink: one input file, one available-now micro-batch."""
    landing = root / "input"
    landing.mkdir(parents=True)
    (landing / "part-000.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    schema = ", ".join(f"`{n}` {SPARK_TYPES[t]}" for n, t in COLUMNS)
    query = (spark.readStream.schema(schema).json(str(landing))
             .writeStream.format("parquet").option("path", layout.data("sinks/rows"))
             .option("checkpointLocation", str(root / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    assert (Path(layout.data("sinks/rows")) / "_spark_metadata").is_dir()


@pytest.fixture
def parquet_layout(tmp_path: Path) -> tuple[StreamPlan, Layout]:
    spec = make_spec({"type": "parquet", "path": "sinks/rows"})
    layout = Layout(spec, tmp_path / "data", tmp_path / "streams")
    return compile_plan(spec, layout), layout


def test_a_parquet_sink_equal_to_the_ground_truth_is_ok_and_orphan_files_do_not_count(
        spark, tmp_path: Path, parquet_layout) -> None:
    plan, layout = parquet_layout
    write_parquet_sink(spark, tmp_path, ROWS, layout)
    report = verify.compare(spark, plan, MANIFEST)
    assert report.ok, report.describe()
    assert the_output(report).actual == len(ROWS)
    # a data file no batch committed (left by a crashed attempt) is not part of the sink
    sink = Path(layout.data("sinks/rows"))
    committed = next(sink.glob("part-*.parquet"))
    (sink / ("part-99999-orphan" + committed.name.removeprefix("part-"))).write_bytes(committed.read_bytes())
    assert verify.compare(spark, plan, MANIFEST).ok


def test_a_parquet_sink_missing_a_row(spark, tmp_path: Path, parquet_layout) -> None:
    plan, layout = parquet_layout
    write_parquet_sink(spark, tmp_path, [r for r in ROWS if r["event_id"] != "e2"], layout)
    assert_only(verify.compare(spark, plan, MANIFEST), missing=[("e2",)])


def test_a_parquet_sink_with_a_row_twice(spark, tmp_path: Path, parquet_layout) -> None:
    plan, layout = parquet_layout
    write_parquet_sink(spark, tmp_path, [*ROWS, ROWS[2]], layout)
    assert_only(verify.compare(spark, plan, MANIFEST), duplicated=[("e3",)])


def test_a_parquet_sink_with_a_row_too_many(spark, tmp_path: Path, parquet_layout) -> None:
    plan, layout = parquet_layout
    write_parquet_sink(spark, tmp_path, [*ROWS, {**ROWS[0], "event_id": "e9"}], layout)
    assert_only(verify.compare(spark, plan, MANIFEST), unexpected=[("e9",)])


def test_a_parquet_sink_with_an_altered_value(spark, tmp_path: Path, parquet_layout) -> None:
    plan, layout = parquet_layout
    altered = [{**r, "ts": "2026-01-02T00:00:00.001Z"} if r["event_id"] == "e3" else r for r in ROWS]
    write_parquet_sink(spark, tmp_path, altered, layout)
    assert_only(verify.compare(spark, plan, MANIFEST),
                different=[(("e3",), {"ts": "2026-01-02T00:00:00.001Z"}, {"ts": "2026-01-02T00:00:00.000Z"})])


# ---- tables: written by the table writer, changed with sqlite3 / psycopg --------------------------------


@dataclass
class Database:
    """A table sink's database, changed directly with its driver."""

    kind: str  # sqlite or postgresql
    url: str

    @property
    def placeholder(self) -> str:
        return "?" if self.kind == "sqlite" else "%s"

    def execute(self, *statements: tuple[str, tuple]) -> None:
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)
            try:
                for sql, params in statements:
                    conn.execute(sql, params)
            finally:
                conn.close()
        else:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as conn:
                for sql, params in statements:
                    conn.execute(sql, params)

    def stored(self, column: str, value: Any) -> Any:
        """A value in the manifest's representation as this database stores it."""
        type_ = dict(COLUMNS)[column]
        if type_ == "timestamp":
            ts = datetime.fromisoformat(value).astimezone(UTC)
            return ts.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds") if self.kind == "sqlite" else ts
        if type_ == "date":
            return value if self.kind == "sqlite" else date.fromisoformat(value)
        if type_ == "boolean" and self.kind == "sqlite":
            return int(value)
        return value

    def drop_primary_key(self, table: str) -> None:
        """What a table rebuilt by hand might lose; then a key can be there twice."""
        if self.kind == "postgresql":
            self.execute((f'ALTER TABLE "{table}" DROP CONSTRAINT "{table}_pkey"', ()))
            return
        conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
            columns = ", ".join(f'"{name}" {type_}' for _, name, type_, *_ in info)  # the declared types stay
            conn.executescript(f'BEGIN; CREATE TABLE "{table}_copy" ({columns});'
                               f' INSERT INTO "{table}_copy" SELECT * FROM "{table}"; DROP TABLE "{table}";'
                               f' ALTER TABLE "{table}_copy" RENAME TO "{table}"; COMMIT;')
        finally:
            conn.close()


def typed(row: dict[str, Any]) -> dict[str, Any]:
    """A manifest row as the Python values a query hands the table writer."""
    out = dict(row)
    out["ts"] = datetime.fromisoformat(row["ts"]).astimezone(UTC).replace(tzinfo=None)
    out["day"] = date.fromisoformat(row["day"])
    return out


@pytest.fixture(params=["sqlite", "postgresql"])
def table_sink(request, tmp_path: Path) -> tuple[StreamPlan, Database]:
    """A table sink holding ROWS, written by the table writer: the stream's plan, the database."""
    if request.param == "sqlite":
        spec = make_spec({"type": "table", "table": "verified_rows", "key": ["event_id"],
                          "url": "sqlite:///tables/sink.db"})
        layout = Layout(spec, tmp_path / "data", tmp_path / "streams")
    else:
        url = request.getfixturevalue("postgres_database")
        spec = make_spec({"type": "table", "table": "verified_rows", "key": ["event_id"], "url": url})
        layout = Layout(spec, tmp_path / "data", tmp_path / "streams")
    plan = compile_plan(spec, layout)
    url = plan.outputs[0].sink.url
    writer = TableWriter(url, "verified_rows", COLUMNS, ["event_id"], "update", "verified.rows")
    assert writer.write_batch(0, [typed(r) for r in ROWS])
    return plan, Database(request.param, url)


def test_a_table_sink_equal_to_the_ground_truth_is_ok(spark, table_sink) -> None:
    plan, _ = table_sink
    report = verify.compare(spark, plan, MANIFEST)
    assert report.ok, report.describe()
    assert sorted(verify.read_output(spark, plan.outputs[0]), key=lambda r: r["event_id"]) == ROWS


def test_a_table_sink_missing_a_row(spark, table_sink) -> None:
    plan, db = table_sink
    db.execute((f"DELETE FROM verified_rows WHERE event_id = {db.placeholder}", ("e2",)))
    assert_only(verify.compare(spark, plan, MANIFEST), missing=[("e2",)])


def test_a_table_sink_with_a_row_twice(spark, table_sink) -> None:
    plan, db = table_sink
    db.drop_primary_key("verified_rows")
    db.execute((f"INSERT INTO verified_rows SELECT * FROM verified_rows WHERE event_id = {db.placeholder}", ("e3",)))
    assert_only(verify.compare(spark, plan, MANIFEST), duplicated=[("e3",)])


def test_a_table_sink_with_a_row_too_many(spark, table_sink) -> None:
    plan, db = table_sink
    db.execute((f"INSERT INTO verified_rows SELECT {db.placeholder}, ts, day, temperature, readings, active"
                f" FROM verified_rows WHERE event_id = {db.placeholder}", ("e9", "e1")))
    assert_only(verify.compare(spark, plan, MANIFEST), unexpected=[("e9",)])


@pytest.mark.parametrize(("column", "value"), ALTERATIONS, ids=[c for c, _ in ALTERATIONS])
def test_a_table_sink_with_an_altered_value(spark, table_sink, column: str, value: Any) -> None:
    plan, db = table_sink
    db.execute((f'UPDATE verified_rows SET "{column}" = {db.placeholder} WHERE event_id = {db.placeholder}',
                (db.stored(column, value), "e2")))
    was = next(r for r in ROWS if r["event_id"] == "e2")[column]
    assert_only(verify.compare(spark, plan, MANIFEST), different=[(("e2",), {column: value}, {column: was})])


def test_a_table_sink_that_was_never_written_misses_every_row(spark, tmp_path: Path) -> None:
    spec = make_spec({"type": "table", "table": "verified_rows", "key": ["event_id"], "url": "sqlite:///absent.db"})
    plan = compile_plan(spec, Layout(spec, tmp_path / "data", tmp_path / "streams"))
    report = verify.compare(spark, plan, MANIFEST)
    assert the_output(report).missing == [(r["event_id"],) for r in ROWS] and not report.ok
    assert not (tmp_path / "data" / "absent.db").exists()  # reading creates no database


# ---- the quarantine: the sensors stream's own queries over generated records ---------------------------


SENSORS = default_spec_dir() / "sensors.yaml"


def sensors_variant(name: str) -> Any:
    """The sensors spec with only its ``readings`` output, its input, quarantine and
    checkpoints under ``name`` (so variants share a data root and the baseline's readings)."""
    data = yaml.safe_load(SENSORS.read_text())
    data["outputs"] = [o for o in data["outputs"] if o["name"] == "readings"]
    if name != "sensors":  # a variant's own accepted rows (accepted/<stream>)
        data["name"] = f"sensors_{name}"
    data["source"]["path"] = f"landing/{name}"
    data["quarantine"]["path"] = f"quarantine/{name}"
    data["checkpoint"] = f"checkpoints/{name}"
    return parse_spec(data)


@dataclass
class Generated:
    root: Path
    manifest: dict[str, Any]
    ledger: list[dict[str, Any]]

    def plan(self, spec: Any) -> StreamPlan:
        """The plan of a variant's spec over the generated data root."""
        return compile_plan(spec, Layout(spec, self.root, default_spec_dir()))


@pytest.fixture(scope="module")
def generated(spark, tmp_path_factory) -> Generated:
    """Generated sensors records (with malformed and future ones) through the stream's
    ingestion and its readings output."""
    root = tmp_path_factory.mktemp("verify") / "data"
    result = generate.generate(SENSORS, root, generate.Settings(
        files=3, events_per_file=20, empty_files=0, malformed=0.3, future=0.1, seed=1))
    ledger = [json.loads(line) for line in (root / "generated" / "sensors" / "ledger.jsonl").read_text().splitlines()]
    # the generator lands files in landing/sensors: the baseline variant reads them there
    spec = sensors_variant("sensors")
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, Layout(spec, root, default_spec_dir())))
    return Generated(root, json.loads(result.manifest.read_text()), ledger)


def run_quarantine_on(spark, generated: Generated, name: str, file: str, edit) -> Any:
    """The ingestion (which writes the quarantine) of a variant whose input is the generated
    files, ``file`` changed by ``edit(lines)``; returns the variant's plan."""
    spec = sensors_variant(name)
    plan = analysis.resolve_plan(spark, spec, Layout(spec, generated.root, default_spec_dir()))
    assert plan.source is not None and plan.source.landing is not None
    landing = Path(plan.source.landing)
    landing.mkdir(parents=True)
    for src in sorted((generated.root / "landing" / "sensors").glob("part-*")):
        data = src.read_bytes()
        if src.name == file:
            lines = data.splitlines(keepends=True)
            edit(lines)
            data = b"".join(lines)
        (landing / src.name).write_bytes(data)
    query = flows.start(spark, plan, Trigger(available_now=True), only=lambda n: n == INGEST_FLOW)
    query[INGEST_FLOW].awaitTermination(120)
    assert query[INGEST_FLOW].exception() is None
    return plan


def target(generated: Generated) -> dict[str, Any]:
    """A malformed record to change: one with a value of the wrong type (plain ASCII, event id intact)."""
    return next(e for e in generated.ledger if e["kind"] == "malformed" and e["reason"] == "wrong_type")


def test_the_quarantine_equal_to_the_ground_truth_is_ok(spark, generated: Generated) -> None:
    spec = sensors_variant("sensors")
    report = verify.compare(spark, generated.plan(spec), generated.manifest)
    assert report.ok, report.describe()
    kinds = {e["reason"] for e in generated.manifest["quarantine"]}
    assert {"wrong_type", "truncated", "missing_required", "invalid_utf8", "future"} <= kinds
    assert report.quarantine is not None and report.quarantine.actual == len(generated.manifest["quarantine"])
    assert "quarantine: " in report.describe() and "equal to the ground truth" in report.describe().splitlines()[-1]


def quarantine_only(report: verify.StreamReport, **found: Any) -> None:
    """Every output equals the ground truth, the quarantine differs by exactly ``found``."""
    assert all(o.ok for o in report.outputs), report.describe()
    q = report.quarantine
    assert q is not None and not q.ok and not report.ok
    for label in ("missing", "unexpected", "duplicated", "different"):
        assert getattr(q, label) == found.get(label, []), (label, report.describe())
    assert report.describe().splitlines()[-1] == q.describe()


def test_a_quarantine_missing_a_record(spark, generated: Generated) -> None:
    record = target(generated)
    plan = run_quarantine_on(spark, generated, "dropped", record["name"], lambda lines: lines.pop(record["line"] - 1))
    report = verify.compare(spark, plan, generated.manifest)
    quarantine_only(report, missing=[(record["name"], record["raw"])])
    assert report.quarantined == report.expected_quarantined - 1
    assert "1 missing" in report.describe()


def test_a_quarantine_with_a_record_twice(spark, generated: Generated) -> None:
    record = target(generated)
    plan = run_quarantine_on(spark, generated, "twice", record["name"],
                             lambda lines: lines.insert(record["line"], lines[record["line"] - 1]))
    report = verify.compare(spark, plan, generated.manifest)
    quarantine_only(report, duplicated=[(record["name"], record["raw"])])
    assert "1 duplicated" in report.describe()


def test_a_quarantine_with_an_altered_record(spark, generated: Generated) -> None:
    record = target(generated)
    event_id = json.loads(record["raw"])["event_id"]
    altered = record["raw"].replace(event_id, event_id + "-altered")

    def edit(lines: list[bytes]) -> None:
        lines[record["line"] - 1] = altered.encode() + b"\n"

    plan = run_quarantine_on(spark, generated, "altered", record["name"], edit)
    report = verify.compare(spark, plan, generated.manifest)
    quarantine_only(report, missing=[(record["name"], record["raw"])], unexpected=[(record["name"], altered)])
    assert report.quarantined == report.expected_quarantined  # the count alone would not tell


def test_a_quarantined_record_with_another_reason_or_file(spark, generated: Generated) -> None:
    spec = sensors_variant("sensors")
    rows = verify.read_quarantine(spark, generated.plan(spec))
    record = target(generated)
    columns = input_columns(spec)

    def mutated(change: dict[str, str]) -> verify.QuarantineReport:
        changed = [({**r, **change} if verify.file_name(r["source_file"]) == record["name"]
                    and r["raw"] == record["raw"] else r) for r in rows]
        assert changed != rows
        return verify.compare_quarantine(generated.manifest["quarantine"], changed, columns)

    assert verify.compare_quarantine(generated.manifest["quarantine"], rows, columns).ok
    other_reason = mutated({"reason": "missing required field(s): ts"})
    assert other_reason.different == [((record["name"], record["raw"]), ["missing_required"], ["wrong_type"])]
    assert not (other_reason.missing or other_reason.unexpected or other_reason.duplicated)
    assert "1 with another reason" in other_reason.describe()
    other_file = mutated({"source_file": "file:///elsewhere/part-999999.json"})
    assert other_file.missing == [(record["name"], record["raw"])]
    assert other_file.unexpected == [("part-999999.json", record["raw"])] and not other_file.different


def test_a_csv_quarantine_equal_to_the_ground_truth_is_ok(spark, tmp_path: Path) -> None:
    """CSV records are kept as their line (U+FFFD for invalid bytes) or, if parsed, as JSON."""
    spec_path = clicks_csv_spec(tmp_path / "include")
    result = generate.generate(spec_path, tmp_path / "data", generate.Settings(
        files=2, events_per_file=20, empty_files=0, malformed=0.4, future=0.1, seed=4))
    manifest = json.loads(result.manifest.read_text())
    assert {"wrong_type", "too_few_fields", "invalid_utf8", "future"} <= {e["reason"] for e in manifest["quarantine"]}
    spec = load_spec(spec_path)
    plan = analysis.resolve_plan(spark, spec, Layout(spec, tmp_path / "data", spec_path.parent))
    query = flows.start(spark, plan, Trigger(available_now=True), only=lambda n: n == INGEST_FLOW)
    query[INGEST_FLOW].awaitTermination(120)
    assert query[INGEST_FLOW].exception() is None
    report = verify.compare(spark, plan, manifest)  # only the ingestion ran
    assert report.quarantine is not None and report.quarantine.ok, report.quarantine.describe()
    assert report.quarantined == len(manifest["quarantine"]) == manifest["counts"]["quarantined"]


def test_record_keys_match_the_forms_spark_keeps() -> None:
    columns = {"event_id": "string", "ts": "timestamp", "temperature": "double", "status": "string"}
    written = '{"event_id": "a", "ts": "2026-01-01T00:00:00.000Z", "temperature": null, "status": "ok"}'
    kept = '{"event_id":"a","ts":"2026-01-01T00:00:00Z","status":"ok"}'  # to_json of the parsed values
    assert verify.record_key(written, columns) == verify.record_key(kept, columns)
    assert verify.record_key(written, columns) != verify.record_key(kept.replace('"ok"', '"warn"'), columns)
    assert verify.record_key('{\\xff\\xfe"event_id": "a"', columns) == verify.record_key('{\ufffd\ufffd"event_id": "a"',
                                                                                         columns)
    wrong = '{"event_id": "a", "ts": "2026-01-01T00:00:00.000Z", "temperature": "hot"}'
    assert verify.record_key(wrong, columns) == wrong  # not a parsed record: its text as it is
    assert verify.reason_kind("malformed json record: value does not match the column type: ts (timestamp)") \
        == "wrong_type"


def test_an_approximate_distinct_count_may_miss_the_values_that_share_a_register(spark) -> None:
    """19 of the generator's 200 users (a window's, seen in a benchmark), some of them sharing one of
    the 512 registers of Spark's HyperLogLog++: Spark counts 16 of them, in a batch as in a stream."""
    users = ["user-0000", "user-0001", "user-0003", "user-0015", "user-0028", "user-0037", "user-0060",
             "user-0063", "user-0064", "user-0085", "user-0091", "user-0096", "user-0109", "user-0113",
             "user-0140", "user-0147", "user-0154", "user-0155", "user-0170"]
    (row,) = spark.createDataFrame([(u,) for u in users], "user_id string").selectExpr(
        "approx_count_distinct(user_id) AS users").collect()
    expected = {"kind": "aggregate", "mode": "append", "key": ["window"], "approximate": ["users"],
                "columns": ["window", "users"], "rows": [{"window": "w1", "users": len(users)}]}

    def compared(users_found: int) -> verify.OutputReport:
        return verify.compare_rows("views_15m", expected, [{"window": "w1", "users": users_found}])

    assert row["users"] == 16
    assert compared(row["users"]).ok
    assert not compared(12).ok  # more than register sharing explains
