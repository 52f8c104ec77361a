"""Blue/green folders: a result built in a *staged* folder beside its live one, then put in the live
one's place in one step (``spark_jobs.upgrade``, ``spark_jobs.reprocess``).

A staged folder is hidden from readers of the folder above (its name begins with a dot, which
Spark and pyarrow skip). Spark's file logs name each file by its full path: a file sink's
``_spark_metadata`` and a checkpoint's file-source logs (``sources/<n>/``), so a folder about to
move has its log rewritten first (:func:`relocate_log`). The exchange of the two folders is one
step where the system can (``runtime.atomic.exchange``); the staged place then holds the old
folder, which a rollback exchanges back. A marker in the swapped-in folder names the upgrade that
put it there, so a killed try's exchange is not taken again.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from spark_jobs.runtime.atomic import exchange, write_atomically

log = logging.getLogger("upgrade")


def staged_sink(sink_path: str, number: int) -> str:
    """Where an output is rebuilt beside its live sink (hidden from readers of the folder above:
    Spark and pyarrow skip names that begin with a dot)."""
    live = Path(sink_path)
    return str(live.with_name(f".{live.name}.upgrade-{number:06d}"))


#: a file sink's log names each file by its full path (Hadoop's URI of it)
_PATH_FIELD = re.compile(r'"path":"([^"]*)"')
_URI_SAFE = "/:@!$&'()*+,;=-._~"


def relocate_sink_log(folder: str, was: str, now: str) -> None:
    """Rewrite the file sink log in ``folder`` (``_spark_metadata``) so that its entries name the
    folder ``now`` where they named ``was`` (the files stay; their folder is about to move there),
    each log file replaced in one step. Entries naming ``now`` already are left."""
    relocate_log(Path(folder) / "_spark_metadata", was, now)


def relocate_log(log_dir: str | os.PathLike[str], was: str, now: str) -> None:
    """:func:`relocate_sink_log` for any of Spark's file logs under ``log_dir`` (a file sink's, or
    the file sources' logs of a checkpoint, ``sources/<n>/``); a rewritten file's checksum file,
    which would no longer match, goes."""
    was, now = os.path.abspath(was), os.path.abspath(now)
    for path in sorted(Path(log_dir).rglob("*")):
        if not path.is_file() or not path.name.removesuffix(".compact").isdigit():
            continue
        text = path.read_text(encoding="utf-8")

        def move(match: re.Match[str], path: Path = path) -> str:
            uri = urlsplit(match.group(1))
            local = unquote(uri.path)
            if local.startswith(was + "/"):
                moved = urlunsplit(uri._replace(path=quote(now + local[len(was):], safe=_URI_SAFE)))
                return f'"path":"{moved}"'
            if local.startswith(now + "/"):
                return match.group(0)
            raise RuntimeError(f"{path}: an entry names {match.group(1)}, under neither {was} nor {now}")

        rewritten = _PATH_FIELD.sub(move, text)
        if rewritten != text:
            write_atomically(path, rewritten)
            path.with_name(f".{path.name}.crc").unlink(missing_ok=True)


def _marker(folder: str) -> Path:
    """A file in a swapped Parquet folder naming the upgrade that put it there (Spark and pyarrow
    skip names that begin with an underscore)."""
    return Path(folder) / "_upgrade"


def swapped_in_by(folder: str) -> int | None:
    try:
        return int(_marker(folder).read_text())
    except (OSError, ValueError):
        return None


def swap_folder(staged: str, live: str, number: int, log_names_paths: bool = True) -> None:
    """A Parquet sink: the staged folder, its log rewritten to name the live path, exchanged with the
    live folder in one step (the staged place then holds the old result). ``log_names_paths``
    false: a folder whose log names no path of its own (a Delta table's)."""
    if swapped_in_by(live) == number:
        return  # exchanged by a killed try
    if log_names_paths and (Path(staged) / "_spark_metadata").is_dir():
        relocate_sink_log(staged, staged, live)
    write_atomically(_marker(staged), str(number))
    if Path(live).exists():
        exchange(staged, live)
    else:
        Path(live).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, live)
    log.info("%s exchanged with its rebuilt result", live)
