"""Stream specs: what a stream is (``models``), how a YAML file becomes one (``loading``,
``validation``) and where its files live (``layout``). No pyspark here."""
