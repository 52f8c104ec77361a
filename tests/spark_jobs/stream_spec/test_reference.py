"""The generated spec reference: the committed page is what the model renders, and it names the fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.stream_spec.reference import REFERENCE_PAGE, main, model_order, render, spec_schema

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / REFERENCE_PAGE


def test_the_committed_reference_is_not_stale() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        f"{REFERENCE_PAGE} is stale: run python -m spark_jobs.stream_spec.reference > {REFERENCE_PAGE}")


def test_render_is_deterministic() -> None:
    assert render() == render()


def test_known_fields_and_models_appear() -> None:
    text = render()
    for row in ("| `watermark` | string | *required* |", "| `checkpoint` | string | *required* |",
                "| `max_files_per_trigger` | integer (>= 1) | `10` |", "| `standby` | boolean | `false` |"):
        assert row in text
    assert "| `trigger` | [Trigger](#trigger) | `{processing_time: 10 seconds}` |" in text
    assert "`files` → [FileSource](#filesource)" in text  # a union by its `type` tag
    assert "one of `append`, `update`, `complete`" in text  # a Literal by its values


def test_every_model_has_one_section_stream_spec_first() -> None:
    schema = spec_schema()
    order = model_order(schema)
    assert order[0] == "StreamSpec"
    assert sorted(order[1:]) == sorted(schema["$defs"])
    text = render()
    assert [line[3:] for line in text.splitlines() if line.startswith("## ")] == order


def test_check_exits_1_naming_the_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "spec-reference.md"
    stale.write_text(render() + "an edit by hand\n", encoding="utf-8")
    assert main(["--check", str(stale)]) == 1
    assert f"{stale} is stale: run python -m spark_jobs.stream_spec.reference > {stale}" in capsys.readouterr().err
    stale.write_text(render(), encoding="utf-8")
    assert main(["--check", str(stale)]) == 0
