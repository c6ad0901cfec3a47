"""Spark: the backfill driver's tasks, the job helpers, the CLI's Spark options.

``backfill_task`` (one key group's backfill: transactional output with its progress),
``job`` (Spark session and job helpers), ``cli_options`` (``--spark-conf`` and the
rescale command).
"""
