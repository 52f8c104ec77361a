"""What a scheduled run costs in a shared driver, and how many quiet streams one shared driver serves.

    python -m bench.shared_driver [--parts runs,capacity] [--pairs 5] [--files 4]
                                  [--streams 30] [--minutes 12] [--every 240] [--rate 0.0167]

``runs``: one copy of the ``sensors`` example stream; per pair, ``--files`` new files land, then
one available-now run takes them in a JVM of its own (submitted as the supervisor of a
``scheduled`` stream submits it: ``spark_jobs.submit``, the JIT's first tier only), and after more
files a run in a shared driver (``spark_jobs/shared_driver.py``, asked through its queue), in
alternating order. Before the pairs, the shared driver takes ``--warm-up`` runs (reported apart:
its own JVM's first compiling). Per run: wall time and CPU seconds (the own run's whole process,
by the ``RUSAGE_CHILDREN`` of this process around it; the shared run's, by the driver's
process tree around it, as it reports in its result).

``capacity``: ``--streams`` copies of the stream, a data root each, each fed by the generator at
``--rate`` files a second (default one a minute) for ``--minutes``, and each asked for a run every
``--every`` seconds when files wait (copies staggered over the interval), all taken by one shared
driver; after the feeding, the schedule goes on until every landed file was read. Per stream-hour: the driver's CPU seconds (exact: its processes' ``RUSAGE_CHILDREN`` at its
exit) and memory (its processes' PSS, sampled every 2 s, as MB-hours); how fresh every sink was
(from a file's landing until the ingestion batch that read it and each output's next batch
committed, ``bench.harness.freshness``); and every copy's accepted-rows table against its
generator's ground truth. Writes ``bench/results/shared_driver.json`` (``--out``); the working
folder (in the temp dir) is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.harness import (
    MASTER,
    Memory,
    accepted_rows,
    child_env,
    clean_up,
    descendants,
    freshness,
    kill_tree,
    landing_of,
    run_generator,
    run_measured,
    working_folder,
)
from bench.report import RESULTS, Progress, machine, spread, write_results
from runner.processes import wait_until
from spark_jobs import submit
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import processed_files, waiting_files
from spark_jobs.runtime.run_queue import RunQueue, RunRequest
from spark_jobs.stream_spec.layout import Layout, project_root
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW
from streamops.cost import reaped_cpu

SPEC = project_root() / "include" / "streams" / "sensors.yaml"


class SharedDriver:
    """A shared driver this benchmark started, and its queue."""

    def __init__(self, work: Path, log: Path) -> None:
        self.queue = RunQueue(work / "queue")
        self.proc = subprocess.Popen(submit.shared_driver_command(self.queue.dir, MASTER), env=child_env(),
                                     stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: self.queue.serving() is not None or self.proc.poll() is not None, 300, every=0.2)
        if self.proc.poll() is not None:
            raise RuntimeError(f"the shared driver exited {self.proc.returncode}: {log}")

    def ask(self, root: Path, driver_id: str) -> str:
        return self.queue.ask(RunRequest(spec=str(SPEC), data_root=str(root), driver_id=driver_id))

    def result(self, run_id: str, timeout: float = 600) -> dict[str, Any]:
        wait_until(lambda: self.queue.result(run_id) is not None, timeout, every=0.1)
        found = self.queue.result(run_id)
        self.queue.forget(run_id)
        if found["code"] != 0:
            raise RuntimeError(f"a shared run exited {found['code']}: {found.get('error')}")
        return found

    def stop(self) -> float:
        """Stop it (SIGTERM to its Python process: between runs); its whole CPU seconds, once it exited."""
        before = reaped_cpu()
        serving = self.queue.serving()
        os.kill(serving["pid"] if serving else self.proc.pid, signal.SIGTERM)
        self.proc.wait(300)
        return reaped_cpu() - before


def own_run(root: Path, log: Path) -> dict[str, float]:
    """An available-now run in a JVM of its own, whole process."""
    return run_measured(submit.command("stream", SPEC, MASTER, ["--data-root", str(root), "--trigger", "available-now"]),
                        log)


def runs_part(args: argparse.Namespace, work: Path, say: Progress) -> dict[str, Any]:
    root, log = work / "runs" / "data", work / "runs.log"
    run_generator(SPEC, root, args.files, args.events_per_file, seed=1)
    own_run(root, log)  # the checkpoint and tables made: every measured run resumes
    driver = SharedDriver(work / "runs", work / "shared-driver.log")
    seed, warm_up, runs = 2, [], {"own": [], "shared": []}
    try:
        for i in range(args.warm_up):
            run_generator(SPEC, root, args.files, args.events_per_file, seed=seed)
            seed += 1
            r = driver.result(driver.ask(root, f"warm-up-{i}"))
            warm_up.append({"wall_s": r["wall_s"], "cpu_s": r["cpu_s"]})
            say(f"warm-up run {i + 1}: {json.dumps(warm_up[-1])}")
        for pair in range(args.pairs):
            for kind in ("own", "shared") if pair % 2 == 0 else ("shared", "own"):
                run_generator(SPEC, root, args.files, args.events_per_file, seed=seed)
                seed += 1
                if kind == "own":
                    runs["own"].append(own_run(root, log))
                else:
                    r = driver.result(driver.ask(root, f"pair-{pair}"))
                    runs["shared"].append({"wall_s": r["wall_s"], "cpu_s": r["cpu_s"]})
                say(f"pair {pair + 1}: {kind} {json.dumps(runs[kind][-1])}")
    finally:
        driver.stop()
    held, accepted = accepted_rows(root)
    medians = {k: {m: statistics.median(r[m] for r in v) for m in ("wall_s", "cpu_s")} for k, v in runs.items()}
    return {"warm_up": warm_up, "runs": runs, "medians": medians,
            "shared_over_own": {m: round(medians["shared"][m] / medians["own"][m], 3) for m in ("wall_s", "cpu_s")},
            "accepted_rows": {"held": held, "ground_truth": accepted}}


def capacity_part(args: argparse.Namespace, work: Path, say: Progress) -> dict[str, Any]:
    spec = load_spec(SPEC)
    roots = [work / "capacity" / f"copy-{i:03d}" for i in range(args.streams)]
    plans = [compile_plan(spec, Layout(spec, root, SPEC.parent)) for root in roots]
    (work / "capacity").mkdir(parents=True)
    driver = SharedDriver(work / "capacity", work / "capacity-driver.log")
    memory = Memory()
    memory.driver = driver.proc.pid
    memory.start()
    feeders = [subprocess.Popen([sys.executable, "-m", "runner.testdata.generate", "--spec", str(SPEC), "--data-root",
                                 str(root), "--rate", str(args.rate), "--events-per-file", str(args.events_per_file),
                                 "--seed", str(100 + i)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=child_env()) for i, root in enumerate(roots)]
    started = time.time()
    end = started + args.minutes * 60
    due = [started + args.every * (i + 1) / args.streams for i in range(args.streams)]
    asked: dict[int, str] = {}  # copy -> its run asked for and not ended
    results: list[dict[str, Any]] = []
    skipped, cpu, feeding = 0, 0.0, True

    def waiting(i: int) -> bool:
        return bool(waiting_files(landing_of(plans[i]), processed_files(plans[i].checkpoint(INGEST_FLOW))))

    try:
        while True:
            if feeding and time.time() >= end:  # then the schedule goes on until every landed file was read
                feeding = False
                for feeder in feeders:
                    feeder.terminate()
            for i, run_id in list(asked.items()):
                found = driver.queue.result(run_id)
                if found is not None:
                    driver.queue.forget(run_id)
                    results.append({"copy": i, **{k: found.get(k) for k in ("code", "wall_s", "cpu_s", "started_at")}})
                    del asked[i]
                    if len(results) % 10 == 0:
                        say(f"{len(results)} runs")
            for i in range(args.streams):
                if time.time() < due[i] or i in asked:
                    continue
                due[i] += args.every
                if waiting(i):
                    asked[i] = driver.ask(roots[i], f"copy-{i}-{len(results)}")
                else:
                    skipped += 1
            if not feeding and not asked and not any(waiting(i) for i in range(args.streams)):
                break
            time.sleep(0.5)
    finally:
        for feeder in feeders:
            feeder.terminate()
            feeder.wait()
        try:
            cpu = driver.stop()
        finally:
            memory.stop()
            for pid in descendants(os.getpid()):
                kill_tree(pid)
    hours = (time.time() - started) / 3600
    fresh, unread, exact = [], 0, 0
    for plan, root in zip(plans, roots, strict=True):
        f, missing = freshness(plan)
        fresh += [round(x, 1) for x in f]
        unread += missing
        held, accepted = accepted_rows(root)
        exact += held == accepted
    stream_hours = hours * args.streams
    return {"streams": args.streams, "hours": round(hours, 3), "runs": len(results), "skipped_runs": skipped,
            "exit_codes": sorted({r["code"] for r in results}), "driver_cpu_s": round(cpu, 1),
            "cpu_s_per_stream_hour": round(cpu / stream_hours, 1),
            "driver_busy": round(sum(r["wall_s"] or 0 for r in results) / (hours * 3600), 3),
            "mb_hours_per_stream_hour": round(memory.mb_seconds / 3600 / stream_hours, 1),
            "peak_memory_mb": round(memory.peak_mb), "run_wall_s": spread([r["wall_s"] for r in results]),
            "run_cpu_s": spread([r["cpu_s"] for r in results]), "freshness_s": spread(fresh),
            "within_5_minutes": sum(f <= 300 for f in fresh), "files_read": len(fresh),
            "files_not_in_every_sink": unread, "copies_exact": exact}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="runs,capacity")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--warm-up", type=int, default=3, help="shared runs before the pairs")
    p.add_argument("--files", type=int, default=4, help="files landed before each run (runs)")
    p.add_argument("--events-per-file", type=int, default=40)
    p.add_argument("--streams", type=int, default=30, help="copies of the stream (capacity)")
    p.add_argument("--minutes", type=float, default=12.0, help="how long the copies are fed (capacity)")
    p.add_argument("--rate", type=float, default=1 / 60, help="files per second per copy (capacity)")
    p.add_argument("--every", type=float, default=240.0, help="seconds between a copy's runs (capacity)")
    p.add_argument("--keep", action="store_true", help="keep the working folder (in the temp dir)")
    p.add_argument("--out", default=str(RESULTS / "shared_driver.json"), help="where the JSON results go")
    args = p.parse_args(argv)
    say = Progress()
    work = working_folder("shared-driver-")
    out: dict[str, Any] = {"machine": machine(), "date": datetime.now().isoformat(timespec="seconds"),
                           "settings": vars(args)}
    ok = True
    try:
        if "runs" in args.parts.split(","):
            out["runs"] = r = runs_part(args, work, say)
            print(f"own JVM    wall {r['medians']['own']['wall_s']:>6.2f} s  CPU {r['medians']['own']['cpu_s']:>6.2f} s")
            print(f"shared     wall {r['medians']['shared']['wall_s']:>6.2f} s  CPU {r['medians']['shared']['cpu_s']:>6.2f} s"
                  f"  (medians of {args.pairs}); shared / own: {json.dumps(r['shared_over_own'])}")
            ok &= r["accepted_rows"]["held"] == r["accepted_rows"]["ground_truth"]
        if "capacity" in args.parts.split(","):
            out["capacity"] = c = capacity_part(args, work, say)
            print(f"{c['streams']} streams, one shared driver: {c['runs']} runs, {c['cpu_s_per_stream_hour']} CPU s and "
                  f"{c['mb_hours_per_stream_hour']} MB-h per stream-hour, busy {c['driver_busy']:.0%}; freshness "
                  f"median {c['freshness_s']['median']} s, max {c['freshness_s']['max']} s, {c['within_5_minutes']} of "
                  f"{c['files_read']} files within 5 minutes, {c['files_not_in_every_sink']} not in every sink; "
                  f"{c['copies_exact']} of {c['streams']} copies exact")
            ok &= c["copies_exact"] == c["streams"] and c["exit_codes"] == [0]
    finally:
        clean_up(work, args.keep, say)
    write_results(Path(args.out), out, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
