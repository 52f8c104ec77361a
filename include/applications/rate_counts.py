"""An existing Structured Streaming application, as a team would have written it, plus the
few lines that let the platform deploy and supervise it (``spark_jobs.runtime.driver.supervised``):
rows of Spark's rate source counted per 5-second window, written to Parquet.

Its spec declares it instead of a source and outputs::

    name: rate_counts
    application:
      path: applications/rate_counts.py
      args: [--output, sinks/rate_counts, --rows-per-second, "5"]
      queries: [counts]
    checkpoint: checkpoints/rate_counts
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.runtime.driver import supervised


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", required=True, help="the Parquet sink, relative to the platform's data root")
    p.add_argument("--rows-per-second", type=int, default=5)
    args = p.parse_args()

    spark = SparkSession.builder.appName("rate_counts").getOrCreate()
    counts = (spark.readStream.format("rate").option("rowsPerSecond", args.rows_per_second).load()
              .withWatermark("timestamp", "5 seconds")
              .groupBy(F.window("timestamp", "5 seconds"))
              .agg(F.count("*").alias("rows"))
              .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "rows"))

    with supervised(spark) as app:  # the lease, progress events, the stop marker
        app.start("counts", counts.writeStream.outputMode("append").format("parquet")
                  .option("path", app.data(args.output)).trigger(processingTime="2 seconds"))
        app.run()  # until a stop is asked for (between micro-batches) or a query fails
    spark.stop()


if __name__ == "__main__":
    main()
