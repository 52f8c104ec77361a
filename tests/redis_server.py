"""A throwaway Redis server for tests (the Celery broker), started from the installed binary.

It listens on 127.0.0.1 on a free port with a generated password, keeps nothing on disk,
and lives in a fresh temporary directory that is removed when it stops.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

INSTALL_HINT = "redis-server was not found on PATH; install the Debian package 'redis-server'"
START_TIMEOUT_SECONDS = 30


class RedisNotInstalled(RuntimeError):
    """No redis-server binary: tests that need it skip (fail on CI)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisNotInstalled(INSTALL_HINT)
        self.binary = binary
        self.password = secrets.token_hex(16)
        self.port: int | None = None
        self.base: Path | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The broker URL (with the password: give it only to the processes that need it)."""
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
                reply = b""
                while reply.count(b"\r\n") < 2:
                    chunk = s.recv(64)
                    if not chunk:
                        return False
                    reply += chunk
                return reply == b"+OK\r\n+PONG\r\n"
        except OSError:
            return False

    def start(self) -> RedisServer:
        self.base = Path(tempfile.mkdtemp(prefix="redistest-"))
        self.port = _free_port()
        config = self.base / "redis.conf"  # the password in a file of its own, not on a command line
        config.write_text(f"port {self.port}\nbind 127.0.0.1\nprotected-mode yes\nsave \"\"\nappendonly no\n"
                          f"dir {self.base}\nrequirepass {self.password}\nlogfile {self.base / 'redis.log'}\n")
        config.chmod(0o600)
        self.proc = subprocess.Popen([self.binary, str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.base / "redis.log").read_text(errors="replace")[-2000:] if (self.base / "redis.log").exists() else ""
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
