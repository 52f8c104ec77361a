"""Run the example streams end to end on generated data, and check them against the truth.

For every spec in the spec folder: generate a fixed input (with late, duplicate and
malformed events; a stream that reads a Kafka topic gets it produced to a broker on
loopback, started here unless ``KAFKA_BOOTSTRAP_SERVERS`` names one), run the stream job
through ``spark-submit`` (Spark local mode) until the input is processed, validate every sink with Great Expectations (``quality_job.py``:
closed units, accounting measured from progress events and the quarantine sink, Data
Docs), then compare every sink with the generator's ground truth. Exit status 1 if any
sink differs from the ground truth or fails validation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from runner.testdata import generate
from spark_jobs.plan import TableDataset
from spark_jobs.runtime.session import connector_jars, submit_args
from spark_jobs.stream_spec.layout import (
    Layout,
    default_data_root,
    default_spec_dir,
    redact,
)
from spark_jobs.stream_spec.loading import load_specs
from spark_jobs.stream_spec.models import KafkaSource
from spark_jobs.submit import job_path

STREAM_JOB = Path(job_path("stream"))
QUALITY_JOB = Path(job_path("quality"))


def spark_submit(spec_path: Path, data_root: Path, master: str, log_path: Path, *extra: str,
                 job: Path = STREAM_JOB) -> int:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, TZ="UTC", SPARK_LOCAL_IP="127.0.0.1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    jars = connector_jars()
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", master,
           *(["--jars", ",".join(jars)] if jars else []),
           "--conf", "spark.ui.showConsoleProgress=false", *submit_args(), str(job),
           "--spec", str(spec_path), "--data-root", str(data_root), *extra]
    with open(log_path, "w") as log:
        return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec-dir", type=Path, default=default_spec_dir())
    p.add_argument("--data-root", type=Path, default=default_data_root() / "demo")
    p.add_argument("--files", type=int, default=40)
    p.add_argument("--events-per-file", type=int, default=500)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--keep", action="store_true", help="keep the data of an earlier demo run")
    args = p.parse_args(argv)

    specs, errors = load_specs(args.spec_dir)
    for error in errors.values():
        print(error, file=sys.stderr)
    if errors:
        return 2
    if args.data_root.exists() and not args.keep:
        shutil.rmtree(args.data_root)
    logs = args.data_root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    topics = sorted({t for spec in specs.values() if isinstance(spec.source, KafkaSource) for t in spec.source.topics or []})
    broker = None
    if topics:
        from runner.kafka import KafkaBroker, ensure_topics

        if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
            broker = KafkaBroker(args.data_root / "kafka").start()
            os.environ["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap
            print(f"==> Kafka: a broker on {broker.bootstrap} (log: {broker.log_file})", flush=True)
        ensure_topics(os.environ["KAFKA_BOOTSTRAP_SERVERS"], topics, partitions=3)
    try:
        return _run(args, specs, logs)
    finally:
        if broker is not None:
            broker.stop()


def _run(args: argparse.Namespace, specs: dict, logs: Path) -> int:
    """Generate, stream, validate and compare every stream (``main``'s work, a broker running)."""
    timings: dict[str, float] = {}
    for name in sorted(specs):
        spec_path = args.spec_dir / f"{name}.yaml"
        print(f"==> {name}: generating {args.files} files x {args.events_per_file} events", flush=True)
        generate.main(["--spec", str(spec_path), "--data-root", str(args.data_root), "--files", str(args.files),
                       "--events-per-file", str(args.events_per_file)])
        print(f"==> {name}: spark-submit --master {args.master} (log: {logs / (name + '.log')})", flush=True)
        started = time.monotonic()
        code = spark_submit(spec_path, args.data_root, args.master, logs / f"{name}.log", "--trigger", "available-now")
        timings[name] = time.monotonic() - started
        if code != 0:
            print(f"stream {name} failed (exit {code}); last lines of its log:", file=sys.stderr)
            print("\n".join((logs / f"{name}.log").read_text(errors="replace").splitlines()[-15:]), file=sys.stderr)
            return 1

    quality: dict[str, dict] = {}
    for name in sorted(specs):
        print(f"==> {name}: validating the sinks with Great Expectations", flush=True)
        result_file = args.data_root / "quality" / name / "runs" / "demo.json"
        code = spark_submit(args.spec_dir / f"{name}.yaml", args.data_root, args.master, logs / f"{name}.quality.log",
                            "--result", str(result_file), job=QUALITY_JOB)
        if code != 0:
            print(f"validation of {name} failed (exit {code}); see {logs / (name + '.quality.log')}", file=sys.stderr)
            return 1
        quality[name] = json.loads(result_file.read_text())

    from runner.testdata import verify
    from spark_jobs.analysis import resolve_plan
    from spark_jobs.quality_job import describe
    from spark_jobs.runtime.session import build_session

    spark = build_session("demo-verify", master="local[1]", extra={"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    ok = True
    try:
        for name, spec in sorted(specs.items()):
            plan = resolve_plan(spark, spec, Layout(spec, args.data_root, args.spec_dir))
            manifest = json.loads((args.data_root / "generated" / name / "manifest.json").read_text())
            report = verify.compare(spark, plan, manifest)
            c = manifest["counts"]
            print(f"\n{name}: {c['input_records']} records in {timings[name]:.1f} s "
                  f"({c['input_records'] / timings[name]:.0f} records/s end to end, JVM start included)")
            print(f"  expected: {c['input_records']} in = {c['accepted']} accepted + {c['quarantined']} quarantined"
                  f" + {c['duplicates']} duplicates + {c['dropped_late']} dropped late")
            for line in report.describe().splitlines():
                print(f"  {line}")
            for output in plan.outputs:
                sink = output.sink
                where = (f"{redact(sink.url)} table {sink.table}" if isinstance(sink, TableDataset)
                         else getattr(sink, "path", sink.where))
                print(f"  {output.name} -> {where}")
            print("  data quality (measured):")
            for line in describe(quality[name]):
                print(f"    {line}")
            ok &= report.ok and quality[name]["ok"]
    finally:
        spark.stop()
    print("\nall sinks equal the ground truth and pass validation" if ok
          else "\nSOME SINKS DIFFER FROM THE GROUND TRUTH OR FAIL VALIDATION")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
