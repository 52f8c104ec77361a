"""The platform's lifecycle on one machine: a Kafka broker started for the streams that read
topics, Airflow started, every stream deployed through its DAGs and fed by the generator,
watched, then shut down in order (the streams catch up, stop through their stop DAGs, the
quality DAGs validate what they wrote, Airflow stops, the broker stops)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.airflow import AirflowServices
from runner.kafka import KafkaBroker, ensure_topics
from runner.processes import PRIVATE, Every, private_log, wait_until
from runner.summary import summarize, verify_sinks
from spark_jobs.plan import OutputPlan, TableDataset, compile_plan
from spark_jobs.runtime.run_queue import RunQueue
from spark_jobs.stream_spec.layout import Layout, redact
from spark_jobs.stream_spec.models import KafkaSource, StreamSpec
from streamops import SHARED_DRIVER_DAG, dag_id, tenure

#: how often the platform says where it is while it waits (catching up, stopping, validating)
PROGRESS_SECONDS = 15.0
#: where the example specs find their Kafka broker (``bootstrap_servers: ${KAFKA_BOOTSTRAP_SERVERS}``)
KAFKA_ENV = "KAFKA_BOOTSTRAP_SERVERS"
#: partitions of a topic the platform creates for an example stream
TOPIC_PARTITIONS = 3


def _batches(health: Any) -> str:
    committed = [b for b in health.last_committed.values() if b is not None]
    return f"batch {max(committed)} committed" if committed else "no batch committed"


def _where(output: OutputPlan) -> str:
    sink = output.sink
    if isinstance(sink, TableDataset):
        return f"{sink.table} ({redact(sink.url)})"
    return getattr(sink, "path", sink.where)


class Platform:
    """Airflow, the streams' DAGs and the generators, started and stopped in order."""

    def __init__(self, specs: dict[str, StreamSpec], spec_dir: Path, data_root: Path, port: int,
                 rate: float, events_per_file: int, master: str, out: Callable[[str], None] = print):
        self.specs, self.spec_dir, self.data_root = specs, spec_dir, data_root
        self.rate, self.events_per_file = rate, events_per_file
        self.layouts = {name: Layout(spec, data_root, spec_dir) for name, spec in specs.items()}
        #: each stream's plan, compiled once: what the platform reads of a stream besides its control files
        self.plans = {name: compile_plan(spec, self.layouts[name]) for name, spec in specs.items()}
        self.topics = sorted({t for spec in specs.values() if isinstance(spec.source, KafkaSource)
                              for t in spec.source.topics or []})
        # a broker of its own for the streams that read topics, unless the environment names one
        self.broker = KafkaBroker(data_root / "kafka") if self.topics and not os.environ.get(KAFKA_ENV) else None
        self.airflow = AirflowServices(data_root / "airflow", data_root, port=port, spark_master=master,
                                       extra_env={"STREAMS_SPEC_DIR": str(spec_dir)})
        self.generators: dict[str, subprocess.Popen] = {}
        self.quality_runs: dict[str, list[dict[str, Any]]] = {}
        #: every sink against the ground truth (``python -m runner.summary``), checked in a process of its own
        #: once the streams stopped, while the validation runs and Airflow stops; its answer's file
        self._verifying: subprocess.Popen | None = None
        self._verified_file = data_root / "logs" / "verified.json"
        self.started_at = time.time()
        self.deployed = False
        #: whether a stream sends its scheduled runs to the data root's shared driver
        self.shared_driver = any(spec.execution.shared_driver for spec in specs.values())
        self.interrupts = 0
        self.out = out

    # -- start

    def start(self) -> None:
        if self.broker is not None:
            self.out(f"==> Kafka: a broker (KRaft) on {self.broker.bootstrap}, its data in {self.broker.home}")
            self.broker.start()
            os.environ[KAFKA_ENV] = self.broker.bootstrap  # for the generators and this process's health checks
        if self.topics:
            self.airflow.env[KAFKA_ENV] = os.environ[KAFKA_ENV]  # for the drivers, sensors and the Streams page
            created = ensure_topics(os.environ[KAFKA_ENV], self.topics, TOPIC_PARTITIONS)
            self.out(f"==> Kafka topic(s) {', '.join(self.topics)} on {os.environ[KAFKA_ENV]}"
                     + (f" (created: {', '.join(created)})" if created else ""))
        self.out(f"==> Airflow: migrating the metadata database in {self.airflow.home}")
        self.airflow.start()
        self.out(f"==> Airflow: API server, scheduler (LocalExecutor), DAG processor and triggerer on {self.airflow.url}")
        if not wait_until(self.airflow.healthy, 180, interrupted=self.stopping):
            if self.stopping():
                return
            raise RuntimeError(f"the Airflow API server did not come up; see {self.airflow.home}/api-server.log")
        wanted = {dag_id(name, role) for name in self.specs for role in ("", "stop", "quality")}
        if self.shared_driver:
            wanted.add(SHARED_DRIVER_DAG)
        self.out("==> waiting for the DAG processor to parse the streams' DAGs")
        if not wait_until(lambda: wanted <= self.airflow.dag_ids(), 240, every=3, interrupted=self.stopping):
            if self.stopping():
                return
            errors = "\n".join(f"  {e.get('filename')}: {e.get('stack_trace', '')[-300:]}"
                               for e in self.airflow.import_errors())
            raise RuntimeError(f"DAGs not parsed: {sorted(wanted - self.airflow.dag_ids())}\n{errors}")
        if self.shared_driver:  # before the deploys: the streams' first runs find it serving or not, either works
            self.airflow.unpause(SHARED_DRIVER_DAG)
            self.out(f"==> DAG {SHARED_DRIVER_DAG} unpaused: it keeps the shared driver running for the scheduled runs "
                     f"of {', '.join(n for n, s in sorted(self.specs.items()) if s.execution.shared_driver)}")
        deployed_at = time.time()
        for name in sorted(self.specs):
            for dag in (dag_id(name), dag_id(name, "stop"), dag_id(name, "quality")):
                self.airflow.unpause(dag)
            self.airflow.trigger(dag_id(name))
            self.deployed = True
            self.out(f"==> {name}: deployed through DAG stream_{name}; quality DAG stream_{name}_quality unpaused "
                     f"(it validates when units of the stream's sinks close: Airflow assets)")
            self.generators[name] = subprocess.Popen(
                [sys.executable, "-m", "runner.testdata.generate", "--spec", str(self.spec_dir / f"{name}.yaml"),
                 "--data-root", str(self.data_root), "--rate", str(self.rate),
                 "--events-per-file", str(self.events_per_file)],
                stdout=private_log(self.data_root / "logs" / f"generate-{name}.log"),
                stderr=subprocess.STDOUT, start_new_session=True, umask=PRIVATE)
        self.out("==> waiting for the streams' supervisor tasks to start")
        wait_until(lambda: all((t := tenure.current(layout.lease_dir)) is not None and t.started_at >= deployed_at
                               for layout in self.layouts.values()), 120, interrupted=self.stopping)
        self.print_where()

    def print_where(self) -> None:
        self.out("")
        self.out(f"  Airflow UI     {self.airflow.url}  (user admin, password in {self.airflow.passwords_file})")
        self.out(f"  Streams page   {self.airflow.url}/streams/")
        for name, plan in sorted(self.plans.items()):
            sinks = ", ".join(_where(o) for o in plan.outputs)
            source = plan.source
            kafka = source.kafka if source is not None else None
            where = (f"topic {', '.join(kafka.topics or [])} on {os.environ.get(KAFKA_ENV)}"
                     if kafka is not None else f"landing {source.landing if source is not None else None}")
            self.out(f"  {name:<14} {where}; sinks {sinks}")
            self.out(f"  {'':<14} Data Docs {self.data_root / 'quality' / name / 'docs' / 'index.html'}")
        self.out(f"  logs           {self.airflow.home} (Airflow), {self.data_root / 'logs'} (generators)"
                 + (f", {self.broker.log_file} (Kafka)" if self.broker is not None else ""))
        self.out("  Ctrl-C stops everything gracefully\n")

    # -- run

    def stopping(self) -> bool:
        return self.interrupts > 0

    def watch(self, minutes: float | None, every: float = 15.0) -> None:
        from streamops.health import assess

        deadline = None if minutes is None else time.monotonic() + minutes * 60
        while not self.stopping() and (deadline is None or time.monotonic() < deadline):
            dead = self.airflow.dead_services()
            if dead:
                raise RuntimeError(f"Airflow service(s) ended: {dead}; see the logs in {self.airflow.home}")
            line = []
            for name in sorted(self.specs):
                h = assess(self.plans[name], self.layouts[name])
                batches = max((b for b in h.last_committed.values() if b is not None), default=None)
                line.append(f"{name}: {h.status}, batch {batches if batches is not None else '-'}, "
                            f"backlog {h.backlog_text}")
            self.out(f"[{time.strftime('%H:%M:%S')}] " + "; ".join(line))
            wait_until(lambda: False, every if deadline is None else min(every, max(0.0, deadline - time.monotonic())),
                       every=0.5, interrupted=self.stopping)

    # -- stop

    def shutdown(self, graceful: bool = True) -> None:
        """Stop everything; ``graceful``: let the streams take what arrived, stop them through their
        stop DAGs, validate what they wrote, then stop Airflow (always) and the broker. Says where it
        is every 15 s."""
        began = time.monotonic()
        try:
            self._wind_down(graceful)
        finally:  # whatever went wrong above, no service of the platform outlives it
            self.out("==> stopping Airflow")
            self.airflow.stop()
            if self.broker is not None:
                self.out("==> stopping the Kafka broker")
                self.broker.stop()
        self.out(f"==> shut down in {time.monotonic() - began:.0f} s")

    def _wind_down(self, graceful: bool) -> None:
        """:meth:`shutdown` up to stopping Airflow: generators, streams, validation."""
        from streamops.hooks.stream import StreamHook

        for gen in self.generators.values():
            if gen.poll() is None:
                gen.send_signal(signal.SIGTERM)
        for gen in self.generators.values():
            try:
                gen.wait(60)
            except subprocess.TimeoutExpired:
                gen.kill()
        graceful = graceful and self.deployed
        second_interrupt = lambda: self.interrupts > 1  # noqa: E731
        if graceful:
            self.out("==> generators stopped; waiting for the streams to take what arrived")
            self.catch_up(second_interrupt)
        self.out("==> stopping the streams" + (" gracefully (stop DAGs)" if graceful else ""))
        if graceful and not second_interrupt():
            self.run_dags({dag_id(name, "stop"): {"mode": "graceful"} for name in sorted(self.specs)}, 240,
                          second_interrupt)
        for name in sorted(self.specs):
            hook = StreamHook(name, str(self.spec_dir), str(self.data_root))
            if hook.driver_alive():
                hook.kill_driver()
                hook.wait_for_exit(30)
        if self.shared_driver:
            self.out(f"==> stopping the shared driver (DAG {SHARED_DRIVER_DAG} paused, its run ended)")
            self.airflow.stop_dag(SHARED_DRIVER_DAG)
            queue = RunQueue(next(iter(self.layouts.values())).shared_driver_queue)
            wait_until(lambda: queue.serving() is None, 30, every=1)
        if self.deployed:  # the sinks are final: checked against the ground truth while the rest stops
            log = open(self.data_root / "logs" / "summary-spark.log", "ab")  # the process's; closed here once it has it
            self._verifying = subprocess.Popen(
                [sys.executable, "-m", "runner.summary", "--spec-dir", str(self.spec_dir), "--data-root",
                 str(self.data_root), "--out", str(self._verified_file)], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
            log.close()
        if graceful and not second_interrupt():
            # after the streams stopped: the validation has the machine to itself
            self.out("==> validating what the streams wrote (quality DAGs)")
            self.run_dags({dag_id(name, "quality"): {} for name in sorted(self.specs)}, 600, second_interrupt)
        if self.deployed:
            self.quality_runs = self._quality_runs()

    def _quality_runs(self) -> dict[str, list[dict[str, Any]]]:
        """The quality DAGs' runs (before Airflow stops): how validation was started, and how it went."""
        try:
            return {name: self.airflow.runs(dag_id(name, "quality")) for name in self.specs}
        except (OSError, RuntimeError) as exc:
            self.out(f"    could not list the quality DAGs' runs: {exc}")
            return {}

    def catch_up(self, interrupted: Callable[[], bool], timeout: float = 300) -> None:
        """Wait until every stream is idle (all input taken); give up on one that stays down for 60 s."""
        from streamops.health import Status, assess

        pending = set(self.specs)
        down_since: dict[str, float] = {}
        say = Every(PROGRESS_SECONDS)

        def settled() -> bool:
            healths = {name: assess(self.plans[name], self.layouts[name]) for name in sorted(pending)}
            for name, health in healths.items():
                if health.status == Status.IDLE and not self._watermarks_to_catch_up(name):
                    pending.discard(name)
                    self.out(f"    {name}: took everything that arrived ({_batches(health)})")
                elif health.status in (Status.DEAD, Status.CORRUPT, Status.BLOCKED):
                    down_since.setdefault(name, time.monotonic())
                    if time.monotonic() - down_since[name] > 60:
                        pending.discard(name)
                        self.out(f"    {name} is down; not waiting for it: {health.summary()}")
                else:
                    down_since.pop(name, None)
            if pending and say.due():
                self.out(f"    [{time.strftime('%H:%M:%S')}] waiting for the streams to take what arrived: " + "; ".join(
                    f"{name}: {healths[name].status}, {healths[name].backlog_text} waiting, "
                    f"{_batches(healths[name])}" for name in sorted(pending)))
            return not pending

        wait_until(settled, timeout, interrupted=interrupted)
        for name in sorted(pending):
            self.out(f"    {name} has not caught up: {assess(self.plans[name], self.layouts[name]).summary()}")

    def _watermarks_to_catch_up(self, name: str) -> list[str]:
        """The stream's queries that owe a batch only moving their watermark (its windows that the
        input already closed are not emitted yet): stopping now would leave them out of the sinks."""
        from spark_jobs.runtime.checkpoint import watermark_to_catch_up

        return [o.name for o in self.plans[name].outputs_with_flows  # those whose windows the watermark emits
                if o.emits_by_watermark and watermark_to_catch_up(o.checkpoint)]

    def run_dags(self, runs: dict[str, dict[str, Any]], timeout: float,
                 interrupted: Callable[[], bool]) -> dict[str, str]:
        """Trigger a run of each DAG (with its conf), all at once, and wait for every run to
        end; each DAG's final state ("unfinished" after ``timeout`` seconds)."""
        ids = {dag: self.airflow.trigger(dag, conf) for dag, conf in runs.items()}
        states: dict[str, str] = {}
        current: dict[str, str] = {}
        began = time.monotonic()
        say = Every(PROGRESS_SECONDS)

        def ended() -> bool:
            for dag, run_id in ids.items():
                if dag in states:
                    continue
                state = next((r["state"] for r in self.airflow.runs(dag) if r["run_id"] == run_id), "unknown")
                current[dag] = state
                if state in ("success", "failed"):
                    states[dag] = state
                    self.out(f"    {dag}: {state} after {time.monotonic() - began:.0f} s")
            waiting = [dag for dag in runs if dag not in states]
            if waiting and say.due():
                self.out(f"    [{time.strftime('%H:%M:%S')}] waiting for " + ", ".join(
                    f"{dag} ({current.get(dag, 'queued')}, {time.monotonic() - began:.0f} s)" for dag in waiting)
                    + self._doing(waiting))
            return not waiting

        wait_until(ended, timeout, every=1, interrupted=interrupted)
        for dag in runs:
            if dag not in states:
                states[dag] = "unfinished"
                self.out(f"    {dag}: unfinished")
        return states

    def _doing(self, dags: list[str]) -> str:
        """What the streams of the DAGs are doing meanwhile (a driver still finishing a batch)."""
        from streamops.health import assess

        alive = [name for name in sorted(self.specs) if any(d.startswith(dag_id(name)) for d in dags)
                 and assess(self.plans[name], self.layouts[name]).driver_pid is not None]
        return f"; driver still running: {', '.join(alive)}" if alive else ""

    # -- summary

    def summary(self) -> dict[str, Any]:
        """Per stream: the accounting measured by the quality DAG, every sink against the ground truth,
        restarts in this run and the units validated (:func:`runner.summary.summarize`)."""
        verified = None
        if self._verifying is not None and self._verifying.wait() == 0:
            verified = json.loads(self._verified_file.read_text())
        elif self._verifying is not None:  # said; the sinks are checked here
            self.out(f"    the sinks' check while shutting down failed (see {self.data_root / 'logs'}); checking again")
        if verified is None:
            verified = verify_sinks(self.specs, self.spec_dir, self.data_root)
        return summarize(self.plans, self.layouts, self.started_at, self.quality_runs, verified)
