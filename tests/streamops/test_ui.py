"""The streams' pages in the Airflow UI: served by the plugin on Airflow's own API server app, behind its login."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def metadata_db() -> None:
    """Airflow's metadata database (the test home's SQLite): token checks look up revoked tokens."""
    from airflow.utils.db import upgradedb

    upgradedb()


@pytest.fixture
def client(tmp_path: Path, monkeypatch, metadata_db):  # noqa: ANN201 - a fastapi TestClient
    from fastapi.testclient import TestClient

    quality = tmp_path / "data" / "quality" / "sensors"
    (quality / "gx" / "site").mkdir(parents=True)
    (quality / "gx" / "site" / "index.html").write_text("<h1>Data Docs</h1>")
    (quality / "docs").symlink_to("gx/site", target_is_directory=True)
    (quality / "index.html").write_text("<h1>Data quality of stream sensors</h1>")
    (quality / "summary.json").write_text(json.dumps({"ok": True, "last_run": {"at": "2026-01-01T00:00:00Z"},
                                                      "accounting": {"ok": True},
                                                      "outputs": {"readings": {"validated": 3, "failed": 0}}}))
    (tmp_path / "data" / "secret.txt").write_text("not for the browser")
    monkeypatch.setenv("STREAMS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "ops:viewer")

    from airflow import plugins_manager, settings
    from airflow.api_fastapi import app as api_app

    monkeypatch.setattr(settings, "PLUGINS_FOLDER", str(ROOT / "plugins"))
    for name in dir(plugins_manager):  # the plugin manager caches what it found
        cached = getattr(plugins_manager, name)
        if callable(getattr(cached, "cache_clear", None)):
            cached.cache_clear()
    api_app.purge_cached_app()
    app = api_app.create_app()
    with TestClient(app) as c:
        yield c
    api_app.purge_cached_app()


def token(role: str = "viewer") -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="ops", role=role))


def test_anonymous_requests_are_refused(client) -> None:
    for path in ("/stream-quality/", "/stream-quality/sensors/", "/stream-quality/sensors/docs/index.html",
                 "/stream-quality/dag/stream_sensors_quality"):
        response = client.get(path, follow_redirects=False)
        assert (response.status_code, response.json()) == (401, {"detail": "Not authenticated"}), path
    assert client.get("/stream-quality/", headers={"Authorization": "Bearer forged"}).status_code in (401, 403)


def test_a_logged_in_user_sees_summaries_and_data_docs(client) -> None:
    client.cookies.set("_token", token())  # the UI's session cookie
    index = client.get("/stream-quality/")
    assert index.status_code == 200
    assert "sensors/" in index.text and "3 validated, 0 failed" in index.text and "clicks" in index.text
    assert "Data quality of stream sensors" in client.get("/stream-quality/sensors/").text
    assert client.get("/stream-quality/sensors/docs/index.html").text == "<h1>Data Docs</h1>"
    tab = client.get("/stream-quality/dag/stream_sensors_quality", follow_redirects=False)
    assert tab.status_code == 307 and tab.headers["location"] == "../sensors/"


def test_nothing_outside_a_streams_quality_folder_is_served(client) -> None:
    headers = {"Authorization": f"Bearer {token()}"}
    assert client.get("/stream-quality/sensors/..%2F..%2Fsecret.txt", headers=headers).status_code == 404
    assert client.get("/stream-quality/nope/index.html", headers=headers).status_code == 404
    assert client.get("/stream-quality/clicks/", headers=headers).status_code == 404  # not validated yet
    assert client.get("/stream-quality/dag/some_other_dag", headers=headers).status_code == 404
