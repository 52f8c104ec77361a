"""Where outputs land beyond Spark's own file sink: relational tables (``table``)."""
