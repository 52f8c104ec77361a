"""``./platform demo`` submits the platform's own jobs (its whole run, 1.5 minutes, is not part of the suite)."""

from __future__ import annotations

from pathlib import Path

from runner.testdata import demo
from spark_jobs import quality_job, stream_job


def test_the_demo_submits_the_platform_s_stream_and_quality_jobs() -> None:
    assert demo.STREAM_JOB.resolve() == Path(stream_job.__file__).resolve()
    assert demo.QUALITY_JOB.resolve() == Path(quality_job.__file__).resolve()
