"""An upgrade: a stream's spec changed in ways its checkpoint cannot resume, carried out output by
output, with a savepoint to roll back to.

    python -m spark_jobs.submit upgrade --spec include/streams/<name>.yaml [-- --data-root R]
    python -m spark_jobs.submit upgrade --spec ... -- --step rehearse
    python -m spark_jobs.submit upgrade --spec ... -- --step prepare --online   (then --step rebuild, --step swap)
    python -m spark_jobs.submit upgrade --spec ... -- --rollback
    python -m spark_jobs.submit upgrade --spec ... -- --clean [--keep 1]   (what old upgrades keep, removed)

(the steps one by one are what the DAG ``stream_<name>_upgrade`` runs; docs/changes.md)

Each flow's verdict (``spark_jobs.changes``) says what it takes:

* *compatible*, *new*, *retired*: nothing to rebuild; a start carries them out (a new output over
  every accepted row, a retired one's checkpoint archived), so a running driver that started
  from the spec before is restarted at the end (:func:`restart_needed`; the DAG's graceful
  restart). A change of nothing but these is an upgrade too, of a savepoint and that restart;
* *rebuild*: the output is computed again from the accepted rows, as the new plan's query would
  have written it from the first accepted row: into a *staged* sink beside the live one, under a
  checkpoint of its own (blue/green). Once caught up, the staged output takes the live one's
  place in one step: a Delta table by one transaction (the staged rows overwrite the table; the
  commit records the staged query's last batch, so its next batch follows exactly); a Parquet
  folder by an exchange of the two folders (its ``_spark_metadata`` log first rewritten to name
  the live path; see ``runtime.staging``); a database table by two renames in one
  transaction. The staged checkpoint takes the old one's place the same way. A reader of the
  sink sees the old complete result until then and the new complete result after, never a mix;
* *unknown*: rehearsed first (``spark_jobs.rehearsal``: one micro-batch of the new plan on a
  copy of the checkpoint), which settles it as compatible or rebuild; one it cannot settle is
  refused;
* *reprocess* (the ingestion's): the input read again from its start by the new ingestion into
  staged tables, and every output rebuilt from them, all swapped in together
  (``spark_jobs.reprocess``). The rebuild of a Kafka output is refused (what a topic received
  cannot be taken back).

First a **savepoint** (``_control/upgrades/<n>/savepoint/``): the checkpoints of the outputs to
rebuild and the plan they ran copied, and each one's sink and position recorded. The old sinks
stay (``.<name>.upgrade-<n>`` beside a Parquet folder, ``<table>__before_<n>``, a Delta table's
versions), so ``--rollback`` puts those outputs back as the savepoint had them: checkpoints, sinks
(a Delta table restored to its version in one transaction) and the plan; the other flows go on
from where they are. A rollback pins the spec the stream ran before (:func:`pinned_spec`).
Without ``--online`` the stream's driver must not run meanwhile: the upgrade holds its lease;
online, a driver started after the savepoint holds the outputs to rebuild (:func:`held_outputs`)
and starts them once the swap is done (:class:`Release`). Every step is recorded in the upgrade's
``upgrade.json``; an upgrade killed at any moment, run again, continues from the last step it
finished (or ``--rollback`` undoes it). Exit codes: 0 done, 2 refused (the message says why), 1
failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs import changes, rehearsal, reprocess
from spark_jobs.plan import (
    DeltaDataset,
    KafkaDataset,
    OutputPlan,
    ParquetDataset,
    StreamPlan,
    TableDataset,
    compile_plan,
)
from spark_jobs.runtime.atomic import exchange, write_atomically
from spark_jobs.runtime.checkpoint import previous_plan, query_id, sink_last_batch
from spark_jobs.runtime.clock import iso
from spark_jobs.runtime.driver import log_to_stderr
from spark_jobs.runtime.staging import relocate_sink_log, staged_sink, swap_folder, swapped_in_by
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW, SpecError, Trigger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("upgrade")

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2
#: an upgrade's steps, in order; ``rolled_back`` ends one too
HOLDING, PREPARED, REBUILT, SWAPPED, DONE, ROLLED_BACK = (
    "holding", "prepared", "rebuilt", "swapped", "done", "rolled_back")
#: how long a live upgrade waits for the running driver to hold the outputs to rebuild
HOLD_SECONDS = 300.0


class UpgradeRefused(ValueError):
    """The upgrade cannot be carried out as asked; nothing was changed."""


# ---- where an upgrade keeps things --------------------------------------------------------


def upgrades_dir(layout: Layout) -> Path:
    return layout.lease_dir / "upgrades"


def _numbers(layout: Layout) -> list[int]:
    """The numbers of the stream's upgrades, the newest last."""
    return sorted(int(p.name) for p in upgrades_dir(layout).glob("*") if p.name.isdigit())


def latest(layout: Layout) -> dict[str, Any] | None:
    """The record of the stream's newest upgrade, or None."""
    numbers = _numbers(layout)
    return _read(upgrades_dir(layout) / f"{numbers[-1]:06d}") if numbers else None


def history(layout: Layout) -> list[dict[str, Any]]:
    """The stream's upgrades, the newest first."""
    return [r for n in reversed(_numbers(layout)) if (r := _read(upgrades_dir(layout) / f"{n:06d}")) is not None]


def unfinished(layout: Layout) -> dict[str, Any] | None:
    """The stream's newest upgrade if it has not ended (done or rolled back), else None."""
    record = latest(layout)
    return record if record is not None and record.get("phase") not in (DONE, ROLLED_BACK) else None


def held_outputs(record: dict[str, Any] | None, spec_file: str | os.PathLike[str]) -> list[str] | None:
    """What a driver starting during the unfinished upgrade ``record`` holds back: the outputs it
    rebuilds, if it is an online one (``--online``) to this very spec; None if the driver may not
    start at all (an offline upgrade, or one to another spec); empty without an upgrade."""
    if record is None:
        return []
    if not record.get("online") or record.get("spec") != Path(spec_file).read_text(encoding="utf-8"):
        return None
    return list(record["rebuild"])


def write_running_plan(layout: Layout, plan: StreamPlan, previous: dict[str, Any], held: list[str]) -> None:
    """The plan a starting driver runs, as ``_control/plan.json``: the held outputs' entries stay the
    last start's (their checkpoints still hold the old plan's state) until the upgrade swaps them in."""
    if not held:
        plan.write(layout.plan_file)
        return
    running = json.loads(plan.to_json())
    running["outputs"] = [previous_output(previous, o["name"]) or o if o["name"] in held else o
                          for o in running["outputs"]]
    write_atomically(layout.plan_file, json.dumps(running, indent=1) + "\n")


class Release:
    """A driver's outputs held for an upgrade, started once it is done. Held from the driver's
    start (one started during an online upgrade, :func:`held_outputs`: their queries are planned
    only then, from the driver's own plan, which is the upgraded spec's: a sink checked at
    planning, a table whose key changed, is checked once swapped in), or on request while it runs
    (a live upgrade's ``holding`` record: those outputs' queries are stopped between batches, the
    others go on); a live hold starts them again from the upgraded spec's plan, compiled then.
    Called at each look of the driver's loop with its running queries, which it changes."""

    def __init__(self, layout: Layout, record: dict[str, Any] | None, spark: SparkSession, events: Any,
                 spec_file: str, stop: Callable[[dict[str, Any]], None],
                 replan: Callable[[list[str], StreamPlan | None], list[Any]]):
        """``record``: the unfinished upgrade whose outputs the driver holds from its start, if any;
        ``stop``: stops queries between batches; ``replan``: the queries of the flows named, as the
        driver plans them (its trigger, the size sizing by lag set), of its own plan or of the plan
        given (the upgraded spec's)."""
        self.layout, self.record, self.spark, self.events = layout, record, spark, events
        self.spec_file, self.stop, self.replan = spec_file, stop, replan
        self.live = False  # held on request while running: the driver's plan is the spec before the upgrade
        self._said = False

    @property
    def holding(self) -> bool:
        """Whether flows are held now (a reprocess holds every one: the driver waits, it has not ended)."""
        return self.record is not None

    def __call__(self, running: dict[str, Any]) -> None:
        if self.record is None:
            self._hold_on_request(running)
            return
        phase = (_read(Path(self.record["folder"])) or {}).get("phase")
        live = self.live
        if phase == ROLLED_BACK and live:  # checkpoints and sinks as they were when held: go on as before
            self._start(running, self.replan(self.record["rebuild"], None),
                        "rolled back: outputs %s started as they were")
        elif phase == ROLLED_BACK and not self._said:
            self._said = True
            log.warning("upgrade %d was rolled back: outputs %s stay held; restart the stream to run its plan",
                        self.record["number"], ", ".join(self.record["rebuild"]))
        elif phase == DONE and (planned := self._upgraded_plan() if live else self.replan(self.record["rebuild"], None)
                                ) is not None:
            self._start(running, planned, "done: outputs %s started from their rebuilt results")

    def _start(self, running: dict[str, Any], planned: list[Any], said: str) -> None:
        from spark_jobs.flows import queries

        assert self.record is not None
        started = queries.start_planned(self.spark, planned)
        running.update(started)
        log.info(f"upgrade %d {said}", self.record["number"], ", ".join(started))
        self.events.write({"event": "outputs_released", "stream": self.record["stream"], "outputs": sorted(started),
                           "upgrade": self.record["number"]})
        self.record, self.live = None, False  # a later upgrade may hold them again

    def _hold_on_request(self, running: dict[str, Any]) -> None:
        record = unfinished(self.layout)
        if record is None or record.get("phase") != HOLDING or not record.get("live"):
            return
        held = {name: running.pop(name) for name in record["rebuild"] if name in running}
        self.stop(held)
        log.info("upgrade %d: outputs %s stopped between batches and held while they are rebuilt; the stream's "
                 "other flows go on", record["number"], ", ".join(record["rebuild"]))
        self.events.write({"event": "outputs_held", "stream": record["stream"], "outputs": list(record["rebuild"]),
                           "upgrade": record["number"], "live": True})
        self.record, self.live = record, True  # started from the upgraded spec's plan once it is done

    def _upgraded_plan(self) -> list[Any] | None:
        """The held outputs' queries as the upgraded spec plans them (None, said once, if the spec
        file changed again since: they stay held until the stream restarts). The upgrade's spec
        file, not the driver's: a driver that runs a rollback's pinned spec runs a copy, which the
        upgrade removed."""
        from spark_jobs.analysis import analyze

        assert self.record is not None
        spec_file = self.record.get("spec_file") or self.spec_file
        try:
            text = Path(spec_file).read_text(encoding="utf-8")
        except OSError:
            text = None
        if text != self.record["spec"]:
            if not self._said:
                self._said = True
                log.warning("upgrade %d is done, but %s changed again since: outputs %s stay held; restart the "
                            "stream", self.record["number"], spec_file, ", ".join(self.record["rebuild"]))
            return None
        return self.replan(self.record["rebuild"], analyze(self.spark, load_spec(spec_file), self.layout, spec_file))


def _read(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / "upgrade.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _save(record: dict[str, Any], **changes_: Any) -> dict[str, Any]:
    record.update(changes_, updated_at=time.time())
    write_atomically(Path(record["folder"]) / "upgrade.json", json.dumps(record, indent=1))
    return record


def pin_file(layout: Layout) -> Path:
    """The spec a rollback pinned the stream to: the one it ran before the upgrade it undid."""
    return layout.lease_dir / "pinned" / f"{layout.stream}.yaml"


def pinned_spec(layout: Layout, spec_file: str | os.PathLike[str]) -> Path | None:
    """The spec a driver runs instead of ``spec_file``, if a rollback pinned one and the file still
    says otherwise; a pin the file agrees with again (the edit undone) is removed."""
    pin = pin_file(layout)
    try:
        pinned = pin.read_text(encoding="utf-8")
    except OSError:
        return None
    if pinned == Path(spec_file).read_text(encoding="utf-8"):
        unpin(layout)
        return None
    return pin


def unpin(layout: Layout) -> None:
    pin_file(layout).unlink(missing_ok=True)


def _pin_previous(layout: Layout, record: dict[str, Any]) -> Path | None:
    """Pin the spec the stream last started with before ``record``'s upgrade (its plans' history)."""
    before = [p for p in changes.plans(layout) if (p.get("started_at") or 0) < record["started_at"]]
    if not before:
        return None
    kept = json.loads((layout.plans_dir / f"{before[0]['number']:06d}.json").read_text(encoding="utf-8"))
    if kept.get("spec") is None or kept["spec"] == record["spec"]:
        return None
    return write_atomically(pin_file(layout), kept["spec"])


def staged_table(table: str, number: int) -> str:
    return f"{table}__upgrade_{number:06d}"


def before_table(table: str, number: int) -> str:
    return f"{table}__before_{number:06d}"


def rolled_back_table(table: str, number: int) -> str:
    """Where a rollback of upgrade ``number`` sets aside the table of an output that upgrade added."""
    return f"{table}__rolled_back_{number}"


def rolled_back_dir(record: dict[str, Any]) -> Path:
    """Where a rollback sets aside the checkpoints and folders of the outputs its upgrade added."""
    return Path(record["folder"]) / "rolled_back"


# ---- the steps ----------------------------------------------------------------------------


def check(plan: StreamPlan, previous: dict[str, Any], spec_file: str,
          watermark: str | None) -> tuple[list[changes.Verdict], list[str]]:
    """The verdicts of an upgrade from the plan ``previous`` to ``plan``, and the outputs it would
    rebuild; refused (:class:`UpgradeRefused`, saying why) when a verdict is one an upgrade cannot
    carry out, or when there is nothing to carry out. No Spark: the upgrade DAG checks first."""
    verdicts = changes.judge(plan, previous, spec_file, watermark)
    refused = [v for v in verdicts if v.verdict == changes.UNKNOWN]
    if refused:
        raise UpgradeRefused("an upgrade cannot carry these changes out (an unknown change is settled by its "
                             "rehearsal first, --step rehearse, whose reasons say why it could not); restore them "
                             "in the spec:\n" + changes.report(refused))
    if any(v.verdict == changes.REPROCESS for v in verdicts):  # the input read again: every output rebuilt
        try:
            rebuild = reprocess.flows(plan, spec_file)
        except reprocess.CannotReprocess as exc:
            raise UpgradeRefused(str(exc)) from None
    else:
        rebuild = [v.flow for v in verdicts if v.verdict == changes.REBUILD]
    for name in rebuild:
        if name == INGEST_FLOW:
            continue
        output = plan.output(name)
        if isinstance(output.sink, KafkaDataset):
            raise UpgradeRefused(f"{spec_file}: output {name}: its rebuild would publish every result again to "
                                 f"topic {output.sink.topic}, whose readers already took the old ones: give the "
                                 "output a new name (a new output, over every accepted row) or a new topic")
        if output.written_by_ingestion and INGEST_FLOW not in rebuild:
            raise UpgradeRefused(f"{spec_file}: output {name}: the ingestion writes it, so its change is one of the "
                                 "accepted rows: a reprocess, not a rebuild")
    if all(v.verdict == changes.UNCHANGED for v in verdicts):
        raise UpgradeRefused("nothing to upgrade: the spec file is what the stream runs:\n" + changes.report(verdicts))
    return verdicts, rebuild  # with nothing to rebuild: compatible, new or retired flows, which a start carries out


#: the verdicts a running driver does not take on: its next start carries them out
ON_START = (changes.COMPATIBLE, changes.NEW, changes.RETIRED)


def restart_needed(layout: Layout, record: dict[str, Any] | None) -> str | None:
    """Why the stream's running driver must be restarted for its upgrade ``record`` (done) to take
    full effect, or None: the change has flows that only a start carries out (:data:`ON_START`)
    and the driver that holds the stream started from another spec than the upgrade's (the plan
    its start kept, :func:`changes.plans`). Rebuilt outputs it takes on itself (:class:`Release`);
    a stream with no live driver runs the new plan at its next start."""
    from spark_jobs.runtime.lease import holder_alive

    if record is None or record.get("phase") != DONE or not holder_alive(layout.lease_dir):
        return None
    on_start = [f"{v['flow']} ({v['verdict']})" for v in record["verdicts"] if v["verdict"] in ON_START]
    kept = changes.plans(layout)
    if not on_start or (kept and kept[0]["spec_sha256"] == changes.spec_hash(record["spec"])):
        return None
    since = f"plan {kept[0]['number']}, kept at its start" if kept else "no plan kept"
    return (f"upgrade {record['number']} of {record['stream']}: {', '.join(on_start)} are carried out by a start, "
            f"and the running driver started from an earlier spec ({since})")


def prepare(plan: StreamPlan, layout: Layout, spec_file: str, watermark: str | None,
            online: bool = False, live: bool = False) -> dict[str, Any]:
    """The verdicts (:func:`check`), then the savepoint; the upgrade's record. A pinned spec (a
    rollback's) gives way: this upgrade is to the spec file as it is now.

    ``live``: the stream's driver runs (it holds the lease): the record says ``holding`` first,
    which asks that driver to stop the outputs to rebuild between batches (:class:`Release`); once
    its ``outputs_held`` event says so, their checkpoints are still and the savepoint is taken,
    while its other flows go on committing."""
    previous = previous_plan(layout)
    verdicts, rebuild = check(plan, previous, spec_file, watermark)
    unpin(layout)
    number = max(_numbers(layout), default=0) + 1
    folder = upgrades_dir(layout) / f"{number:06d}"
    savepoint = folder / "savepoint"
    savepoint.mkdir(parents=True)
    record = {"number": number, "folder": str(folder), "stream": plan.stream, "spec_file": spec_file,
              "spec": Path(spec_file).read_text(encoding="utf-8"), "started_at": time.time(),
              "verdicts": [{"flow": v.flow, "verdict": v.verdict, "reasons": v.reasons} for v in verdicts],
              "rebuild": rebuild, "outputs": {}, "checkpoints": {}, "online": online or live, "live": live}
    if live and rebuild:  # (nothing to rebuild: nothing to hold; the driver runs on until its restart)
        _save(record, phase=HOLDING)
        log.info("upgrade %d of %s: asked the running driver to hold outputs %s", number, plan.stream,
                 ", ".join(rebuild))
        _wait_until_held(layout, record)
    try:
        checkpoints = {name: c for name in rebuild if (c := (previous.get("checkpoints") or {}).get(name))
                       and Path(c).exists()}
        for name, checkpoint in checkpoints.items():
            shutil.copytree(checkpoint, savepoint / "checkpoints" / name, symlinks=True)
        if layout.plan_file.exists():
            shutil.copy2(layout.plan_file, savepoint / "plan.json")
        # (an output new to the plan is rebuilt when its sink holds results already: those are its old ones)
        record["outputs"] = {name: _sink_position(plan.output(name), previous_output(previous, name) or {
            "sink": _without_url(asdict(plan.output(name).sink))}, number) for name in reprocess.outputs_of(record)}
        record["new"] = {v.flow: {"checkpoint": plan.output(v.flow).checkpoint,
                                  "sink": _without_url(asdict(plan.output(v.flow).sink))}
                         for v in verdicts if v.verdict == changes.NEW and v.flow != INGEST_FLOW}
        record["checkpoints"] = checkpoints
        if INGEST_FLOW in rebuild:
            record["ingestion"] = reprocess.position(plan, number)
    except BaseException:
        if live:  # nothing live was changed: the running driver starts the held outputs again as they were
            _save(record, phase=ROLLED_BACK, finished_at=time.time())
        raise
    log.info("upgrade %d of %s: savepoint in %s; outputs to rebuild: %s", number, plan.stream, savepoint,
             ", ".join(rebuild) or "none (a start carries the change out)")
    return _save(record, phase=PREPARED)


def _wait_until_held(layout: Layout, record: dict[str, Any], seconds: float = HOLD_SECONDS) -> None:
    """Until the running driver's ``outputs_held`` event for this upgrade; refused (and the record
    ended: nothing was held or copied) if no driver runs or none holds them in time."""
    from spark_jobs.runtime.lease import holder_alive
    from spark_jobs.runtime.progress import read_events

    deadline = time.monotonic() + seconds
    while True:
        if any(e.get("event") == "outputs_held" and e.get("upgrade") == record["number"]
               for e in read_events(layout.events_file) if e.get("logged_at", 0) >= record["started_at"]):
            return
        if not holder_alive(layout.lease_dir) or time.monotonic() > deadline:
            _save(record, phase=ROLLED_BACK, finished_at=time.time())
            raise UpgradeRefused(f"upgrade {record['number']} of {record['stream']}: the stream's driver "
                                 + ("ended" if not holder_alive(layout.lease_dir) else f"did not hold outputs "
                                    f"{record['rebuild']} within {seconds:.0f}s") + " before its savepoint; "
                                 "nothing was changed: run the upgrade again")
        time.sleep(0.5)


def previous_output(previous: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((o for o in previous.get("outputs") or [] if isinstance(o, dict) and o.get("name") == name), None)


def _sink_position(output: OutputPlan, old: dict[str, Any], number: int) -> dict[str, Any]:
    """Where an output's old and new results go, and how far the old sink was: what the swap and a
    rollback need."""
    sink, old_sink = output.sink, old.get("sink") or {}
    found: dict[str, Any] = {"kind": sink.kind, "checkpoint": output.checkpoint, "sink": _without_url(asdict(sink)),
                             "old_checkpoint": old.get("checkpoint"), "old_sink": _without_url(old_sink)}
    if isinstance(sink, ParquetDataset | DeltaDataset):
        found["staged"] = staged_sink(sink.path, number)
        if isinstance(sink, ParquetDataset) and old_sink.get("path"):
            found["old_last_batch"] = sink_last_batch(old_sink["path"])
        if isinstance(sink, DeltaDataset) and old_sink.get("kind") == "delta" and old_sink.get("path"):
            from spark_jobs.sinks import delta_log

            versions = delta_log.versions(old_sink["path"])
            found["old_version"] = versions[-1] if versions else None
    elif isinstance(sink, TableDataset):
        found["staged"] = staged_table(sink.table, number)
    return found


def _without_url(sink: dict[str, Any]) -> dict[str, Any]:
    """A sink as the upgrade's record keeps it: a database's URL (which may hold a password) left out."""
    return {k: v for k, v in sink.items() if k != "url"}


def _table_url(plan: StreamPlan, name: str) -> str:
    """The URL of an output's database, from the spec (and the environment) as they are now."""
    output = next((o for o in plan.outputs if o.name == name), None)
    if output is None or not isinstance(output.sink, TableDataset):
        raise UpgradeRefused(f"output {name} has no table sink in {plan.stream}'s spec to roll back")
    return output.sink.url


def staged_plan(plan: StreamPlan, record: dict[str, Any]) -> StreamPlan:
    """The new plan with each output to rebuild writing to its staged sink under its staged checkpoint."""
    folder = Path(record["folder"])
    outputs = []
    for output in plan.outputs:
        if output.name in record["rebuild"]:
            staged = record["outputs"][output.name]["staged"]
            sink = replace(output.sink, table=staged) if isinstance(output.sink, TableDataset) else (
                replace(output.sink, path=staged) if isinstance(output.sink, ParquetDataset | DeltaDataset)
                else output.sink)
            output = replace(output, checkpoint=str(folder / "staged" / output.name), sink=sink)
        outputs.append(output)
    checkpoints = plan.checkpoints | {o.name: o.checkpoint for o in outputs if o.name in record["rebuild"]}
    staged = replace(plan, outputs=outputs, checkpoints=checkpoints)
    return reprocess.staged(staged, record) if reprocess.reprocessing(record) else staged


def rebuild(spark: SparkSession, plan: StreamPlan, record: dict[str, Any], events: Any = None,
            timeout_seconds: float = 3600) -> None:
    """Compute each output to rebuild over every accepted row committed so far, into its staged sink
    (available-now: Spark resumes the staged checkpoint of a killed try). A reprocess first reads
    the input again into the staged accepted rows, which those outputs then read; its progress
    goes to ``events`` (the stream's event log), as a driver's does."""
    from spark_jobs.flows import queries
    from spark_jobs.runtime.progress import ProgressListener

    if not record["rebuild"]:
        _save(record, phase=REBUILT)
        return
    staged = staged_plan(plan, record)
    if reprocess.reprocessing(record):
        log.info("upgrade %d: the input read again from %d file(s)%s", record["number"], reprocess.replay(record),
                 " and the topics" if plan.source is not None and plan.source.kind == "kafka" else "")
        listener = ProgressListener(events, plan.stream, staged.spark_query_names).add(spark) if events else None
        try:
            _run_available_now(spark, queries.plan_queries(spark, staged, Trigger(available_now=True), outputs=[
                INGEST_FLOW], on_batch=events.write if events else None), record, timeout_seconds)
        finally:
            if listener is not None:
                listener.remove(spark)
        record["ingestion"]["query"] = query_id(reprocess.staged_checkpoint(record))
        _save(record)
    _run_available_now(spark, queries.plan_queries(spark, staged, Trigger(available_now=True),
                                                   outputs=reprocess.outputs_of(record)), record, timeout_seconds)
    for name in reprocess.outputs_of(record):
        record["outputs"][name]["query"] = query_id(staged.output(name).checkpoint)
    _save(record, phase=REBUILT)


def _run_available_now(spark: SparkSession, planned: list[Any], record: dict[str, Any], timeout_seconds: float) -> None:
    from spark_jobs.flows import queries

    started = queries.start_planned(spark, planned)
    try:
        for name, query in started.items():
            query.awaitTermination(timeout_seconds)
            if query.isActive:
                raise RuntimeError(f"{name}: its rebuild did not finish in {timeout_seconds:.0f}s")
            if query.exception() is not None:
                raise RuntimeError(f"{name}: its rebuild failed: {query.exception()}")
            log.info("%s rebuilt into %s", name, (record["outputs"].get(name) or {}).get("staged")
                     or record["ingestion"]["accepted"]["staged"])
    finally:
        for query in started.values():
            query.stop()


def swap(spark: SparkSession, plan: StreamPlan, record: dict[str, Any]) -> None:
    """Each rebuilt output takes its live sink's and checkpoint's place (see the module's doc); a
    step a killed try took already is recognised and not taken again."""
    staged = staged_plan(plan, record)
    number = record["number"]
    if reprocess.reprocessing(record):
        reprocess.swap(record, {name: str(staged.output(name).checkpoint) for name in reprocess.outputs_of(record)})
    for name in reprocess.outputs_of(record):
        output, new = plan.output(name), staged.output(name)
        assert output.checkpoint is not None and new.checkpoint is not None
        new_query = record["outputs"][name].get("query") or (
            query_id(new.checkpoint) if Path(new.checkpoint).exists() else None)  # (a record from before it was kept)
        if new_query is None or (Path(output.checkpoint).exists() and query_id(output.checkpoint) == new_query):
            continue  # swapped by a killed try: the live checkpoint is the staged one
        if isinstance(output.sink, ParquetDataset):
            swap_folder(new.sink.path, output.sink.path, number)
        elif isinstance(output.sink, DeltaDataset):
            _swap_delta(spark, plan.stream, new, output, number)
        elif isinstance(output.sink, TableDataset):
            _swap_table(output.sink, new.sink.table, number)
        if Path(output.checkpoint).exists():
            exchange(new.checkpoint, output.checkpoint)  # the old one stays at the staged place
        else:
            Path(output.checkpoint).parent.mkdir(parents=True, exist_ok=True)
            os.replace(new.checkpoint, output.checkpoint)
        log.info("output %s: the rebuilt result is live (%s)", name, output.sink.kind)
    _save(record, phase=SWAPPED)


def _swap_delta(spark: SparkSession, stream: str, staged: OutputPlan, live: OutputPlan, number: int) -> None:
    """A Delta sink: its rows overwritten by the staged table's in one commit, which records the
    staged query's last batch (so its next batch follows, exactly once)."""
    from spark_jobs.sinks import delta as delta_sink
    from spark_jobs.sinks import delta_log

    assert isinstance(live.sink, DeltaDataset)
    writer_of = delta_sink.DeltaWriter(stream, staged)
    last = delta_log.last_batch(staged.sink.path, None)
    metadata = json.dumps(json.loads(delta_sink.commit_metadata(stream, live.name, writer_of.query_id(),
                                                                -1 if last is None else last))
                          | {"upgrade": number}, sort_keys=True)
    if Path(live.sink.path, "_delta_log").exists() and delta_sink.version_of_commit(spark, live.sink.path, metadata):
        return  # committed by a killed try
    writer = (spark.read.format("delta").load(staged.sink.path).write.format("delta").mode("overwrite")
              .option("overwriteSchema", "true").option("userMetadata", metadata))
    if last is not None:
        writer = writer.option("txnAppId", writer_of.app_id()).option("txnVersion", last)
    if live.sink.partition_by:
        writer = writer.partitionBy(*live.sink.partition_by)
    delta_sink.retry_conflicts(f"the upgrade of {live.name}", lambda: writer.save(live.sink.path))
    shutil.rmtree(staged.sink.path, ignore_errors=True)
    log.info("Delta sink %s overwritten by its rebuilt result in one commit", live.sink.path)


def _swap_table(sink: TableDataset, staged: str, number: int) -> None:
    from spark_jobs.sinks.table import open_database

    open_database(sink.url).swap_tables(sink.table, staged, before_table(sink.table, number))
    log.info("table %s replaced by its rebuilt result in one transaction", sink.table)


def finish(plan: StreamPlan, layout: Layout, record: dict[str, Any]) -> None:
    """Record the plan the checkpoints now hold: the last start's, with each rebuilt output's
    entry the new plan's, so the next start finds them unchanged."""
    previous = previous_plan(layout)
    new = json.loads(plan.to_json())
    if reprocess.reprocessing(record):  # every flow runs the new plan; removed outputs are retired at the next start
        names = {o["name"] for o in new["outputs"]}
        new["outputs"] += [o for o in previous.get("outputs") or [] if isinstance(o, dict) and o.get("name") not in names]
        new["checkpoints"] = (previous.get("checkpoints") or {}) | new["checkpoints"]
        previous = new
    rebuilt = {o["name"]: o for o in new["outputs"] if o["name"] in record["rebuild"]}
    before = [o.get("name") for o in previous.get("outputs") or []]
    previous["outputs"] = [rebuilt.get(o.get("name"), o) for o in previous.get("outputs") or []] + [
        o for name, o in rebuilt.items() if name not in before]  # new outputs rebuilt into sinks that held results
    previous["checkpoints"] = (previous.get("checkpoints") or {}) | {
        n: new["checkpoints"][n] for n in rebuilt if n in new["checkpoints"]}
    write_atomically(layout.plan_file, json.dumps(previous, indent=1) + "\n")
    _save(record, phase=DONE, finished_at=time.time())
    log.info("upgrade %d of %s done: the next start runs the new plan", record["number"], plan.stream)


def rollback(spark: SparkSession, plan: StreamPlan, layout: Layout, record: dict[str, Any]) -> None:
    """``plan``: the spec's as it is now (its database URLs). Put each rebuilt output back as the
    savepoint had it, its checkpoint and its old sink (a Parquet folder or a table exchanged back, a
    Delta table restored to its recorded version in one commit), and the plan, and each retired
    output's checkpoint a start archived since (:func:`_restore_retired`); each added output is set
    aside (:func:`_set_aside_new`); the staged results go. The other flows' checkpoints and sinks
    stay as they are."""
    folder, number = Path(record["folder"]), record["number"]
    if record.get("phase") == HOLDING:  # nothing copied nor changed yet
        _save(record, phase=ROLLED_BACK, finished_at=time.time())
        return
    if reprocess.reprocessing(record) and record.get("ingestion"):
        reprocess.roll_back(record)
    for name in record["rebuild"]:
        if name == INGEST_FLOW:  # its tables are back; its checkpoint follows, as an output's
            _put_back_checkpoint(record, name, record["ingestion"]["checkpoint"])
            continue
        place = record["outputs"][name]
        live, staged, old_sink = place.get("sink") or {}, place.get("staged"), place.get("old_sink") or {}
        moved = {k: live.get(k) for k in ("kind", "path", "table")} != {k: old_sink.get(k) for k in
                                                                        ("kind", "path", "table")}
        if place["kind"] == "parquet":
            if swapped_in_by(live["path"]) == number:
                if moved or not Path(staged).exists():
                    shutil.rmtree(live["path"])  # a new place: nothing was there before
                else:
                    exchange(staged, live["path"])  # the old folder back
            shutil.rmtree(staged, ignore_errors=True)
        elif place["kind"] == "delta":
            if not moved and place.get("old_version") is not None:
                from delta.tables import DeltaTable

                DeltaTable.forPath(spark, live["path"]).restoreToVersion(place["old_version"])
            else:  # no table was there before
                shutil.rmtree(live["path"], ignore_errors=True)
            shutil.rmtree(staged, ignore_errors=True)
        elif place["kind"] == "table":
            from spark_jobs.sinks.table import open_database

            open_database(_table_url(plan, name)).restore_table(live["table"], before_table(live["table"], number),
                                                                  staged)
        # its checkpoint as the savepoint has it; the other flows' go on from where they are (their
        # sinks hold their batches since: a checkpoint put back would plan those batches anew)
        _put_back_checkpoint(record, name, place["checkpoint"])
    shutil.rmtree(folder / "staged", ignore_errors=True)
    _restore_retired(layout, record)
    _set_aside_new(plan, record)
    if (folder / "savepoint" / "plan.json").exists():
        shutil.copy2(folder / "savepoint" / "plan.json", layout.plan_file)
    pinned = _pin_previous(layout, record)
    _save(record, phase=ROLLED_BACK, finished_at=time.time(), pinned=str(pinned) if pinned else None)
    log.info("upgrade %d of %s rolled back to its savepoint%s", number, record["stream"],
             f"; its drivers run the spec it ran before ({pinned}) until the spec file changes again" if pinned else "")


def _restore_retired(layout: Layout, record: dict[str, Any]) -> None:
    """Put back the checkpoint of each output the upgrade retired that a start after it archived
    (``changes.retire``): the spec the rollback pins runs that output again, from where it was
    (started over, it would write its sink's batches anew)."""
    saved = Path(record["folder"]) / "savepoint" / "plan.json"
    before = json.loads(saved.read_text(encoding="utf-8")) if saved.exists() else {}
    places = {o.get("name"): o.get("checkpoint") for o in before.get("outputs") or [] if isinstance(o, dict)}
    for v in record["verdicts"]:
        checkpoint = places.get(v["flow"]) if v["verdict"] == changes.RETIRED else None
        if not checkpoint or Path(checkpoint).exists():
            continue
        archived = changes.archived_since(layout, v["flow"], record["started_at"])  # by a start since it began
        if archived is not None:
            os.replace(archived, checkpoint)
            log.info("output %s: its checkpoint, archived when it was retired, is back in %s", v["flow"], checkpoint)


def _set_aside_new(plan: StreamPlan, record: dict[str, Any]) -> None:
    """Move each output the upgrade added out of the way (``<upgrade>/rolled_back/<name>/``: its
    checkpoint and its Parquet folder or Delta table; a table renamed ``<table>__rolled_back_<n>``):
    the plan rolled back to has no such output, and an upgrade that adds it again must find its sink
    as it was before this one (a Kafka topic keeps what it received)."""
    aside = rolled_back_dir(record)
    for name, place in (record.get("new") or {}).items():
        sink = place["sink"]
        moves = [(place.get("checkpoint"), aside / name / "checkpoint")]
        if sink.get("kind") in ("parquet", "delta"):
            moves.append((sink["path"], aside / name / "sink"))
        for source, target in moves:
            if source and Path(source).exists() and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                if sink.get("kind") == "parquet" and source == sink["path"]:
                    relocate_sink_log(source, source, str(target))  # its log names its files where they go
                shutil.move(source, target)
                log.info("output %s, added by upgrade %d, set aside: %s is now %s", name, record["number"], source,
                         target)
        if sink.get("kind") == "table" and any(o.name == name for o in plan.outputs):
            from spark_jobs.sinks.table import open_database

            aside_table = rolled_back_table(sink["table"], record["number"])
            if open_database(_table_url(plan, name)).rename_table(sink["table"], aside_table):
                log.info("output %s, added by upgrade %d, set aside: table %s is now %s", name, record["number"],
                         sink["table"], aside_table)


def _put_back_checkpoint(record: dict[str, Any], name: str, checkpoint: str) -> None:
    kept = Path(record["folder"]) / "savepoint" / "checkpoints" / name
    if Path(checkpoint).exists():
        shutil.rmtree(checkpoint)
    if kept.exists() and checkpoint == record["checkpoints"].get(name):
        shutil.copytree(kept, checkpoint, symlinks=True)


def clean(plan: StreamPlan, layout: Layout, keep: int = 1) -> list[str]:
    """Remove what ended upgrades keep for a rollback, all but the newest ``keep`` upgrades': the
    old Parquet folders (at their staged places), the old tables (``<table>__before_<n>``), the
    old and the savepoint's checkpoints, and what a rollback set aside (``rolled_back/``, the tables
    ``<table>__rolled_back_<n>``). A cleaned upgrade can no longer be rolled back (its record
    says ``cleaned_at``). A Delta table's old versions are Delta's to vacuum. ``plan``: the spec's
    as it is now (its database URLs). What was removed, in words."""
    removed = []
    ended = [r for r in history(layout) if r.get("phase") in (DONE, ROLLED_BACK)]
    newest = {r["number"] for r in history(layout)[:keep]}
    for record in ended:
        if record["number"] in newest or record.get("cleaned_at"):
            continue
        folder, number = Path(record["folder"]), record["number"]
        if record.get("phase") == DONE and reprocess.reprocessing(record) and record.get("ingestion"):
            removed += reprocess.clean(record)
        for name in reprocess.outputs_of(record) if record.get("phase") == DONE else []:
            place = record["outputs"][name]
            live = place.get("sink") or {}
            if place["kind"] == "parquet" and place.get("staged") and Path(place["staged"]).exists():
                shutil.rmtree(place["staged"])
                removed.append(f"upgrade {number}: {name}'s old folder {place['staged']}")
            elif place["kind"] == "table" and live.get("table") and any(o.name == name for o in plan.outputs):
                from spark_jobs.sinks.table import open_database

                before = before_table(live["table"], number)
                if open_database(_table_url(plan, name)).drop_table(before):
                    removed.append(f"upgrade {number}: {name}'s old table {before}")
        for name, place in (record.get("new") or {}).items() if record.get("phase") == ROLLED_BACK else []:
            aside = rolled_back_table(place["sink"].get("table"), number)
            if place["sink"].get("kind") == "table" and any(o.name == name for o in plan.outputs):
                from spark_jobs.sinks.table import open_database

                if open_database(_table_url(plan, name)).drop_table(aside):
                    removed.append(f"upgrade {number}: {name}'s table set aside by its rollback, {aside}")
        for kept in (folder / "staged", folder / "savepoint" / "checkpoints", rolled_back_dir(record)):
            if kept.exists():
                shutil.rmtree(kept)
                removed.append(f"upgrade {number}: {kept}")
        _save(record, cleaned_at=time.time())
    return removed


# ---- the whole upgrade, by hand or from its DAG -------------------------------------------


#: the steps one can run on their own (``--step``); ``all`` runs them in order, holding the lease
STEPS = ("all", "rehearse", "prepare", "rebuild", "swap")


def run(spark: SparkSession, spec_file: str, data_root: str | None, *, step: str = "all", online: bool = False,
        roll_back: bool = False, number: int | None = None) -> dict[str, Any]:
    """Carry out (or continue) the stream's upgrade to the spec in ``spec_file``, or roll the newest
    back; the upgrade's record.

    ``step``: ``all`` (the default) rehearses unknown changes, prepares, rebuilds, swaps and records
    the plan, holding the stream's lease from the preparation on (no driver runs meanwhile);
    ``rehearse`` only settles unknown verdicts (``spark_jobs.rehearsal``: on a copy of the
    checkpoint, beside a running driver); ``prepare`` only takes the savepoint
    (``online``: a driver started afterwards runs every flow but the outputs to rebuild, which it
    starts once the upgrade is done); ``rebuild`` and ``swap`` (which records the plan too) go on
    with a prepared upgrade, beside the running driver if it is online. One step at a time
    (:func:`one_step`)."""
    from spark_jobs.analysis import analyze
    from spark_jobs.runtime.lease import DriverLease, LeaseHeld

    spec = load_spec(spec_file)
    layout = Layout(spec, data_root, spec_dir=Path(spec_file).resolve().parent)
    with one_step(layout, spec.name):
        text = Path(spec_file).read_text(encoding="utf-8")
        lease = DriverLease(layout.lease_dir, stream=spec.name)  # no driver of the stream runs meanwhile
        record = unfinished(layout)
        if roll_back:
            newest = latest(layout)
            if newest is None or newest.get("phase") == ROLLED_BACK:
                raise UpgradeRefused(f"stream {spec.name} has no upgrade to roll back")
            if newest.get("cleaned_at"):
                raise UpgradeRefused(f"upgrade {newest['number']} of {spec.name} was cleaned up (--clean): what a "
                                     "rollback needs is gone")
            if number is not None and newest["number"] != number:
                raise UpgradeRefused(f"upgrade {number} of {spec.name} is not its newest ({newest['number']}): only the "
                                     "newest is rolled back")
            with lease:
                rollback(spark, compile_plan(spec, layout), layout, newest)
            return newest
        plan = None  # analyzed once, for the rehearsal and the steps after it
        if step == "rehearse" or (step == "all" and record is None):  # unknown verdicts settled on a copy
            plan = analyze(spark, spec, layout, spec_file)
            previous = previous_plan(layout)
            verdicts = rehearsal.rehearse(spark, plan, previous, changes.judge(
                plan, previous, spec_file, spec.event_time.watermark if spec.event_time else None), spec_file)
            if step == "rehearse":
                return {"number": None, "phase": "rehearsed", "verdicts": [
                    {"flow": v.flow, "verdict": v.verdict, "reasons": v.reasons} for v in verdicts]}
        if record is not None and record.get("spec") != text:
            raise UpgradeRefused(f"upgrade {record['number']} of {spec.name} to another spec is unfinished "
                                 f"({record['phase']}, {record['folder']}): roll it back first (--rollback)")
        if step in ("all", "prepare"):
            watermark = spec.event_time.watermark if spec.event_time else None
            plan = plan or analyze(spark, spec, layout, spec_file)
            try:
                with lease:
                    if record is None:
                        record = prepare(plan, layout, spec_file, watermark, online=online and step == "prepare")
                    if step == "all":
                        _carry_out(spark, plan, layout, record, through=SWAPPED)
            except LeaseHeld:
                if not (online and step == "prepare" and record is None):
                    raise
                # the stream runs: its driver holds the outputs to rebuild, its other flows go on
                record = prepare(plan, layout, spec_file, watermark, online=True, live=True)
            return record
        if record is None:
            raise UpgradeRefused(f"stream {spec.name} has no unfinished upgrade to this spec: prepare one first "
                                 "(--step prepare)")
        if step == "swap" and record["phase"] == PREPARED:
            raise UpgradeRefused(f"upgrade {record['number']} of {spec.name} has not rebuilt its outputs yet "
                                 "(--step rebuild)")
        with (contextlib.nullcontext() if record.get("online") else lease):
            plan = analyze(spark, spec, layout, spec_file)
            _carry_out(spark, plan, layout, record, through=REBUILT if step == "rebuild" else SWAPPED)
        return record


#: How long a step of a stream's upgrade waits for another one to end before it is refused.
STEP_WAIT_SECONDS = 120.0
#: The environment variable in which the Airflow task that submits a step names itself
#: (``<host>:<pid>:<start>``, :func:`watch_task`).
TASK_ENV = "STREAMS_UPGRADE_TASK"


@contextlib.contextmanager
def one_step(layout: Layout, stream: str, wait_seconds: float = STEP_WAIT_SECONDS) -> Any:
    """Run one step of the stream's upgrades at a time, on whichever worker: a lease of its own,
    which holds across hosts as the stream's does (``_control/upgrades/lease/``). A step whose
    Airflow task was SIGKILLed goes on in its ``spark-submit`` until it sees that the task is gone
    (:func:`watch_task`); the rollback that the upgrade DAG runs next waits for it to end instead of
    undoing the upgrade beside it. Refused (:class:`UpgradeRefused`, naming the other step's
    process) if it has not ended within ``wait_seconds``."""
    from spark_jobs.runtime.lease import DriverLease, LeaseHeld
    from spark_jobs.runtime.lease import latest as lease_holder

    claim = DriverLease(upgrades_dir(layout), stream=stream, fences=False)
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            claim.acquire()
            break
        except LeaseHeld:
            if time.monotonic() >= deadline:
                holder = lease_holder(claim.dir)
                raise UpgradeRefused(f"another step of stream {stream}'s upgrade still runs "
                                     f"({holder.describe() if holder else 'its process'}); it has not ended within "
                                     f"{wait_seconds:.0f}s: refusing to run beside it") from None
            time.sleep(1)  # the other step's end (its process gone, on another host its heartbeat lapsed)
    try:
        yield
    finally:
        claim.release()


def watch_task(every: float = 1.0) -> None:
    """Halt this step once the Airflow task that submitted it is gone (:data:`TASK_ENV`, on this
    host): a task killed by SIGKILL leaves its ``spark-submit`` running, and the upgrade DAG goes on
    to its rollback, which :func:`one_step` makes wait for this step's end."""
    import threading

    from spark_jobs.runtime.lease import halt, host_id, process_start

    try:
        host, pid, start = os.environ[TASK_ENV].rsplit(":", 2)
        task, started = int(pid), int(start)
    except (KeyError, ValueError):
        return  # not submitted by a task
    if host != host_id():
        return  # the step's driver runs on another machine than its task (a cluster's deploy mode)

    def watch() -> None:
        while process_start(task) == started:
            time.sleep(every)
        halt(f"the Airflow task (pid {task}) that submitted this upgrade step is gone")

    threading.Thread(target=watch, name="task-watch", daemon=True).start()


def task_env() -> dict[str, str]:
    """What a task that submits a step sets in its environment (:data:`TASK_ENV`)."""
    from spark_jobs.runtime.lease import host_id, process_start

    return {TASK_ENV: f"{host_id()}:{os.getpid()}:{process_start(os.getpid())}"}


def _carry_out(spark: SparkSession | None, plan: StreamPlan, layout: Layout, record: dict[str, Any],
               through: str) -> None:
    """The steps of a prepared upgrade not taken yet, up to the one that ends in ``through``
    (``spark`` None: an upgrade with nothing to rebuild, whose steps need no session)."""
    if record["phase"] == PREPARED:
        rebuild(spark, plan, record, events=_events(layout) if reprocess.reprocessing(record) else None)
    if through == REBUILT:
        return
    if record["phase"] == REBUILT:
        swap(spark, plan, record)
    if record["phase"] == SWAPPED:
        finish(plan, layout, record)


def step_without_spark(plan: StreamPlan, layout: Layout, spec_file: str, step: str) -> dict[str, Any] | None:
    """The ``rebuild`` or ``swap`` step of an upgrade to ``spec_file`` that rebuilds nothing (its
    flows are compatible, new or retired), taken here: no Spark job is needed; its record. None
    when the step needs the job (which also refuses what it must, saying why)."""
    from spark_jobs.runtime.lease import DriverLease, LeaseHeld

    record = unfinished(layout)
    if (step not in ("rebuild", "swap") or record is None or record["rebuild"]
            or record.get("spec") != Path(spec_file).read_text(encoding="utf-8")):
        return None
    lease = DriverLease(layout.lease_dir, stream=plan.stream)  # an offline upgrade's: no driver runs meanwhile
    with one_step(layout, plan.stream):
        record = unfinished(layout)
        if record is None:  # finished by a step before this one
            return latest(layout)
        try:
            with contextlib.nullcontext() if record.get("online") else lease:
                # with nothing to rebuild, neither the rebuild nor the swap uses the session
                _carry_out(None, plan, layout, record, through=REBUILT if step == "rebuild" else SWAPPED)
        except LeaseHeld as exc:
            raise UpgradeRefused(f"the stream's driver runs ({exc}): stop it first; an upgrade never runs beside "
                                 "it") from None
    return record


def _events(layout: Layout) -> Any:
    """The stream's event log, as its driver writes it (a reprocess's ingestion reports there)."""
    from spark_jobs.runtime.history import History
    from spark_jobs.runtime.progress import EventLog

    return EventLog(layout.events_file, history=History(layout.history_file))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True, help="the stream's spec file (YAML), as changed")
    p.add_argument("--data-root", default=None, help="root of relative data paths (default: $STREAMS_DATA_DIR or ./data)")
    p.add_argument("--rollback", action="store_true", help="roll the newest upgrade back to its savepoint")
    p.add_argument("--number", type=int, default=None, help="with --rollback: only if it is this upgrade")
    p.add_argument("--clean", action="store_true",
                   help="remove the old sinks and checkpoints ended upgrades keep for a rollback (see --keep)")
    p.add_argument("--keep", type=int, default=1, help="with --clean: the newest upgrades left as they are")
    p.add_argument("--step", choices=STEPS, default="all", help="one step only (see spark_jobs.upgrade.run)")
    p.add_argument("--online", action="store_true",
                   help="with --step prepare: the stream runs during the rebuild, its outputs to rebuild held")
    args = p.parse_args(argv)
    log_to_stderr()
    from spark_jobs.runtime.lease import LeaseHeld
    from spark_jobs.runtime.session import build_session

    if args.clean:  # files and database tables: no Spark
        try:
            spec = load_spec(args.spec)
            layout = Layout(spec, args.data_root, spec_dir=Path(args.spec).resolve().parent)
            removed = clean(compile_plan(spec, layout), layout, keep=max(args.keep, 0))
        except (UpgradeRefused, SpecError) as exc:
            log.error("%s", exc)
            return EXIT_REFUSED
        log.info("cleaned up %d item(s)%s", len(removed), "".join(f"\n  {r}" for r in removed))
        return EXIT_OK
    watch_task()
    spark = None
    try:
        spark = build_session("upgrade")
        record = run(spark, args.spec, args.data_root, step=args.step, online=args.online, roll_back=args.rollback,
                     number=args.number)
    except (UpgradeRefused, SpecError) as exc:
        log.error("%s", exc)
        return EXIT_REFUSED
    except LeaseHeld as exc:
        log.error("the stream's driver runs (%s): stop it first; an upgrade never runs beside it", exc)
        return EXIT_REFUSED
    except Exception:
        log.exception("the upgrade failed; its record (_control/upgrades/) says the last step it finished. The "
                      "live sinks change only in its swap: run it again to go on, or roll it back (--rollback)")
        return EXIT_FAILED
    finally:
        if spark is not None:
            spark.stop()
    if record["number"] is None:  # a rehearsal
        log.info("rehearsed at %s:\n%s", iso(time.time()), "\n".join(
            f"{v['flow']}: {v['verdict']}: {'; '.join(v['reasons'])}" for v in record["verdicts"]))
    else:
        log.info("upgrade %d: %s at %s", record["number"], record["phase"], iso(time.time()))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
