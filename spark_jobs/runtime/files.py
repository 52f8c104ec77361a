"""Files written whole: a reader sees the previous content or the new one, never a part.

Every state file of the platform (a lease record, a plan, the quality ledger, the run
history, markers) is written the same way: to a temporary file of its own in the target's
folder, then renamed over the target (:func:`os.replace` is atomic on one file system).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None,
                     fsync: bool = False, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``data`` (text is encoded with ``encoding``) in one step; return the path.

    Creates the parent folder. The temporary file beside the target has a name no other writer
    uses (created exclusively), so concurrent writers never mix their bytes: the last rename
    wins. ``mode``: the file's permissions (e.g. ``0o600`` for a secret), else those a new file
    gets (``0o666`` less the umask). ``fsync``: flush the bytes to the disk before the rename.
    The temporary file is removed if anything fails.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode(encoding) if isinstance(data, str) else data
    # not tempfile.mkstemp: it creates files 0o600, and the platform's files are read by other
    # processes (the Airflow UI, the workers); an exclusive create gives the umask's permissions
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 0o600 if mode is not None else 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            fh.write(payload)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target
