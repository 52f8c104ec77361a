"""The test-data generator: atomic files, ordering, late-event placement, ledger and manifest."""

from __future__ import annotations

import csv
import errno
import json
import os
import re
import signal
from pathlib import Path

import pytest
import yaml
from examples import clicks_csv_spec, example_spec, include_with

from runner.testdata import generate as gen
from spark_jobs.plan import compile_plan
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import duration_seconds

STREAMS = Path(__file__).resolve().parents[3] / "include" / "streams"
SENSORS = STREAMS / "sensors.yaml"
ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
MARGIN_MS = 30_000
#: Shares high enough that every kind of record shows up in a few small files.
BUSY = {"late_within": 0.1, "late_beyond": 0.1, "duplicates": 0.1, "malformed": 0.15, "unknown_keys": 0.1}


@pytest.fixture(scope="module")
def clicks_csv(tmp_path_factory) -> Path:
    """The clicks example reading CSV files (it reads a Kafka topic): the CSV stream here."""
    return clicks_csv_spec(tmp_path_factory.mktemp("clicks-csv"))


@pytest.fixture(params=["json", "csv"])
def spec_path(request) -> Path:
    return SENSORS if request.param == "json" else request.getfixturevalue("clicks_csv")


def run(spec_path, root, clock=None, **settings):
    clocks = {"monotonic": clock.monotonic, "sleep": clock.sleep, "wall": clock.wall} if clock else {}
    return gen.generate(spec_path, root, gen.Settings(**settings), **clocks)


def ledger(root, stream):
    path = Path(root) / "generated" / stream / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def manifest(root, stream):
    return json.loads((Path(root) / "generated" / stream / "manifest.json").read_text())


def ms(text):
    from datetime import datetime

    return round(datetime.fromisoformat(text).timestamp() * 1000)


def records_of(path: Path, fmt: str) -> list[bytes]:
    lines = [line for line in path.read_bytes().split(b"\n") if line.strip()]
    return lines[1:] if fmt == "csv" else lines


def parse_valid(line: bytes, spec) -> dict | None:
    """The event a record holds if Spark would accept it, else None (checked independently of the generator)."""
    columns = spec.source.columns
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if spec.source.format == "json":
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
    else:
        fields = next(csv.reader([text], escapechar="\\"))
        if len(fields) != len(columns):
            return None
        obj = dict(zip([c.name for c in columns], [f if f != "" else None for f in fields], strict=True))
    event = {}
    for c in columns:
        value = obj.get(c.name)
        if value is None:
            if c.required:
                return None
            event[c.name] = None
            continue
        try:
            if c.type == "string":
                ok = isinstance(value, str)
            elif c.type == "timestamp":
                ok = isinstance(value, str) and bool(ISO.match(value))
            elif c.type == "double":
                value = float(value) if isinstance(value, str) else value
                ok = isinstance(value, int | float) and not isinstance(value, bool)
            else:  # integer, long
                value = int(value) if isinstance(value, str) else value
                ok = isinstance(value, int) and not isinstance(value, bool)
        except ValueError:
            return None
        if not ok:
            return None
        event[c.name] = value
    return event


def test_files_are_renamed_complete_from_staging_in_sequence(tmp_path, monkeypatch, spec_path):
    spec = load_spec(spec_path)
    staging = tmp_path / "generated" / spec.name / "staging"
    landing = tmp_path / "landing" / spec.name
    real_rename = os.rename
    renames = []

    def spy(src, dst):
        src, dst = Path(src), Path(dst)
        assert src.parent == staging and dst.parent == landing
        assert not dst.exists()
        data = src.read_bytes()
        assert data == b"" or data.endswith(b"\n")  # complete before it becomes visible
        renames.append((dst.name, data, src.stat().st_mtime_ns))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", spy)
    result = run(spec_path, tmp_path, files=4, events_per_file=30, empty_files=2, **BUSY)

    names = sorted(p.name for p in landing.iterdir())
    ext = spec.source.format
    assert names == [f"part-{i:06d}.{ext}" for i in range(1, 7)]
    assert [n for n, _, _ in renames] == names and result.sequence == list(range(1, 7))
    assert list(staging.iterdir()) == []
    for name, data, mtime in renames:  # what landed is what was staged, mtime included
        assert (landing / name).read_bytes() == data
        assert (landing / name).stat().st_mtime_ns == mtime
    mtimes = [(landing / n).stat().st_mtime_ns for n in names]
    assert all(a < b for a, b in zip(mtimes, mtimes[1:], strict=False)), mtimes
    empty = [n for n in names if (landing / n).stat().st_size == 0]
    assert len(empty) == 2
    entries = ledger(tmp_path, spec.name)
    assert not {e["name"] for e in entries} & set(empty)


def test_records_match_the_ledger_and_malformed_ones_never_look_valid(tmp_path, spec_path):
    spec = load_spec(spec_path)
    run(spec_path, tmp_path, files=5, events_per_file=40, **BUSY)
    landing = tmp_path / "landing" / spec.name
    entries = ledger(tmp_path, spec.name)
    by_file: dict[str, list] = {}
    for e in entries:
        by_file.setdefault(e["name"], []).append(e)
    reasons = set()
    for path in sorted(landing.iterdir()):
        lines = records_of(path, spec.source.format)
        expected = by_file.get(path.name, [])
        assert len(lines) == len(expected)
        if spec.source.format == "csv" and lines:
            assert path.read_bytes().split(b"\n")[0].decode() == ",".join(c.name for c in spec.source.columns)
        for line, entry in zip(lines, expected, strict=True):
            event = parse_valid(line, spec)
            if entry["kind"] == "malformed":
                reasons.add(entry["reason"])
                assert event is None, (entry, line)
            else:
                assert event == entry["event"], (entry, line)
                assert ISO.match(event["ts"])
    want = {"json": {"truncated", "wrong_type", "missing_required", "invalid_utf8"},
            "csv": {"wrong_type", "too_few_fields", "invalid_utf8"}}[spec.source.format]
    assert reasons == want
    valid = [e for e in entries if e["kind"] != "malformed"]
    ids = [e["event"]["event_id"] for e in valid if e["kind"] != "duplicate"]
    assert len(ids) == len(set(ids))
    key, ref = {"sensors": ("device_id", "devices.csv"), "clicks": ("page", "pages.csv")}[spec.name]
    with open(STREAMS.parent / "reference" / ref, newline="") as fh:
        known = {row[key] for row in csv.DictReader(fh)}
    unknown = [e for e in valid if "unknown_key" in e["flags"]]
    assert unknown and all(e["event"][key] not in known for e in unknown)
    assert all(e["event"][key] in known for e in valid if "unknown_key" not in e["flags"])


def kinds(entries):
    out: dict[str, int] = {}
    for e in entries:
        out[e["kind"]] = out.get(e["kind"], 0) + 1
    return out


def test_manifest_counts_add_up(tmp_path, spec_path):
    spec = load_spec(spec_path)
    files = 2 * spec.source.max_files_per_trigger + 4  # events late beyond the watermark start at file 2m+1
    run(spec_path, tmp_path, files=files, events_per_file=50, **BUSY)
    m = manifest(tmp_path, spec.name)
    c = m["counts"]
    entries = ledger(tmp_path, spec.name)
    k = kinds(entries)
    assert c["input_records"] == len(entries) == m["ledger_records"]
    assert c["input_records"] == c["accepted"] + c["quarantined"] + c["duplicates"] + c["dropped_late"]
    assert c["quarantined"] == k["malformed"] and c["duplicates"] == k["duplicate"]
    assert c["dropped_late"] == k["late_beyond"] and c["accepted"] == k["ok"] + k["late_within"]
    assert m["stream"] == spec.name and m["files"] == files + 1 and m["settings"][0]["seed"] == 7
    assert set(m["outputs"]) == {o.name for o in spec.outputs}
    passthrough = [o for o in spec.outputs if o.query.type == "passthrough"]
    for o in passthrough:
        assert len(m["outputs"][o.name]["rows"]) == c["accepted"]


def check_placement(entries, spec):
    """The late-event and duplicate rules, for every micro-batch grouping Spark may choose."""
    m = spec.source.max_files_per_trigger
    delay = duration_seconds(spec.event_time.watermark) * 1000
    windows = [duration_seconds(o.query.window.duration) * 1000 for o in spec.outputs
               if o.query.type == "aggregate" and o.query.window]
    w = max(windows, default=0)
    file_max: dict[int, int] = {}
    for e in entries:
        if e["kind"] != "malformed":
            t = ms(e["event"]["ts"])
            file_max[e["file"]] = max(file_max.get(e["file"], t), t)

    def maxts(k):
        return max((v for f, v in file_max.items() if f <= k), default=None)

    originals = {(e["file"], e["line"]): e for e in entries}
    seen = {"late_beyond": 0, "late_within": 0, "duplicate": 0}
    for e in entries:
        k = e["file"]
        if e["kind"] in seen:
            seen[e["kind"]] += 1
        if e["kind"] == "late_beyond":
            # Spark judges lateness by the previous batch's watermark: at least maxts(k - 2m) - D
            assert k > 2 * m and maxts(k - 2 * m) is not None
            assert ms(e["event"]["ts"]) < maxts(k - 2 * m) - delay - w - MARGIN_MS, e
        elif e["kind"] == "late_within":
            assert maxts(k) - delay + MARGIN_MS < ms(e["event"]["ts"]) < maxts(k), e
        elif e["kind"] == "duplicate":
            original = originals[e["of"]["file"], e["of"]["line"]]
            assert original["kind"] == "ok" and original["event"] == e["event"]
            assert (original["file"], original["line"]) < (k, e["line"]) and original["file"] in (k, k - 1)
            if k > 1 and maxts(k - 1) is not None:  # not late for the batch that reads file k
                assert ms(e["event"]["ts"]) > maxts(k - 1) - delay
    return seen


def custom_spec(tmp_path):
    """A sensors variant: 3 files per trigger, a 1-minute watermark, 5-minute tumbling windows."""
    data = yaml.safe_load(SENSORS.read_text())
    data["name"] = "probe"
    data["source"]["path"] = "landing/probe"
    data["source"]["max_files_per_trigger"] = 3
    data["quarantine"]["path"] = "quarantine/probe"
    data["checkpoint"] = "checkpoints/probe"
    data["event_time"]["watermark"] = "2 minutes"
    data["outputs"][1]["query"]["window"] = {"duration": "5 minutes"}
    data["outputs"][0]["sink"]["path"] = "sinks/probe/readings"
    data["outputs"][1]["sink"]["path"] = "sinks/probe/w"
    data["outputs"][2]["sink"]["table"] = "probe_status"
    (tmp_path / "streams").mkdir()
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "devices.csv").write_text((STREAMS.parent / "reference" / "devices.csv").read_text())
    path = tmp_path / "streams" / "probe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("which", "events"), [("sensors", 60), ("clicks", 60), ("custom", 150)])
def test_late_events_and_duplicates_are_placed_safely(tmp_path, request, which, events):
    spec_path = {"sensors": SENSORS}.get(which) or (request.getfixturevalue("clicks_csv") if which == "clicks"
                                                    else custom_spec(tmp_path))
    spec = load_spec(spec_path)
    root = tmp_path / "data"
    # custom: a file spans 150 s of event time, more than the 2-minute watermark delay
    files = max(12, 2 * spec.source.max_files_per_trigger + 4)  # late beyond the watermark from file 2m+1
    run(spec_path, root, files=files, events_per_file=events, empty_files=3, **BUSY)
    seen = check_placement(ledger(root, spec.name), spec)
    assert all(seen.values()), seen


def test_second_run_continues_sequence_clock_and_history(tmp_path):
    first = run(SENSORS, tmp_path, files=3, events_per_file=40, empty_files=0, **BUSY)
    before = ledger(tmp_path, "sensors")
    second = run(SENSORS, tmp_path, files=4, events_per_file=40, empty_files=1, **BUSY)
    entries = ledger(tmp_path, "sensors")
    assert first.sequence == [1, 2, 3] and second.sequence == [4, 5, 6, 7, 8]
    assert entries[: len(before)] == before
    on_time = [ms(e["event"]["ts"]) for e in entries if e["kind"] == "ok"]
    assert all(a < b for a, b in zip(on_time, on_time[1:], strict=False))
    last_first = max(ms(e["event"]["ts"]) for e in before if e["kind"] == "ok")
    first_second = min(ms(e["event"]["ts"]) for e in entries[len(before):] if e["kind"] == "ok")
    assert 0 < first_second - last_first < 2000  # the virtual clock goes on, one step per event
    steps = [b - a for a, b in zip(on_time, on_time[1:], strict=False)]
    assert max(steps) < 2000 and 900 < sum(steps) / len(steps) < 1100
    check_placement(entries, load_spec(SENSORS))
    m = manifest(tmp_path, "sensors")
    assert m["files"] == 8 and m["ledger_records"] == len(entries) and len(m["settings"]) == 2
    assert [r["first_seq"] for r in m["settings"]] == [1, 4]
    landing = tmp_path / "landing" / "sensors"
    mtimes = [(landing / f"part-{i:06d}.json").stat().st_mtime_ns for i in range(1, 9)]
    assert all(a < b for a, b in zip(mtimes, mtimes[1:], strict=False))


def test_mtimes_increase_even_when_the_wall_clock_stands_still(tmp_path):
    class Frozen(FakeClock):
        def wall(self):
            return 1_800_000_000.0

    run(SENSORS, tmp_path, files=3, empty_files=1, events_per_file=5, clock=Frozen())
    run(SENSORS, tmp_path, files=2, empty_files=0, events_per_file=5, clock=Frozen())
    landing = tmp_path / "landing" / "sensors"
    mtimes = [(landing / f"part-{i:06d}.json").stat().st_mtime_ns for i in range(1, 7)]
    assert all(b - a >= 1_000_000 for a, b in zip(mtimes, mtimes[1:], strict=False)), mtimes  # >= 1 ms apart


def test_same_seed_gives_the_same_ledger(tmp_path, clicks_csv):
    run(clicks_csv, tmp_path / "a", files=3, events_per_file=30, **BUSY)
    run(clicks_csv, tmp_path / "b", files=3, events_per_file=30, **BUSY)
    run(clicks_csv, tmp_path / "c", files=3, events_per_file=30, seed=8, **BUSY)
    assert ledger(tmp_path / "a", "clicks") == ledger(tmp_path / "b", "clicks")
    assert ledger(tmp_path / "a", "clicks") != ledger(tmp_path / "c", "clicks")


class FakeClock:
    def __init__(self, on_sleep=None):
        self.now = 100.0
        self.slept = 0.0
        self.on_sleep = on_sleep

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        assert seconds > 0
        self.now += seconds
        self.slept += seconds
        if self.on_sleep:
            self.on_sleep(self)

    def wall(self):
        return 1_800_000_000 + self.now


def test_rate_mode_paces_files_and_uses_the_wall_clock(tmp_path):
    clock = FakeClock()
    result = run(SENSORS, tmp_path, rate=10, duration=0.5, events_per_file=20, empty_files=1, clock=clock)
    assert result.sequence == [1, 2, 3, 4, 5] and not result.stopped
    assert clock.slept == pytest.approx(0.4)
    landing = tmp_path / "landing" / "sensors"
    assert (landing / "part-000002.json").stat().st_size == 0
    on_time = [ms(e["event"]["ts"]) for e in ledger(tmp_path, "sensors") if e["kind"] == "ok"]
    assert min(on_time) >= (1_800_000_000 + 100 - 0.1) * 1000
    assert max(on_time) <= (1_800_000_000 + 100.4) * 1000
    assert manifest(tmp_path, "sensors")["settings"][0]["mode"] == "rate"


def test_rate_mode_stops_after_the_current_file_on_sigterm(tmp_path, clicks_csv):
    def send_term(clock):
        if clock.now >= 100.15:
            os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    clock = FakeClock(send_term)
    result = run(clicks_csv, tmp_path, rate=10, events_per_file=10, empty_files=0, clock=clock)  # no duration: until stopped
    assert result.stopped and result.sequence == [1, 2]
    assert signal.getsignal(signal.SIGTERM) is previous
    state = json.loads((tmp_path / "generated" / "clicks" / "state.json").read_text())
    assert state["next_seq"] == 3
    assert manifest(tmp_path, "clicks")["files"] == 2


def test_cross_device_rename_is_a_clear_error(tmp_path, monkeypatch):
    def exdev(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "rename", exdev)
    with pytest.raises(gen.GeneratorError, match="different file systems"):
        run(SENSORS, tmp_path, files=1, events_per_file=5)
    assert list((tmp_path / "landing" / "sensors").iterdir()) == []
    assert list((tmp_path / "generated" / "sensors" / "staging").iterdir()) == []


def test_a_landed_file_is_never_overwritten(tmp_path):
    landing = tmp_path / "landing" / "sensors"

    class Intruder(FakeClock):
        def wall(self):  # another writer drops the same name while the file is being made
            landing.mkdir(parents=True, exist_ok=True)
            (landing / "part-000001.json").touch()
            return super().wall()

    with pytest.raises(gen.GeneratorError, match="refusing to overwrite"):
        run(SENSORS, tmp_path, files=1, events_per_file=5, clock=Intruder())
    assert (landing / "part-000001.json").read_bytes() == b""


def test_unrecorded_landing_file_is_refused(tmp_path):
    landing = tmp_path / "landing" / "sensors"
    landing.mkdir(parents=True)
    (landing / "part-000001.json").write_text("{}\n")
    with pytest.raises(gen.GeneratorError, match="not recorded"):
        run(SENSORS, tmp_path, files=1, events_per_file=5)


def test_cli(tmp_path, capsys, clicks_csv):
    assert gen.main(["--spec", str(clicks_csv), "--data-root", str(tmp_path), "--files", "2",
                     "--events-per-file", "10", "--empty-files", "0"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["files"] == 2 and summary["last_seq"] == 2
    assert summary["counts"]["input_records"] == summary["records"]
    assert gen.main(["--spec", str(clicks_csv), "--data-root", str(tmp_path), "--duration", "3"]) == 2
    assert gen.main(["--spec", str(clicks_csv), "--data-root", str(tmp_path), "--late-within", "2"]) == 2
    assert "between 0 and 1" in capsys.readouterr().err


def test_future_events_only_when_asked_far_beyond_max_future_and_quarantined(tmp_path, spec_path):
    spec = load_spec(spec_path)
    run(spec_path, tmp_path / "plain", files=3, events_per_file=40, **BUSY)
    assert "future" not in kinds(ledger(tmp_path / "plain", spec.name))

    clock = FakeClock()  # the wall clock says 2027-01-15
    run(spec_path, tmp_path / "ahead", clock=clock, files=3, events_per_file=40, future=0.1, **BUSY)
    entries = ledger(tmp_path / "ahead", spec.name)
    ahead = [e for e in entries if e["kind"] == "future"]
    assert len(ahead) >= 3
    limit = (clock.wall() + duration_seconds(spec.event_time.max_future)) * 1000
    assert all(ms(e["event"]["ts"]) > limit + 365 * 86_400_000 for e in ahead)
    for line, e in [(line, e) for path in sorted((tmp_path / "ahead" / "landing" / spec.name).iterdir())
                    for line, e in zip(records_of(path, spec.source.format),
                                       [x for x in entries if x["name"] == path.name], strict=True)]:
        if e["kind"] == "future":
            assert parse_valid(line, spec) == e["event"]  # a well-formed record, only dated too far ahead
    m = manifest(tmp_path / "ahead", spec.name)
    k = kinds(entries)
    assert m["counts"]["quarantined"] == k["malformed"] + k["future"]
    assert m["watermark"]["max_event_time"] < "2027"  # the virtual clock's 2026, never the future events
    assert m["settings"][0]["future"] == 0.1


def test_future_share_is_checked(tmp_path):
    with pytest.raises(gen.GeneratorError, match="future must be between 0 and 1"):
        run(SENSORS, tmp_path, files=1, future=1.5)
    with pytest.raises(gen.GeneratorError, match="must not exceed 1"):
        run(SENSORS, tmp_path, files=1, late_within=0.5, duplicates=0.3, future=0.3)


def test_a_topic_gets_each_file_as_one_transaction_and_the_ledger_its_positions(tmp_path, monkeypatch,
                                                                                 kafka_broker, kafka_topic):
    data = example_spec("clicks")
    data["source"]["topics"] = [kafka_topic]
    spec_path = include_with(tmp_path / "include", data) / "clicks.yaml"
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    with pytest.raises(gen.GeneratorError, match=r"cannot produce to topic .*KAFKA_BOOTSTRAP_SERVERS.* not set"):
        run(spec_path, tmp_path / "data", files=1)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_broker.bootstrap)

    result = run(spec_path, tmp_path / "data", files=4, events_per_file=30, empty_files=1, **BUSY)
    assert result.sequence == [1, 2, 3, 4, 5] and result.files == []  # nothing lands in a directory
    entries = ledger(tmp_path / "data", "clicks")
    values = {f"{m.topic()}/{m.partition()}@{m.offset()}": m.value() for m in kafka_broker.consume(kafka_topic)}
    assert sorted(values) == sorted(e["name"] for e in entries) and len(values) == result.records
    assert {int(p.split("/")[1].split("@")[0]) for p in values} == {0, 1, 2}  # the partitions in turn
    kinds_seen = set()
    for e in entries:
        value = values[e["name"]]
        kinds_seen.add(e["kind"])
        if e["kind"] == "malformed":
            assert value.decode("utf-8", "backslashreplace") == e["raw"]
        else:
            assert json.loads(value) == e["event"]
    assert {"ok", "duplicate", "malformed"} <= kinds_seen
    assert manifest(tmp_path / "data", "clicks")["counts"]["input_records"] == len(entries)

    # a generator that dies mid-file leaves nothing of it visible: the next one fences it and aborts it
    spec = load_spec(spec_path)
    plan = compile_plan(spec, Layout(spec, tmp_path / "data", spec_path.parent))
    dying = gen.TopicWriter(plan)
    dying.open()
    dying.producer.begin_transaction()
    dying.producer.produce(kafka_topic, value=b"half a file")
    dying.producer.flush(10)
    gen.TopicWriter(plan).open()
    assert b"half a file" not in [m.value() for m in kafka_broker.consume(kafka_topic)]
