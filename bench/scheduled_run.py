"""What one scheduled run costs with the JIT the platform gives it, against the JVM's default.

    python -m bench.scheduled_run [--pairs 5] [--files 4] [--events-per-file 40]

One copy of the ``sensors`` example stream; per pair, ``--files`` new files land, then one
available-now run takes them, submitted as the supervisor of a ``scheduled`` stream submits it
(``spark_jobs.submit``: its JVM compiles with the JIT's first tier only,
``spark_jobs.runtime.session.available_now_conf``), and after more files the same command with
that option taken out (the JVM's default: both tiers). The order alternates from pair to pair.
Per run: the whole process's wall time and CPU seconds (exact: the ``RUSAGE_CHILDREN`` of this
process around it). Afterwards the accepted-rows table must hold every row the generator's
ground truth accepted. Medians, and first tier over default; writes
``bench/results/scheduled_run.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

from bench.harness import MASTER, accepted_rows, clean_up, run_generator, run_measured, working_folder
from bench.report import RESULTS, Progress, machine, spread, write_results
from spark_jobs import submit
from spark_jobs.runtime.session import DRIVER_JAVA_OPTIONS, FIRST_TIER_JIT
from spark_jobs.stream_spec.layout import project_root

SPEC = project_root() / "include" / "streams" / "sensors.yaml"
VARIANTS = ("first_tier", "default")


def command(root: Path, variant: str) -> list[str]:
    """The run's spark-submit command: the platform's, or with the first-tier option taken out."""
    cmd = submit.command("stream", SPEC, MASTER, ["--data-root", str(root), "--trigger", "available-now"])
    if variant == "default":
        at = next(i for i, a in enumerate(cmd) if a.startswith(f"{DRIVER_JAVA_OPTIONS}="))
        cmd[at] = cmd[at].replace(f"={FIRST_TIER_JIT} ", "=").replace(f"={FIRST_TIER_JIT}", "=")
        if cmd[at] == f"{DRIVER_JAVA_OPTIONS}=":
            del cmd[at - 1:at + 1]
    return cmd


def run(root: Path, variant: str, log: Path) -> dict[str, float]:
    """One available-now run, whole process: its wall time and CPU seconds."""
    return run_measured(command(root, variant), log)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--files", type=int, default=4, help="files landed before each run")
    p.add_argument("--events-per-file", type=int, default=40)
    p.add_argument("--keep", action="store_true", help="keep the working folder (in the temp dir)")
    p.add_argument("--out", default=str(RESULTS / "scheduled_run.json"), help="where the JSON results go")
    args = p.parse_args(argv)
    say = Progress()
    work = working_folder("scheduled-run-")
    root, log = work / "data", work / "runs.log"
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    try:
        run_generator(SPEC, root, args.files, args.events_per_file, seed=1)
        run(root, "first_tier", log)  # the checkpoint and tables made: every measured run resumes
        seed = 2
        for pair in range(args.pairs):
            for variant in VARIANTS if pair % 2 == 0 else reversed(VARIANTS):
                run_generator(SPEC, root, args.files, args.events_per_file, seed=seed)
                seed += 1
                runs[variant].append(run(root, variant, log))
                say(f"pair {pair + 1}: {variant} {json.dumps(runs[variant][-1])}")
        held, accepted = accepted_rows(root)
    finally:
        clean_up(work, args.keep, say)
    medians = {v: {k: statistics.median(r[k] for r in runs[v]) for k in ("wall_s", "cpu_s")} for v in VARIANTS}
    ratio = {k: round(medians["first_tier"][k] / medians["default"][k], 2) for k in ("wall_s", "cpu_s")}
    write_results(Path(args.out), {
        "machine": machine(), "date": datetime.now().isoformat(timespec="seconds"), "settings": vars(args),
        "runs": runs, "spread": {v: {k: spread([r[k] for r in runs[v]]) for k in ("wall_s", "cpu_s")} for v in VARIANTS},
        "medians": medians, "first_tier_over_default": ratio, "accepted_rows": {"held": held, "ground_truth": accepted}},
        indent=2)
    for v in VARIANTS:
        print(f"{v:<11} wall {medians[v]['wall_s']:>6.2f} s  CPU {medians[v]['cpu_s']:>6.2f} s  (medians of {args.pairs})")
    print(f"first tier / default: wall {ratio['wall_s']}, CPU {ratio['cpu_s']}; accepted rows {held} of {accepted}")
    return 0 if held == accepted else 1


if __name__ == "__main__":
    sys.exit(main())
