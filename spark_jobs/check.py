"""The dry run of stream specs: everything a driver checks before it starts, without starting.

    python -m spark_jobs.check include/streams/*.yaml

loads each spec (``spark_jobs.stream_spec``) and analyzes it on a local SparkSession over no rows
(``spark_jobs.analysis``); exits 0 when every spec passes, 2 otherwise, each problem naming
the file, the field and Spark's own message (a Kafka source's broker must answer and its
topics exist). For a stream that has run (under ``--data-root``), it also prints the verdict
of each flow against the plan of its last start and the state its checkpoint holds
(``spark_jobs.changes``), and fails on one a driver would refuse to start with (``--rehearse``:
an *unknown* verdict is first settled by a rehearsal on a copy of the checkpoint,
``spark_jobs.rehearsal``); and how the stream runs (``execution``: continuous, scheduled or
adaptive), which a change of mode alone changes.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from spark_jobs import changes, rehearsal
from spark_jobs.analysis import analyze
from spark_jobs.runtime.checkpoint import previous_plan
from spark_jobs.sources.kafka import KafkaUnavailable
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import SpecError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("specs", nargs="+", help="spec files (YAML)")
    p.add_argument("--data-root", default=None, help="root of relative data paths (default: $STREAMS_DATA_DIR or ./data)")
    p.add_argument("--rehearse", action="store_true",
                   help="settle unknown verdicts by a rehearsal of one micro-batch on a copy of the checkpoint")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from pyspark.sql import SparkSession

    from spark_jobs.runtime.session import build_session

    failed = 0
    spark = None
    borrowed = SparkSession.getActiveSession() is not None  # a caller's session is the caller's to stop
    try:
        for path in args.specs:
            try:
                spec = load_spec(path)
                if spark is None:
                    spark = build_session("spec-check", master="local[1]", extra={"spark.ui.enabled": "false"})
                layout = Layout(spec, args.data_root, spec_dir=Path(path).resolve().parent)
                plan = analyze(spark, spec, layout, path)
            except SpecError as exc:
                failed += 1
                print(exc, file=sys.stderr)
                continue
            except KafkaUnavailable as exc:
                failed += 1
                print(f"{path}: {exc}", file=sys.stderr)
                continue
            previous = previous_plan(layout)
            if previous or Path(layout.checkpoint_root).exists():
                verdicts = changes.judge(plan, previous, path, spec.event_time.watermark if spec.event_time else None)
                if args.rehearse:
                    verdicts = rehearsal.rehearse(spark, plan, previous, verdicts, path)
                print(f"{path}: against {layout.checkpoint_root}:\n" + changes.report(verdicts))
                if changes.blocking(verdicts):
                    failed += 1
                    print(f"{path}: a driver would refuse to start: the stream needs its upgrade", file=sys.stderr)
                    continue
            print(f"{path}: runs {spec.execution.describe()}")  # a switch of mode keeps every checkpoint
            print(f"{path}: ok")
    finally:
        if spark is not None and not borrowed:
            spark.stop()
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
