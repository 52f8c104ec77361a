"""A stream's flows: the ingestion (``ingestion``), which parses the input once into the
accepted rows and the quarantine, and one flow per output (``outputs``) over those rows;
``queries`` builds them as Spark streaming queries from the plan and starts them."""
