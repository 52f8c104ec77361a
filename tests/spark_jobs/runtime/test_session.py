"""The one SparkSession builder: the platform's settings, then the job's, then the spec's own."""

from __future__ import annotations

import yaml

from spark_jobs.runtime.session import (
    SESSION_CONF,
    build_session,
)
from spark_jobs.spec.layout import default_spec_dir
from spark_jobs.spec.loading import parse_spec


def test_a_spec_s_spark_conf_reaches_every_session_built_for_it(spark) -> None:  # noqa: ANN001
    data = yaml.safe_load((default_spec_dir() / "sensors.yaml").read_text())
    data["spark"] = {"conf": {"spark.sql.streaming.numRecentProgressUpdates": "7",
                              "spark.sql.session.timeZone": "UTC"}, "shuffle_partitions": 3}
    spec = parse_spec(data)
    before = {k: spark.conf.get(k) for k in ("spark.sql.streaming.numRecentProgressUpdates",
                                             "spark.sql.shuffle.partitions")}
    try:
        # the tests' shared session is returned, with the spec's runtime settings applied to it
        session = build_session("backfill:sensors", spec, extra={"spark.sql.shuffle.partitions": 9})
        assert session.conf.get("spark.sql.streaming.numRecentProgressUpdates") == "7"
        assert session.conf.get("spark.sql.shuffle.partitions") == "3"  # the spec's, over the job's
        for key, value in SESSION_CONF.items():
            assert session.conf.get(key) == value
    finally:
        for key, value in before.items():
            spark.conf.set(key, value)
