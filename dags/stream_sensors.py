"""Airflow DAGs of the `sensors` stream, built from include/streams/sensors.yaml (see streamops.dag_factory)."""

from streamops.dag_factory import stream_dags

globals().update(stream_dags("sensors"))
