"""Airflow side of the streaming platform: hooks, sensors, triggers, operators, DAG factory.

Modules here are imported by DAG files and by the triggerer; none imports pyspark or
Great Expectations at module level, so DAG parsing stays fast.
"""

#: Where the streams' pages live in the Airflow UI (``streamops.ui``, mounted by ``plugins/streams_ui.py``).
STREAMS_URL = "/streams"

#: The DAGs of a stream, by role ("" is the one that deploys and supervises it).
DAG_ROLES = ("", "stop", "restart", "backfill", "quality", "maintenance", "state", "upgrade", "rollback")


#: The data root's one DAG that keeps the shared driver running (``execution.shared_driver``).
SHARED_DRIVER_DAG = "shared_driver"


def dag_id(stream: str, role: str = "") -> str:
    """``stream_<name>`` or ``stream_<name>_<role>``: the one place DAG ids are spelled."""
    if role not in DAG_ROLES:
        raise ValueError(f"unknown DAG role {role!r}; one of {DAG_ROLES}")
    return f"stream_{stream}" + (f"_{role}" if role else "")
