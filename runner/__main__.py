"""The whole platform on one machine (the embedded default): ``./platform up``.

Starts Airflow's own services on loopback (API server with login, scheduler with the
LocalExecutor, DAG processor, triggerer) on a SQLite metadata database, deploys every
stream through its DAGs (Spark local mode through the ``spark_streams`` connection),
feeds each stream from the generator, and lets the quality DAGs validate what the
streams write. It prints where to look and, every few seconds, each stream's status.

While it runs, the quality DAGs validate as units of the sinks close (Airflow assets).
Ctrl-C (or the end of ``--minutes``) shuts it down in order, saying every 15 seconds what
it waits for: the generators stop, the streams catch up with what arrived, they stop
gracefully through their stop DAGs, the quality DAGs validate what they wrote, Airflow
stops; then a summary per stream (rows in, accepted, quarantined, duplicates, dropped
late, rows per sink against the generator's ground truth, restarts, units validated and
how soon after they closed, whether the accounting balances) is printed and written to
``<data root>/summary.json``. A second Ctrl-C skips the wait and kills. Spark's own output
(banners, progress bars) goes to the logs, not the terminal.

Everything lives under the data root (default ``data/platform``): landing directories,
checkpoints, sinks, quality reports and the Airflow home (``airflow/``, with its logs
and the generated login in ``airflow/passwords.json``). A second ``up`` on the same data
root continues where the first stopped; ``--fresh`` starts from nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
from pathlib import Path

from runner.platform import Platform
from runner.processes import port_is_free
from runner.summary import describe_summary
from spark_jobs import changes
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import previous_plan, refuse_incompatible
from spark_jobs.stream_spec.layout import Layout, default_spec_dir, project_root
from spark_jobs.stream_spec.loading import load_specs
from spark_jobs.stream_spec.models import StreamSpec


def parser() -> argparse.ArgumentParser:
    """``python -m runner COMMAND``: one command so far, ``up`` (what ``./platform up`` runs)."""
    p = argparse.ArgumentParser(prog="python -m runner", description="The local runner: the whole platform on one "
                                "machine. `python -m runner up --help` says more.")
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up_ = commands.add_parser("up", prog="./platform up", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              help="run the whole platform until Ctrl-C (or --minutes), then print a summary")
    up_.add_argument("--minutes", type=float, help="run this long, then shut down and print the summary "
                                                   "(default: until Ctrl-C)")
    up_.add_argument("--port", type=int, default=8080, help="the Airflow UI's port on 127.0.0.1 (default 8080)")
    up_.add_argument("--data-root", type=Path, default=project_root() / "data" / "platform")
    up_.add_argument("--spec-dir", type=Path, default=default_spec_dir())
    up_.add_argument("--rate", type=float, default=0.5, help="files per second per stream from the generator")
    up_.add_argument("--events-per-file", type=int, default=40)
    up_.add_argument("--master", default="local[2]", help="the spark_streams connection's host (default local[2])")
    up_.add_argument("--fresh", action="store_true", help="delete the data root first")
    up_.set_defaults(run=up, error=up_.error)  # the errors of its options, as ./platform up's
    return p


def unresumable(specs: dict[str, StreamSpec], spec_dir: Path, data_root: Path) -> list[str]:
    """Why a stream's data under ``data_root`` cannot be resumed with its spec (the check each
    driver makes at its start, made before anything starts); empty if every one can."""
    problems = []
    for spec in specs.values():
        layout = Layout(spec, data_root, spec_dir)
        plan = compile_plan(spec, layout)
        try:
            refuse_incompatible(plan, layout)
        except RuntimeError as exc:
            problems.append(str(exc))
            continue
        spec_file = str(spec_dir / f"{spec.name}.yaml")
        refused = changes.blocking(changes.judge(plan, previous_plan(layout), spec_file,
                                                 spec.event_time.watermark if spec.event_time else None))
        if refused:
            problems.append(f"stream {spec.name}: its spec changed in ways its checkpoint {layout.checkpoint_root} "
                            "cannot resume (docs/changes.md: upgrade it, or start with --fresh):\n"
                            + changes.report(refused))
    return problems


def up(args: argparse.Namespace) -> int:
    """Run the platform (``args``: those of ``up``); 0 if every sink equals the ground truth and
    the data quality passed."""
    if args.minutes is not None and args.minutes <= 0:
        args.error("--minutes must be positive")
    if not port_is_free(args.port):
        args.error(f"port {args.port} on 127.0.0.1 is in use; choose another with --port")

    specs, errors = load_specs(args.spec_dir)
    for error in errors.values():
        print(f"error: {error}", file=sys.stderr)
    if errors or not specs:
        print("error: fix the specs above first" if errors else f"error: no specs in {args.spec_dir}", file=sys.stderr)
        return 2
    if args.fresh and args.data_root.exists():
        shutil.rmtree(args.data_root)
    stale = unresumable(specs, args.spec_dir.resolve(), args.data_root.resolve())
    for problem in stale:
        print(f"error: {problem}", file=sys.stderr)
    if stale:
        print(f"error: {args.data_root} holds data that these specs cannot resume from; "
              "`./platform up --fresh` discards it", file=sys.stderr)
        return 2
    (args.data_root / "logs").mkdir(parents=True, exist_ok=True)

    platform = Platform(specs, args.spec_dir.resolve(), args.data_root.resolve(), args.port, args.rate,
                        args.events_per_file, args.master, out=lambda s: print(s, flush=True))

    def interrupt(_signum: int, _frame: object) -> None:
        platform.interrupts += 1
        print("\n==> Ctrl-C: shutting down gracefully (again to skip waiting)" if platform.interrupts == 1
              else "\n==> Ctrl-C again: not waiting any more", flush=True)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    failed = None
    try:
        platform.start()
        platform.watch(args.minutes)
    except RuntimeError as exc:
        failed = str(exc)
        print(f"error: {exc}", file=sys.stderr)
    finally:
        platform.shutdown(graceful=failed is None)
    if failed is not None or not platform.deployed:
        return 1
    summary = platform.summary()
    (args.data_root / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print("\n" + "\n".join(describe_summary(summary)))
    print(f"\nsummary: {args.data_root / 'summary.json'}")
    ok = all(s["ground_truth_equal"] and s["quality_ok"] for s in summary["streams"].values())
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
