"""The quarantine as any Parquet reader sees it: pyarrow, with no Spark, over the files the
sink's ``_spark_metadata`` log lists and over its whole folder."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow.parquet as pq

from spark_jobs.runtime.checkpoint import sink_files


def committed_files(path: str | Path) -> list[str]:
    """The local paths of the files the sink's log lists, in name order."""
    return sorted(unquote(urlsplit(p).path) for p in sink_files(path))


def pyarrow_rows(path: str | Path) -> list[dict]:
    """Every committed row, read by pyarrow (``to_pylist`` decodes each string as UTF-8 and
    raises ``UnicodeDecodeError`` on one that is not); the folder read whole as well."""
    files = committed_files(path)
    assert files, f"no committed file in {path}"
    rows = [row for f in files for row in pq.read_table(f).to_pylist()]
    assert len(pq.read_table(path).to_pylist()) == len(rows)  # pyarrow skips _spark_metadata; no orphan files
    for row in rows:
        assert isinstance(row["raw"], str), row
        row["raw"].encode("utf-8")  # text, no lone surrogate: valid UTF-8
        assert row["raw_bytes"] is None or isinstance(row["raw_bytes"], bytes), row
    return rows
