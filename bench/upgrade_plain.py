"""The plain PySpark batch job that ``bench/upgrade.py`` compares an upgrade with.

    spark-submit --master 'local[2]' bench/upgrade_plain.py --job job.json

Only pyspark and the standard library. The job file names the accepted rows (a Parquet folder,
read through its ``_spark_metadata`` log as Spark reads a file sink), the event-time column, the
window (duration, slide), the grouping columns and the aggregates (name, fn, column) of the
output to recompute, and the folder to write it to: one batch query, ``groupBy(window(...),
keys).agg(...)``, written once as Parquet. It prints the rows written.
"""

from __future__ import annotations

import argparse
import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

FUNCTIONS = {"count": lambda c: F.count(F.lit(1)) if c is None else F.count(c), "avg": F.avg, "max": F.max,
             "min": F.min, "sum": F.sum}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", required=True, help="the job file (JSON) bench/upgrade.py writes")
    with open(p.parse_args(argv).job, encoding="utf-8") as fh:
        job = json.load(fh)
    spark = SparkSession.builder.appName("upgrade-plain").config(map=job["conf"]).getOrCreate()
    rows = spark.read.parquet(job["accepted"])
    window = F.window(job["event_time"], job["duration"], job["slide"])
    aggregates = [FUNCTIONS[a["fn"]](a.get("column")).alias(a["name"]) for a in job["aggregates"]]
    result = (rows.groupBy(window.alias("window"), *job["group_by"]).agg(*aggregates)
              .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                      *job["group_by"], *[a["name"] for a in job["aggregates"]]))
    result.write.mode("overwrite").parquet(job["output"])
    print(json.dumps({"rows": spark.read.parquet(job["output"]).count()}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
