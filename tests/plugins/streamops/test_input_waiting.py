"""The watcher of a scheduled stream's input, over a real stream's checkpoint: it asks for a run
when input waits, once until a run has begun since (or the freshness passed), never while a run
is under way or the stream is stopped on purpose, and remembers across triggerer restarts that
it asked."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import yaml
from watched import first_event, scheduled_specs

from spark_jobs.runtime.lease import DriverLease
from streamops.hooks.stream import StreamHook
from streamops.triggers.input_waiting import SIGNAL_FILE, InputWaitingTrigger, run_began, run_ended


def land(data_root: Path, name: str) -> None:
    (data_root / "landing" / "sensors" / name).write_text(json.dumps({"event_id": name}) + "\n")


def test_waiting_input_asks_for_one_run_until_a_run_began(data_root: Path, tmp_path: Path) -> None:
    specs = scheduled_specs(tmp_path)
    trigger = InputWaitingTrigger("sensors", spec_dir=str(specs), data_root=str(data_root))
    hook = StreamHook("sensors", str(specs), str(data_root))
    assert trigger.check() is None  # the run took everything: nothing waits
    land(data_root, "part-90001.json")
    asked = trigger.check()
    assert asked is not None and asked["waiting"] == "1 file(s)" and asked["stream"] == "sensors", asked
    assert json.loads((hook.layout.lease_dir / SIGNAL_FILE).read_text())["at"] == asked["signalled_at"]
    land(data_root, "part-90002.json")
    again = InputWaitingTrigger("sensors", spec_dir=str(specs), data_root=str(data_root))  # a restarted triggerer
    assert again.check() is None  # asked already, and no run has begun since
    signal_file = hook.layout.lease_dir / SIGNAL_FILE
    signal_file.write_text(json.dumps({"at": time.time() - 301}))  # the freshness passed without a run: again
    assert again.check() is not None
    # a run begins: nothing to ask for while it runs, a driver or not (one restarted after a crash);
    # once it ended, input that came meanwhile asks again
    run_began(hook.layout.lease_dir)
    assert trigger.check() is None
    lease = DriverLease(hook.layout.lease_dir, stream="sensors").acquire()
    try:
        assert trigger.check() is None
    finally:
        lease.release()
    assert trigger.check() is None  # its driver died: the run restarts it
    signal_file.write_text(json.dumps({"at": time.time() - 400}))  # asked for; the run it began never ended:
    run_began(hook.layout.lease_dir, now=time.time() - 350)  # older than the freshness, it is taken for lost
    assert trigger.check() is not None
    run_began(hook.layout.lease_dir)
    run_ended(hook.layout.lease_dir)
    assert trigger.check() is not None


def test_a_stream_stopped_on_purpose_or_no_longer_on_input_asks_for_nothing(data_root: Path, tmp_path: Path) -> None:
    specs = scheduled_specs(tmp_path)
    land(data_root, "part-90001.json")
    hook = StreamHook("sensors", str(specs), str(data_root))
    hook.hold("stream_sensors_stop run manual__1 (graceful)")
    trigger = InputWaitingTrigger("sensors", spec_dir=str(specs), data_root=str(data_root))
    assert trigger.check() is None
    hook.release_hold()
    scheduled_specs(tmp_path / "again", schedule="@hourly", on_input=False)
    shutil.copy(tmp_path / "again" / "include" / "streams" / "sensors.yaml", specs / "sensors.yaml")
    assert trigger.check() is None  # the spec changed: its clock alone runs it now
    scheduled_specs(tmp_path / "third")
    shutil.copy(tmp_path / "third" / "include" / "streams" / "sensors.yaml", specs / "sensors.yaml")
    assert trigger.check() is not None


def test_the_watcher_runs_in_the_triggerers_loop_and_serializes(data_root: Path, tmp_path: Path) -> None:
    specs = scheduled_specs(tmp_path)
    trigger = InputWaitingTrigger("sensors", poll_seconds=0.1, spec_dir=str(specs), data_root=str(data_root))
    classpath, kwargs = trigger.serialize()
    assert classpath == "streamops.triggers.input_waiting.InputWaitingTrigger"
    assert InputWaitingTrigger(**kwargs).poll_seconds == 0.1

    land(data_root, "part-90001.json")
    event = first_event(trigger)
    assert event.payload["waiting"] == "1 file(s)"


def test_records_arriving_on_a_scheduled_streams_topic_ask_for_a_run(spark, tmp_path: Path, kafka_broker,
                                                                    kafka_topic: str) -> None:
    """A scheduled stream fed by a Kafka topic: records behind on the broker (the checkpoint's
    offsets against the topic's end) ask for a run; once a run read them, nothing waits."""
    from spark_jobs import analysis
    from spark_jobs.flows import queries as flows
    from spark_jobs.stream_spec.layout import Layout
    from spark_jobs.stream_spec.loading import load_spec

    specs = tmp_path / "include" / "streams"
    specs.mkdir(parents=True)
    (specs / "k.yaml").write_text(yaml.safe_dump({
        "name": "k", "source": {"type": "kafka", "bootstrap_servers": kafka_broker.bootstrap, "topics": [kafka_topic],
                                "format": "json", "columns": [{"name": "id", "type": "string", "required": True}]},
        "quarantine": {"path": "quarantine/k"},
        "outputs": [{"name": "rows", "query": {"type": "passthrough"}, "mode": "append",
                     "sink": {"type": "parquet", "path": "sinks/k"}}],
        "checkpoint": "checkpoints/k",
        "execution": {"mode": "scheduled", "on_input": True, "freshness": "5 minutes"}}))
    data_root = tmp_path / "data"
    spec = load_spec(specs / "k.yaml")
    layout = Layout(spec, data_root, specs)
    kafka_broker.produce(kafka_topic, ['{"id": "a"}', '{"id": "b"}'], partition=0)
    flows.run_available_now(spark, analysis.analyze(spark, spec, layout))  # a run took them
    trigger = InputWaitingTrigger("k", spec_dir=str(specs), data_root=str(data_root))
    assert trigger.check() is None  # nothing behind
    kafka_broker.produce(kafka_topic, [f'{{"id": "n{i}"}}' for i in range(5)], partition=1)
    asked = trigger.check()
    assert asked is not None and asked["waiting"] == "5 record(s)", asked
    run_began(layout.lease_dir)
    flows.run_available_now(spark, analysis.analyze(spark, spec, layout))
    run_ended(layout.lease_dir)
    assert trigger.check() is None
