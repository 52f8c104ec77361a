"""A corpus of invalid specs (tests/spark_jobs/bad_specs/): each is one realistic mistake.

Every file starts with ``# expect: <field>: <message>``, the whole line the error must
say about that file (``{file}`` stands for the file's own path), and may say
``# problems: N`` on its second line (default 1: one mistake is reported once, and
nothing else in the file is wrong). test_spec.py checks the rules one
by one on the example specs; this corpus checks that whole files fail readably.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spark_jobs import stream_job
from spark_jobs.runtime import driver
from spark_jobs.stream_spec.loading import (
    load_spec,
    load_specs,
)
from spark_jobs.stream_spec.models import SpecError

CORPUS = Path(__file__).resolve().parent / "bad_specs"
FILES = sorted(CORPUS.glob("*.yaml"))
HEADER = re.compile(r"^# expect: (?P<expect>.+)\n(?:# problems: (?P<problems>\d+)\n)?")


def header(path: Path) -> tuple[str, int]:
    match = HEADER.match(path.read_text(encoding="utf-8"))
    assert match, f"{path.name} must start with '# expect: <field>: <message>'"
    return match["expect"].replace("{file}", str(path)), int(match["problems"] or 1)


def test_the_corpus_is_broad() -> None:
    assert len(FILES) >= 12
    fields = {header(p)[0].split(": ")[0] for p in FILES}
    assert {"<spec>", "name", "checkpoint", "source.max_files_per_trigger", "event_time.watermark",
            "event_time.max_future", "outputs[0].mode", "outputs[0].sink", "outputs[0].query.group_by[0]",
            "outputs[1].name", "outputs[1].checkpoint", "trigger", "source.columns[3].name",
            "enrich[0].columns[2].name"} <= fields


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_bad_spec_is_rejected_naming_the_file_and_field(path: Path) -> None:
    expect, problems = header(path)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    message = str(err.value)
    assert err.value.source == str(path)
    assert f"{path}: {expect}" in [line.strip() for line in message.splitlines()], message  # a whole line
    assert expect in [f"{field or '<spec>'}: {text}" for field, text in err.value.problems], message
    assert len(err.value.problems) == problems, message


def test_a_directory_of_bad_specs_deploys_nothing_and_names_every_file() -> None:
    specs, errors = load_specs(CORPUS)
    assert specs == {}
    assert set(errors) == {str(p) for p in FILES}


@pytest.mark.parametrize("name", ["file_sink_in_update_mode", "yaml_syntax_error"])
def test_stream_job_exits_2_without_the_lease_or_spark(tmp_path: Path, monkeypatch, caplog, name: str) -> None:
    path = CORPUS / f"{name}.yaml"
    expect, _ = header(path)

    def forbidden(*args, **kwargs):
        raise AssertionError("a bad spec must neither take the lease nor start Spark")

    monkeypatch.setattr(driver, "DriverLease", forbidden)
    monkeypatch.setattr(stream_job, "_run", forbidden)
    monkeypatch.setattr("pyspark.sql.SparkSession.Builder.getOrCreate", forbidden)
    data_root = tmp_path / "data"
    with caplog.at_level("ERROR"):
        code = stream_job.main(["--spec", str(path), "--data-root", str(data_root), "--trigger", "available-now"])
    assert code == stream_job.EXIT_BAD_SPEC == 2
    # the records' own messages: a handler's formatter may be PySpark's JSON one (which escapes a tab)
    # once a PySparkLogger was made in this process
    assert any(f"{path}: {expect}" in r.getMessage() for r in caplog.records), caplog.text
    assert not data_root.exists()
