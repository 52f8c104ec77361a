"""The benchmarks stay runnable: every module of ``bench/`` imports as ``python -m bench.<name>``
imports it (a rename in the platform fails here, not in the next benchmark run), every script
answers ``--help``, and the cheapest benchmark runs end to end on tiny input.

They run in Python processes of their own from the project's root, as a benchmark is run:
``bench`` is a folder of the project, not an installed package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
#: every module of bench/, found on disk: a new script is covered without a line here
MODULES = sorted("bench" if p.stem == "__init__" else f"bench.{p.stem}" for p in BENCH.glob("*.py"))
#: what the scripts share; every other module is a script
LIBRARIES = {"bench", "bench.harness", "bench.report"}

#: imports each module named in argv[2:], asks each script for --help, writes what happened to argv[1]
PROBE = r"""
import contextlib, importlib, io, json, sys, traceback

found = {}
for name in sys.argv[2:]:
    entry = found[name] = {}
    try:
        module = importlib.import_module(name)
    except BaseException:
        entry["error"] = traceback.format_exc()
        continue
    entry["main"] = callable(getattr(module, "main", None))
    if entry["main"]:
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                module.main(["--help"])
            entry["help_exit"] = "returned"
        except SystemExit as exc:
            entry["help_exit"] = exc.code
        except BaseException:
            entry["help_exit"] = traceback.format_exc()
        entry["help"] = out.getvalue()
with open(sys.argv[1], "w") as f:
    json.dump(found, f)
"""


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every module imported in one process started in the project's root."""
    out = tmp_path_factory.mktemp("bench-imports") / "imports.json"
    run = subprocess.run([sys.executable, "-c", PROBE, str(out), *MODULES], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text())


def test_every_script_is_found() -> None:
    assert {"bench.throughput", "bench.harness", "bench.report"} <= set(MODULES)
    assert len(MODULES) - len(LIBRARIES) >= 9


@pytest.mark.parametrize("module", MODULES)
def test_the_module_imports(module: str, imported: dict[str, dict]) -> None:
    assert "error" not in imported[module], imported[module].get("error")


@pytest.mark.parametrize("module", sorted(set(MODULES) - LIBRARIES))
def test_the_script_runs_as_a_module_and_answers_help(module: str, imported: dict[str, dict]) -> None:
    entry = imported[module]
    assert entry.get("main"), f"{module} has no main(argv=None)"
    assert entry["help_exit"] == 0, entry["help_exit"]
    assert entry["help"].startswith("usage:"), entry["help"]
    path = BENCH / f"{module.removeprefix('bench.')}.py"
    assert 'if __name__ == "__main__":\n    sys.exit(main())' in path.read_text(encoding="utf-8")


def test_the_cheapest_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    """The throughput benchmark's plain Spark parse (one spark-submit, no platform job) over
    two generated files, then its check of the sinks: its table, results and chart written
    where asked, its working folder removed, none of its processes left."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = tmp_path / "results" / "throughput"
    cmd = [sys.executable, "-m", "bench.throughput", "--rows", "1000", "--files", "2", "--repeats", "1",
           "--streams", "clicks_one_output", "--variants", "a", "--out", str(out)]
    env = {**os.environ, "TMPDIR": str(temp)}
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "clicks_one_output: counts equal to the ground truth" in run.stdout
    results = json.loads(out.with_suffix(".json").read_text())
    assert results["checks"]["clicks_one_output"]["ok"]
    medians = results["summary"]["clicks_one_output"]["medians"]["a"]
    assert medians["rows_per_s"] > 0 and medians["files_total"] >= 1
    assert results["samples"]["clicks_one_output"]["a"][0]["rows"] > 1000  # the valid rows and the generator's others
    assert out.with_suffix(".png").stat().st_size > 0
    assert not list(temp.glob("bench-throughput-*")), "the working folder was left behind"
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if any(str(tmp_path) in a for a in p.info["cmdline"] or [])]
    assert left == [], f"processes left running: {left}"
