"""The drivers' class-data sharing archive: Spark's classes, parsed and verified once.

A driver's JVM loads about 13,000 classes from Spark's jars before its first batch, and parses
and verifies each one; that is most of what a start costs (a scheduled run pays it every time, a
restart or a takeover's next standby too). The JVM can map them ready-made from an archive
instead (JDK's application class-data sharing): ``./platform setup`` (and the image's build)
runs one small stream through the real stream job with ``-XX:ArchiveClassesAtExit``, and every
driver then starts with ``-XX:SharedArchiveFile``
(:func:`spark_jobs.runtime.session.class_archive_conf`, which ``spark_jobs.submit`` and
``build_session`` give the drivers they start). The archive is one read-only file that the
drivers of a machine map, not each a copy of its own.

The archive is only valid for the exact class path it was made with: the JVM, Spark's jars and
the platform's jar. Its name is a key over those files
(:func:`spark_jobs.runtime.session.class_archive_key`), so a reinstalled Spark or a rebuilt jar
simply finds no archive (drivers start as before) until setup makes the next one. A driver that
runs elsewhere (a cluster's deploy mode) finds no file at the path and starts as before too: the
JVM ignores a missing archive.

    python -m spark_jobs.runtime.class_archive          # make it if missing; print its path
    python -m spark_jobs.runtime.class_archive --check  # exit 1 if it is missing

``$STREAMS_CLASS_ARCHIVE`` names another file to use, or is empty for none.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from spark_jobs import submit
from spark_jobs.runtime.session import (
    CLASS_ARCHIVE_DIR,
    CLASS_ARCHIVE_ENV,
    DRIVER_JAVA_OPTIONS,
    class_archive_path,
)

#: The stream the archive is made from: a file source of JSON records, enrichment, deduplication,
#: event time, a sliding window, an update-mode table and a pass-through, as the examples have;
#: whatever classes a driver loads beyond these, it loads as before.
WARMUP_SPEC = {
    "name": "class_archive",
    "source": {"type": "files", "path": "landing", "format": "json", "columns": [
        {"name": "event_id", "type": "string", "required": True}, {"name": "device_id", "type": "string"},
        {"name": "ts", "type": "timestamp", "required": True}, {"name": "value", "type": "double"}]},
    "quarantine": {"path": "quarantine"},
    "enrich": [{"name": "devices", "path": "reference/devices.csv", "key": ["device_id"],
                "columns": [{"name": "device_id", "type": "string"}, {"name": "site", "type": "string"}]}],
    "event_time": {"column": "ts", "watermark": "10 minutes"},
    "deduplicate": {"key": ["event_id"]},
    "outputs": [
        {"name": "rows", "query": {"type": "passthrough"}, "mode": "append",
         "sink": {"type": "parquet", "path": "sinks/rows"}},
        {"name": "per_site", "mode": "append", "sink": {"type": "parquet", "path": "sinks/per_site"},
         "query": {"type": "aggregate", "window": {"duration": "10 minutes", "slide": "5 minutes"},
                   "group_by": ["site"], "aggregates": [{"name": "n", "fn": "count"},
                                                        {"name": "avg_value", "fn": "avg", "column": "value"}]}},
        {"name": "per_device", "mode": "update", "sink": {"type": "table", "table": "per_device"},
         "query": {"type": "aggregate", "group_by": ["device_id"],
                   "aggregates": [{"name": "n", "fn": "count"}, {"name": "last", "fn": "latest", "column": "value"}]}},
    ],
    "trigger": {"processing_time": "1 second"},
    "checkpoint": "checkpoint",
}


def _warmup_input(include: Path, data_root: Path) -> Path:
    """The warm-up stream's spec, reference data and a few input files; its spec file."""
    import yaml

    (include / "streams").mkdir(parents=True)
    (include / "reference").mkdir()
    (include / "reference" / "devices.csv").write_text("device_id,site\nd1,north\nd2,south\n")
    spec_file = include / "streams" / f"{WARMUP_SPEC['name']}.yaml"
    spec_file.write_text(yaml.safe_dump(WARMUP_SPEC, sort_keys=False))
    landing = data_root / "landing"
    landing.mkdir(parents=True)
    for n in range(3):
        rows = [{"event_id": f"{n}-{i}", "device_id": f"d{i % 3}", "ts": f"2026-01-01T00:{n * 10 + i:02d}:00Z",
                 "value": float(i)} for i in range(20)]
        (landing / f"part-{n}.json").write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    return spec_file


def build(force: bool = False) -> Path | None:
    """Make the archive for this machine's JVM and jars, unless it exists (or ``force``): a run of
    the warm-up stream to its end (available-now), its JVM writing the classes it loaded at exit;
    moved into place once whole, and archives of other keys removed. None if there is no key."""
    path = class_archive_path()
    if path is None:
        return None
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="class-archive-") as scratch:
        spec_file = _warmup_input(Path(scratch) / "include", Path(scratch) / "data")
        written = Path(scratch) / "classes.jsa"
        cmd = submit.command("stream", spec_file, "local[2]",
                             ["--data-root", str(Path(scratch) / "data"), "--trigger", "available-now"])
        while (at := next((i for i, a in enumerate(cmd) if a.startswith(f"{DRIVER_JAVA_OPTIONS}=")), None)):
            del cmd[at - 1:at + 1]  # the archive being replaced: a JVM writes one only without another
        cmd[1:1] = ["--conf", f"{DRIVER_JAVA_OPTIONS}=-XX:ArchiveClassesAtExit={written}"]
        env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
                   SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=scratch)
        if result.returncode != 0 or not written.is_file():
            raise RuntimeError(f"the warm-up stream exited {result.returncode} without an archive:\n"
                               f"{(result.stdout + result.stderr)[-3000:]}")
        written.chmod(0o444)
        shutil.move(written, path.with_suffix(".part"))
        os.replace(path.with_suffix(".part"), path)
    if CLASS_ARCHIVE_ENV not in os.environ:
        for other in CLASS_ARCHIVE_DIR.glob("*.jsa"):
            if other != path:
                other.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="make nothing: exit 1 if the archive is missing")
    p.add_argument("--force", action="store_true", help="make it again even if it exists")
    args = p.parse_args(argv)
    path = class_archive_path()
    if args.check:
        print(path if path and path.is_file() else f"no class archive ({path or 'no JVM or Spark found'})")
        return 0 if path and path.is_file() else 1
    try:
        made = build(force=args.force)
    except RuntimeError as exc:
        print(f"could not make the drivers' class archive: {exc}", file=sys.stderr)
        return 1
    print(made if made else "no JVM or Spark found: no class archive")
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
