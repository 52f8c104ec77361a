"""Code the user writes: a SQL query over a view, or a Python function
``package.module:function`` from ``include/transforms/`` (:func:`run`).

The folder is zipped and handed to ``SparkContext.addPyFile``, Spark's way of shipping
Python code with a job: the driver imports the module from the zip, and Spark's Python
workers get it too (a function that defines a Python UDF needs its module there), on a
cluster as well as locally. The function takes the accepted rows (a DataFrame, streaming
in the job) and returns the output's rows; the reference data are views by their
``enrich`` names.
"""

from __future__ import annotations

import hashlib
import importlib
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pyspark.sql import DataFrame, SparkSession

#: (SparkContext, folder) -> the zip shipped for it
_shipped: dict[tuple[int, str], str] = {}


class UserCodeError(ValueError):
    """A Python query cannot be loaded or did not return a DataFrame; the message says why."""


def ship(spark: SparkSession, folder: str) -> None:
    """Make the modules of ``folder`` importable by the driver and Spark's Python workers."""
    key = (id(spark.sparkContext), folder)
    if key in _shipped:
        return
    if not Path(folder).is_dir():
        raise UserCodeError(f"the folder of Python queries {folder} does not exist")
    # Spark registers a shipped file by its name: a name of its own per folder
    name = f"transforms-{hashlib.sha1(folder.encode()).hexdigest()[:12]}"
    archive = shutil.make_archive(str(Path(tempfile.mkdtemp(prefix="transforms-")) / name), "zip", folder)
    spark.sparkContext.addPyFile(archive)
    importlib.invalidate_caches()
    _shipped[key] = archive


def module_file(folder: str | Path, ref: str) -> Path | None:
    """The file of the module that holds ``ref`` (``package.module:function``) in ``folder``."""
    base = Path(folder) / ref.split(":")[0].replace(".", "/")
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)


def code_hashes(folder: str | Path | None, refs: list[str]) -> dict[str, str]:
    """Each reference's module file as a SHA-256: a change of the code behind an unchanged
    reference is a change of the plan (``spark_jobs.changes``). Only that file: what it imports
    in turn is not followed."""
    found = {}
    for ref in refs if folder is not None else []:
        if (file := module_file(folder, ref)) is not None:
            found[ref] = hashlib.sha256(file.read_bytes()).hexdigest()
    return found


def load_function(spark: SparkSession, folder: str, ref: str) -> Callable[[DataFrame], Any]:
    """The function ``ref`` (``package.module:function``) from ``folder``."""
    module_name, name = ref.split(":")
    ship(spark, folder)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UserCodeError(f"{ref}: no module {module_name!r} in {folder}") from None
        raise UserCodeError(f"{ref}: importing {module_name} failed: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # the user's module failed to import: say how
        raise UserCodeError(f"{ref}: importing {module_name} failed: {type(exc).__name__}: {exc}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UserCodeError(f"{ref}: module {module_name} (in {folder}) has no function {name!r}")
    return function


def apply(spark: SparkSession, folder: str, ref: str, accepted: DataFrame) -> DataFrame:
    """The output's rows: the function ``ref`` applied to the accepted rows."""
    from pyspark.sql import DataFrame

    function = load_function(spark, folder, ref)
    result = function(accepted)
    if not isinstance(result, DataFrame):
        raise UserCodeError(f"{ref} returned {type(result).__name__}, not a DataFrame")
    return result


def run(frame: DataFrame, view: str, sql: str | None, python: str | None, references: Mapping[str, DataFrame],
        transforms_dir: str | None) -> DataFrame:
    """``sql`` over the view ``view`` (``frame``) and the reference data by name, or the
    function ``python`` of ``frame`` (the views registered as well).

    A view lives in the session of the DataFrame it names, and the query runs in
    ``frame``'s: the references must be of that session too (a micro-batch has a session
    of its stream's own). Spark resolves the views when the query is analyzed, which
    ``spark.sql`` and the DataFrame API do at once: views of the same names made later
    (another output's, the next batch's) do not change it."""
    spark = frame.sparkSession
    for name, reference in references.items():
        reference.createOrReplaceTempView(name)
    frame.createOrReplaceTempView(view)
    if sql is not None:
        return spark.sql(sql)
    assert python is not None
    if transforms_dir is None:
        raise UserCodeError(f"{python}: no folder of Python code is known")
    return apply(spark, transforms_dir, python, frame)
