"""The operator that validates a stream's sinks with Great Expectations: in its own task
without a JVM when it can, else with ``spark-submit``."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from spark_jobs.stream_spec.layout import default_spec_dir
from streamops import STREAMS_URL
from streamops.hooks.stream import StreamHook
from streamops.operators import job_path

QUALITY_JOB = job_path("quality_job.py")
KEEP_RESULTS = 200
#: what a validation run's id may be (``20260101T000000Z-1a2b3c``, or one a caller chose)
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,99}$")


class ValidateStreamOperator(SparkSubmitOperator):
    """Validate what a stream wrote: every unit closed since the last run, a backfilled range,
    or the units of an earlier run again.

    What closed since the last run is validated here, in the task's own process, without a
    JVM (``quality_job.run_without_spark``: pyarrow or deltalake and Great Expectations' pandas
    engine; the same suites, results, ledger and Data Docs), unless that run needs Spark: a
    transform or a SQL output, an expectation only Spark computes so, or more rows of an output
    than the rules' ``pandas_max_rows`` (it says so before validating anything). Then, and for
    a backfilled range or an earlier run again, it runs ``spark_jobs/quality_job.py`` with
    ``spark-submit`` (where: the Spark connection). Either way it reads the run's result: it
    logs what was validated and the accounting, and fails with a readable summary (which
    checks, which units, how many rows, example values) when a check failed, so the task's
    failure callback alerts. The stream itself is never touched. Returns the run's counts (XCom).

    :param stream: the stream's name. (templated)
    :param backfill_start: with ``backfill_end``, validate that backfilled range instead. (templated)
    :param backfill_end: see ``backfill_start``. (templated)
    :param again: the id of an earlier validation run: validate the units it validated again,
        as of the versions of the Delta tables it read, and fail if an answer differs. (templated)
    :param spec_dir: the specs' folder (default ``$STREAMS_SPEC_DIR``).
    :param data_root: root of relative data paths (default ``$STREAMS_DATA_DIR``).
    All other arguments go to :class:`SparkSubmitOperator` (``conn_id`` picks where Spark runs).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "stream", "backfill_start",
                                      "backfill_end", "again")

    def __init__(self, *, stream: str, backfill_start: str | None = None, backfill_end: str | None = None,
                 again: str | None = None, spec_dir: str | None = None, data_root: str | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("application", QUALITY_JOB)
        kwargs.setdefault("name", f"quality:{stream}")
        super().__init__(**kwargs)
        self.stream, self.backfill_start, self.backfill_end = stream, backfill_start, backfill_end
        self.again, self.spec_dir, self.data_root = again, spec_dir, data_root

    def execute(self, context: Context) -> dict[str, Any]:
        again = (self.again or "").strip()
        if again in ("None", ""):  # an empty DAG param renders so
            again = ""
        elif not RUN_ID_PATTERN.match(again):
            raise AirflowFailException(f"again: {again[:120]!r} is not a validation run's id (letters, digits and "
                                       f"_.:+- only, e.g. 20260101T000000Z-1a2b3c from the data-quality page)")
        hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        result_file = point_job(self, context, hook.layout.quality_dir, self.stream, self.spec_dir, self.data_root)
        if self.backfill_start or self.backfill_end:
            self.application_args += ["--backfill", str(self.backfill_start), str(self.backfill_end)]
        elif again:
            self.application_args += ["--again", again]
        elif self.validate_here(hook, result_file):
            return self.report(result_file)
        super().execute(context)
        return self.report(result_file)

    def validate_here(self, hook: StreamHook, result_file: Path) -> bool:
        """Validate what closed since the last run in this process, without Spark, writing the
        result; False (nothing validated) when the run needs Spark."""
        from spark_jobs.quality.pandas_engine import NeedsSpark
        from spark_jobs.quality.rules import load_rules
        from spark_jobs.quality_job import run_without_spark
        from spark_jobs.stream_spec.models import SpecError

        try:
            result = run_without_spark(hook.plan, hook.layout, load_rules(hook.spec, hook.spec_dir))
        except NeedsSpark as exc:
            self.log.info("validating %s with Spark (spark-submit): %s", self.stream, exc)
            return False
        except SpecError as exc:
            raise AirflowFailException(str(exc)) from None
        except Exception as exc:  # whatever went wrong without Spark, the Spark job may still validate
            # the ledger is saved last: a run that failed here recorded nothing, and Spark's run takes it all up
            self.log.warning("validating %s without Spark failed (%s: %s); validating with Spark (spark-submit)",
                             self.stream, type(exc).__name__, exc, exc_info=True)
            return False
        result_file.parent.mkdir(parents=True, exist_ok=True)
        result_file.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
        return True

    def report(self, result_file: Path) -> dict[str, Any]:
        """Log a run's result; fail with its problems, or return its counts."""
        try:
            result = json.loads(result_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise AirflowFailException(f"the validation job of {self.stream} wrote no result ({exc})") from None
        prune_results(result_file.parent)
        from spark_jobs.quality_job import describe

        for line in describe(result):
            self.log.info("%s", line)
        units = [u for o in result["outputs"] for u in o["units"]]
        failed = [u for u in units if u["status"] == "failed"]
        if not result["ok"]:
            shown = "\n  - ".join(result["problems"][:20])
            more = f"\n  ... {len(result['problems']) - 20} more" if len(result["problems"]) > 20 else ""
            raise AirflowFailException(
                f"data quality of stream {self.stream} FAILED: {len(failed)} of {len(units)} unit(s) failed; "
                f"{len(result['problems'])} problem(s):\n  - {shown}{more}\n"
                f"Summary: {STREAMS_URL}/{self.stream}/quality/ in the Airflow UI ({result['summary']}).")
        return {"stream": self.stream, "units": len(units), "failed": len(failed),
                "rows": sum(u["rows"] for u in units), "accounting": (result.get("accounting") or {}).get("ok"),
                "summary": result["summary"], "engine": result.get("engine", "spark")}


def point_job(op: SparkSubmitOperator, context: Context, folder: Path, stream: str, spec_dir: str | None,
              data_root: str | None) -> Path:
    """Give a stream's job its arguments (its spec, a fresh result file named for the run under
    ``folder/runs``, the data root) and its Python; the result file's path."""
    run = context["run_id"] if "run_id" in context else "manual"
    result_file = folder / "runs" / f"{safe_name(run)}.json"
    result_file.unlink(missing_ok=True)
    op.application_args = ["--spec", f"{spec_dir or default_spec_dir()}/{stream}.yaml", "--result", str(result_file)]
    if data_root:
        op.application_args += ["--data-root", data_root]
    op.env_vars = {"PYSPARK_PYTHON": sys.executable, **(op.env_vars or {})}
    return result_file


def prune_results(folder: Path, keep: int = KEEP_RESULTS) -> None:
    """Keep the newest ``keep`` run results (the ledger keeps the history)."""
    files = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
    for old in files[:-keep]:
        old.unlink(missing_ok=True)


def safe_name(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
