"""The operator that compacts and vacuums a stream's Delta tables."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from streamops.hooks.stream import StreamHook
from streamops.operators import job_path
from streamops.operators.quality import point_job, prune_results

MAINTENANCE_JOB = job_path("maintenance.py")


class MaintainTablesOperator(SparkSubmitOperator):
    """Compact every Delta table of a stream, then vacuum it, while the stream runs.

    Runs ``spark_jobs/maintenance.py`` with ``spark-submit`` (where: the Spark connection)
    and logs per table its files, bytes and version before and after, what the compaction
    rewrote and what the vacuum deleted. Fails naming the table and the reader when a
    vacuum was refused because a reader needs older files than the retention keeps. Returns
    the run's result (XCom).

    :param stream: the stream's name. (templated)
    :param retention: the vacuum's retention, e.g. ``7 days`` (default: the spec's). (templated)
    :param spec_dir: the specs' folder (default ``$STREAMS_SPEC_DIR``).
    :param data_root: root of relative data paths (default ``$STREAMS_DATA_DIR``).
    All other arguments go to :class:`SparkSubmitOperator` (``conn_id`` picks where Spark runs).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "stream", "retention")

    def __init__(self, *, stream: str, retention: str | None = None, spec_dir: str | None = None,
                 data_root: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("application", MAINTENANCE_JOB)
        kwargs.setdefault("name", f"maintenance:{stream}")
        super().__init__(**kwargs)
        self.stream, self.retention, self.spec_dir, self.data_root = stream, retention, spec_dir, data_root

    def execute(self, context: Context) -> dict[str, Any]:
        hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        result_file = point_job(self, context, hook.layout.maintenance_dir, self.stream, self.spec_dir, self.data_root)
        if self.retention:
            self.application_args += ["--retention", str(self.retention)]
        failure: AirflowException | None = None
        try:
            super().execute(context)
        except AirflowException as exc:  # a refused vacuum exits 2 after writing its result
            failure = exc
        try:
            result = json.loads(result_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            if failure is not None:
                raise failure from None
            raise AirflowFailException(f"the maintenance job of {self.stream} wrote no result") from None
        prune_results(result_file.parent)
        for table in result["tables"]:
            self.log.info("%s", describe(table))
        if result["refused"]:
            raise AirflowFailException("\n".join(result["refused"]))
        if failure is not None:
            raise failure
        return result


def describe(table: dict[str, Any]) -> str:
    """One table's upkeep in a line."""
    if "before" not in table:
        return f"{table['output']}: {table.get('note', 'nothing done')}"
    before, after = table["before"], table["after"]
    parts = [f"{table['output']} ({table['path']}): {before['files']} files, {before['bytes']} bytes "
             f"-> {after['files']} files, {after['bytes']} bytes, version {after['version']}"]
    if "optimize" in table:
        parts.append(f"compaction rewrote {table['optimize']['files_removed']} files into "
                     f"{table['optimize']['files_added']}")
    vacuum = table.get("vacuum") or {}
    if "files_deleted" in vacuum:
        parts.append(f"vacuum deleted {vacuum['files_deleted']} files (retention {vacuum['retention_seconds']:g}s)")
    elif "refused" in vacuum:
        parts.append(f"vacuum refused: {vacuum['refused']}")
    return "; ".join(parts)
