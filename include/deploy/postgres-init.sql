-- A database of its own for the streams' table sinks, beside Airflow's metadata database.
CREATE DATABASE streams;
