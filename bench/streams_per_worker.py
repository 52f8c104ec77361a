"""How many streams one worker holds, against plain Spark on the same machine and input.

    python -m bench.streams_per_worker [--max-streams 8] [--minutes 2] [--rate 0.5] [--events-per-file 40]

A worker of the multi-machine deployment runs the drivers of the streams its supervisor
tasks took. This runs N copies of the ``sensors`` example stream side by side on this
machine, as one worker would (each copy in a data root of its own: its landing folder,
checkpoint, sinks and table), each fed by the generator at the embedded platform's rate
(``--rate`` files per second of ``--events-per-file`` events), for N = 1, 2, ... until the
first copy lags, and reports the largest N at which none did, with each driver's peak
memory (its JVM and its Python processes, by proportional set size: pages the processes
share, such as forked Python workers', count once). Spark runs ``local[2]`` in each
driver: the worker computes too, as on the embedded default (on a cluster the executors'
work goes to the Spark workers, and a worker holds more).

Two kinds, each from N = 1:

* ``platform``: ``spark-submit spark_jobs/stream_job.py`` (the lease, the ingestion, the
  outputs, the progress events: what the supervisor task starts);
* ``standby``: the same, with a warm standby driver beside each (``supervision.standby``;
  its memory is reported apart, ``peak_pss_mb_per_standby``);
* ``plain``: the same outputs hand-written the obvious way, one query per output and one
  for the quarantine, each parsing the files (``bench/throughput_plain.py``'s variant b,
  on the spec's processing-time trigger).

A copy lags when the files waiting for a query that reads the landing folder (landed, not
in its checkpoint's source log) grew by more than one trigger's worth over the second
half of the measured minutes, or end above three triggers' worth. Measuring starts once
every query of every copy has committed a batch. Writes
``bench/results/streams_per_worker.json`` (``--out``). Every process started is ended by its pid; the
working folder (in the temp dir) is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.harness import (
    PLAIN_JOB,
    STREAM_JOB,
    PeakRss,
    Stream,
    child_env,
    clean_up,
    kill_pids,
    kill_tree,
    landing_of,
    pss_bytes,
    submit_command,
    working_folder,
)
from bench.report import RESULTS, machine, write_results
from runner.processes import wait_until
from spark_jobs.runtime.checkpoint import (
    landed_files,
    landing_backlog,
    read_query_checkpoint,
)
from spark_jobs.runtime.session import submit_args
from spark_jobs.stream_spec.layout import project_root
from spark_jobs.stream_spec.models import INGEST_FLOW

SPEC = project_root() / "include" / "streams" / "sensors.yaml"
KINDS = ("plain", "platform")  # and "standby", on request


class Copy:
    """One copy of the stream: its data root, its generator, its driver."""

    def __init__(self, root: Path, kind: str, rate: float, events_per_file: int, logs: Path, n: int):
        self.root, self.kind = root, kind
        root.mkdir(parents=True)
        self.stream = Stream("sensors", SPEC, root, "bc")
        self.plan = self.stream.plan(root)
        self.landing = landing_of(self.plan)
        self.mfpt = self.plan.source.max_files_per_trigger
        env = child_env()
        if kind in ("platform", "standby"):
            args = [*submit_args(), str(STREAM_JOB), "--spec", str(SPEC), "--data-root", str(root)]
            self.checkpoints = [Path(self.plan.checkpoint(INGEST_FLOW))]
        else:
            job = self.stream.plain_job("b", root)
            job["processing_time"] = self.plan.trigger.processing_time
            (root / "job.json").write_text(json.dumps(job))
            args = [str(PLAIN_JOB), "--job", str(root / "job.json")]
            self.checkpoints = [Path(job["checkpoints"]) / o for o in ["quarantine", *[o["name"] for o in job["outputs"]]]]
        cmd = submit_command(args, conf={"spark.ui.enabled": "false"})
        self.driver = subprocess.Popen(cmd, stdout=open(logs / f"{kind}-{n}.log", "w"),
                                       stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            self.feeder = subprocess.Popen(
                [sys.executable, "-m", "runner.testdata.generate", "--spec", str(SPEC), "--data-root", str(root),
                 "--rate", str(rate), "--events-per-file", str(events_per_file), "--seed", str(n)],
                stdout=open(logs / f"generate-{n}.log", "w"), stderr=subprocess.STDOUT, env=env)
        except BaseException:
            kill_tree(self.driver.pid)
            raise
        self.memory = PeakRss(self.driver.pid, every=2.0, measure=pss_bytes)  # a light sampler: the copies need the cores
        self.memory.start()
        self.standby = self.standby_memory = None
        if kind == "standby":
            self.standby = subprocess.Popen([*cmd, "--standby"], stdout=open(logs / f"{kind}-{n}-standby.log", "w"),
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
            self.standby_memory = PeakRss(self.standby.pid, every=2.0, measure=pss_bytes)
            self.standby_memory.start()

    def committed(self) -> bool:
        return all((c / "commits" / "0").exists() for c in self.checkpoints)

    def backlog(self) -> int:
        """Files waiting for the landing-reading query furthest behind."""
        landed = landed_files(self.landing)
        return max(landing_backlog(landed, read_query_checkpoint(str(c)).processed_files)[0] for c in self.checkpoints)

    def stop(self) -> dict[str, float]:
        """End the feeder and the driver (its whole tree: the measurement is over); its peak memory."""
        self.feeder.terminate()
        self.feeder.wait()
        memory = self.memory.stop()
        kill_tree(self.driver.pid)
        self.driver.wait()
        kill_pids(self.memory.seen)
        if self.standby is not None:
            memory["standby_peak_rss_mb"] = self.standby_memory.stop()["peak_rss_mb"]
            kill_tree(self.standby.pid)
            self.standby.wait()
            kill_pids(self.standby_memory.seen)
        return memory


def run(kind: str, n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """N copies of the kind, measured: whether any lagged, their backlogs, their drivers' memory."""
    logs = work / f"{kind}-{n}" / "logs"
    logs.mkdir(parents=True)
    copies: list[Copy] = []
    step: dict[str, Any] = {"kind": kind, "streams": n}
    try:
        for i in range(n):
            copies.append(Copy(work / f"{kind}-{n}" / f"copy-{i}", kind, args.rate, args.events_per_file, logs, i))
        started = time.time()
        if not wait_until(lambda: all(c.committed() for c in copies), timeout=300, every=1):
            step.update(lagging=n, error="not every query committed a batch within 300 s",
                        exit_codes=[c.driver.poll() for c in copies])
        else:
            step["warmup_s"] = round(time.time() - started, 1)
            samples: list[list[int]] = []
            end = time.time() + args.minutes * 60
            while time.time() < end:
                samples.append([c.backlog() for c in copies])
                time.sleep(10)  # the sampling period itself
            samples.append([c.backlog() for c in copies])
            middle = samples[len(samples) // 2]
            step.update(lagging=sum(1 for i, c in enumerate(copies)
                                    if samples[-1][i] - middle[i] > c.mfpt or samples[-1][i] > 3 * c.mfpt),
                        backlog_end=samples[-1], backlog_max=[max(s[i] for s in samples) for i in range(n)],
                        exit_codes=[c.driver.poll() for c in copies])
    finally:
        stopped = [c.stop() for c in copies]
        step["peak_pss_mb_per_driver"] = [round(m["peak_rss_mb"]) for m in stopped]
        if kind == "standby":
            step["peak_pss_mb_per_standby"] = [round(m["standby_peak_rss_mb"]) for m in stopped]
    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-streams", type=int, default=8)
    p.add_argument("--minutes", type=float, default=2.0, help="measured minutes per step")
    p.add_argument("--rate", type=float, default=0.5, help="files per second per copy (./platform up's default)")
    p.add_argument("--events-per-file", type=int, default=40)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--keep", action="store_true", help="keep the working folder (in the temp dir)")
    p.add_argument("--out", default=str(RESULTS / "streams_per_worker.json"), help="where the JSON results go")
    args = p.parse_args(argv)
    work = working_folder("streams-per-worker-")
    steps: list[dict[str, Any]] = []
    held: dict[str, int] = {}
    try:
        for kind in args.kinds.split(","):
            held[kind] = 0
            for n in range(1, args.max_streams + 1):
                step = run(kind, n, args, work)
                steps.append(step)
                print(json.dumps(step), flush=True)
                if step["lagging"]:
                    break
                held[kind] = n
    finally:
        clean_up(work, args.keep)
    result = {"machine": machine(),
              "date": datetime.now().isoformat(timespec="seconds"), "settings": vars(args), "held": held,
              "steps": steps}
    if "plain" in held and "platform" in held and held["plain"]:
        result["platform_over_plain"] = held["platform"] / held["plain"]
    write_results(Path(args.out), result, indent=2)
    print(f"streams one worker holds ({os.cpu_count()} cores, {args.rate} files/s of {args.events_per_file} events "
          f"each): " + ", ".join(f"{k} {v}" for k, v in held.items())
          + (f"; platform/plain {result['platform_over_plain']:.2f}" if "platform_over_plain" in result else ""))
    for step in steps:
        print(f"  {step['kind']:<8} {step['streams']} stream(s): lagging {step['lagging']}, memory per driver "
              f"{step.get('peak_pss_mb_per_driver')} MB"
              + (f" (and per standby {step['peak_pss_mb_per_standby']} MB)" if "peak_pss_mb_per_standby" in step else "")
              + f", files waiting at the end {step.get('backlog_end')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
