"""One way to submit a driver (spark_jobs/submit.py): the DAGs' and a run by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from examples import example_spec, include_with

from spark_jobs import submit
from spark_jobs.runtime.session import (
    DRIVER_JAVA_OPTIONS,
    FENCED_CHECKPOINTS,
    FIRST_TIER_JIT,
    connector_jars,
    local_fs_conf,
)


def test_a_stream_s_driver_gets_the_platform_s_classes_and_the_spec_s_settings(tmp_path: Path) -> None:
    data = example_spec("sensors") | {"spark": {"shuffle_partitions": 3, "driver_memory": "2g",
                                                "conf": {"spark.driver.extraClassPath": "/opt/udfs.jar"}}}
    spec_file = include_with(tmp_path / "include", data) / "sensors.yaml"
    cmd = submit.command("stream", spec_file, "local[2]", ["--trigger", "available-now"])
    assert cmd[0] == str(Path(sys.executable).parent / "spark-submit") and cmd[1:3] == ["--master", "local[2]"]
    assert cmd[-5:] == [submit.job_path("stream"), "--spec", str(spec_file), "--trigger", "available-now"]
    assert cmd[-5].endswith("spark_jobs/stream_job.py") and Path(cmd[-5]).is_file()
    conf = dict(cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "--conf")
    assert conf["spark.sql.shuffle.partitions"] == "3" and cmd[cmd.index("--driver-memory") + 1] == "2g"
    if local_fs_conf():  # setup built the platform's jar: every driver gets it and the fenced checkpoints
        jar = local_fs_conf()["spark.driver.extraClassPath"]
        assert conf["spark.driver.extraClassPath"] == f"/opt/udfs.jar:{jar}"
        assert conf["spark.sql.streaming.checkpointFileManagerClass"] == FENCED_CHECKPOINTS
    if connector_jars():
        assert cmd[cmd.index("--jars") + 1] == ",".join(connector_jars())
    # an available-now run's JVM compiles with the JIT's first tier only, the spec's Java options after it
    assert conf[DRIVER_JAVA_OPTIONS].split()[0] == FIRST_TIER_JIT
    continuous = submit.command("stream", spec_file, "local[2]")
    assert FIRST_TIER_JIT not in " ".join(continuous)
    own = data | {"spark": {"conf": {DRIVER_JAVA_OPTIONS: "-XX:TieredStopAtLevel=4"}}}
    own_file = include_with(tmp_path / "own", own) / "sensors.yaml"
    own_cmd = submit.command("stream", own_file, "local[2]", ["--trigger", "available-now"])
    options = dict(own_cmd[i + 1].split("=", 1) for i, arg in enumerate(own_cmd) if arg == "--conf")[DRIVER_JAVA_OPTIONS]
    assert options.split()[:2] == [FIRST_TIER_JIT, "-XX:TieredStopAtLevel=4"]  # the JVM takes the last: the spec's
    quality = submit.command("quality", spec_file, "spark://master:7077")
    assert "spark.sql.shuffle.partitions" not in " ".join(quality)  # the stream's settings are its driver's
    assert quality[-3:] == [submit.job_path("quality"), "--spec", str(spec_file)]


def test_a_shared_driver_gets_the_platform_s_settings_and_no_stream_s(tmp_path: Path, capsys) -> None:
    cmd = submit.shared_driver_command(tmp_path / "queue", "local[2]")
    assert cmd[-3:] == [str(submit.SHARED_DRIVER), "--queue", str(tmp_path / "queue")] and submit.SHARED_DRIVER.is_file()
    conf = dict(cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "--conf")
    assert "spark.sql.shuffle.partitions" not in conf and FIRST_TIER_JIT not in conf.get(DRIVER_JAVA_OPTIONS, "")
    assert conf.items() >= local_fs_conf().items() and cmd[cmd.index("--driver-memory") + 1] == "1g"
    assert submit.main([submit.SHARED, "--queue", str(tmp_path / "queue"), "--dry-run"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"shared_driver.py --queue {tmp_path / 'queue'}")
    with pytest.raises(SystemExit):  # a shared driver has no spec of its own
        submit.main([submit.SHARED, "--queue", "q", "--spec", "s.yaml", "--dry-run"])
    assert "takes --queue and no --spec" in capsys.readouterr().err


def test_by_hand_the_command_is_printed_and_a_bad_spec_is_refused(tmp_path: Path, capsys) -> None:
    spec_file = include_with(tmp_path / "include", example_spec("sensors")) / "sensors.yaml"
    assert submit.main(["stream", "--spec", str(spec_file), "--dry-run", "--", "--trigger", "available-now"]) == 0
    printed = capsys.readouterr().out
    assert "spark-submit --master 'local[2]'" in printed and printed.rstrip().endswith("--trigger available-now")
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"name": "broken"}))
    assert submit.main(["stream", "--spec", str(broken), "--dry-run"]) == 2
    assert "broken.yaml" in capsys.readouterr().err
