"""What validating one closed unit costs, against a single Spark pass computing the same checks.

    python -m bench.quality_cost [--sizes 1000 10000 100000 1000000] [--repeats 5]

For each size, one event-time unit of the ``sensors.readings`` output (its real schema,
realistic values) is written as Parquet and read back, then validated:

* ``platform``: the platform's own validation of the unit (:class:`Validator`: suite with
  the derived and declared checks, Great Expectations checkpoint with the Data Docs action,
  results attributed to units), as the quality DAG runs it;
* ``checks only``: the same Great Expectations validation definition run without storing
  its result or rendering Data Docs: what the checks themselves cost;
* ``gx COMPLETE``: one Great Expectations run with full detail (example values and the unit
  of every failing row) for every check: the cost the platform avoids for passing units;
* ``baseline``: one ``DataFrame.agg`` computing the same checks (schema, nulls, uniqueness,
  ranges, value sets, pattern, freshness) in a single pass.

Every case runs in the same process on the same cached data; medians of ``--repeats``
runs after a warm-up are printed with their ratio to the baseline, and written to
``bench/results/quality_cost.json`` (``--out NAME``: ``NAME.json``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime

from bench.harness import MASTER, working_folder
from bench.report import machine, results_path, write_results
from spark_jobs import analysis
from spark_jobs.quality.rules import load_rules, targets
from spark_jobs.quality.validation import Validator, expected_schema, iso
from spark_jobs.runtime.session import build_session
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import load_spec


def unit_frame(spark, rows: int, schema):
    """One hour of readings: unique ids, valid values, every column of the output's schema."""
    from pyspark.sql import functions as F

    base = spark.range(rows).select(
        F.format_string("sensors-%09d", F.col("id")).alias("event_id"),
        F.format_string("dev-%03d", (F.col("id") % 20).cast("int")).alias("device_id"),
        F.timestamp_millis(F.lit(1767225600000) + (F.col("id") * 3_600_000 / rows).cast("long")).alias("ts"),
        (F.lit(15.0) + (F.col("id") % 200) / 10).alias("temperature"),
        ((F.col("id") * 7) % 1000 / 10).alias("humidity"),
        F.element_at(F.array(F.lit("ok"), F.lit("warn"), F.lit("fail")), (F.col("id") % 3 + 1).cast("int")).alias("status"),
        F.format_string("site-%d", (F.col("id") % 4).cast("int")).alias("site"),
        F.lit("TX-100").alias("model"),
    ).withColumn("event_date", F.to_date("ts"))
    return base.select(*[F.col(f.name).cast(f.dataType) for f in schema.fields])


def baseline(frame, rules_for_readings) -> dict:  # the same checks, one pass
    from pyspark.sql import functions as F

    aggs = [F.count(F.lit(1)).alias("rows"), F.count_distinct("event_id").alias("distinct_ids"),
            F.max("ts").alias("newest")]
    for c in ("event_id", "device_id", "ts", "temperature"):
        aggs.append(F.sum(F.col(c).isNull().cast("int")).alias(f"null_{c}"))
    for i, (name, kw) in enumerate(rules_for_readings):
        col = F.col(kw["column"])
        if name == "expect_column_values_to_be_between":
            bad = (col < kw["min_value"]) | (col > kw["max_value"])
        elif name == "expect_column_values_to_be_in_set":
            bad = ~col.isin(kw["value_set"])
        elif name == "expect_column_values_to_match_regex":
            bad = ~col.rlike(kw["regex"])
        else:
            continue
        aggs.append(F.sum(F.coalesce(bad, F.lit(False)).cast("int")).alias(f"bad_{i}"))
    row = frame.agg(*aggs).collect()[0].asDict()
    row["schema"] = [(f.name, f.dataType.simpleString()) for f in frame.schema.fields]
    return row


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="quality_cost",
                   help="results' name in bench/results/ (default quality_cost; an absolute path: there instead)")
    args = p.parse_args(argv)

    spark = build_session("bench-quality", master=MASTER, extra={
        "spark.sql.shuffle.partitions": 2, "spark.ui.enabled": False, "spark.ui.showConsoleProgress": False})
    spark.sparkContext.setLogLevel("ERROR")
    work = working_folder("bench-quality-")
    spec = load_spec(default_spec_dir() / "sensors.yaml")
    layout = Layout(spec, work, default_spec_dir())
    plan = analysis.resolve_plan(spark, spec, layout)
    rules = load_rules(spec, default_spec_dir())
    target = next(t for t in targets(plan, rules)[0] if t.output.name == "readings")
    schema = expected_schema(spark, plan, target.output.name)
    results = []
    try:
        v = Validator(spark, plan, layout, rules, run_id="bench")
        complete = v.checkpoint(target, schema, label="bench", detail=True)
        checks_only = v.checkpoint(target, schema, label="bench").validation_definitions[0]
        print(f"{'rows':>10} {'baseline s':>11} {'platform s':>11} {'ratio':>7} {'checks only s':>14} {'ratio':>7} "
              f"{'gx COMPLETE s':>14} {'ratio':>7}")
        for rows in args.sizes:
            path = work / f"unit-{rows}"
            unit_frame(spark, rows, schema).write.parquet(str(path))
            frame = spark.read.parquet(str(path)).cache()
            frame.count()
            unit = iso(datetime(2026, 1, 1, tzinfo=UTC))

            def platform_run(frame=frame, rows=rows, unit=unit) -> None:
                units = {unit: v._unit_record(unit, None, None, rows)}
                v.validate_units(target, schema, frame, units, lambda _value: unit,
                                 {"fresh_after": datetime(2025, 12, 31)}, label="bench")
                assert units[unit]["status"] == "passed", units[unit]["failed"]

            def complete_run(frame=frame) -> None:
                result = complete.run(batch_parameters={"dataframe": frame},
                                      expectation_parameters={"fresh_after": datetime(2025, 12, 31)})
                assert result.success

            def checks_run(frame=frame) -> None:
                result = checks_only.run(batch_parameters={"dataframe": frame}, result_format="BOOLEAN_ONLY",
                                         expectation_parameters={"fresh_after": datetime(2025, 12, 31)})
                assert result.success

            base = timed(lambda frame=frame: baseline(frame, target.declared), args.repeats)
            plat = timed(platform_run, args.repeats)
            checks = timed(checks_run, args.repeats)
            full = timed(complete_run, args.repeats)
            results.append({"rows": rows, "baseline_s": base, "platform_s": plat, "checks_only_s": checks,
                            "gx_complete_s": full, "platform_ratio": plat / base, "checks_only_ratio": checks / base,
                            "complete_ratio": full / base})
            print(f"{rows:>10} {base:>11.3f} {plat:>11.3f} {plat / base:>7.2f} {checks:>14.3f} {checks / base:>7.2f} "
                  f"{full:>14.3f} {full / base:>7.2f}", flush=True)
            frame.unpersist()
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    out = write_results(results_path(args.out), {"machine": machine(), "repeats": args.repeats, "results": results})
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
