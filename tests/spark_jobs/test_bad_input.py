"""Bad input through the real pipeline: a corpus of malformed, odd and hostile records.

The `sensors` stream (JSON) and the `clicks` stream (CSV), as declared in
include/streams/, each get one available-now run over a corpus in which every kind of
bad input is its own landing file (one file per micro-batch: max_files_per_trigger 1).
Their sinks are swapped for memory sinks and a pass-through output ``accepted`` is added
where the stream has none, so that every accepted row can be named. For every kind the
test states the exact outcome: the rows quarantined (with their reason), the rows
accepted, the duplicates and the rows dropped as late, and that they add up to the rows
the ingestion read from the file: input = accepted + quarantined + duplicates + dropped late.

Event times rise by 10 minutes per file, so nothing is late unless a kind says so. The
far-future kind comes early: if its row reached the watermark, every later kind would
lose its rows as late.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from examples import clicks_on_files
from quarantine_files import pyarrow_rows
from stream_runs import T0, Run, at, run  # tests/stream_runs.py

from runner.testdata import generate, verify
from spark_jobs import analysis
from spark_jobs.flows import queries as flows
from spark_jobs.plan import enriched_columns
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW

SPEC_DIR = default_spec_dir()
ACCEPTED = "accepted"


def stream_spec(stream: str, name: str) -> dict:
    """The stream's own spec (clicks: as it reads CSV files), renamed (memory sink names are
    global), with memory sinks, one file per micro-batch, and a pass-through output if it has none."""
    data = clicks_on_files() if stream == "clicks" else yaml.safe_load((SPEC_DIR / f"{stream}.yaml").read_text())
    data["name"] = name
    data["source"]["max_files_per_trigger"] = 1
    for out in data["outputs"]:
        out["sink"] = {"type": "memory"}
    if not any(o["query"]["type"] == "passthrough" for o in data["outputs"]):
        data["outputs"].append({"name": ACCEPTED, "query": {"type": "passthrough"}, "mode": "append",
                                "sink": {"type": "memory"}})
    return data


def readings_only(name: str, max_future: str) -> dict:
    """The sensors stream with only its pass-through output (fewer queries, for the smaller tests)."""
    data = stream_spec("sensors", name)
    data["outputs"] = [o for o in data["outputs"] if o["name"] == "readings"]
    data["event_time"]["max_future"] = max_future
    return data


def passthrough(data: dict) -> str:
    return next(o["name"] for o in data["outputs"] if o["query"]["type"] == "passthrough")


@dataclass(frozen=True)
class Kind:
    """One kind of bad input: its file and what must become of each record."""

    name: str
    prefix: str  # of the event ids of its records
    lines: list[str | bytes]  # the file's lines; none: a 0-byte file
    accepted: set[str]  # event ids that reach the outputs
    quarantined: dict[str, str] = field(default_factory=dict)  # a substring of the raw record -> reason
    records: int | None = None  # rows Spark reads from the file, if not one per line
    duplicates: int = 0
    late: int = 0
    header: str | None = None  # a CSV header line written before the lines

    @property
    def rows_read(self) -> int:
        return len(self.lines) if self.records is None else self.records


@dataclass
class Outcome:
    """What one run did, per landing file."""

    run: Run
    kinds: list[Kind]
    quarantine: list[dict]
    accepted: list[dict]
    output: str

    def quarantined(self, kind: Kind) -> list[dict]:
        return [r for r in self.quarantine if r["source_file"].endswith(f"/{file_name(self, kind)}")]

    def batch(self, kind: Kind) -> dict:
        """The progress of the micro-batch that read the kind's file (the i-th batch with data)."""
        return batches(self.run, INGEST_FLOW)[self.kinds.index(kind)]


def file_name(outcome: Outcome, kind: Kind) -> str:
    return f"part-{outcome.kinds.index(kind):04d}.{outcome.run.spec.source.format}"


def batches(result: Run, output: str) -> list[dict]:
    """Progress of the batches that read a file (a trailing no-data batch only moves the watermark)."""
    progress = sorted(result.progress(output), key=lambda p: p["batch_id"])
    return [p for p in progress if any(s["startOffset"] != s["endOffset"] for s in p["sources"])]


def execute(spark, tmp_path: Path, data: dict, kinds: list[Kind]) -> Outcome:
    """Run the corpus, one file per kind."""
    files = [k.lines if k.header is None else [k.header, *k.lines] for k in kinds]
    result = run(spark, tmp_path, data, files)
    layout = Layout(result.spec, tmp_path / "data", SPEC_DIR)
    quarantine = [r.asDict() for r in spark.read.parquet(layout.data(result.spec.quarantine.path)).collect()]
    output = passthrough(data)
    return Outcome(result, kinds, quarantine, result.rows(output), output)


def check_kind(outcome: Outcome, kind: Kind) -> None:
    """The kind's exact outcome, and that its rows add up."""
    quarantined = outcome.quarantined(kind)
    got = {}
    for row in quarantined:
        markers = [m for m in kind.quarantined if m in row["raw"]]
        assert len(markers) == 1, f"{kind.name}: quarantined row {row['raw'][:120]!r} matches {markers}"
        got[markers[0]] = row["reason"]
    assert got == kind.quarantined, f"{kind.name}: quarantined rows and reasons differ"
    assert len(quarantined) == len(kind.quarantined)

    accepted = sorted(r["event_id"] for r in outcome.accepted if r["event_id"].startswith(kind.prefix))
    assert accepted == sorted(kind.accepted), f"{kind.name}: accepted rows differ (each must appear once)"

    batch = outcome.batch(kind)
    assert batch["input_rows"] == kind.rows_read, f"{kind.name}: rows read"
    assert batch["dropped_duplicates"] == kind.duplicates, f"{kind.name}: duplicates"
    assert batch["dropped_by_watermark"] == kind.late, f"{kind.name}: dropped late"
    assert batch["input_rows"] == len(accepted) + len(quarantined) + kind.duplicates + kind.late


def check_totals(outcome: Outcome, queries: list[str]) -> None:
    """The ingestion read every row once, input = accepted + quarantined + duplicates +
    dropped late; every output read every accepted row once."""
    result, kinds = outcome.run, outcome.kinds
    total = sum(k.rows_read for k in kinds)
    assert result.total(INGEST_FLOW, "input_rows") == total
    assert len(batches(result, INGEST_FLOW)) == len(kinds), "one micro-batch per file"
    for q in queries:
        if q != INGEST_FLOW:
            assert result.total(q, "input_rows") == len(outcome.accepted), q
            assert result.total(q, "dropped_by_watermark") == 0, q
    duplicates = result.total(INGEST_FLOW, "dropped_duplicates")
    late = result.total(INGEST_FLOW, "dropped_by_watermark")
    assert duplicates == sum(k.duplicates for k in kinds)
    assert late == sum(k.late for k in kinds)
    assert len(outcome.accepted) == sum(len(k.accepted) for k in kinds)
    assert len(outcome.quarantine) == sum(len(k.quarantined) for k in kinds)
    assert total == len(outcome.accepted) + len(outcome.quarantine) + duplicates + late


# ---- the JSON corpus: sensors (event_id, device_id, ts, temperature required; humidity, status) ---------


def minute(file: int, offset: float = 0) -> float:
    """Event times rise by 10 minutes per file: file k's rows lie in [10k, 10k + 10)."""
    return 10 * file + offset


def js(event_id: str, at_minute: float | None, **fields: object) -> str:
    """A valid sensor reading at a minute past T0, with fields changed, added or removed (value ``...``)."""
    record = {"event_id": event_id, "device_id": "dev-001", "ts": ... if at_minute is None else at(at_minute),
              "temperature": 20.0, **fields}
    return json.dumps({k: v for k, v in record.items() if v is not ...}, ensure_ascii=False)


def bad_bytes(line: str, text: str, replacement: bytes) -> bytes:
    """The line as UTF-8, with ``text`` replaced by raw bytes."""
    assert text in line
    return line.encode().replace(text.encode(), replacement)


def epoch_seconds(at_minute: float) -> int:
    return int((T0.replace(tzinfo=UTC) + timedelta(minutes=at_minute)).timestamp())


WRONG_TYPE = "malformed json record: value does not match the column type: "
NOT_OBJECT = "malformed json record: not a JSON object (truncated, or not JSON)"
NOT_UTF8 = "malformed json record: not valid UTF-8"
FUTURE = "event time too far in the future: ts is more than 1 day ahead of the processing time"
LONG = 1_000_000
HUGE = 5_000
#: The file index of each JSON kind (its event times lie in [10 * index, 10 * index + 10) minutes).
J = {name: i for i, name in enumerate([
    "baseline", "truncated_json", "not_an_object", "wrong_types", "far_future", "missing_required", "extra_fields",
    "duplicates", "null_event_time", "non_utf8", "empty_file", "blank_lines", "late", "huge_file", "long_line"])}


def json_corpus() -> list[Kind]:
    def m(kind: str, offset: float) -> float:
        return minute(J[kind], offset)

    kinds = [
        Kind("baseline", "bl-", [js("bl-1", m("baseline", 1)), js("bl-2", m("baseline", 2)),
                                 js("bl-3", m("baseline", 3))],
             accepted={"bl-1", "bl-2", "bl-3"}),
        Kind("truncated_json", "tr-", [
            js("tr-ok", m("truncated_json", 1)),
            '{"event_id": "tr-1", "device_id": "dev-001", "ts": "20',  # cut inside a value
            js("tr-2", m("truncated_json", 2))[:-1],  # no closing brace
            '{"event_id": "tr-3", "dev',  # cut inside a name
            js("tr-4", m("truncated_json", 3))[:-1] + ', "humidity": '],  # cut after a name
            accepted={"tr-ok"},
            quarantined={"tr-1": NOT_OBJECT, "tr-2": NOT_OBJECT, "tr-3": NOT_OBJECT, "tr-4": NOT_OBJECT}),
        Kind("not_an_object", "na-", [
            "null", "42", '"na-text"', "[1, 2]",
            # a JSON array is a list of records: its objects are read one by one, and [] holds none
            "[]", "[" + js("na-a1", m("not_an_object", 1)) + ", " + js("na-a2", m("not_an_object", 2)) + "]"],
            records=6,  # null, 42, "text", [1, 2] (one record), [] (none), [a1, a2] (two)
            accepted={"na-a1", "na-a2"},
            quarantined={"null": NOT_OBJECT, "42": NOT_OBJECT, "na-text": NOT_OBJECT, "[1, 2]": NOT_OBJECT}),
        Kind("wrong_types", "wt-", [
            js("wt-hot", m("wrong_types", 1), temperature="hot"),
            js("wt-quoted-number", m("wrong_types", 1), temperature="21.5"),  # a string is not a number
            js("wt-bool", m("wrong_types", 1), temperature=True),
            js("wt-list", m("wrong_types", 1), temperature=[20.0]),
            js("wt-time", m("wrong_types", 1), ts="not-a-time"),
            js("wt-two", m("wrong_types", 1), ts="yesterday", humidity="wet"),
            # what Spark's JSON reader coerces, accepted (values asserted below)
            js("wt-number-as-string", m("wrong_types", 2), device_id=42),
            js("wt-epoch-seconds", None, ts=epoch_seconds(m("wrong_types", 3))),
            js("wt-nan", m("wrong_types", 4), temperature="NaN"),
            js("wt-status-number", m("wrong_types", 5), status=5)],
            accepted={"wt-number-as-string", "wt-epoch-seconds", "wt-nan", "wt-status-number"},
            quarantined={"wt-hot": WRONG_TYPE + "temperature (double)",
                         "wt-quoted-number": WRONG_TYPE + "temperature (double)",
                         "wt-bool": WRONG_TYPE + "temperature (double)",
                         "wt-list": WRONG_TYPE + "temperature (double)",
                         "wt-time": WRONG_TYPE + "ts (timestamp)",
                         "wt-two": WRONG_TYPE + "ts (timestamp), humidity (double)"}),
        Kind("far_future", "ff-", [
            js("ff-ok-1", m("far_future", 1)), js("ff-2100", None, ts="2100-01-01T00:00:00.000Z"),
            js("ff-9999", None, ts="9999-12-31T23:59:59.000Z"), js("ff-ok-2", m("far_future", 2))],
            accepted={"ff-ok-1", "ff-ok-2"},
            quarantined={"ff-2100": FUTURE, "ff-9999": FUTURE}),
        Kind("missing_required", "mr-", [
            js("mr-ok", m("missing_required", 1), humidity=..., status=...),  # optional columns may be absent
            js("mr-no-device", m("missing_required", 1), device_id=...),
            js("mr-null-device", m("missing_required", 1), device_id=None),
            js("mr-no-temperature", m("missing_required", 1), temperature=...),
            js("mr-case", m("missing_required", 1), temperature=..., Temperature=21.0),  # names are case-sensitive
            json.dumps({"event_id": "mr-only-id"}),
            "{}"],
            accepted={"mr-ok"},
            quarantined={"mr-no-device": "missing required field(s): device_id",
                         "mr-null-device": "missing required field(s): device_id",
                         "mr-no-temperature": "missing required field(s): temperature",
                         "mr-case": "missing required field(s): temperature",
                         "mr-only-id": "missing required field(s): device_id, ts, temperature",
                         "{}": "missing required field(s): event_id, device_id, ts, temperature"}),
        Kind("extra_fields", "ex-", [
            js("ex-1", m("extra_fields", 1), firmware="1.2.3", location={"lat": 1.5, "lon": 2.5}),
            js("ex-2", m("extra_fields", 2), site="west", _corrupt_record="x", _source_file="/etc/passwd",
               tags=["a", "b"])],
            accepted={"ex-1", "ex-2"}),
        Kind("duplicates", "dp-", [
            js("dp-1", m("duplicates", 1)), js("dp-1", m("duplicates", 1)),  # an exact copy in the same file
            js("ex-1", m("extra_fields", 1), firmware="1.2.3", location={"lat": 1.5, "lon": 2.5}),  # of the last file
            js("dp-2", m("duplicates", 2)), js("dp-2", m("duplicates", 2), temperature=99.0)],  # same key, new values
            accepted={"dp-1", "dp-2"},
            duplicates=3),
        Kind("null_event_time", "nt-", [
            js("nt-ok", m("null_event_time", 1)), js("nt-null", None, ts=None), js("nt-absent", None),
            js("nt-empty", None, ts="")],
            accepted={"nt-ok"},
            quarantined={"nt-null": "missing required field(s): ts", "nt-absent": "missing required field(s): ts",
                         "nt-empty": WRONG_TYPE + "ts (timestamp)"}),
        Kind("non_utf8", "nu-", [
            js("nu-ok", m("non_utf8", 1), status="café ✓"),
            bad_bytes(js("nu-in-value", m("non_utf8", 1), status="ok"), "ok", b"o\xffk"),
            js("nu-latin1", m("non_utf8", 1), status="café").encode("latin-1"),
            b"{\xc3\x28" + js("nu-between", m("non_utf8", 1)).encode()[1:],
            bad_bytes(js("nu-in-id-X", m("non_utf8", 1)), "-X", b"-\x80"),  # a lone continuation byte
            bad_bytes(js("nu-truncated", m("non_utf8", 1), status="caf"), "caf", b"caf\xc3"),
            # an overlong "/": Spark's JSON reader (Jackson) decodes it instead of refusing it
            # (asserted below); in a record it rejects, the text is checked and it is not UTF-8
            bad_bytes(js("nu-overlong", m("non_utf8", 1), status="/"), '"/"', b'"\xc0\xaf"'),
            bad_bytes(js("nu-overlong-cut", m("non_utf8", 1), status="/"), '"/"', b'"\xc0\xaf"')[:-1],
            bad_bytes(js("nu-surrogate", m("non_utf8", 1), status="s"), '"s"', b'"\xed\xa0\x80"'),
            # a NUL byte in a string: valid UTF-8, but the reader refuses an unescaped control
            # character, which the JSON functions explaining the rejection accept: every column named
            bad_bytes(js("nu-nul", m("non_utf8", 1), status="n"), '"n"', b'"\x00"'),
            b"\xff\xfe" + js("nu-bom", m("non_utf8", 1)).encode()],
            accepted={"nu-ok", "nu-overlong"},
            quarantined={"nu-in-value": NOT_UTF8, "nu-latin1": NOT_UTF8, "nu-between": NOT_UTF8,
                         "nu-in-id-": NOT_UTF8, "nu-truncated": NOT_UTF8, "nu-overlong-cut": NOT_UTF8,
                         "nu-surrogate": NOT_UTF8, "nu-bom": NOT_UTF8,
                         "nu-nul": WRONG_TYPE + "event_id (string), device_id (string), ts (timestamp), "
                                                "temperature (double), status (string)"}),
        Kind("empty_file", "ef-", [], accepted=set()),
        Kind("blank_lines", "bk-", ["", "   ", "\t"], records=0, accepted=set()),
        Kind("late", "lt-", [
            js("lt-ok", m("late", 1)),
            js("lt-old", minute(J["baseline"], 5))],  # far behind the watermark (newest event time - 10 minutes)
            accepted={"lt-ok"},
            late=1),
        Kind("huge_file", "hg-", [js(f"hg-{n:05d}", m("huge_file", 9 * n / HUGE)) for n in range(HUGE)],
             accepted={f"hg-{n:05d}" for n in range(HUGE)}),
        Kind("long_line", "ll-", [
            js("ll-ok", m("long_line", 1), status="x" * LONG),
            js("ll-bad", m("long_line", 2), status="y" * LONG)[:-2],  # a megabyte, truncated
            js("ll-after", m("long_line", 3))],
            accepted={"ll-ok", "ll-after"},
            quarantined={"ll-bad": NOT_OBJECT}),
    ]
    assert [k.name for k in kinds] == list(J)
    return kinds


JSON_KINDS = json_corpus()


@pytest.fixture(scope="module")
def sensors_run(spark, tmp_path_factory) -> Outcome:
    data = stream_spec("sensors", "bad_sensors")
    return execute(spark, tmp_path_factory.mktemp("bad-sensors"), data, JSON_KINDS)


@pytest.mark.parametrize("kind", JSON_KINDS, ids=[k.name for k in JSON_KINDS])
def test_sensors_json_corpus(sensors_run: Outcome, kind: Kind) -> None:
    check_kind(sensors_run, kind)


def test_sensors_corpus_adds_up_in_every_query(sensors_run: Outcome) -> None:
    check_totals(sensors_run, sensors_run.run.plan.flows)


def test_sensors_accepted_values_and_coercions(sensors_run: Outcome) -> None:
    rows = {r["event_id"]: r for r in sensors_run.accepted}
    assert rows["wt-number-as-string"]["device_id"] == "42"
    assert rows["wt-status-number"]["status"] == "5"
    assert rows["wt-epoch-seconds"]["ts"] == T0 + timedelta(minutes=minute(J["wrong_types"], 3))
    assert math.isnan(rows["wt-nan"]["temperature"])  # Spark reads "NaN" as a double; a range check catches it
    assert rows["nu-ok"]["status"] == "café ✓"
    assert rows["nu-overlong"]["status"] == "/"  # b"\xc0\xaf", an overlong "/", decoded by the reader
    assert len(rows["ll-ok"]["status"]) == LONG
    assert rows["mr-ok"]["humidity"] is None and rows["mr-ok"]["status"] is None
    # unknown fields are dropped, even ones named like the platform's columns
    assert set(rows["ex-2"]) == set(enriched_columns(sensors_run.run.spec))
    assert rows["ex-2"]["site"] == rows["bl-1"]["site"] == "south"  # from the reference data, not the record
    assert rows["dp-2"]["temperature"] == 20.0  # of two records with one key, the first wins
    long_raw = next(r["raw"] for r in sensors_run.quarantine if "ll-bad" in r["raw"])
    assert len(long_raw) == len(js("ll-bad", minute(J["long_line"], 2), status="y" * LONG)) - 2  # kept whole


def corpus_lines(kinds: list[Kind]) -> set[bytes]:
    return {ln if isinstance(ln, bytes) else ln.encode() for k in kinds for ln in k.lines}


def test_sensors_quarantine_is_readable_by_any_parquet_reader_and_keeps_the_lines_bytes(sensors_run: Outcome) -> None:
    """pyarrow reads every quarantined row: ``raw`` valid UTF-8 (invalid bytes replaced by
    U+FFFD) and, for a line the JSON parser rejected, ``raw_bytes`` the line exactly."""
    rows = pyarrow_rows(sensors_run.run.plan.ingestion.quarantine)
    assert len(rows) == len(sensors_run.quarantine)
    lines = corpus_lines(JSON_KINDS)
    parsed = [r for r in rows if r["reason"].startswith("malformed json record: ")]
    assert sum(r["reason"] == NOT_UTF8 for r in parsed) == 8
    for row in parsed:
        assert row["raw_bytes"] in lines, row["raw"][:120]
        assert row["raw"] == row["raw_bytes"].decode("utf-8", "replace")
    # read by the parser, rejected by a rule: known by its parsed values (raw, as JSON) alone
    assert all(r["raw_bytes"] is None for r in rows if r not in parsed)
    assert sum(r["raw_bytes"] is None for r in rows) == sum(
        r.startswith(("missing", "event time")) for k in JSON_KINDS for r in k.quarantined.values())


def test_clicks_quarantine_is_readable_by_any_parquet_reader(clicks_run: Outcome) -> None:
    """Spark's CSV reader decodes a line before anyone sees it (invalid bytes replaced by
    U+FFFD): ``raw`` is that text, and no original bytes are kept."""
    rows = pyarrow_rows(clicks_run.run.plan.ingestion.quarantine)
    assert len(rows) == len(clicks_run.quarantine) == sum(len(k.quarantined) for k in CSV_KINDS)
    assert all(r["raw_bytes"] is None for r in rows)
    assert sum("\ufffd" in r["raw"] for r in rows) == 3  # the non_utf8 kind's records


def test_far_future_rows_never_reach_the_watermark(sensors_run: Outcome) -> None:
    result = sensors_run.run
    final = T0 + timedelta(minutes=minute(J["long_line"], 3) - 10)  # the newest accepted event time - 10 minutes
    watermarks = [p["watermark"] for p in result.progress(INGEST_FLOW) if p["watermark"]]
    assert max(watermarks) == final.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert max(r["last_seen"] for r in result.rows("device_status")) == final + timedelta(minutes=10)
    # sliding windows kept closing after the far-future file, up to the final watermark
    windows = result.rows("site_temperature_10m")
    assert max(r["window_end"] for r in windows) == T0 + timedelta(minutes=130)  # the last end <= 02:13


# ---- the CSV corpus: clicks (event_id, user_id, page, ts required; duration_ms) -----------------------------


HEADER = "event_id,user_id,page,ts,duration_ms"
CSV_WRONG = "malformed csv record: value does not match the column type: "
FEWER = "malformed csv record: fewer fields than the 5 declared columns"
MORE = "malformed csv record: more fields than the 5 declared columns"


def csv_corpus() -> list[Kind]:
    def t(file: int, offset: float) -> str:
        return at(minute(file, offset))

    csv = functools.partial(Kind, header=HEADER)

    return [
        csv("baseline", "cb-", [f"cb-1,u1,/,{t(0, 1)},100", f"cb-2,u2,/help,{t(0, 2)},"],
            accepted={"cb-1", "cb-2"}),
        csv("too_few_fields", "tf-", [f"tf-1,u1,/,{t(1, 1)}", "tf-2,u1", f"tf-ok,u1,/,{t(1, 2)},"],
            accepted={"tf-ok"}, quarantined={"tf-1": FEWER, "tf-2": FEWER}),
        csv("too_many_fields", "tm-", [
            f"tm-1,u1,/,{t(2, 1)},100,extra", f"tm-2,u,1,/,{t(2, 1)},100",  # an unquoted comma
            f'tm-ok,"u,1",/,{t(2, 2)},5'],
            accepted={"tm-ok"}, quarantined={"tm-1": MORE, "tm-2": MORE}),
        csv("wrong_types", "cw-", [
            "cw-1,u1,/,yesterday,1", f"cw-2,u1,/,{t(3, 1)},lots", f"cw-3,u1,/,{t(3, 1)},1.5",
            f"cw-4,u1,/,{t(3, 1)}, 7", f"cw-ok,u1,/,{t(3, 2)},7"],
            accepted={"cw-ok"},
            quarantined={"cw-1": CSV_WRONG + "ts (timestamp)", "cw-2": CSV_WRONG + "duration_ms (long)",
                         "cw-3": CSV_WRONG + "duration_ms (long)", "cw-4": CSV_WRONG + "duration_ms (long)"}),
        csv("missing_required", "cm-", [f"cm-1,,/,{t(4, 1)},1", "cm-2,u1,,,", ",,,,", f"cm-ok,u1,/,{t(4, 2)},"],
            accepted={"cm-ok"},
            quarantined={"cm-1": "missing required field(s): user_id",
                         "cm-2": "missing required field(s): page, ts",
                         "{}": "missing required field(s): event_id, user_id, page, ts"}),
        csv("non_utf8", "cu-", [
            f"cu-1,u\xff1,/,{t(5, 1)},1".encode("latin-1"),  # in a string column
            f"cu-2,u1,/caf\xe9,{t(5, 1)},1".encode("latin-1"),  # Latin-1, not UTF-8
            f"cu-3,u1,/,{t(5, 1)},5".encode() + b"\xff",  # in a number
            f"cu-ok,u1,/café,{t(5, 2)},1"],
            accepted={"cu-ok"},
            quarantined={"cu-1": "malformed csv record: not valid UTF-8 in user_id",
                         "cu-2": "malformed csv record: not valid UTF-8 in page",
                         "cu-3": "malformed csv record: not valid UTF-8"}),
        csv("unbalanced_quote", "cq-", [f'"cq-1,u1,/,{t(6, 1)},1', f"cq-ok,u1,/,{t(6, 2)},1"],
            accepted={"cq-ok"}, quarantined={"cq-1": FEWER}),
        csv("header_only", "ch-", [], accepted=set()),
        Kind("empty_file", "ce-", [], accepted=set()),  # 0 bytes, no header
        csv("duplicates", "cd-", [f"cd-1,u1,/,{t(9, 1)},1", f"cd-1,u1,/,{t(9, 1)},1", f"cd-1,u9,/cart,{t(9, 1)},2"],
            accepted={"cd-1"}, duplicates=2),
        csv("far_future", "cf-", ["cf-1,u1,/,2100-01-01T00:00:00.000Z,1", f"cf-ok,u1,/,{t(10, 1)},1"],
            accepted={"cf-ok"}, quarantined={"cf-1": FUTURE}),
        csv("after_far_future", "ca-", [f"ca-{n},u1,/,{t(11, n)},1" for n in range(3)],
            accepted={f"ca-{n}" for n in range(3)}),
        csv("long_after_far_future", "cl-", [f"cl-{n},u1,/,{t(12, n)},1" for n in range(3)],
            accepted={f"cl-{n}" for n in range(3)}),
    ]


CSV_KINDS = csv_corpus()


@pytest.fixture(scope="module")
def clicks_run(spark, tmp_path_factory) -> Outcome:
    data = stream_spec("clicks", "bad_clicks")
    return execute(spark, tmp_path_factory.mktemp("bad-clicks"), data, CSV_KINDS)


@pytest.mark.parametrize("kind", CSV_KINDS, ids=[k.name for k in CSV_KINDS])
def test_clicks_csv_corpus(clicks_run: Outcome, kind: Kind) -> None:
    check_kind(clicks_run, kind)


def test_clicks_corpus_adds_up_in_every_query(clicks_run: Outcome) -> None:
    check_totals(clicks_run, clicks_run.run.plan.flows)
    rows = {r["event_id"]: r for r in clicks_run.accepted}
    assert rows["tm-ok"]["user_id"] == "u,1"
    assert rows["cu-ok"]["page"] == "/café"
    assert rows["cb-2"]["duration_ms"] is None  # an empty field is null
    assert rows["cd-1"]["user_id"] == "u1"  # of records with one key, the first wins
    # page_totals (complete mode: the memory sink holds the last result) counts every accepted row once
    assert sum(r["views"] for r in clicks_run.run.rows("page_totals")) == len(rows)


# ---- event_time.max_future relative to the processing time ----------------------------------------------------


def test_max_future_is_measured_from_the_processing_time(spark, tmp_path: Path) -> None:
    data = readings_only("bad_sensors_now", "1 hour")
    now = datetime.now(UTC).replace(tzinfo=None)

    def rec(event_id: str, delta: timedelta) -> str:
        ts = (now + delta).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        return json.dumps({"event_id": event_id, "device_id": "dev-001", "ts": ts, "temperature": 20.0})

    files = [[rec("past", -timedelta(minutes=5)), rec("ahead-30m", timedelta(minutes=30)),
              rec("ahead-2h", timedelta(hours=2)), rec("ahead-1y", timedelta(days=365))]]
    result = run(spark, tmp_path, data, files)
    layout = Layout(result.spec, tmp_path / "data", SPEC_DIR)
    quarantine = {json.loads(r["raw"])["event_id"]: r["reason"]
                  for r in spark.read.parquet(layout.data("quarantine/sensors")).collect()}
    reason = "event time too far in the future: ts is more than 1 hour ahead of the processing time"
    assert quarantine == {"ahead-2h": reason, "ahead-1y": reason}
    assert {r["event_id"] for r in result.rows("readings")} == {"past", "ahead-30m"}


def test_a_far_future_row_without_the_guard_would_drop_later_rows_as_late(spark, tmp_path: Path) -> None:
    """The hazard the guard prevents, shown with a guard wide enough to let the year 2100 in."""
    data = readings_only("bad_sensors_unguarded", "36500 days")
    files = [[js("u-1", 1)], [js("u-2100", None, ts="2100-01-01T00:00:00.000Z")], [js("u-2", 2)], [js("u-3", 3)]]
    result = run(spark, tmp_path, data, files)
    # u-2 is judged by the watermark of the batch before the year-2100 row; u-3 by the one after it
    assert {r["event_id"] for r in result.rows("readings")} == {"u-1", "u-2100", "u-2"}
    assert result.total(INGEST_FLOW, "dropped_by_watermark") == 1


def test_generated_future_events_match_the_ground_truth(spark, tmp_path: Path) -> None:
    """The generator's future events, through the real sensors spec and sinks, as its ground truth says."""
    spec_path = SPEC_DIR / "sensors.yaml"
    root = tmp_path / "data"
    generated = generate.generate(spec_path, root, generate.Settings(
        files=4, events_per_file=30, empty_files=0, future=0.1, late_within=0, late_beyond=0, seed=3))
    manifest = json.loads(generated.manifest.read_text())
    entries = [json.loads(line) for line in (root / "generated" / "sensors" / "ledger.jsonl").read_text().splitlines()]
    futures = sum(e["kind"] == "future" for e in entries)
    assert futures >= 3 and manifest["counts"]["quarantined"] >= futures

    spec = load_spec(spec_path)
    layout = Layout(spec, root, SPEC_DIR)
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    report = verify.compare(spark, analysis.resolve_plan(spark, spec, layout), manifest)
    assert report.ok, report.describe()
    reasons = [r["reason"] for r in spark.read.parquet(layout.data(spec.quarantine.path)).collect()]
    assert reasons.count(FUTURE) == futures
