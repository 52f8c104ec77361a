"""The local runner: the whole platform on one machine (``./platform up``, ``python -m runner up``).

Airflow's own services on loopback (``airflow``), the streams deployed, fed and stopped in
order through their DAGs (``platform``), the summary per stream (``summary``), and what
they share: processes, logs, ports, waiting (``processes``). Not loaded by Airflow.
"""
