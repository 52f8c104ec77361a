"""Airflow plugin: the streams' data-quality pages in the Airflow UI (see ``streamops.ui``).

Adds "Stream quality" to the navigation, a "Data quality" tab on every stream DAG's
page, and serves each stream's summary and Great Expectations Data Docs, behind
Airflow's own login.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from streamops.operators.quality import QUALITY_URL
from streamops.ui import app

PREFIX = QUALITY_URL.strip("/")


class StreamsUiPlugin(AirflowPlugin):
    name = "streams_ui"
    fastapi_apps = [{"app": app, "url_prefix": QUALITY_URL, "name": "Stream quality"}]
    external_views = [
        {"name": "Stream quality", "href": f"{PREFIX}/", "destination": "nav", "url_route": "stream-quality",
         "category": "browse"},
        {"name": "Data quality", "href": f"{PREFIX}/dag/{{DAG_ID}}", "destination": "dag", "url_route": "data-quality"},
    ]
