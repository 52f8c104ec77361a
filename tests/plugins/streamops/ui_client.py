"""A client of the Streams pages as Airflow's API server serves them, and logging in to it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def sync_dags() -> None:
    """Airflow's metadata database (the test home's SQLite) with the project's DAGs in it."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.utils.db import upgradedb

    upgradedb()
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(DagBag(dag_folder=str(ROOT / "dags")), bundle_name="dags-folder", bundle_version=None)


@contextmanager
def streams_client(monkeypatch) -> Iterator:  # pytest's MonkeyPatch
    """A TestClient of Airflow's API server app with the project's plugin (``STREAMS_DATA_DIR`` and
    ``STREAMS_SPEC_DIR`` as the caller set them); users are who :func:`login` says."""
    from fastapi.testclient import TestClient

    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    from airflow import plugins_manager, settings
    from airflow.api_fastapi import app as api_app

    monkeypatch.setattr(settings, "PLUGINS_FOLDER", str(ROOT / "plugins"))
    for name in dir(plugins_manager):  # the plugin manager caches what it found
        cached = getattr(plugins_manager, name)
        if callable(getattr(cached, "cache_clear", None)):
            cached.cache_clear()
    api_app.purge_cached_app()
    with TestClient(api_app.create_app()) as c:
        yield c
    api_app.purge_cached_app()


def login(client, role: str | None = "viewer", teams: list[str] | None = None) -> None:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    user = SimpleAuthManagerUser(username="ops", role=role, teams=teams)
    client.cookies.set("_token", get_auth_manager().generate_jwt(user))
