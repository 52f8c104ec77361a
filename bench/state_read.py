"""Reading a stream's state while it runs: do the state job's reads slow the stream's micro-batches?

    python -m bench.state_read [--batches N] [--rounds R] [--trigger T] [--rate F] [--keep] [--out NAME]

The ``sensors`` stream (``include/streams/sensors.yaml`` with a ``--trigger`` processing-time
trigger, 3 seconds by default) runs as a real driver, ``python -m spark_jobs.submit stream
--spec ... --master local[2] -- --data-root ...``, while the test-data generator lands ``--rate``
files a second (100 events each, event time from the wall clock: the watermark, the open windows
and the deduplication keys move on as in production). After a warm-up, ``--rounds`` rounds of
two phases:

- **without**: no state read, until ``--batches`` batches of the ingestion (with rows) ran in it;
- **with**: the state job (``spark_jobs/state.py``) back to back, each run as the stream's
  ``stream_<name>_state`` DAG runs it: ``python -m spark_jobs.submit state --spec ... --master
  local[2] -- --result <file> --data-root ...``; each must exit 0 and write its result; reads go
  on until ``--batches`` batches of the ingestion ran while they did.

A batch belongs to a phase if it started and ended inside it (from the stream's progress events,
``_events/progress.jsonl``: its start and ``duration_ms.triggerExecution``); one that straddles a
phase's boundary is left out (counted). Per query and over every query: the batches' durations
(median, p90) without and with reads, the ratios with/without, a bootstrap 95% interval of the
ratio of the medians (batches resampled within each side) and each round's own ratio: a difference
"beyond noise" is one whose interval leaves out 1. Also each read's duration (spark-submit to its
exit) and peak memory, and per phase the load average and the CPU that processes other than this
benchmark's used (another workload on the machine disturbs the figures: it shows there).

Whether a read writes into the checkpoint: once the stream is stopped at the end, one more read
runs, and every byte of the checkpoint (its ``_control`` and ``_events`` folders aside, which the
job writes its result into) is compared before and after. ``tests/spark_jobs/test_state.py``
checks the same on every test run.

Output: a table on stdout and ``bench/results/state_read.json`` (``--out NAME``: ``NAME.json``).
Every process started here is ended by its pid, also on failure; the working folder is removed
unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from bench.harness import (
    MASTER,
    child_env,
    clean_up,
    cpu_seconds,
    end_everything,
    epoch,
    kill_tree,
    wait_measured,
    working_folder,
)
from bench.report import Progress, machine, results_path, spread, write_results
from runner.processes import wait_for
from spark_jobs.runtime.progress import read_events
from spark_jobs.stream_spec.layout import Layout, project_root
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW

STREAM = "sensors"
EVENTS_PER_FILE = 100
#: batches of the ingestion (with rows) before the first round: the JVM's and Spark's warm-up
WARMUP_BATCHES = 4
#: how long one state read may take, and how long a phase may wait for its batches
READ_TIMEOUT_S = 300.0
PHASE_TIMEOUT_S = 900.0
#: resamples of the bootstrap interval (fixed seed: the same batches give the same interval)
BOOTSTRAP = 2000
#: every query's batches pooled, beside each query's own
ALL = "all queries"


# ---- the stream, its input, its reads ----------------------------------------------------------------


def spec_copy(root: Path, trigger: str) -> Path:
    """``include/streams/sensors.yaml`` on a processing-time ``trigger``, beside a copy of the
    reference data it joins; the spec's path."""
    include = project_root() / "include"
    shutil.copytree(include / "reference", root / "reference")
    spec = yaml.safe_load((include / "streams" / f"{STREAM}.yaml").read_text())
    spec["trigger"] = {"processing_time": trigger}
    (root / "streams").mkdir(parents=True)
    path = root / "streams" / f"{STREAM}.yaml"
    path.write_text("# Written by bench/state_read.py: include/streams/sensors.yaml on its own trigger.\n"
                    + yaml.safe_dump(spec, sort_keys=False))
    load_spec(path)  # valid, or fail here
    return path


def tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    """``cmd`` from the project's root with the benchmarks' environment, its output into ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen(cmd, cwd=project_root(), env=child_env(), stdout=out, stderr=subprocess.STDOUT,
                                process_group=0)  # not in the terminal's group: a Ctrl-C reaches only this process


def submit(job: str, spec_path: Path, job_args: list[str]) -> list[str]:
    """``python -m spark_jobs.submit <job> --spec ... --master local[2] -- <job args>``: how the DAGs submit."""
    return [sys.executable, "-m", "spark_jobs.submit", job, "--spec", str(spec_path), "--master", MASTER, "--",
            *job_args]


class Reader:
    """The state job, run as the state DAG's operator runs it (its spec, a result file, the data root)."""

    def __init__(self, spec_path: Path, data_root: Path, work: Path):
        self.spec_path, self.data_root = spec_path, data_root
        self.folder = work / "reads"
        self.folder.mkdir()
        self.count = 0

    def read(self) -> dict[str, Any]:
        """One run to its end: when it started and ended, what it found, its peak memory; an error
        unless it exited 0 and wrote its result."""
        self.count += 1
        result, log = self.folder / f"read-{self.count}.json", self.folder / f"read-{self.count}.log"
        started = time.time()
        proc = start(submit("state", self.spec_path, ["--result", str(result), "--data-root", str(self.data_root)]),
                     log)
        code, memory = wait_measured(proc, READ_TIMEOUT_S, every=2.0)  # a light sampler beside the stream
        ended = time.time()
        if code != 0:
            raise RuntimeError(f"state read {self.count} exited {code}; {log}:\n{tail(log)}")
        try:
            found = json.loads(result.read_text())
        except (OSError, ValueError):
            raise RuntimeError(f"state read {self.count} exited 0 but wrote no result; {log}:\n{tail(log)}") from None
        if not found.get("flows"):
            raise RuntimeError(f"state read {self.count} found no flow with state: {found}")
        return {"n": self.count, "start": started, "end": ended, "s": ended - started, "exit_code": code,
                "batches": {flow: f["batch"] for flow, f in found["flows"].items()},
                "state_rows": {flow: sum(o.get("rows") or 0 for o in f["operators"]) for flow, f in found["flows"].items()},
                "peak_rss_mb": memory["peak_rss_mb"]}


# ---- the stream's batches, and what else ran -----------------------------------------------------------


def batches(events_file: Path) -> list[dict[str, Any]]:
    """Every micro-batch the progress events record: query, id, start, end (epoch s), duration, rows."""
    found = []
    for e in read_events(events_file):
        ms = (e.get("duration_ms") or {}).get("triggerExecution")
        if e.get("event") != "progress" or ms is None or not e.get("timestamp"):
            continue
        begin = epoch(e["timestamp"])
        found.append({"query": e.get("query"), "batch_id": e.get("batch_id"), "start": begin, "end": begin + ms / 1000,
                      "ms": ms, "input_rows": e.get("input_rows") or 0})
    return found


def ingested(found: list[dict[str, Any]], since: float, until: float) -> list[dict[str, Any]]:
    """The ingestion's batches with rows that ran within [since, until]."""
    return [b for b in found if b["query"] == INGEST_FLOW and b["input_rows"] and since <= b["start"]
            and b["end"] <= until]


def cpu_now() -> dict[str, float]:
    """The machine's busy CPU seconds, and this process's with every process it started."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)
    return {"at": time.time(), "busy": busy, "mine": cpu_seconds(os.getpid())}


def machine_use(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Over a phase: the cores' busy share, and the CPU seconds of processes this benchmark did not start."""
    wall = after["at"] - before["at"]
    busy, mine = after["busy"] - before["busy"], after["mine"] - before["mine"]
    cores = os.cpu_count() or 1
    return {"busy_share": busy / (wall * cores) if wall > 0 else 0.0, "cpu_s": busy, "ours_cpu_s": mine,
            "others_cpu_s": busy - mine, "others_share": (busy - mine) / (wall * cores) if wall > 0 else 0.0}


# ---- figures -------------------------------------------------------------------------------------------


def inside(b: dict[str, Any], phase: dict[str, Any]) -> bool:
    return phase["start"] <= b["start"] and b["end"] <= phase["end"]


def straddles(b: dict[str, Any], phase: dict[str, Any]) -> bool:
    return b["start"] < phase["end"] and phase["start"] < b["end"] and not inside(b, phase)


def with_rows(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The batches that read rows (a no-data batch, for the watermark alone, is another kind of batch)."""
    return [b for b in found if b["input_rows"]]


def bootstrap_ratio(without: list[float], with_: list[float], seed: int = 1) -> dict[str, float] | None:
    """A 95% interval of median(with) / median(without), both sides resampled."""
    if not without or not with_:
        return None
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(with_, k=len(with_)))
                    / statistics.median(rng.choices(without, k=len(without))) for _ in range(BOOTSTRAP))
    return {"low": ratios[int(0.025 * BOOTSTRAP)], "high": ratios[int(0.975 * BOOTSTRAP) - 1]}


def compare(without: list[float], with_: list[float]) -> dict[str, Any]:
    a, b = spread(without), spread(with_)
    interval = bootstrap_ratio(without, with_)
    if interval is None:
        verdict = "not measured"
    elif interval["low"] > 1:
        verdict = "slower beyond noise"
    elif interval["high"] < 1:
        verdict = "faster beyond noise"
    else:
        verdict = "within noise"
    return {"without_ms": a, "with_ms": b,
            "ratio_median": b["median"] / a["median"] if a["n"] and b["n"] else None,
            "ratio_p90": b["p90"] / a["p90"] if a["n"] and b["n"] else None,
            "ratio_median_95": interval, "verdict": verdict}


def summarize(found: list[dict[str, Any]], phases: list[dict[str, Any]], reads: list[dict[str, Any]]) -> dict[str, Any]:
    """Per query and over every query: batch durations without and with reads; per round; the reads."""
    mine = with_rows(found)
    queries = sorted({b["query"] for b in mine}, key=lambda q: (q != INGEST_FLOW, q))
    for phase in phases:
        phase["batches"] = {q: [b["ms"] for b in mine if b["query"] == q and inside(b, phase)] for q in queries}
        phase["batches"][ALL] = [ms for q in queries for ms in phase["batches"][q]]
        phase["left_out"] = sum(straddles(b, phase) for b in mine)
    sides = {side: [p for p in phases if p["reads"] == (side == "with")] for side in ("without", "with")}

    def pooled(side: str, q: str) -> list[float]:
        return [ms for p in sides[side] for ms in p["batches"][q]]

    per_query = {q: compare(pooled("without", q), pooled("with", q)) for q in [ALL, *queries]}
    rounds = []
    for r in sorted({p["round"] for p in phases}):
        a = next(p for p in phases if p["round"] == r and not p["reads"])
        b = next((p for p in phases if p["round"] == r and p["reads"]), None)
        row = {"round": r, "without_median_ms": spread(a["batches"][ALL])["median"],
               "with_median_ms": spread(b["batches"][ALL])["median"] if b else None,
               "others_share": [a["use"]["others_share"], b["use"]["others_share"] if b else None]}
        row["ratio_median"] = (row["with_median_ms"] / row["without_median_ms"]
                               if row["with_median_ms"] and row["without_median_ms"] else None)
        rounds.append(row)
    measured = [r for r in reads if r.get("phase") is not None]
    return {
        "queries": queries, "batches": per_query, "rounds": rounds,
        "left_out_straddling": sum(p["left_out"] for p in phases),
        "reads": {"count": len(measured), "succeeded": sum(r["exit_code"] == 0 for r in measured),
                  "s": spread([r["s"] for r in measured]),
                  "peak_rss_mb": spread([r["peak_rss_mb"] for r in measured])},
        "machine_use": {side: {"busy_share": statistics.mean(p["use"]["busy_share"] for p in ps),
                               "others_share": statistics.mean(p["use"]["others_share"] for p in ps),
                               "load_average_at_start": [p["load_average"] for p in ps]}
                        for side, ps in sides.items() if ps},
    }


def table(s: dict[str, Any]) -> list[str]:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"

    def ratio(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    lines = [f"  {'query':<22} {'batches':>9}  {'median ms':>17}  {'p90 ms':>17}  {'ratio':>11}  {'95% (median)':>12}  verdict",
             f"  {'':<22} {'w/o  with':>9}  {'w/o      with':>17}  {'w/o      with':>17}  {'med   p90':>11}"]
    for q, c in s["batches"].items():
        a, b, ci = c["without_ms"], c["with_ms"], c["ratio_median_95"]
        interval = f"{ci['low']:.2f}-{ci['high']:.2f}" if ci else "-"
        lines.append(f"  {q:<22} {a['n']:>4} {b['n']:>4}  {ms(a['median']):>8} {ms(b['median']):>8}  "
                     f"{ms(a['p90']):>8} {ms(b['p90']):>8}  {ratio(c['ratio_median']):>5} {ratio(c['ratio_p90']):>5}  "
                     f"{interval:>12}  {c['verdict']}")
    lines.append("  per round, every query's median without -> with reads (ratio; other processes' share of the cores):")
    for r in s["rounds"]:
        others = " / ".join("-" if x is None else f"{x:.0%}" for x in r["others_share"])
        lines.append(f"    round {r['round']}: {ms(r['without_median_ms'])} -> {ms(r['with_median_ms'])} ms "
                     f"({ratio(r['ratio_median'])}; {others})")
    lines.append(f"  batches straddling a phase's boundary, left out: {s['left_out_straddling']}")
    r = s["reads"]
    if r["count"]:
        lines.append(f"state reads: {r['count']}, {r['succeeded']} succeeded; each median {r['s']['median']:.1f} s, "
                     f"p90 {r['s']['p90']:.1f} s, max {r['s']['max']:.1f} s; peak memory median "
                     f"{r['peak_rss_mb']['median']:,.0f} MB")
    for side, use in s["machine_use"].items():
        lines.append(f"machine {side} reads: cores busy {use['busy_share']:.0%}, of it other processes' "
                     f"{use['others_share']:.0%} of the cores; load average at each start "
                     + ", ".join(f"{x:.2f}" for x in use["load_average_at_start"]))
    return lines


# ---- the checkpoint, read-only --------------------------------------------------------------------------


def checkpoint_files(root: Path) -> dict[str, bytes]:
    """Every file of the checkpoint but its ``_control`` and ``_events`` folders (the state job's result goes there)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "_control" not in p.relative_to(root).parts and "_events" not in p.relative_to(root).parts}


def read_only_check(reader: Reader, checkpoint: Path) -> dict[str, Any]:
    """One read of the stopped stream's checkpoint: did any byte of it change?"""
    before = checkpoint_files(checkpoint)
    read = reader.read()
    after = checkpoint_files(checkpoint)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return {"unchanged": not changed, "files": len(before), "changed": changed[:20], "read_s": read["s"],
            "batches": read["batches"]}


# ---- main ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=20,
                   help="ingestion batches per phase, without and with reads (default 20)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the two phases (default 3)")
    p.add_argument("--trigger", default="3 seconds", help="the stream's processing-time trigger (default 3 seconds)")
    p.add_argument("--rate", type=float, default=1.0, help="files landing per second (default 1)")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    p.add_argument("--out", default="state_read",
                   help="results' name in bench/results/ (default state_read; an absolute path: there instead)")
    args = p.parse_args(argv)
    if args.batches < 1 or args.rounds < 1 or args.rate <= 0:
        p.error("--batches and --rounds must be at least 1, --rate positive")

    note = Progress()
    work = working_folder("bench-state-read-")
    layout: Layout | None = None
    phases: list[dict[str, Any]] = []
    reads: list[dict[str, Any]] = []
    try:
        spec_path = spec_copy(work / "specs", args.trigger)
        data_root = work / "data"
        data_root.mkdir()
        (work / "logs").mkdir()
        layout = Layout(load_spec(spec_path), data_root, spec_path.parent)
        events, checkpoint = layout.events_file, Path(layout.checkpoint_root)
        reader = Reader(spec_path, data_root, work)

        generator = start([sys.executable, "-m", "runner.testdata.generate", "--spec", str(spec_path),
                           "--data-root", str(data_root), "--rate", str(args.rate), "--events-per-file",
                           str(EVENTS_PER_FILE), "--empty-files", "0", "--seed", "1"], work / "logs" / "generate.log")
        driver_log = work / "logs" / "driver.log"
        driver = start(submit("stream", spec_path, ["--data-root", str(data_root)]), driver_log)
        note(f"driver pid {driver.pid} and generator pid {generator.pid} started ({args.rate:g} files/s, "
             f"trigger {args.trigger})")

        def running() -> None:
            for name, proc, log in (("the driver", driver, driver_log), ("the generator", generator,
                                                                          work / "logs" / "generate.log")):
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode}; {log}:\n{tail(log)}")

        def ingestion_batches(since: float, n: int, what: str) -> list[dict[str, Any]]:
            def enough() -> list[dict[str, Any]] | None:
                running()
                got = ingested(batches(events), since, time.time())
                return got if len(got) >= n else None
            return wait_for(enough, what, PHASE_TIMEOUT_S, every=0.5)

        ingestion_batches(0.0, WARMUP_BATCHES, f"the stream's first {WARMUP_BATCHES} batches")
        note(f"warmed up: {WARMUP_BATCHES} batches of the ingestion")

        for r in range(1, args.rounds + 1):
            phase = {"round": r, "reads": False, "start": time.time(), "load_average": os.getloadavg()[0]}
            use = cpu_now()
            ingestion_batches(phase["start"], args.batches, f"{args.batches} batches without reads (round {r})")
            phase["end"] = time.time()
            phase["use"] = machine_use(use, cpu_now())
            phases.append(phase)
            note(f"round {r}: {args.batches} batches without reads in {phase['end'] - phase['start']:.0f} s")

            phase = {"round": r, "reads": True, "start": time.time(), "load_average": os.getloadavg()[0]}
            use = cpu_now()
            while True:  # reads back to back, until enough batches ran while they did
                read = reader.read() | {"phase": len(phases)}
                reads.append(read)
                running()
                done = len(ingested(batches(events), phase["start"], read["end"]))
                if done >= args.batches:
                    break
                if read["end"] - phase["start"] > PHASE_TIMEOUT_S:
                    raise RuntimeError(f"round {r}: {done} batches in {PHASE_TIMEOUT_S:.0f} s of reads")
            phase["end"] = read["end"]
            phase["use"] = machine_use(use, cpu_now())
            phases.append(phase)
            took = ", ".join(f"{x['s']:.1f}" for x in reads if x["phase"] == len(phases) - 1)
            note(f"round {r}: {done} batches with reads in {phase['end'] - phase['start']:.0f} s (reads {took} s)")

        found = batches(events)
        generator.terminate()  # it stops after the file it writes
        generator.wait(60)
        kill_tree(driver.pid)  # the stream is over: stopped, nothing writes the checkpoint any more
        driver.wait(60)
        check = read_only_check(reader, checkpoint)
        note(f"stream stopped; one more read: checkpoint {'unchanged' if check['unchanged'] else 'CHANGED'} "
             f"({check['files']} files)")
    finally:
        end_everything(layout.lease_dir if layout is not None else None)
        clean_up(work, args.keep, note)

    summary = summarize(found, phases, reads)
    print()
    print(f"state reads against the running stream: sensors, trigger {args.trigger}, {args.rate:g} files/s of "
          f"{EVENTS_PER_FILE} events, {args.rounds} round(s) of {args.batches} ingestion batches without reads, "
          "then with reads back to back; every query's batches with rows:")
    print("\n".join(table(summary)))
    print(f"checkpoint after one read of the stopped stream: {'unchanged' if check['unchanged'] else 'CHANGED'} "
          f"({check['files']} files compared; tests/spark_jobs/test_state.py checks the same)")
    out = results_path(args.out)
    write_results(out, {
        "machine": machine(), "master": MASTER, "trigger": args.trigger, "rate_files_per_s": args.rate,
        "events_per_file": EVENTS_PER_FILE, "batches_per_phase": args.batches, "rounds": args.rounds,
        "warmup_batches": WARMUP_BATCHES, "wall_s": note.elapsed(), "summary": summary,
        "checkpoint_read_only": check,
        "phases": phases, "reads": reads,
        "samples": [b for b in found if b["input_rows"]]})
    print(f"\nwall time {note.elapsed() / 60:.1f} min; written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
