"""What the benchmarks share to report: progress lines, medians and percentiles, aims, tables,
charts, and the results' JSON in ``bench/results/``."""

from __future__ import annotations

import json
import os
import platform as host
import statistics
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


class Progress:
    """Prints a line with the seconds since it was made: ``[   12.3s] what``."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __call__(self, what: str) -> None:
        print(f"[{self.elapsed():7.1f}s] {what}", flush=True)


# ---- figures ------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def latencies(samples: list[float]) -> dict[str, Any]:
    """Median, p99 and max of latencies in seconds, with the samples."""
    return {"median_s": statistics.median(samples), "p99_s": percentile(samples, 0.99), "max_s": max(samples),
            "samples": samples}


def spread(values: list[float]) -> dict[str, float | int | None]:
    """Count, median, p90 and max (None of an empty list)."""
    if not values:
        return {"n": 0, "median": None, "p90": None, "max": None}
    ordered = sorted(values)
    return {"n": len(ordered), "median": statistics.median(ordered),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "max": ordered[-1]}


def median_of(samples: list[dict], *keys: str) -> float:
    """The median of ``sample[k1][k2]...`` over the samples."""
    values = []
    for s in samples:
        for k in keys:
            s = s[k]
        values.append(s)
    return statistics.median(values)


def verdict(met: bool | None) -> str:
    """How an aim came out: met, MISSED, or not measured (None)."""
    return {True: "met", False: "MISSED", None: "not measured"}[met]


# ---- tables and charts --------------------------------------------------------------------------------


def markdown_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table, as docs/benchmarks.md shows results: its lines."""
    return ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |",
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def pyplot():  # matplotlib.pyplot, drawing into files only
    """matplotlib's pyplot on its file backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_chart(fig, path: Path) -> None:  # a matplotlib Figure
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


# ---- results ------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The machine a run measured: cores, system, Python and PySpark versions."""
    try:
        pyspark = version("pyspark")
    except PackageNotFoundError:
        pyspark = None
    return {"cpus": os.cpu_count(), "platform": host.platform(), "machine": host.machine(),
            "python": sys.version.split()[0], "pyspark": pyspark}


def results_path(out: str, suffix: str = ".json") -> Path:
    """``bench/results/<out><suffix>``; an absolute ``out`` (``/tmp/x/name``) names the file itself."""
    return RESULTS / f"{out}{suffix}"


def write_results(path: Path, data: dict[str, Any], indent: int = 1) -> Path:
    """The results as JSON (values JSON does not know as their text); the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, default=str))
    return path


def finish(lines: list[str], out: str, args: Any, results: dict[str, dict[str, Any]]) -> int:
    """Print the table's ``lines``, write the results with the machine and the arguments to
    ``results_path(out)``; the exit code: 0 only if every variant's sinks were exact."""
    print("\n".join(lines))
    path = write_results(results_path(out), {"machine": machine(), "args": vars(args), "results": results})
    print(f"written: {path}")
    return 0 if all(r["sinks_exact"] for r in results.values()) else 1
