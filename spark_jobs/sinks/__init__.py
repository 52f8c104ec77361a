"""Where outputs land beyond Spark's own file sink: Delta Lake tables (``delta``), relational
tables (``table``), Kafka topics (``kafka``)."""
