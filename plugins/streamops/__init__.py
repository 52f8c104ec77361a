"""Airflow side of the streaming platform: hooks, sensors, triggers, operators, DAG factory.

Modules here are imported by DAG files and by the triggerer; none imports pyspark or
Great Expectations at module level, so DAG parsing stays fast.
"""

#: Where the streams' pages live in the Airflow UI (``streamops.ui``, mounted by ``plugins/streams_ui.py``).
STREAMS_URL = "/streams"
