"""The frames a plan describes: reference data checked once per version of its files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from spark_jobs.frames import reference_frame
from spark_jobs.plan import JoinPlan
from spark_jobs.stream_spec.models import Column


def devices(path: Path) -> JoinPlan:
    return JoinPlan("devices", str(path), "csv", [Column(name="device_id", type="string"),
                                                  Column(name="site", type="string")], ["device_id"], "left")


def jobs_run(spark, group: str, action) -> tuple[object, int]:
    """``action()``'s result and the Spark jobs it ran."""
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        result = action()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return result, len(sc.statusTracker().getJobIdsForGroup(group))


def test_a_check_of_reference_data_is_recorded_and_reused_until_its_files_change(spark, tmp_path: Path) -> None:
    ref, checks = tmp_path / "devices.csv", tmp_path / "checks"
    ref.write_text("site,device_id\nnorth,dev-001\nsouth,dev-002\n")
    join = devices(ref)

    first, jobs = jobs_run(spark, "first", lambda: reference_frame(spark, join, str(checks)))
    assert jobs >= 2  # the header, then the keys
    record = json.loads((checks / "devices.json").read_text())
    assert record["key"] == ["device_id"] and [f[1] for f in record["files"]] == [ref.stat().st_size]

    again, jobs = jobs_run(spark, "again", lambda: reference_frame(spark, join, str(checks)))
    assert jobs == 0  # nothing read until a batch joins it
    assert sorted(map(tuple, again.collect())) == sorted(map(tuple, first.collect())) == [
        ("dev-001", "north"), ("dev-002", "south")]

    # the file changed (a repeated key, same size, another modification time): checked again
    ref.write_text("site,device_id\nnorth,dev-001\nsouth,dev-001\n")
    os.utime(ref, ns=(ref.stat().st_atime_ns, ref.stat().st_mtime_ns + 2_000_000_000))
    with pytest.raises(ValueError, match=r"reference data 'devices' .* has key\(s\) \['device_id'\] more than once"):
        reference_frame(spark, join, str(checks))


def test_a_record_for_another_key_or_a_damaged_one_is_not_trusted(spark, tmp_path: Path) -> None:
    ref, checks = tmp_path / "devices.csv", tmp_path / "checks"
    ref.write_text("device_id,site\ndev-001,north\ndev-001,south\n")  # unique by site, not by device
    by_site = JoinPlan("devices", str(ref), "csv", devices(ref).columns, ["site"], "left")
    reference_frame(spark, by_site, str(checks))
    with pytest.raises(ValueError, match="more than once"):
        reference_frame(spark, devices(ref), str(checks))
    (checks / "devices.json").write_text("{not json")
    _, jobs = jobs_run(spark, "damaged", lambda: reference_frame(spark, by_site, str(checks)))
    assert jobs >= 2
