"""The Airflow DAG of the shared driver, if a stream's spec sends its scheduled runs to one (see streamops.dag_factory)."""

from streamops.dag_factory import shared_driver_dags

globals().update(shared_driver_dags())
