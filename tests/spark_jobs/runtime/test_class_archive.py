"""The drivers' class archive: keyed on what it is valid for, given to every driver, and mapped by
a real driver's JVM (which refuses an archive that does not match its class path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs import submit
from spark_jobs.runtime import session
from spark_jobs.stream_spec.loading import load_spec

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def spark_home(tmp_path: Path, monkeypatch) -> Path:
    """A Spark home of two jars, and no archive named by the environment."""
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    for name in ("spark-core.jar", "spark-sql.jar"):
        (jars / name).write_bytes(b"jar")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.delenv(session.CLASS_ARCHIVE_ENV, raising=False)
    monkeypatch.setattr(session, "CLASS_ARCHIVE_DIR", tmp_path / "archives")
    return tmp_path / "spark"


def test_the_key_changes_with_any_jar_and_with_the_class_path_environment(spark_home: Path, monkeypatch) -> None:
    before = session.class_archive_key()
    assert before is not None and session.class_archive_key() == before
    (spark_home / "jars" / "spark-sql.jar").write_bytes(b"another jar")
    changed = session.class_archive_key()
    assert changed != before
    monkeypatch.setenv("SPARK_CONF_DIR", str(spark_home / "conf"))
    assert session.class_archive_key() not in (before, changed)
    (spark_home / "jars" / "spark-extra.jar").write_bytes(b"jar")
    assert session.class_archive_path().parent == session.CLASS_ARCHIVE_DIR


def test_no_archive_no_option_and_a_spec_s_own_class_path_gets_none(spark_home: Path) -> None:
    assert session.class_archive_conf() == {}  # not made yet
    path = session.class_archive_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    option = f"-XX:SharedArchiveFile={path}"
    assert session.class_archive_conf() == {session.DRIVER_JAVA_OPTIONS: option}
    # a spec's own Java options stay, the archive's follow
    assert session.class_archive_conf({session.DRIVER_JAVA_OPTIONS: "-Dx=1"}) == {
        session.DRIVER_JAVA_OPTIONS: f"-Dx=1 {option}"}
    # a class path of the spec's own would not match the archive's: the JVM would refuse it
    assert session.class_archive_conf({"spark.driver.extraClassPath": "/opt/mine.jar"}) == {}


def test_every_driver_and_a_tool_s_session_get_the_archive_with_a_spec_s_java_options(
        spark_home: Path, tmp_path: Path) -> None:
    path = session.class_archive_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    spec = load_spec(ROOT / "include" / "streams" / "sensors.yaml")
    own = spec.model_copy(update={"spark": spec.spark.model_copy(
        update={"conf": {session.DRIVER_JAVA_OPTIONS: "-Dmine=1"}})})
    assert submit.settings(own).conf[session.DRIVER_JAVA_OPTIONS] == f"-Dmine=1 -XX:SharedArchiveFile={path}"
    for job in ("quality", "state", "stream"):
        cmd = submit.command(job, ROOT / "include" / "streams" / "sensors.yaml", "local[2]")
        assert f"{session.DRIVER_JAVA_OPTIONS}=-XX:SharedArchiveFile={path}" in cmd, job


def test_a_driver_maps_the_archive_setup_made(tmp_path: Path) -> None:
    """The archive ``./platform setup`` made is valid for the drivers' class path: a JVM told to
    use it or fail (``-Xshare:on``) starts, and loads Spark's classes from it."""
    path = session.class_archive_path()
    assert path is not None and path.is_file(), f"no class archive at {path}: run ./platform setup"
    script = tmp_path / "job.py"
    script.write_text("from pyspark.sql import SparkSession\n"
                      "s = SparkSession.builder.getOrCreate()\n"
                      "print('rows', s.range(5).groupBy().count().collect()[0][0])\n")
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[1]", "--conf", "spark.ui.enabled=false"]
    for key, value in submit.settings().conf.items():
        if key == session.DRIVER_JAVA_OPTIONS:
            value += " -Xshare:on -Xlog:class+load=info"
        cmd += ["--conf", f"{key}={value}"]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    result = subprocess.run([*cmd, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "rows 5" in result.stdout
    shared = sum("source: shared objects file (top)" in line for line in result.stdout.splitlines())
    assert shared > 5000, f"only {shared} classes came from the archive"
