"""Data-quality validation of one stream: ``spark-submit spark_jobs/quality_job.py --spec <spec>``.

Validates every unit of the stream's sinks that closed since the last run with Great
Expectations and checks the accounting of every input row; or, with ``--backfill START
END``, the outputs a backfill wrote for that range; or, with ``--again RUN_ID``, the units
that earlier run validated, as of the Delta versions it read them at, each against the
answer it gave. Rebuilds Data Docs and the stream's summary page, and writes the run's
result as JSON (``--result``).

``--without-spark`` (``python -m spark_jobs.quality_job``): what closed since the last run,
in this process with no JVM (:func:`run_without_spark`, what the quality DAG's task does
first), or exit code 3 when the run needs Spark (the message says why).

Exit codes: 0 the validation ran (the result says whether it passed), 2 invalid spec,
rules or parameters (the message names the file and field), 3 ``--without-spark`` and the
run needs Spark, 1 the run itself failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.driver import log_to_stderr
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import SpecError

if TYPE_CHECKING:
    from spark_jobs.quality.rules import QualityRules

log = logging.getLogger("quality_job")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True, help="the stream's spec file")
    p.add_argument("--data-root", default=None, help="root of relative data paths (default: $STREAMS_DATA_DIR or ./data)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--backfill", nargs=2, metavar=("START", "END"), help="validate this backfilled range instead")
    which.add_argument("--again", metavar="RUN_ID", help="validate the units of this earlier run again, as of the "
                                                         "Delta versions it read")
    p.add_argument("--result", type=Path, help="write the run's result here as JSON")
    p.add_argument("--without-spark", action="store_true",
                   help="validate in this process without a JVM (pyarrow, deltalake, pandas); exit 3 if the run "
                        "needs Spark")
    args = p.parse_args(argv)

    from spark_jobs.backfill import BackfillError, parse_range, range_label
    from spark_jobs.quality.rules import load_rules

    try:
        spec = load_spec(args.spec)
        layout = Layout(spec, args.data_root, Path(args.spec).resolve().parent)
        rules = load_rules(spec, layout.spec_dir)
        label = range_label(*parse_range(*args.backfill)) if args.backfill else None
    except (SpecError, BackfillError) as exc:
        log.error("%s", exc)
        return 2

    from spark_jobs.quality.ledger import run_lock
    from spark_jobs.quality.pandas_engine import NeedsSpark
    from spark_jobs.quality.validation import UnknownRun, Validator

    if args.without_spark:
        if label or args.again:
            log.error("--without-spark validates what closed since the last run; backfills and runs again need Spark")
            return 2
        try:
            result = run_without_spark(compile_plan(spec, layout), layout, rules)
        except NeedsSpark as exc:
            log.error("this run needs Spark: %s", exc)
            return 3
        except SpecError as exc:
            log.error("%s", exc)
            return 2
    else:
        from spark_jobs.analysis import resolve_plan
        from spark_jobs.runtime.session import build_session

        spark = build_session(f"quality:{spec.name}", spec)
        try:
            plan = resolve_plan(spark, spec, layout)  # its transform analyzed
            with run_lock(layout.quality_dir):
                result = Validator(spark, plan, layout, rules).run(backfill_label=label, again=args.again)
        except (SpecError, UnknownRun) as exc:
            log.error("%s", exc)
            return 2
        finally:
            spark.stop()
    if args.result:
        args.result.parent.mkdir(parents=True, exist_ok=True)
        args.result.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    for line in describe(result):
        log.info("%s", line)
    return 0


def run_without_spark(plan: StreamPlan, layout: Layout, rules: QualityRules) -> dict:
    """Validate what closed since the last run in this process, without a JVM: the rows read
    with pyarrow or deltalake, Great Expectations' pandas engine, the same suites, ledger and
    Data Docs as the Spark job's (``spark_jobs.quality.pandas_engine``). Raises
    :class:`~spark_jobs.quality.pandas_engine.NeedsSpark` before anything is validated when
    the run needs Spark: the spec or rules (a transform, a SQL output, an expectation only Spark
    computes so), or more rows of an output than ``pandas_max_rows``. ``plan``: ``compile_plan``'s
    (a stream whose plan needs Spark's analysis, one with a transform, needs Spark)."""
    from spark_jobs.quality.ledger import run_lock
    from spark_jobs.quality.pandas_engine import NeedsSpark, PandasRows, needs_spark
    from spark_jobs.quality.validation import Validator

    reason = needs_spark(plan, rules)
    if reason is not None:
        raise NeedsSpark(reason)
    with run_lock(layout.quality_dir):
        return Validator(None, plan, layout, rules, rows=PandasRows(rules.pandas_max_rows, plan.event_time_column)).run()


def describe(result: dict) -> list[str]:
    """A readable account of a run: what was validated, what failed, the accounting."""
    lines = [f"validated with {result['engine']}"] if result.get("engine") else []
    for o in result["outputs"]:
        units = o["units"]
        failed = [u for u in units if u["status"] == "failed"]
        what = f"{len(units)} unit(s), {sum(u['rows'] for u in units)} rows" if units else o.get("note", "nothing new")
        if units and o.get("again"):
            same = sum(bool(u.get("same")) for u in units)
            what += f" again as of run {o['again']}: {same} of {len(units)} gave the same answer"
        lines.append(f"{o['output']}: {what}; {len(failed)} failed" if units else f"{o['output']}: {what}")
    for note in result["skipped"]:
        lines.append(note)
    acc = result.get("accounting")
    if acc:
        lines.append(f"accounting: {acc['input']} input rows, {acc['quarantined']} quarantined "
                     f"({acc['quarantine_rate']:.2%}, threshold {acc['max_quarantine_rate']:.2%})")
        for b in acc["balances"]:
            accepted = "?" if b["accepted"] is None else b["accepted"]
            lines.append(f"  {b['output']}: {b['status']}: {b['input']} = {accepted} accepted + {b['quarantined']} "
                         f"quarantined + {b['duplicates']} duplicates + {b['dropped_late']} dropped late"
                         + (f" ({b['message']})" if b["message"] else ""))
    if result["problems"]:
        lines.append(f"FAILED: {len(result['problems'])} problem(s):")
        lines += [f"  - {p}" for p in result["problems"][:30]]
        if len(result["problems"]) > 30:
            lines.append(f"  ... and {len(result['problems']) - 30} more (see {result['summary']})")
    else:
        lines.append("all checks passed")
    lines.append(f"summary: {result['summary']}; Data Docs: {result['docs']}")
    return lines


if __name__ == "__main__":
    log_to_stderr()
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    sys.exit(main())
