"""Airflow DAGs of the `clicks` stream, built from include/streams/clicks.yaml (see streamops.dag_factory)."""

from streamops.dag_factory import stream_dags

globals().update(stream_dags("clicks"))
