"""The operator that reprocesses a stream's input for an event-time range, in batch."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Context

from spark_jobs.stream_spec.layout import default_spec_dir
from streamops.operators import job_path

BACKFILL_JOB = job_path("backfill.py")


class BackfillOperator(SparkSubmitOperator):
    """Reprocess a stream's input for an event-time range with ``spark-submit`` (batch).

    Output goes to ``<data root>/backfill/<stream>/<output>/range=<start>_<end>/`` and is
    replaced whole on a rerun: the same range twice gives identical output.

    :param stream: the stream's name. (templated)
    :param start: range start, ISO-8601, inclusive. (templated)
    :param end: range end, ISO-8601, exclusive. (templated)
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "stream", "start", "end")

    def __init__(self, *, stream: str, start: str, end: str, spec_dir: str | None = None,
                 data_root: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("application", BACKFILL_JOB)
        kwargs.setdefault("name", f"backfill:{stream}")
        super().__init__(**kwargs)
        self.stream, self.start, self.end = stream, start, end
        self.spec_dir, self.data_root = spec_dir, data_root

    def execute(self, context: Context) -> None:
        spec = f"{self.spec_dir or default_spec_dir()}/{self.stream}.yaml"
        self.application_args = ["--spec", spec, "--start", self.start, "--end", self.end]
        if self.data_root:
            self.application_args += ["--data-root", self.data_root]
        self.env_vars = {"PYSPARK_PYTHON": sys.executable, **(self.env_vars or {})}
        super().execute(context)
