"""How every driver of the platform is submitted: one helper for the stream's DAG, its standby,
the backfill, quality, state and maintenance jobs, and a run by hand.

    python -m spark_jobs.submit stream --spec include/streams/sensors.yaml [--master 'local[2]'] [-- job args]

runs ``spark-submit`` with what every driver needs: the connectors' jars (Kafka, Delta Lake) and
the platform's JVM classes (its local file system, its fenced checkpoint manager) on the class
path, Spark's classes mapped from the drivers' class archive
(``spark_jobs.runtime.session.class_archive_conf``), an available-now run's JVM with the JIT's first
tier only (``available_now_conf``), the spec's shuffle partitions, ``spark.conf`` and driver memory,
and the project's Python for the workers. ``stream`` is ``spark_jobs/stream_job.py``; ``backfill``, ``quality``,
``state`` and ``maintenance`` are the other jobs; ``shared-driver --queue <folder>`` starts a
shared driver (``spark_jobs/shared_driver.py``). ``--dry-run`` prints the command.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from spark_jobs.runtime.session import (
    available_now_conf,
    class_archive_conf,
    connector_jars,
    fenced_checkpoints_conf,
    local_fs_conf,
)
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import SpecError, StreamSpec

JOBS_DIR = Path(__file__).resolve().parent
#: each job's entry point (``spark_jobs/<file>``)
JOBS = {"stream": "stream_job.py", "backfill": "backfill.py", "quality": "quality_job.py", "state": "state.py",
        "maintenance": "maintenance.py", "upgrade": "upgrade.py"}
#: the driver that takes many scheduled streams' runs (no spec of its own), and its job's name here
SHARED_DRIVER, SHARED = JOBS_DIR / "shared_driver.py", "shared-driver"


def job_path(job: str) -> str:
    """The file spark-submit runs for a job (:data:`JOBS`)."""
    return str(JOBS_DIR / JOBS[job])


@dataclass(frozen=True)
class Settings:
    """What spark-submit gets beside the job: ``--jars`` and ``--conf``, and the driver's memory."""

    jars: list[str] = field(default_factory=list)
    conf: dict[str, str] = field(default_factory=dict)
    driver_memory: str | None = None
    executor_memory: str | None = None


def settings(spec: StreamSpec | None = None) -> Settings:
    """The platform's settings for a driver: its JVM classes and fenced checkpoints if built, the class
    archive if made, the connectors' jars if fetched; for a stream's driver (``spec``) also the spec's shuffle partitions
    and ``spark.conf`` (which win; a class path of the spec's keeps the platform's jar after it)."""
    conf = local_fs_conf() | fenced_checkpoints_conf()
    archive = class_archive_conf(spec.spark.conf if spec is not None else None)  # the spec's own class path decides
    memory = executor = None
    if spec is not None:
        own = {k: str(v) for k, v in spec.spark.conf.items()}
        for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
            if key in own and key in conf:  # the spec's class path, and the platform's jar
                own[key] = f"{own[key]}{os.pathsep}{conf[key]}"
        conf |= {"spark.sql.shuffle.partitions": str(spec.spark.shuffle_partitions), **own}
        memory, executor = spec.spark.driver_memory, spec.spark.executor_memory
    return Settings(connector_jars(), conf | archive, memory, executor)


def _available_now(job_args: list[str]) -> bool:
    return any(a == "--trigger" and b == "available-now" for a, b in zip(job_args, job_args[1:], strict=False))


def command(job: str, spec_file: str | os.PathLike[str], master: str, job_args: list[str] | None = None,
            spec: StreamSpec | None = None) -> list[str]:
    """The spark-submit command line of ``job`` for the stream of ``spec_file``."""
    spec = spec or load_spec(spec_file)
    s = settings(spec if job == "stream" else None)
    if job == "stream" and _available_now(job_args or []):
        s = replace(s, conf=available_now_conf(s.conf))
    return [*_spark_submit(s, master, f"{job}:{spec.name}"), job_path(job), "--spec", str(spec_file), *(job_args or [])]


def shared_driver_command(queue: str | os.PathLike[str], master: str, driver_memory: str = "1g") -> list[str]:
    """The spark-submit command line of a shared driver (``spark_jobs/shared_driver.py``) that
    serves ``queue``: the platform's settings, none of a stream's (each run sets its own)."""
    s = replace(settings(), driver_memory=driver_memory)
    return [*_spark_submit(s, master, SHARED), str(SHARED_DRIVER), "--queue", str(queue)]


def _spark_submit(s: Settings, master: str, name: str) -> list[str]:
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", master, "--name", name]
    if s.jars:
        cmd += ["--jars", ",".join(s.jars)]
    for key, value in s.conf.items():
        cmd += ["--conf", f"{key}={value}"]
    if s.driver_memory:
        cmd += ["--driver-memory", s.driver_memory]
    if s.executor_memory:
        cmd += ["--executor-memory", s.executor_memory]
    return cmd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", choices=[*sorted(JOBS), SHARED], help="which of the platform's jobs")
    p.add_argument("--spec", help="the stream's spec file (every job but a shared driver's)")
    p.add_argument("--queue", help=f"{SHARED}: the folder of its queue (spark_jobs.runtime.run_queue)")
    p.add_argument("--master", default=os.environ.get("STREAMS_SPARK_MASTER", "local[2]"),
                   help="Spark's master (default $STREAMS_SPARK_MASTER or local[2])")
    p.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    argv = list(sys.argv[1:] if argv is None else argv)
    job_args = argv[argv.index("--") + 1:] if "--" in argv else []  # after --: the job's own arguments
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if (args.job == SHARED) != (args.queue is not None) or (args.job != SHARED) == (args.spec is None):
        p.error(f"{SHARED} takes --queue and no --spec; every other job takes --spec")
    try:
        cmd = (shared_driver_command(args.queue, args.master) if args.job == SHARED
               else command(args.job, args.spec, args.master, job_args))
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    os.execve(cmd[0], cmd, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
