"""The run loop of the test-data generator: one stream's files, published into its landing directory, with a ledger.

    python -m runner.testdata.generate --spec include/streams/sensors.yaml --files 20 --events-per-file 100
    python -m runner.testdata.generate --spec include/streams/clicks.yaml --rate 2 --duration 60

A run writes files one after another, in batch mode (``--files``, with empty files among
them) or in rate mode (files per second until ``--duration`` or SIGINT/SIGTERM), under a
lock so that one generator at a time writes a stream. Each file is written completely
into ``<data_root>/generated/<stream>/staging/``, given its modification time there, and
renamed into the landing directory, so Spark never sees a partial file. Names are
``part-<seq:06d>.<json|csv>`` with one sequence per stream; modification times increase
strictly with the sequence (Spark's file source orders new files by modification time).

A stream that reads a Kafka topic gets the same files' records produced to its topic
instead (:class:`TopicWriter`): each file as one transaction, its records to the
partitions in turn, each record's position (``topic/partition@offset``) its ledger
``name``. Such a stream's micro-batches take whatever was produced since the last one,
so no record is late beyond the watermark for certain: the generator makes none for it.

What a file holds (on-time, late, duplicate, future and malformed records, their event
times and values) is made by :mod:`runner.testdata.records`.
Every record goes to ``ledger.jsonl``; ``state.json`` lets a later run continue the
stream (sequence, clock, history); ``manifest.json`` is :func:`groundtruth.expected`
over the whole ledger, rewritten after every run. A ledger line per record (``line`` is
the line in the file; a CSV header is line 1)::

    {"file": 4, "name": "part-000004.json", "line": 17, "kind": "ok", "flags": ["unknown_key"],
     "event": {"event_id": "sensors-000004-0017", "ts": "2026-01-01T00:05:12.345Z", ...}}
    {"file": 4, ..., "kind": "duplicate", "flags": [], "of": {"file": 3, "line": 88}, "event": {...}}
    {"file": 4, ..., "kind": "malformed", "reason": "wrong_type", "column": "temperature", "raw": "..."}

``kind`` is one of ok, late_within, late_beyond, late_edge, duplicate, future, malformed.

Event time comes from a virtual clock (batch mode: ``--start`` plus ``--event-interval-ms``
per on-time event) or the wall clock (rate mode).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runner.testdata import groundtruth as gt
from runner.testdata.records import GeneratorError, RecordMaker, Settings
from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.stream_spec.layout import (
    Layout,
    default_data_root,
)
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import SpecError

DEFAULT_START = "2026-01-01T00:00:00Z"
STATE_VERSION = 1
PART_NAME = re.compile(r"^part-(\d{6,})\.(json|csv)$")


class TopicWriter:
    """Produces each generated file's records to the stream's Kafka topic as one transaction:
    a reader with ``kafka.isolation.level: read_committed`` sees a file's records together or
    not at all (a generator killed mid-file leaves nothing visible). Records go to the
    partitions in turn; :meth:`publish` returns each one's position (``topic/partition@offset``),
    as the quarantine names it."""

    def __init__(self, plan: StreamPlan):
        source = plan.source
        kafka = source.kafka if source is not None else None
        assert source is not None and kafka is not None, "a stream that reads a Kafka topic"
        if kafka.topics is None or len(kafka.topics) != 1:
            raise GeneratorError(f"stream {plan.stream!r} reads {kafka.pattern or kafka.topics}; the generator "
                                 "produces to exactly one topic")
        self.stream, self.topic, self.kafka, self.options = plan.stream, kafka.topics[0], kafka, source.reader_options
        self.producer: Any = None
        self.partitions = 0

    def open(self) -> None:
        """Connect, count the topic's partitions and fence any earlier producer of this stream."""
        from confluent_kafka import KafkaException, Producer

        from spark_jobs.sources import kafka as source

        try:
            config = source.client_config(self.kafka, self.options)
            config.pop("isolation.level", None)  # a consumer's setting
            partitions = source.probe(self.kafka, self.options).get(self.topic)
            self.producer = Producer(config | {"transactional.id": f"streams-generator-{self.stream}",
                                               "linger.ms": 5})
            self.producer.init_transactions(30)
        except (source.KafkaUnavailable, KafkaException) as exc:
            raise GeneratorError(f"cannot produce to topic {self.topic!r}: {exc}") from None
        self.partitions = partitions or 1

    def publish(self, values: list[bytes]) -> list[str]:
        """Produce ``values`` in one transaction and wait for its commit; their positions."""
        from confluent_kafka import KafkaException

        assert self.producer is not None, "open() first"
        positions: list[str | None] = [None] * len(values)
        errors: list[str] = []

        def delivered(i: int) -> Callable[[Any, Any], None]:
            def report(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    positions[i] = f"{msg.topic()}/{msg.partition()}@{msg.offset()}"
            return report

        try:
            self.producer.begin_transaction()
            for i, value in enumerate(values):
                self.producer.produce(self.topic, value=value, partition=i % self.partitions, on_delivery=delivered(i))
                self.producer.poll(0)
            self.producer.flush(60)
            if errors or None in positions:
                raise KafkaException(f"not delivered: {errors[:3] or 'no report within 60 s'}")
            self.producer.commit_transaction(60)
        except KafkaException as exc:
            with contextlib.suppress(KafkaException):
                self.producer.abort_transaction(30)
            raise GeneratorError(f"producing to topic {self.topic!r} failed (the file's transaction was aborted, "
                                 f"so no reader sees part of it): {exc}") from None
        return [p for p in positions if p is not None]


@dataclass
class RunResult:
    files: list[Path] = field(default_factory=list)  # written into the landing directory (none for a topic)
    sequence: list[int] = field(default_factory=list)  # every file's number, a topic's transactions too
    records: int = 0
    stopped: bool = False  # ended early by a signal or request_stop()
    manifest: Path | None = None


# ---- the generator --------------------------------------------------------------------------


class Generator:
    """Writes one stream's files (its compiled ``plan``; ``generated/`` under the layout's data root);
    see the module docstring."""

    def __init__(self, plan: StreamPlan, layout: Layout):
        self.plan = plan
        source = plan.source
        self.topic: TopicWriter | None = None
        if source is not None and source.kind == "kafka":
            self.topic = TopicWriter(plan)
            self.landing = None
        elif source is not None and source.is_files:
            landing = source.landing
            assert landing is not None
            if "://" in landing:
                raise GeneratorError(f"landing {landing!r} is not a local path; the generator writes local files only")
            self.landing = Path(landing)
        else:
            raise GeneratorError(f"stream {plan.stream!r} reads neither files nor a Kafka topic; nothing to generate")
        self.root = Path(layout.data_root).resolve() / "generated" / plan.stream
        self.staging = self.root / "staging"
        self.ledger_path = self.root / "ledger.jsonl"
        self.state_path = self.root / "state.json"
        self.manifest_path = self.root / "manifest.json"
        self.format = source.format
        self.records = RecordMaker(plan)
        self._stop = False

    # ---- public ---------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop after the file being written (what SIGINT and SIGTERM do)."""
        self._stop = True

    def run(self, settings: Settings, *, monotonic: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep, wall: Callable[[], float] = time.time) -> RunResult:
        """Write one run of files, then the manifest. The clocks can be replaced for tests."""
        settings.check()
        self._stop = False
        for d in (self.root, self.staging, self.landing):
            if d is not None:
                d.mkdir(parents=True, exist_ok=True)
        result = RunResult()
        with self._locked(), self._signals():
            state = self._load_state()
            if self.landing is not None:
                self._check_landing(state)
            for leftover in self.staging.iterdir():  # never renamed, so never seen by Spark
                leftover.unlink()
            if self.topic is not None:
                self.topic.open()
            if state["clock_ms"] is None:
                state["clock_ms"] = gt.parse_ts(settings.start or DEFAULT_START)
            elif settings.start is not None:
                state["clock_ms"] = max(state["clock_ms"], gt.parse_ts(settings.start))
            run = {**asdict(settings), "mode": settings.mode, "clock": settings.clock_kind,
                   "first_seq": state["next_seq"], "last_seq": None, "records": 0}
            state["runs"].append(run)
            rng = random.Random(f"{settings.seed}:{state['next_seq']}")

            def write(empty: bool, span_ms: float) -> None:
                result.sequence.append(state["next_seq"])
                path, n = self._write_file(state, settings, rng, empty, wall, span_ms)
                if path is not None:
                    result.files.append(path)
                result.records += n
                run["last_seq"], run["records"] = state["next_seq"] - 1, run["records"] + n
                self._save_state(state)

            if settings.rate is None:
                total = settings.files + settings.empty_files
                slots = range(1, total) if settings.files else range(total)
                empties = set(rng.sample(slots, min(settings.empty_files, len(slots))))
                for i in range(total):
                    if self._stop:
                        result.stopped = True
                        break
                    write(i in empties, settings.event_interval_ms * settings.events_per_file)
            else:
                result.stopped = self._run_rate(settings, write, monotonic, sleep)
            self._save_state(state)
            result.manifest = self.write_manifest(state, now=wall())
        return result

    def write_manifest(self, state: dict[str, Any] | None = None, now: float | None = None) -> Path:
        """Write ``manifest.json``: the expected results over the whole ledger (``now``: wall-clock seconds)."""
        state = state or self._load_state()
        records = gt.read_ledger(self.ledger_path)
        manifest = gt.expected(self.plan, records, files=state["next_seq"] - 1, settings=state["runs"],
                               now_ms=None if now is None else round(now * 1000))
        manifest["generator"] = {"landing": str(self.landing) if self.topic is None else None,
                                 "topic": self.topic.topic if self.topic is not None else None,
                                 "ledger": str(self.ledger_path), "format": self.format}
        write_atomically(self.manifest_path, json.dumps(manifest, indent=1) + "\n", fsync=True)
        return self.manifest_path

    # ---- runs -------------------------------------------------------------------------------

    def _run_rate(self, settings: Settings, write: Callable[[bool, float], None],
                  monotonic: Callable[[], float], sleep: Callable[[float], None]) -> bool:
        """Files at ``rate`` per second for ``duration`` seconds; True if stopped early."""
        assert settings.rate is not None
        start = monotonic()
        empties_left = settings.empty_files
        i = 0
        while not self._stop:
            due = start + i / settings.rate
            if settings.duration is not None and due - start >= settings.duration:
                return False
            while not self._stop and (remaining := due - monotonic()) > 0:
                sleep(min(remaining, 0.25))
            if self._stop:
                break
            empty = empties_left > 0 and i % 2 == 1  # the 2nd, 4th, ... file until the count is used
            empties_left -= empty
            write(empty, 1000 / settings.rate)
            i += 1
        return True

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in previous:
            signal.signal(s, lambda signum, frame: self.request_stop())
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise GeneratorError(f"another generator is writing stream {self.plan.stream!r} ({self.root})") from None
            yield

    # ---- state ------------------------------------------------------------------------------

    def _load_state(self) -> dict[str, Any]:
        if not self.state_path.exists():
            return {"version": STATE_VERSION, "stream": self.plan.stream, "format": self.format, "next_seq": 1,
                    "clock_ms": None, "last_ts_ms": None, "last_mtime_ns": 0,
                    "history": [], "recent_ts": [], "prev": None, "runs": []}
        state = json.loads(self.state_path.read_text(encoding="utf-8"))
        if state.get("version") != STATE_VERSION or state.get("format") != self.format:
            raise GeneratorError(f"{self.state_path} was written for another version or format; "
                                 f"remove {self.root} and the landing files to start over")
        return state

    def _save_state(self, state: dict[str, Any]) -> None:
        write_atomically(self.state_path, json.dumps(state) + "\n", fsync=True)

    def _check_landing(self, state: dict[str, Any]) -> None:
        """Refuse to reuse a sequence number that is already in the landing directory."""
        for p in self.landing.iterdir():
            match = PART_NAME.match(p.name)
            if match and int(match.group(1)) >= state["next_seq"]:
                raise GeneratorError(f"{p} is not recorded in {self.state_path}; an earlier run was interrupted "
                                     "or another writer uses this directory. Remove the file or start over.")

    # ---- one file ---------------------------------------------------------------------------

    def _write_file(self, state: dict[str, Any], settings: Settings, rng: random.Random, empty: bool,
                    wall: Callable[[], float], span_ms: float) -> tuple[Path | None, int]:
        """One file of records: written into the landing directory, or produced to the topic as one
        transaction (a file's records become visible together); then its ledger entries."""
        seq = state["next_seq"]
        name = f"part-{seq:06d}.{self.format}"
        if empty:
            entries, records, file_max = [], [], None
        else:
            entries, records, file_max = self.records.make(seq, state, settings, rng, int(wall() * 1000), span_ms)
        if self.topic is not None:
            names = self.topic.publish([r.removesuffix(b"\n") for r in records]) if records else []
            where = None
        else:
            where = self._publish(name, self.records.header() + b"".join(records) if records else b"", state, wall)
            names = [name] * len(entries)
        if entries:
            with self.ledger_path.open("a", encoding="utf-8") as fh:
                for e, n in zip(entries, names, strict=True):
                    fh.write(json.dumps({"file": seq, "name": n, **e}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        # a file without records (0 bytes, or a bare CSV header) is counted as empty
        state["history"].append([seq, file_max, bool(entries)])
        state["next_seq"] = seq + 1
        return where, len(entries)

    def _publish(self, name: str, data: bytes, state: dict[str, Any], wall: Callable[[], float]) -> Path:
        """Write into staging, set the mtime, rename into landing."""
        tmp, dst = self.staging / name, self.landing / name
        if dst.exists():
            raise GeneratorError(f"{dst} exists already; refusing to overwrite a file Spark may have read")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        # millisecond steps: Hadoop's local file system reports modification times in ms
        mtime_ns = max(int(wall() * 1000) * 1_000_000, state["last_mtime_ns"] + 1_000_000)
        os.utime(tmp, ns=(mtime_ns, mtime_ns))  # before the rename: the file appears with its final mtime
        try:
            os.rename(tmp, dst)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno == errno.EXDEV:
                raise GeneratorError(f"cannot rename {tmp} to {dst}: the staging directory and the landing "
                                     "directory are on different file systems, so the move would not be atomic. "
                                     "Put the data root and the landing path on one file system.") from exc
            raise
        os.utime(dst, ns=(mtime_ns, mtime_ns))
        state["last_mtime_ns"] = mtime_ns
        return dst


# ---- library entry point and CLI -----------------------------------------------------------------


def generate(spec_path: str | os.PathLike[str], data_root: str | os.PathLike[str] | None = None,
             settings: Settings | None = None, **kwargs: Any) -> RunResult:
    """Load the spec at ``spec_path``, compile its plan and run the generator once (keyword arguments:
    :meth:`Generator.run`'s clocks)."""
    spec = load_spec(spec_path)
    layout = Layout(spec, data_root if data_root is not None else default_data_root(),
                    spec_dir=Path(spec_path).parent)
    return Generator(compile_plan(spec, layout), layout).run(settings or Settings(), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runner.testdata.generate",
                                description="Write test events for one stream into its landing directory.")
    p.add_argument("--spec", required=True, help="the stream's spec file")
    p.add_argument("--data-root", help="data root (default: STREAMS_DATA_DIR or <project>/data)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--files", type=int, help="batch mode: files with events (default 10)")
    mode.add_argument("--rate", type=float, help="rate mode: files per second")
    p.add_argument("--duration", type=float, help="rate mode: seconds to run (default: until SIGINT/SIGTERM)")
    p.add_argument("--events-per-file", type=int, default=100, help="valid events per file (default 100)")
    for name, default, what in (("late-within", 0.03, "late events Spark must keep"),
                                ("late-beyond", 0.02, "events behind the watermark Spark must drop"),
                                ("late-edge", 0.0, "events so near the watermark that the micro-batches decide"),
                                ("duplicates", 0.02, "exact copies of recent on-time events"),
                                ("malformed", 0.03, "malformed records, as a share of the valid events"),
                                ("unknown-keys", 0.02, "on-time events whose join keys the reference data lacks"),
                                ("future", 0.0, "events beyond event_time.max_future ahead of now, to be quarantined")):
        p.add_argument(f"--{name}", type=float, default=default, help=f"share: {what} (default {default})")
    p.add_argument("--empty-files", type=int, default=1, help="0-byte files per run (default 1)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--start", help=f"batch mode: event time of the first event (default {DEFAULT_START}); "
                                    "a later run continues the clock")
    p.add_argument("--event-interval-ms", type=int, default=1000, help="virtual clock step per event (default 1000)")
    p.add_argument("--clock", choices=["virtual", "wall"],
                   help="event time source (default: virtual in batch mode, wall in rate mode)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.duration is not None and args.rate is None:
        print("--duration needs --rate", file=sys.stderr)
        return 2
    settings = Settings(
        files=10 if args.files is None else args.files, events_per_file=args.events_per_file, rate=args.rate,
        duration=args.duration, late_within=args.late_within, late_beyond=args.late_beyond,
        late_edge=args.late_edge, duplicates=args.duplicates, malformed=args.malformed, unknown_keys=args.unknown_keys,
        future=args.future, empty_files=args.empty_files, seed=args.seed, start=args.start,
        event_interval_ms=args.event_interval_ms, clock=args.clock)
    try:
        result = generate(args.spec, args.data_root, settings)
    except (SpecError, GeneratorError, gt.GroundTruthError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    seqs = result.sequence
    manifest = json.loads(result.manifest.read_text(encoding="utf-8")) if result.manifest else {}
    print(json.dumps({"files": len(seqs), "first_seq": seqs[0] if seqs else None,
                      "last_seq": seqs[-1] if seqs else None, "records": result.records,
                      "stopped": result.stopped, "manifest": str(result.manifest),
                      "counts": manifest.get("counts")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
