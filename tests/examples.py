"""The project's example specs for the tests: as dicts to change, written into an ``include/``
of a test's own, and the clicks stream as it would read CSV files instead of its topic."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
STREAMS = ROOT / "include" / "streams"


def example_spec(name: str) -> dict:
    """The project's example spec ``name`` (``include/streams/<name>.yaml``), as a dict to change."""
    return yaml.safe_load((STREAMS / f"{name}.yaml").read_text())


def include_with(root: Path, *specs: dict) -> Path:
    """An ``include/`` under ``root``: the project's expectations and reference data, and the
    given stream specs; its ``streams`` folder (the spec directory to point the platform at)."""
    for folder in ("expectations", "reference"):
        shutil.copytree(ROOT / "include" / folder, root / folder, dirs_exist_ok=True)
    (root / "streams").mkdir(parents=True, exist_ok=True)
    for spec in specs:
        (root / "streams" / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return root / "streams"


def clicks_on_files() -> dict:
    """The clicks example reading CSV files from ``landing/clicks`` instead of its Kafka topic
    (the tests' CSV stream: the same columns, reference data, outputs and quality rules)."""
    data = example_spec("clicks")
    data["source"] = {"type": "files", "path": "landing/clicks", "format": "csv",
                      "columns": data["source"]["columns"], "max_files_per_trigger": 10,
                      "archive_path": "archive/clicks"}
    return data


def clicks_csv_spec(root: Path) -> Path:
    """:func:`clicks_on_files` written into an ``include/`` under ``root``; its spec file."""
    return include_with(root, clicks_on_files()) / "clicks.yaml"
