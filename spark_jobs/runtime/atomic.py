"""Files written whole: a reader sees the previous content or the new one, never a part.

Every state file of the platform (a lease record, a plan, the quality ledger, the run
history, markers) is written the same way: to a temporary file of its own in the target's
folder, then renamed over the target (:func:`os.replace` is atomic on one file system).
Two folders trade places the same way (:func:`exchange`), as an upgrade swaps a sink.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import uuid
from pathlib import Path

#: ``renameat2``'s flag that swaps two paths atomically (Linux 3.15+, glibc 2.28+)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Swap two existing paths on one file system: ``a`` gets what ``b`` held and back.

    In one step where the system can (Linux's ``renameat2`` with ``RENAME_EXCHANGE``): a reader
    of either path sees the old folder or the new one, never neither. Elsewhere (another system,
    a file system without the flag) in three renames, during which ``a`` is briefly missing,
    never a mix. Returns whether it was one step."""
    a, b = os.fspath(a), os.fspath(b)
    for path in (a, b):
        if not os.path.lexists(path):
            raise FileNotFoundError(errno.ENOENT, "nothing to exchange", path)
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
            return True
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), a, None, b)
    spare = f"{a}.{uuid.uuid4().hex}.exchange"
    os.rename(a, spare)
    os.rename(b, a)
    os.rename(spare, b)
    return False


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
