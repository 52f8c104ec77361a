"""The one place a SparkSession is built: every job (stream, backfill, validation, demo)
and the tests use it, so a spec's ``spark.conf`` applies wherever its data is touched."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_jobs.stream_spec.models import StreamSpec

#: Session settings every stream needs. Filter pushdown into the JSON and CSV readers is
#: off so that the ingestion's numInputRows counts every record read (the accounting of
#: input = accepted + quarantined + duplicates + dropped late relies on it).
#:
#: Spark keeps the classes it compiles from generated code in a cache of 100 by default. A
#: stream's queries (the ingestion and its outputs, each batch's stages, projections and
#: predicates) use more than that, so every batch evicted the classes the next one needed:
#: it compiled them again, and the JVM then compiled their hot methods again.
SESSION_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.json.filterPushdown.enabled": "false",
    "spark.sql.csv.filterPushdown.enabled": "false",
    "spark.sql.csv.parser.columnPruning.enabled": "false",
    "spark.sql.codegen.cache.maxEntries": "2000",
}


#: where ``./platform setup`` puts the connectors' jars (``include/deploy/maven/spark-connectors.xml``)
CONNECTORS_DIR = Path(__file__).resolve().parents[2] / ".jars" / "spark-connectors"


def connector_jars() -> list[str]:
    """The jars every driver gets (``spark-submit --jars``, ``spark.jars``) beside Spark's own:
    Spark's Kafka connector and Delta Lake, from ``$STREAMS_CONNECTOR_JARS`` (a folder) if set,
    none if setup has not fetched them (a Kafka stream then fails its analysis, a Delta table
    its first write, saying so); and the
    platform's local file system (:func:`local_fs_conf`) if built, for executors elsewhere."""
    folder = Path(os.environ.get("STREAMS_CONNECTOR_JARS", CONNECTORS_DIR))
    local_fs = local_fs_conf().get("spark.driver.extraClassPath")
    return sorted(str(p) for p in folder.glob("*.jar")) + ([local_fs] if local_fs else [])


#: where ``./platform setup`` builds the platform's Hadoop local file system (``include/deploy/java``)
LOCAL_FS_JAR = Path(__file__).resolve().parents[2] / ".jars" / "local-fs" / "local-fs.jar"
LOCAL_FS_PACKAGE = "streams.platform.hadoop"


def local_fs_conf() -> dict[str, str]:
    """Spark settings that send ``file:`` paths through the platform's local file system
    (``include/deploy/java``): Hadoop's own, except that it sets permissions and looks for
    symbolic links in the JVM, where Hadoop without its native library starts a ``chmod`` or
    ``readlink`` process, dozens per micro-batch.

    For spark-submit's command line: the class must be on the driver's class path before it
    touches its first file. Executors find it at the same path where it exists (the compose
    file's Spark workers), else through ``--jars`` (:func:`connector_jars`). A session with a
    master (:func:`build_session`) gets it too. From ``$STREAMS_LOCAL_FS_JAR`` if set (empty:
    none); none if setup has not built it, and Hadoop's stock one serves."""
    jar = os.environ.get("STREAMS_LOCAL_FS_JAR", str(LOCAL_FS_JAR))
    if not jar or not Path(jar).is_file():
        return {}
    return {"spark.driver.extraClassPath": jar, "spark.executor.extraClassPath": jar,
            "spark.hadoop.fs.file.impl": f"{LOCAL_FS_PACKAGE}.ForklessLocalFileSystem",
            "spark.hadoop.fs.AbstractFileSystem.file.impl": f"{LOCAL_FS_PACKAGE}.ForklessLocalFs"}


#: The platform's checkpoint manager (``include/deploy/java``, in the same jar): Spark's own, with
#: every checkpoint file it writes or deletes fenced by the stream's lease (:func:`fence_lease`).
FENCED_CHECKPOINTS = "streams.platform.streaming.FencedCheckpointFileManager"
LEASE_DIR_CONF, LEASE_EPOCH_CONF = "spark.streams.lease.dir", "spark.streams.lease.epoch"


def fenced_checkpoints_conf() -> dict[str, str]:
    """Spark settings that send its checkpoint writes through :data:`FENCED_CHECKPOINTS`, if the
    platform's jar is built (:func:`local_fs_conf` puts it on the class path); else none, and only
    the driver's Python fences its lease. Without a lease (:func:`fence_lease`), it fences nothing."""
    return {"spark.sql.streaming.checkpointFileManagerClass": FENCED_CHECKPOINTS} if local_fs_conf() else {}


def fence_lease(spark: SparkSession, lease_dir: str | os.PathLike[str] | None, epoch: int | None) -> None:
    """Fence the checkpoint files of the queries this session starts from now on by the lease's
    ``epoch`` (``None``: fence nothing). A driver calls it once it holds the lease, before its
    queries start: a JVM that runs on after its driver lost the lease (paused with it, then
    resumed) writes no checkpoint file, whatever it had in flight."""
    if lease_dir is None or epoch is None:
        spark.conf.unset(LEASE_DIR_CONF)
        spark.conf.unset(LEASE_EPOCH_CONF)
    else:
        spark.conf.set(LEASE_DIR_CONF, str(lease_dir))
        spark.conf.set(LEASE_EPOCH_CONF, str(epoch))


#: Delta Lake's session settings: its SQL commands (OPTIMIZE, VACUUM) and its DeltaTable API
#: (MERGE) need its extension and catalog. A table's log is replayed in a few tasks, not 50
#: (the platform's tables are many and small; a spec's ``spark.conf`` can raise it).
DELTA_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "4",
}
DELTA_JAR_PREFIX = "delta-spark_"


def delta_conf() -> dict[str, str]:
    """:data:`DELTA_CONF` if setup has fetched Delta's jars, else nothing (a Delta table then
    fails its first write: "Failed to find the data source: delta")."""
    return dict(DELTA_CONF) if any(Path(j).name.startswith(DELTA_JAR_PREFIX) for j in connector_jars()) else {}


def uses_delta(spec: StreamSpec) -> bool:
    """Whether a stream keeps any Delta table: then its sessions get :func:`delta_conf`."""
    return spec.accepted.format == "delta" or any(o.sink.type == "delta" for o in spec.outputs)


def submit_args() -> list[str]:
    """``--conf`` arguments of :func:`local_fs_conf` and :func:`fenced_checkpoints_conf`, for a
    driver's spark-submit command line."""
    conf = local_fs_conf() | fenced_checkpoints_conf()
    return [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]


#: the niceness of a job that must not slow the stream it looks at (the lowest priority there is)
BACKGROUND_NICENESS = 19


def yield_cpu(niceness: int = BACKGROUND_NICENESS) -> int:
    """Lower the CPU priority of this job: every thread of this process and, when spark-submit
    started it, of its driver's JVM (the parent; a Linux niceness is a thread's, and threads
    started later inherit their starter's). A job beside a running stream on the same cores (the
    state job) then takes only the CPU the stream leaves. Returns the threads lowered (0 where
    the system has no ``/proc``)."""
    pids = [os.getpid()]
    try:
        parent = os.getppid()
        if Path(f"/proc/{parent}/comm").read_text().strip() == "java":
            pids.append(parent)
    except OSError:
        pass
    lowered = 0
    for pid in pids:
        try:
            threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in threads:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, max(niceness, os.getpriority(os.PRIO_PROCESS, tid)))
                lowered += 1
            except OSError:  # a thread that ended meanwhile
                continue
    return lowered


def build_session(app_name: str, spec: StreamSpec | None = None, master: str | None = None,
                  extra: Mapping[str, Any] | None = None) -> SparkSession:
    """A SparkSession with the platform's settings, then ``extra`` (the job's own), then
    the spec's shuffle partitions and ``spark.conf`` (which win: a user who sets a key means it).
    ``master`` is for tests and tools, whose session also gets the connectors' jars and the
    platform's local file system; ``spark-submit`` sets them otherwise. Delta Lake's settings
    go to a session with a master and to one for a stream with Delta tables; they are static,
    so they must be set here, before the session exists."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    builder = builder.config("spark.log.level", os.environ.get("STREAMS_SPARK_LOG_LEVEL", "WARN"))
    conf: dict[str, Any] = dict(SESSION_CONF)
    if master:
        conf.update(local_fs_conf() | fenced_checkpoints_conf())
        if connector_jars():
            conf["spark.jars"] = ",".join(connector_jars())
    if master or (spec is not None and uses_delta(spec)):
        conf.update(delta_conf())
    conf.update(extra or {})
    if spec is not None:
        conf["spark.sql.shuffle.partitions"] = spec.spark.shuffle_partitions
        conf.update(spec.spark.conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
