"""The installed stack is the pinned, consistent one."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pyspark

ROOT = Path(__file__).resolve().parent.parent


def pinned() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for dep in deps:
        name, _, version = re.sub(r"\[.*?\]", "", dep).partition("==")
        pins[name.strip().lower()] = version.strip()
    return pins


def test_pip_check_is_clean() -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_installed_versions_match_the_pins() -> None:
    wrong = {name: (version, md.version(name)) for name, version in pinned().items() if md.version(name) != version}
    assert wrong == {}, f"installed versions differ from pyproject.toml (pinned, installed): {wrong}"


def test_pyspark_and_pyspark_client_are_the_same_version() -> None:
    # both install into the same package folder; a mismatch mixes their Python files
    assert md.version("pyspark") == md.version("pyspark-client") == pyspark.__version__


def test_pyspark_python_files_and_jars_are_the_same_version() -> None:
    jars = Path(pyspark.__file__).parent / "jars"
    cores = sorted(p.name for p in jars.glob("spark-core_*.jar"))
    assert cores, f"no spark-core jar in {jars}"
    versions = {re.search(r"spark-core_[\d.]+-(.+)\.jar", name).group(1) for name in cores}
    assert versions == {pyspark.__version__}, f"jars {cores} vs python files {pyspark.__version__}"
    sql = {re.search(r"spark-sql_[\d.]+-(.+)\.jar", p.name).group(1) for p in jars.glob("spark-sql_*.jar")}
    assert sql == {pyspark.__version__}
