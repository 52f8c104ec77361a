"""A throwaway PostgreSQL server for tests, started from the installed server binaries.

The server lives in a fresh temporary directory (data, unix socket, log), listens on
127.0.0.1 on a free port, trusts its one test user, and runs with fsync off. It is
stopped with ``pg_ctl stop -m fast`` and the directory is removed.

PostgreSQL refuses to run as root. When the tests run as root (CI containers), the
server runs as the ``postgres`` system user (or ``nobody``) through ``runuser``/``setpriv``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

INSTALL_HINT = ("PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found on PATH,"
                " under /usr/lib/postgresql/*/bin, or via pg_config --bindir;"
                " install the Debian package 'postgresql' (apt-get install postgresql)")
TEST_USER = "streams_test"
START_TIMEOUT_SECONDS = 60
SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "120",  # Airflow's services each keep a connection pool
    "shared_buffers": "32MB",
    "log_min_messages": "warning",
}


class PostgresNotInstalled(RuntimeError):
    """No PostgreSQL server binaries: tests that need them skip (fail on CI)."""


class PostgresUnavailable(RuntimeError):
    """The binaries exist but the server cannot be run or did not start: an error."""


def find_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None."""
    needed = ("initdb", "pg_ctl", "postgres")

    def complete(d: Path) -> bool:
        return all(os.access(d / n, os.X_OK) for n in needed)

    on_path = shutil.which("pg_ctl")
    if on_path:
        d = Path(on_path).resolve().parent
        if complete(d):
            return d
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=True)
            candidates.insert(0, out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    for c in candidates:
        if c and complete(Path(c)):
            return Path(c)
    return None


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bindir: Path | None = None, user: str = TEST_USER):
        found = bindir or find_bindir()
        if found is None:
            raise PostgresNotInstalled(INSTALL_HINT)
        self.bindir = Path(found)
        self.user = user
        self.port: int | None = None
        self.base: Path | None = None
        self.run_as = self._system_user() if os.geteuid() == 0 else None

    # ---- running as a non-root user ---------------------------------------------------

    @staticmethod
    def _system_user() -> pwd.struct_passwd:
        for name in ("postgres", "nobody"):
            try:
                return pwd.getpwnam(name)
            except KeyError:
                continue
        raise PostgresUnavailable("running as root, and PostgreSQL refuses to run as root; no 'postgres' or"
                                  " 'nobody' user exists to run it as (create one, or run the tests as a"
                                  " normal user)")

    def _command(self, args: list[str]) -> list[str]:
        if self.run_as is None:
            return args
        if shutil.which("runuser"):
            return ["runuser", "-u", self.run_as.pw_name, "--", *args]
        if shutil.which("setpriv"):
            return ["setpriv", f"--reuid={self.run_as.pw_uid}", f"--regid={self.run_as.pw_gid}",
                    "--init-groups", *args]
        raise PostgresUnavailable("running as root: need runuser or setpriv (util-linux) to run PostgreSQL"
                                  f" as {self.run_as.pw_name!r}")

    def _run(self, args: list[str], what: str, timeout: float = 120) -> None:
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        env.pop("PGDATA", None)
        result = subprocess.run(self._command(args), capture_output=True, text=True, timeout=timeout,
                                env=env, cwd=self.base)
        if result.returncode != 0:
            log = self._log_tail()
            raise PostgresUnavailable(f"{what} failed (exit {result.returncode}): {' '.join(args)}\n"
                                      f"{result.stdout}{result.stderr}{log}")

    def _log_tail(self) -> str:
        if self.base is None or not (self.base / "server.log").exists():
            return ""
        return "\n--- server.log ---\n" + (self.base / "server.log").read_text(errors="replace")[-4000:]

    # ---- lifecycle --------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        assert self.base is not None
        return self.base / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.base is not None
        return self.base / "socket"

    @property
    def url(self) -> str:
        return self.database_url("postgres")

    def database_url(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresServer:
        # gettempdir(), not pytest's tmp_path: that is mode 0700 and unreachable for the server user.
        self.base = Path(tempfile.mkdtemp(prefix="pgtest-"))
        try:
            self.socket_dir.mkdir()
            if self.run_as is not None:
                for path in (self.base, self.socket_dir):
                    os.chown(path, self.run_as.pw_uid, self.run_as.pw_gid)
                if subprocess.run(self._command(["test", "-w", str(self.base)])).returncode != 0:
                    raise PostgresUnavailable(f"user {self.run_as.pw_name!r} cannot write {self.base}; set TMPDIR"
                                              " to a directory every user can reach (e.g. /tmp)")
            self._run([str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", self.user, "--auth=trust",
                       "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"], "initdb")
            self._start_server()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_server(self) -> None:
        conf = self.data_dir / "postgresql.conf"
        original = conf.read_text()
        for attempt in range(3):
            self.port = _free_port()
            settings = {**SERVER_SETTINGS, "port": str(self.port),
                        "unix_socket_directories": f"'{self.socket_dir}'"}
            conf.write_text(original + "\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))
            try:
                self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.base / "server.log"),
                           "-w", "-t", str(START_TIMEOUT_SECONDS), "start"], "pg_ctl start",
                          timeout=START_TIMEOUT_SECONDS + 30)
                return
            except PostgresUnavailable:
                if attempt == 2 or "could not bind" not in self._log_tail():
                    raise  # only a port taken in between is worth another try

    def stop(self) -> None:
        if self.base is None:
            return
        try:
            if (self.data_dir / "postmaster.pid").exists():
                try:
                    self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"],
                              "pg_ctl stop")
                except (PostgresUnavailable, subprocess.TimeoutExpired):
                    self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w",
                               "stop"], "pg_ctl stop -m immediate")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
