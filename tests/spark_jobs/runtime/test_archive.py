"""Archiving committed input: the landing directory shrinks, and the stream neither misses
an archived file nor reads one again (every sink equals the ground truth afterwards)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import yaml

from runner.testdata import generate, verify
from spark_jobs import analysis
from spark_jobs.flows.queries import run_available_now
from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.archive import (
    archivable,
    archive,
)
from spark_jobs.runtime.checkpoint import (
    file_name,
    last_batch,
    processed_files,
)
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import (
    load_spec,
    parse_spec,
)
from spark_jobs.stream_spec.models import INGEST_FLOW

SPEC = default_spec_dir() / "sensors.yaml"


def landing_names(plan: StreamPlan) -> set[str]:
    return {p.name for p in Path(plan.source.landing).iterdir() if not p.name.startswith((".", "_"))}


def test_committed_files_are_archived_and_the_stream_stays_exactly_once(spark, tmp_path: Path) -> None:
    root = tmp_path / "data"
    spec = load_spec(SPEC)
    layout = Layout(spec, root, default_spec_dir())
    archived_dir = Path(layout.data(spec.source.archive_path))

    def land(files: int, seed: int) -> None:
        assert generate.main(["--spec", str(SPEC), "--data-root", str(root), "--files", str(files),
                              "--events-per-file", "25", "--seed", str(seed)]) == 0

    land(8, 3)
    assert archive(compile_plan(spec, layout)).archived == []  # nothing committed yet
    run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    assert archivable(compile_plan(spec, layout)) == []  # committed, but landed less than archive_after (10 minutes) ago

    landed = landing_names(compile_plan(spec, layout))
    first = archive(compile_plan(spec, layout), now=time.time() + 11 * 60)
    assert first.archived and not first.conflicts
    assert {p.name for p in archived_dir.iterdir()} == set(first.archived)
    assert set(first.archived) | landing_names(compile_plan(spec, layout)) == landed and not set(first.archived) & landing_names(compile_plan(spec, layout))
    # only files the ingestion committed before its newest batch (a lost commit replays that one)
    ckpt = compile_plan(spec, layout).checkpoint(INGEST_FLOW)
    assert set(first.archived) <= {file_name(p) for p in processed_files(ckpt, through_batch=last_batch(ckpt, "commits") - 1)}

    # more input, a restart of every query from its checkpoint, archiving again
    land(6, 4)
    run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    second = archive(compile_plan(spec, layout), now=time.time() + 11 * 60)
    assert second.archived and not set(second.archived) & set(first.archived)
    manifest = json.loads((root / "generated" / "sensors" / "manifest.json").read_text())
    report = verify.compare(spark, compile_plan(spec, layout), manifest)
    assert report.ok, report.describe()


def test_a_cross_device_move_cut_short_is_completed_and_a_different_file_is_left_alone(spark, tmp_path: Path) -> None:
    root = tmp_path / "data"
    data = yaml.safe_load(SPEC.read_text())
    data["source"]["archive_after"] = "1 second"
    spec = parse_spec(data)
    layout = Layout(spec, root, default_spec_dir())
    assert generate.main(["--spec", str(SPEC), "--data-root", str(root), "--files", "6",
                          "--events-per-file", "10", "--seed", "5"]) == 0
    run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    names = archivable(compile_plan(spec, layout), now=time.time() + 5)
    assert len(names) >= 2
    archived_dir = Path(layout.data("archive/sensors"))
    archived_dir.mkdir(parents=True)
    landing = Path(compile_plan(spec, layout).source.landing)
    (archived_dir / names[0]).write_bytes((landing / names[0]).read_bytes())  # copied, not yet removed
    (archived_dir / names[1]).write_text("another file of that name\n")
    result = archive(compile_plan(spec, layout), now=time.time() + 5)
    assert names[0] in result.archived and not (landing / names[0]).exists()
    assert result.conflicts == [names[1]] and (landing / names[1]).exists()
    assert "left 1 in place" in result.describe()
    assert os.path.getsize(archived_dir / names[1]) == len("another file of that name\n")
