"""The platform's operators, a module each: ``supervise`` (run a stream and keep it running),
``standby`` (its warm standby on another worker), ``control`` (stop and resume it), ``backfill``,
``quality``, ``state`` and ``maintenance``; ``driver`` holds what the operators that submit a
stream's driver share.

The Spark jobs they submit live in the repository's ``spark_jobs`` folder: :func:`job_path`
is the one place that finds them.
"""

from __future__ import annotations

from spark_jobs.submit import JOBS_DIR


def job_path(name: str) -> str:
    """The path of the platform's Spark job ``name`` (``stream_job.py``, ``backfill.py``...), for spark-submit:
    in the ``spark_jobs`` package (``spark_jobs.submit``, which submits a job by hand the same way)."""
    return str(JOBS_DIR / name)
