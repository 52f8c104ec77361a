"""How soon a burst is caught up: sizing by lag (a rescale through a standby) against a fixed size.

    python -m bench.sizing [--burst N] [--every S] [--events-per-file N] [--variants fixed,sizing] [--keep]

The stream: ``clicks_four_outputs`` (``bench.harness.bench_specs``: a deduplicating ingestion writing
the pass-through output, a sliding window, a complete- and an update-mode table) with a 2-second
trigger, running at 2 files a micro-batch. A file of ``--events-per-file`` clicks lands
every ``--every`` seconds; after a minute of that, ``--burst`` files land at once, and the base
rate goes on. The stream runs under its real supervisor (``StreamSupervisorOperator``, in this
process, submitting its drivers with the stream DAG's spark-submit settings):

* ``sizing``: ``execution.sizing`` (catch up within a minute, reconsidered every 15 s, at most 40
  files a micro-batch): the supervisor rescales through a standby started at the size it sets;
* ``fixed``: sizing bounded to 2 files a micro-batch: recommended, never changed.

Both start at 2 files a micro-batch as sizing set it (``_control/per_trigger.json``), under a spec
whose own limit is 40: Spark drops late records by the watermark of the micro-batch before, so
which records are late depends on how many files a micro-batch takes, and the generator makes its
late records late for every grouping of up to the spec's limit.

Measured from the burst's landing: the seconds until the ingestion took every landed file, and
until every output committed what the ingestion had accepted by then; the sizes set and when.
Afterwards every sink is read back against the generator's ground truth. Output: a table and
``bench/results/sizing.json``. Every process started is ended, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.harness import (
    FOUR,
    MASTER,
    bench_specs,
    child_env,
    clean_up,
    kill_descendants,
    prepare_environment,
    run_generator,
    working_folder,
)
from bench.report import finish
from bench.takeover import Run, check, wait_caught_up
from runner.processes import wait_for
from spark_jobs import submit
from spark_jobs.runtime import rate_limit
from spark_jobs.runtime.checkpoint import file_name, processed_files, sink_files
from spark_jobs.runtime.progress import read_events
from spark_jobs.stream_spec.models import INGEST_FLOW

WARM_UP_SECONDS = 60.0


def supervise(run: Run, spec_dir: Path) -> tuple[Any, threading.Thread]:
    """The stream's supervisor task, as its DAG builds it, running on a thread of this process."""
    from streamops.operators.supervise import StreamSupervisorOperator

    settings = submit.settings(run.spec)
    op = StreamSupervisorOperator(task_id="supervise", stream=run.spec.name, spec_dir=str(spec_dir),
                                  data_root=str(run.root), conn_id=run.spec.spark.connection, conf=settings.conf,
                                  jars=",".join(settings.jars) or None, driver_memory=run.spec.spark.driver_memory,
                                  poll_seconds=1.0, grace_seconds=60)
    thread = threading.Thread(target=op.execute, args=({},), name="supervisor", daemon=True)
    thread.start()
    return op, thread


def taken_all(checkpoint: str, names: set[str]) -> bool:
    return names <= {file_name(p) for p in processed_files(checkpoint)}


def one_variant(variant: str, work: Path, spec_dir: Path, staged: Path, args: argparse.Namespace,
                say: Any) -> dict[str, Any]:
    from streamops.operators.control import StopStreamOperator

    spec_path = spec_dir / f"{FOUR}.yaml"
    data = yaml.safe_load(spec_path.read_text())
    bounds = {"min_per_trigger": 2, "max_per_trigger": 2} if variant == "fixed" else {"max_per_trigger": 40}
    data["execution"] = {"sizing": {"catch_up": "1 minute", "every": "15 seconds", **bounds}}
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    run = Run(work / variant, spec_path, staged, args.every)
    rate_limit.write(run.layout, 2, "files", "bench: the size it starts at")
    run.land(2)
    began = time.time()
    op, thread = supervise(run, spec_dir)
    try:
        wait_for(lambda: run.every_query_committed_after(began), "the first driver's first commits", 300)
        run.start_feeding()
        time.sleep(WARM_UP_SECONDS)
        burst_at = time.time()
        run.land(args.burst)
        landed = {f.name for f in run.landing.iterdir()}
        say(f"{variant}: {args.burst} files landed at once ({len(landed)} landed in all)")
        ingestion = run.plan.checkpoint(INGEST_FLOW)
        wait_for(lambda: taken_all(ingestion, landed), "the ingestion to take the burst", 1200, every=0.5)
        ingested_at = time.time()
        accepted = {file_name(p) for p in sink_files(run.plan.accepted_path)}
        outputs = [c for q, c in run.plan.checkpoints.items() if q != INGEST_FLOW]
        wait_for(lambda: all(taken_all(c, accepted) for c in outputs), "every output to take the burst", 1200,
                 every=0.5)
        caught_up_at = time.time()
        say(f"{variant}: the ingestion took the burst {ingested_at - burst_at:.1f}s after it landed, every output "
            f"{caught_up_at - burst_at:.1f}s after")
        run.land(len(run.pending))
        wait_caught_up(run)
    finally:
        run._halt.set()
        StopStreamOperator(task_id="stop", stream=run.spec.name, spec_dir=str(spec_dir), data_root=str(run.root),
                           grace_seconds=120).execute({})
        thread.join(180)
        if thread.is_alive():
            op.on_kill()
    events = list(read_events(run.layout.events_file))
    sizes = [{"after_burst_s": round(e["logged_at"] - burst_at, 1), "per_trigger": e["per_trigger"],
              "applied": e["applied"], "backlog": e["backlog"]}
             for e in events if e.get("event") == "sizing_decision" and e["logged_at"] >= burst_at]
    rescales = [{"after_burst_s": round(e["logged_at"] - burst_at, 1), "per_trigger": e["per_trigger"],
                 "stop_seconds": e["stop_seconds"]} for e in events if e.get("event") == "rescaled"]
    return {"root": str(run.root), "spec": run.spec, "ingestion_s": round(ingested_at - burst_at, 1),
            "every_output_s": round(caught_up_at - burst_at, 1), "decisions": sizes, "rescales": rescales}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--burst", type=int, default=150, help="files landing at once")
    p.add_argument("--every", type=float, default=4.0, help="seconds between two landing files before and after")
    p.add_argument("--events-per-file", type=int, default=1000)
    p.add_argument("--variants", default="fixed,sizing")
    p.add_argument("--out", default="sizing")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    prepare_environment()
    os.environ.update({k: v for k, v in child_env().items() if k in ("PATH", "PYTHONPATH")})  # spark-submit, the jobs
    os.environ.setdefault("AIRFLOW_CONN_SPARK_STREAMS", json.dumps({"conn_type": "spark", "host": MASTER}))
    work = working_folder("bench-sizing-")
    start = time.time()

    def say(text: str) -> None:
        print(f"[{time.time() - start:6.0f}s] {text}", flush=True)

    results: dict[str, Any] = {}
    try:
        spec_path = bench_specs(work / "include", files_per_trigger=40)[FOUR]
        data = yaml.safe_load(spec_path.read_text())
        data["trigger"] = {"processing_time": "2 seconds"}
        spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
        staged = work / "staged"
        files = 2 + args.burst + int((WARM_UP_SECONDS + 240) / args.every)  # the base rate through a catch-up
        run_generator(spec_path, staged, files, args.events_per_file, seed=11)
        say(f"{files} files of {args.events_per_file} events generated")
        for variant in args.variants.split(","):
            result = one_variant(variant, work, spec_path.parent, staged, args, say)
            checked = check(result)
            say(f"{variant}: sinks {'equal to' if checked['ok'] else 'DIFFERENT from'} the ground truth")
            if not checked["ok"]:
                print(checked["report"])
            results[variant] = {k: v for k, v in result.items() if k not in ("root", "spec")} | {
                "sinks_exact": checked["ok"], "sinks": checked["report"]}
    finally:
        kill_descendants()
        clean_up(work, args.keep, say)
    lines = [f"{'variant':<8} {'ingestion s':>12} {'every output s':>15}  sizes set (s after the burst: files)"]
    for variant, r in results.items():
        sizes = ", ".join(f"{x['after_burst_s']:.0f}: {x['per_trigger']}" for x in r["rescales"]) or "-"
        lines.append(f"{variant:<8} {r['ingestion_s']:>12.1f} {r['every_output_s']:>15.1f}  {sizes}")
    if {"fixed", "sizing"} <= set(results):
        lines.append(f"sizing/fixed, every output caught up: "
                     f"{results['sizing']['every_output_s'] / results['fixed']['every_output_s']:.2f}")
    return finish(lines, args.out, args, results)


if __name__ == "__main__":
    sys.exit(main())
