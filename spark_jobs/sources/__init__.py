"""Where streams read from, beyond what Spark's own readers say: the broker a Kafka source
reads, and how far behind it a stream is."""
