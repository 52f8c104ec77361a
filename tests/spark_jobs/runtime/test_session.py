"""The one SparkSession builder: the platform's settings, then the job's, then the spec's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from spark_jobs.runtime.checkpoint import batch_ids
from spark_jobs.runtime.session import (
    LOCAL_FS_PACKAGE,
    SESSION_CONF,
    NotShareable,
    build_session,
    fence_lease,
    fenced_checkpoints_conf,
    local_fs_conf,
    shared_session,
)
from spark_jobs.stream_spec.layout import default_spec_dir
from spark_jobs.stream_spec.loading import parse_spec


def test_a_spec_s_spark_conf_reaches_every_session_built_for_it(spark) -> None:
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


def test_a_shared_driver_s_run_has_a_session_with_the_driver_s_settings_and_its_own_alone(spark) -> None:
    data = yaml.safe_load((default_spec_dir() / "sensors.yaml").read_text())
    data["spark"] = {"conf": {"spark.sql.ansi.enabled": False}, "shuffle_partitions": 3}
    run = shared_session(spark, parse_spec(data), {"spark.sql.streaming.stopTimeout": "60s"})
    for key, value in SESSION_CONF.items():  # the driver's, from when its JVM started
        assert run.conf.get(key) == value
    assert [run.conf.get(k) for k in ("spark.sql.ansi.enabled", "spark.sql.shuffle.partitions",
                                      "spark.sql.streaming.stopTimeout")] == ["false", "3", "60s"]
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2" and run.sparkContext is spark.sparkContext
    data["spark"] = {"conf": {"spark.sql.codegen.cache.maxEntries": 10}}  # read when a JVM starts
    with pytest.raises(NotShareable, match="spark.sql.codegen.cache.maxEntries"):
        shared_session(spark, parse_spec(data))
    data["spark"] = {"conf": {"spark.sql.codegen.cache.maxEntries": SESSION_CONF["spark.sql.codegen.cache.maxEntries"]}}
    shared_session(spark, parse_spec(data))  # what the driver has already is no reason to refuse


def test_the_session_keeps_the_code_it_compiled_for_more_plans_than_spark_s_default(spark) -> None:
    """Spark's cache of compiled classes holds 100 by default: a stream's queries use more,
    and each batch compiled again the code the batch before had evicted."""
    from pyspark.sql import functions as F

    compiled = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    # each plan's code differs (its constant is written into it): a class or two each
    plans = [spark.range(3).select((F.col("id") * 7 + i).alias("v")).where(F.col("v") > i) for i in range(1000, 1080)]

    def run_all() -> int:
        before = compiled.getCount()
        for plan in plans:
            plan.collect()
        return compiled.getCount() - before

    assert run_all() > 100  # more classes than Spark's default cache holds
    assert run_all() == 0


def test_file_paths_go_through_the_platform_s_local_file_system_which_starts_no_process(
        spark, tmp_path, missing_system_package) -> None:
    """Hadoop's local file system, without its native library, starts ``chmod`` for every file
    it creates and ``readlink`` for every rename of a FileContext (checkpoint files); the
    platform's does both in the JVM, with the same outcome."""
    if not local_fs_conf():
        missing_system_package("a JDK (javac), to build the platform's local file system (./platform setup)")
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    uri = jvm.java.net.URI.create("file:///")
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(uri, conf)
    assert fs.getClass().getName() == f"{LOCAL_FS_PACKAGE}.ForklessLocalFileSystem"
    assert fs.getRawFileSystem().getClass().getName() == f"{LOCAL_FS_PACKAGE}.ForklessRawLocalFileSystem"
    fc = jvm.org.apache.hadoop.fs.FileContext.getFileContext(uri, conf)
    assert fc.getDefaultFileSystem().getClass().getName() == f"{LOCAL_FS_PACKAGE}.ForklessLocalFs"

    # twenty files written and renamed as a checkpoint log writes them: Hadoop's own starts at
    # least one process for each, every time. The count is the machine's: other work (another
    # test worker's Python workers) may start some meanwhile, so the quietest of three rounds counts
    gateway = spark.sparkContext._gateway
    parent = gateway.new_array(jvm.org.apache.hadoop.fs.Options.CreateOpts, 1)
    parent[0] = jvm.org.apache.hadoop.fs.Options.CreateOpts.createParent()
    started_per_round = []
    for round_ in range(3):
        started = _processes_started()
        for i in range(20):
            temporary, final = (jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/log{round_}/{name}")
                                for name in (f".{i}.tmp", str(i)))
            out = fc.create(temporary, jvm.java.util.EnumSet.of(jvm.org.apache.hadoop.fs.CreateFlag.CREATE),
                            parent)
            out.write(b"v1")
            out.close()
            fc.rename(temporary, final, gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 0))
        started_per_round.append(_processes_started() - started)
        assert sorted(p.name for p in (tmp_path / f"log{round_}").iterdir() if not p.name.startswith(".")) == sorted(
            str(i) for i in range(20))
    assert min(started_per_round) < 10, f"the JVM starts processes to write files: {started_per_round}"

    path = jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/dir/a.txt")
    mode = jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o640)
    out = fs.create(path, mode, True, 4096, 1, 1 << 20, None)  # a new directory too
    out.write(b"one")
    out.close()
    assert (tmp_path / "dir" / "a.txt").read_bytes() == b"one"
    assert oct((tmp_path / "dir" / "a.txt").stat().st_mode & 0o777) == oct(0o640 & ~_umask())
    fs.setPermission(path, jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o600))
    assert oct((tmp_path / "dir" / "a.txt").stat().st_mode & 0o777) == "0o600"

    # a FileContext rename, as Spark's checkpoint logs commit a file: refused onto an existing
    # file unless told to overwrite, as Hadoop's own
    (tmp_path / "dir" / "b.txt").write_text("two")
    rename = jvm.org.apache.hadoop.fs.Options.Rename
    target = jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/dir/b.txt")
    none = gateway.new_array(rename, 1)
    none[0] = rename.NONE
    with pytest.raises(Exception, match="FileAlreadyExists|already exists"):
        fc.rename(path, target, none)
    overwrite = gateway.new_array(rename, 1)
    overwrite[0] = rename.OVERWRITE
    fc.rename(path, target, overwrite)
    assert (tmp_path / "dir" / "b.txt").read_bytes() == b"one" and not (tmp_path / "dir" / "a.txt").exists()
    with pytest.raises(Exception, match="FileNotFound|does not exist"):
        fc.getFileLinkStatus(path)
    # a symbolic link is still one
    (tmp_path / "link").symlink_to(tmp_path / "dir" / "b.txt")
    status = fs.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/link"))
    assert status.getLen() == 3


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _processes_started() -> int:
    """How many processes this machine has started since it booted (the JVM's among them)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("processes "):
            return int(line.split()[1])
    raise AssertionError("no process count in /proc/stat")


def test_spark_writes_no_checkpoint_file_once_its_driver_lost_the_lease(spark, tmp_path: Path,
                                                                         missing_system_package) -> None:
    """The JVM of a driver that lost its lease (paused, then resumed after another took the
    stream over) commits nothing of a query that needs no Python: no offsets, no commit, no sink log."""
    import json

    from pyspark.errors import StreamingQueryException

    from spark_jobs.runtime.lease import DriverLease, Holder, create_record, record_path

    if not fenced_checkpoints_conf():
        missing_system_package("a JDK (javac), to build the platform's JVM classes (./platform setup)")
    lease = DriverLease(tmp_path / "_control", stream="s", ttl=30, on_lost=lambda problem: None).acquire()
    landing, checkpoint, out = tmp_path / "in", tmp_path / "checkpoint", tmp_path / "out"
    landing.mkdir()

    def land(n: int) -> None:
        (landing / f"{n}.json").write_text(json.dumps({"v": n}) + "\n")

    def batches(log: str) -> list[str]:
        return sorted(p.name for p in (checkpoint / log).iterdir() if p.name.isdigit())

    land(0)
    fence_lease(spark, lease.records_dir, lease.epoch)
    query = None
    try:
        query = (spark.readStream.schema("v INT").json(str(landing)).writeStream.format("parquet")
                 .option("checkpointLocation", str(checkpoint)).start(str(out)))
        query.processAllAvailable()
        assert batches("commits") == ["0"]

        # its heartbeat stops (a paused driver): older than half the ttl, nothing more is written
        lease._stop.set()  # its heartbeat thread ends
        lease._thread.join()
        record = json.loads(record_path(lease.dir, lease.epoch).read_text())
        record_path(lease.dir, lease.epoch).write_text(json.dumps({**record, "heartbeat_at": record["heartbeat_at"] - 16}))
        land(1)
        with pytest.raises(StreamingQueryException, match="stream lease lost .*heartbeat .* more than half its ttl"):
            query.processAllAvailable()
        assert batches("offsets") == ["0"] and batches("commits") == ["0"]
        assert sorted(p.name for p in (out / "_spark_metadata").iterdir() if p.name.isdigit()) == ["0"]

        # a driver that took the stream over (epoch 2) writes on; this one is refused, naming it
        query = (spark.readStream.schema("v INT").json(str(landing)).writeStream.format("parquet")
                 .option("checkpointLocation", str(checkpoint)).start(str(out)))
        create_record(lease.dir, lease.epoch + 1, Holder(host="elsewhere", pid=1, started_at=0, heartbeat_at=0))
        with pytest.raises(StreamingQueryException, match="epoch 2 of the lease took the stream over"):
            query.processAllAvailable()
        assert batches("offsets") == ["0"]

        # a session that holds no lease (a backfill) is fenced by none
        fence_lease(spark, None, None)
        query = (spark.readStream.schema("v INT").json(str(landing)).writeStream.format("parquet")
                 .option("checkpointLocation", str(checkpoint)).start(str(out)))
        query.processAllAvailable()
        assert batches("commits") == ["0", "1"]
    finally:
        if query is not None:
            query.stop()
        fence_lease(spark, None, None)
        lease.release()  # this process holds no lease any more (spark_jobs.runtime.lease.fence)


def test_a_batch_whose_commit_and_sink_log_files_were_lost_is_replayed_over_their_checksum_files(
        spark, tmp_path: Path) -> None:
    """As ``rm`` loses a file, its checksum file ``.<n>.crc`` stays; without the platform's
    checkpoint manager (the session's), the replay's rename of the file fails on it."""
    landing, checkpoint, sink = tmp_path / "in", tmp_path / "ck", tmp_path / "out"
    landing.mkdir()

    def run() -> None:
        query = (spark.readStream.schema("a INT").json(str(landing)).writeStream.format("parquet")
                 .option("checkpointLocation", str(checkpoint)).option("path", str(sink))
                 .trigger(availableNow=True).start())
        query.awaitTermination()

    for batch in range(2):
        (landing / f"{batch}.json").write_text(f'{{"a": {batch}}}\n')
        run()
    for log in (checkpoint / "commits", sink / "_spark_metadata"):
        (log / "1").unlink()
        assert (log / ".1.crc").exists()

    run()
    assert batch_ids(checkpoint, "commits") == [0, 1]
    assert (sink / "_spark_metadata" / "1").exists()
    assert sorted(r.a for r in spark.read.parquet(str(sink)).collect()) == [0, 1]


def test_a_job_that_yields_the_cpu_lowers_every_thread_of_its_own() -> None:
    import subprocess
    import sys

    script = ("import os, threading, time; from spark_jobs.runtime.session import yield_cpu\n"
              "t = threading.Thread(target=time.sleep, args=(1,)); t.start()\n"
              "print(yield_cpu(), os.getpriority(os.PRIO_PROCESS, 0), os.getpriority(os.PRIO_PROCESS, t.native_id))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) >= 2 and out[1:] == ["19", "19"]  # the main thread and the other one
