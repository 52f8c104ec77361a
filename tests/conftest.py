"""Shared fixtures: one SparkSession for every unit test (JVM start costs ~10 s).

And how skips are reported: at the end of a run every skipped test is listed with its
reason, and a test skipped for a missing system package (PostgreSQL server binaries,
Chromium; `./platform test` installs them when run as root) fails the run unless
``STREAMS_ALLOW_SKIPS=1``: a suite that quietly left out its PostgreSQL and browser
tests would look as green as one that ran them.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest

# py4j logs its shutdown at exit, after pytest has closed the streams logging writes to.
logging.getLogger("py4j").setLevel(logging.WARNING)

# Spark's Python workers must run the interpreter that runs the tests.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TZ", "UTC")
# Spark's driver and block manager listen on loopback only.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The JVMs that spark-submit starts for the tests (drivers, upgrade steps, benchmarks, through
# Airflow too) compile with the JIT's first tier only: they live for seconds to minutes on little
# data, where the second tier's compiling costs more CPU than its faster code saves (the operator
# actions' end-to-end module: 602 s against 781 s). What they do is the same. The tests' own
# session (:func:`spark`), which runs for the whole run, keeps every tier; outside the tests,
# drivers keep the JVM's default.
SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"
os.environ.setdefault(SUBMIT_OPTS, "-XX:TieredStopAtLevel=1")
# Airflow: a throwaway home per test process (each pytest-xdist worker its own: they would
# share its SQLite database otherwise), removed at exit; no example DAGs, unit-test settings.
if os.environ.get("AIRFLOW_HOME") in (None, os.environ.get("STREAMS_TEST_AIRFLOW_HOME")):
    _home = tempfile.mkdtemp(prefix="airflow-home-")
    os.environ["AIRFLOW_HOME"] = os.environ["STREAMS_TEST_AIRFLOW_HOME"] = _home
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")


@pytest.fixture(scope="session")
def spark() -> Iterator:
    from spark_jobs.runtime.session import build_session

    quick_jit = os.environ.pop(SUBMIT_OPTS, None)  # (its JVM keeps every tier: see SUBMIT_OPTS)
    try:
        session = build_session("unit-tests", master="local[2]", extra={
            "spark.sql.shuffle.partitions": 2, "spark.ui.enabled": False,
            "spark.sql.streaming.stateStore.minDeltasForSnapshot": 2})
    finally:
        if quick_jit is not None:
            os.environ[SUBMIT_OPTS] = quick_jit
    session.sparkContext.setLogLevel("ERROR")
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()


# ---- skips: listed at the end; a missing system package fails the run -------------------

#: How the reason of a skip for want of a system package starts.
MISSING_PACKAGE = "missing system package: "
#: Set to 1 to let such skips pass (a machine that cannot install the packages).
ALLOW_SKIPS = "STREAMS_ALLOW_SKIPS"


def skip_for_missing_package(what: str) -> NoReturn:
    """Skip a test that needs a system package which is not installed; fail it if ``CI`` is set."""
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so the tests that need it must run: {MISSING_PACKAGE}{what}", pytrace=False)
    pytest.skip(MISSING_PACKAGE + what)


@pytest.fixture(scope="session")
def missing_system_package() -> Callable[[str], NoReturn]:
    """:func:`skip_for_missing_package`, for fixtures outside this file (e.g. tests/e2e's Chromium)."""
    return skip_for_missing_package


class SkipReport:
    """Collects every skip of the run; lists them at the end; fails the run on a missing package."""

    def __init__(self) -> None:
        self.skips: list[tuple[str, str]] = []  # (test, reason)

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):  # an xfail is reported as skipped too
            return
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        self.skips.append((report.nodeid, reason.removeprefix("Skipped: ")))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    @property
    def missing_packages(self) -> list[tuple[str, str]]:
        return [(test, reason) for test, reason in self.skips if reason.startswith(MISSING_PACKAGE)]

    @staticmethod
    def allowed() -> bool:
        return os.environ.get(ALLOW_SKIPS) == "1"

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # around pytest's own summary: printed after it, last
    def pytest_terminal_summary(self, terminalreporter) -> Iterator[None]:  # a TerminalReporter
        yield
        if not self.skips:
            return
        terminalreporter.write_sep("=", f"skipped tests ({len(self.skips)})", yellow=True)
        for test, reason in self.skips:
            terminalreporter.write_line(f"SKIPPED {test}: {reason}")
        missing = len(self.missing_packages)
        if missing and self.allowed():
            terminalreporter.write_line(f"{missing} skipped for a missing system package, allowed by {ALLOW_SKIPS}=1",
                                        yellow=True)
        elif missing:
            terminalreporter.write_line(
                f"{missing} skipped for a missing system package: the suite did not fully run, so the run fails. "
                f"Install the package (`./platform test` does when run as root), or set {ALLOW_SKIPS}=1 to accept it.",
                red=True, bold=True)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus == pytest.ExitCode.OK and self.missing_packages and not self.allowed():
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipReport(), "streams-skip-report")


# ---- PostgreSQL: a throwaway server per test session (tests/postgres_server.py) ----------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator:
    """A running PostgreSQL server; skips without the binaries (fails if CI is set; see MISSING_PACKAGE)."""
    try:
        from postgres_server import PostgresNotInstalled, PostgresServer  # tests/ is on sys.path (rootdir conftest)
    except ImportError:  # tests/ became a package
        from tests.postgres_server import PostgresNotInstalled, PostgresServer
    try:
        server = PostgresServer()
    except PostgresNotInstalled as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:
        skip_for_missing_package(missing)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server) -> str:
    """``postgresql://streams_test@127.0.0.1:PORT/postgres`` of the session's server."""
    return postgres_server.url


@contextmanager
def fresh_database(server) -> Iterator[str]:  # a tests/postgres_server.PostgresServer
    """URL of a new, empty database on ``server``, dropped on exit."""
    import uuid

    import psycopg

    name = f"test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server.database_url(name)
    finally:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_database(postgres_server) -> Iterator[str]:
    """URL of a fresh, empty database on the session's server, dropped afterwards."""
    with fresh_database(postgres_server) as url:
        yield url


@pytest.fixture(scope="module")
def module_postgres_database(postgres_server) -> Iterator[str]:
    """As ``postgres_database``, shared by the tests of one module (one Airflow for a file)."""
    with fresh_database(postgres_server) as url:
        yield url


# ---- Redis: a throwaway broker per test session (tests/redis_server.py) -------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator:
    """A running Redis server on loopback; skips without the binary (fails if CI is set)."""
    try:
        from redis_server import RedisNotInstalled, RedisServer  # tests/ is on sys.path (rootdir conftest)
    except ImportError:  # tests/ became a package
        from tests.redis_server import RedisNotInstalled, RedisServer
    try:
        server = RedisServer()
    except RedisNotInstalled as exc:
        skip_for_missing_package(str(exc))
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ---- Kafka: a real broker per test session (runner/kafka.py) ------------------------------


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A running single-node Kafka broker on loopback (KRaft), from the jars setup fetched."""
    from runner.kafka import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def kafka_topic(kafka_broker, request: pytest.FixtureRequest) -> str:
    """A new topic of three partitions on the session's broker, named after the test."""
    import re
    import uuid

    name = f"{re.sub(r'[^A-Za-z0-9_]', '_', request.node.name)[:60]}-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(name, partitions=3)
    return name
