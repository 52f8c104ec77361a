"""The benchmarks: the platform against plain Spark on the same input.

Each script is run from the project's root as ``python -m bench.<name>`` (``--help`` says what
it measures and its options); what they share is in :mod:`bench.harness` (processes, generator
runs, the stream under test, cleanup) and :mod:`bench.report` (tables, charts, results). What
each measures and measured: ``docs/benchmarks.md``; results: ``bench/results/``.
"""
