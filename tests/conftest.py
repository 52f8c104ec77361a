"""Shared fixtures: one SparkSession for every unit test (JVM start costs ~10 s)."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator

import pytest

# py4j logs its shutdown at exit, after pytest has closed the streams logging writes to.
logging.getLogger("py4j").setLevel(logging.WARNING)

# Spark's Python workers must run the interpreter that runs the tests.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TZ", "UTC")
# Spark's driver and block manager listen on loopback only.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Airflow: a throwaway home, no example DAGs, unit-test settings.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")


@pytest.fixture(scope="session")
def spark() -> Iterator:
    from spark_jobs.session import build_session

    session = build_session("unit-tests", master="local[2]", extra={
        "spark.sql.shuffle.partitions": 2, "spark.ui.enabled": False,
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": 2})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    for q in session.streams.active:
        q.stop()
    session.stop()


# ---- PostgreSQL: a throwaway server per test session (tests/postgres_server.py) ----------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator:
    """A running PostgreSQL server; skips without the binaries (fails if CI is set)."""
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
    if missing and os.environ.get("CI"):
        pytest.fail(f"CI is set, so PostgreSQL tests must run: {missing}", pytrace=False)
    if missing:
        pytest.skip(missing)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server) -> str:
    """``postgresql://streams_test@127.0.0.1:PORT/postgres`` of the session's server."""
    return postgres_server.url


@pytest.fixture
def postgres_database(postgres_server) -> Iterator[str]:
    """URL of a fresh, empty database on the session's server, dropped afterwards."""
    import uuid

    import psycopg

    name = f"test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield postgres_server.database_url(name)
    finally:
        with psycopg.connect(postgres_server.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
