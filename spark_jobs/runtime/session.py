"""The one place a SparkSession is built: every job (stream, backfill, validation, demo)
and the tests use it, so a spec's ``spark.conf`` applies wherever its data is touched."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
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


#: where setup keeps the drivers' class archive (``spark_jobs.runtime.class_archive``), one file per key
CLASS_ARCHIVE_DIR = Path(__file__).resolve().parents[2] / ".jars" / "class-archive"
CLASS_ARCHIVE_ENV = "STREAMS_CLASS_ARCHIVE"  # another file to use, or empty for none
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: what else decides a driver's class path (Spark's launcher reads them)
CLASS_PATH_ENV = ("SPARK_HOME", "SPARK_CONF_DIR", "SPARK_CLASSPATH", "SPARK_DIST_CLASSPATH", "HADOOP_CONF_DIR",
                  "YARN_CONF_DIR")


def _spark_jars() -> Path | None:
    """The folder of Spark's jars that drivers load: ``$SPARK_HOME/jars``, else pip's pyspark's."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"]) / "jars"
    found = importlib.util.find_spec("pyspark")
    return Path(found.origin).parent / "jars" if found and found.origin else None


def _java_home() -> Path | None:
    """The JDK that ``spark-submit`` starts: ``$JAVA_HOME``, else the ``java`` on the PATH."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    return Path(os.path.realpath(java)).parents[1] if java else None


def class_archive_key() -> str | None:
    """A key over what the drivers' class archive is valid for: the JVM's modules, every jar of
    Spark's, the platform's jar and the environment that changes the class path; None without a
    JVM or Spark. The JVM maps an archive only for the exact class path it was made with."""
    home, jars = _java_home(), _spark_jars()
    if home is None or jars is None or not jars.is_dir():
        return None
    files = [home / "lib" / "modules", *sorted(jars.glob("*.jar"))]
    platform_jar = local_fs_conf().get("spark.driver.extraClassPath")
    files += [Path(platform_jar)] if platform_jar else []
    digest = hashlib.sha256(json.dumps({name: os.environ.get(name) for name in CLASS_PATH_ENV}).encode())
    for f in files:
        try:
            st = f.stat()
        except OSError:
            return None
        digest.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def class_archive_path() -> Path | None:
    """Where the class archive for this machine's JVM and jars is (or goes); None if none can be."""
    if CLASS_ARCHIVE_ENV in os.environ:
        return Path(os.environ[CLASS_ARCHIVE_ENV]) if os.environ[CLASS_ARCHIVE_ENV] else None
    k = class_archive_key()
    return CLASS_ARCHIVE_DIR / f"{k}.jsa" if k else None


def class_archive_conf(own: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The driver's JVM option that maps the class archive (Spark's classes parsed and verified
    once: a quarter less CPU per start), after ``own`` (a spec's ``spark.conf``) Java options;
    nothing if there is no archive, or if ``own`` changes the driver's class path (the archive
    would not match it)."""
    own = {k: str(v) for k, v in (own or {}).items()}
    path = class_archive_path()
    if path is None or not path.is_file() or "spark.driver.extraClassPath" in own:
        return {}
    return {DRIVER_JAVA_OPTIONS: " ".join(filter(None, [own.get(DRIVER_JAVA_OPTIONS), f"-XX:SharedArchiveFile={path}"]))}


#: the JIT's first tier only (C1, no C2): for a driver that takes what waits and exits
FIRST_TIER_JIT = "-XX:TieredStopAtLevel=1"


def available_now_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` for a driver that takes what waits and exits (an available-now run): its JVM
    compiles with the JIT's first tier only. Such a run pays the JVM's start at every run, and
    the second tier's compiling is much of its CPU: with the first tier only, a scheduled run of
    the sensors stream over 4 files took 0.56 of the CPU seconds and 0.73 of the time
    (``python -m bench.scheduled_run``). Put before the spec's own Java options, which
    can undo it (``-XX:TieredStopAtLevel=4``: a run over a backlog of hours, whose hot loops
    gain from the second tier)."""
    own = conf.get(DRIVER_JAVA_OPTIONS)
    return {**conf, DRIVER_JAVA_OPTIONS: " ".join(filter(None, [FIRST_TIER_JIT, own]))}


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
    """``--conf`` arguments of :func:`local_fs_conf`, :func:`fenced_checkpoints_conf` and
    :func:`class_archive_conf`, for a driver's spark-submit command line."""
    conf = local_fs_conf() | fenced_checkpoints_conf() | class_archive_conf()
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


class NotShareable(ValueError):
    """A run's settings need a JVM of its own (:func:`shared_session`); the message names them."""


def shared_session(driver: SparkSession, spec: StreamSpec, extra: Mapping[str, Any] | None = None) -> SparkSession:
    """A session of its own for one run of ``spec`` in a shared driver (``spark_jobs/shared_driver.py``):
    the driver's JVM and SparkContext, with their settings and compiled code, and on this session
    alone the run's settings as :func:`build_session` gives them (``extra``, then the spec's
    shuffle partitions and ``spark.conf``). Raises :class:`NotShareable` for a setting only a JVM of
    its own can take (one Spark reads at its start) that the driver does not have already."""
    session = driver.newSession()
    conf = {**(extra or {}), "spark.sql.shuffle.partitions": spec.spark.shuffle_partitions, **spec.spark.conf}
    text = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in conf.items()}
    fixed = sorted(k for k, v in text.items() if not session.conf.isModifiable(k) and session.conf.get(k, None) != v)
    if fixed:
        raise NotShareable(f"stream {spec.name}: spark.conf sets {', '.join(fixed)}, which Spark reads only when a "
                           "driver starts: the stream needs a driver of its own")
    for key, value in text.items():
        if session.conf.isModifiable(key):
            session.conf.set(key, value)
    return session


def build_session(app_name: str, spec: StreamSpec | None = None, master: str | None = None,
                  extra: Mapping[str, Any] | None = None) -> SparkSession:
    """A SparkSession with the platform's settings, then ``extra`` (the job's own), then
    the spec's shuffle partitions and ``spark.conf`` (which win: a user who sets a key means it).
    ``master`` is for tests and tools, whose session also gets the connectors' jars, the
    platform's local file system and the class archive; ``spark-submit`` sets them otherwise. Delta Lake's settings
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
    if master:  # this session starts its JVM: Spark's classes from the drivers' archive
        conf.update(class_archive_conf({**(extra or {}), **(spec.spark.conf if spec is not None else {})}))
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
