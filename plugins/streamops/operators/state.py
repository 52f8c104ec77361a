"""The operator that reads what a stream's state holds, in a Spark job of its own."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from streamops.hooks.stream import StreamHook
from streamops.operators import job_path
from streamops.operators.quality import point_job

STATE_JOB = job_path("state.py")


class InspectStateOperator(SparkSubmitOperator):
    """Read what a stream's state holds at each flow's last committed batch: the open windows,
    the deduplication keys kept, the groups of an aggregation.

    Runs ``spark_jobs/state.py`` with ``spark-submit`` (where: the Spark connection), a job of
    its own beside the stream's driver, which it never touches: Spark's state data sources read
    the checkpoint's committed state. The result goes to ``_control/state.json``, which the
    stream's page shows; it is logged per flow and returned (XCom).

    :param stream: the stream's name. (templated)
    :param spec_dir: the specs' folder (default ``$STREAMS_SPEC_DIR``).
    :param data_root: root of relative data paths (default ``$STREAMS_DATA_DIR``).
    All other arguments go to :class:`SparkSubmitOperator` (``conn_id`` picks where Spark runs).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "stream")

    def __init__(self, *, stream: str, spec_dir: str | None = None, data_root: str | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("application", STATE_JOB)
        kwargs.setdefault("name", f"state:{stream}")
        super().__init__(**kwargs)
        self.stream, self.spec_dir, self.data_root = stream, spec_dir, data_root

    def execute(self, context: Context) -> dict[str, Any]:
        hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        result_file = point_job(self, context, hook.layout.state_file.parent / "state", self.stream, self.spec_dir,
                                self.data_root)
        super().execute(context)
        try:
            result = json.loads(result_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise AirflowFailException(f"the state job of {self.stream} wrote no result") from None
        finally:
            result_file.unlink(missing_ok=True)
        for flow, found in result["flows"].items():
            for op in found["operators"]:
                self.log.info("%s at batch %s: %s (%s): %s row(s)", flow, found["batch"], op["operator"],
                              op.get("kind"), op.get("rows"))
        return result
