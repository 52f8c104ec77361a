"""Airflow plugin: the streams' pages in the Airflow UI (see ``streamops.ui``).

Adds "Streams" to the navigation (every stream's status, its actions, its data quality),
a "Stream" tab on every stream DAG's page, and serves each stream's quality summary and
Great Expectations Data Docs, all behind Airflow's own login.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from streamops import STREAMS_URL
from streamops.ui import app

PREFIX = STREAMS_URL.strip("/")


class StreamsUiPlugin(AirflowPlugin):
    name = "streams_ui"
    fastapi_apps = [{"app": app, "url_prefix": STREAMS_URL, "name": "Streams"}]
    external_views = [
        {"name": "Streams", "href": f"{PREFIX}/", "destination": "nav", "url_route": "streams", "category": "browse"},
        {"name": "Stream", "href": f"{PREFIX}/dag/{{DAG_ID}}", "destination": "dag", "url_route": "stream"},
    ]
