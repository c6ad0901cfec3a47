"""Configuration: the ``LOCKGATE_*`` settings model, its generated docs, logging.

``settings`` (Settings, load_settings), ``docgen`` (docs/configuration.md from the
model: ``python -m processors._config.docgen``), ``log_setup`` (JSON or console logs,
librdkafka's logs routed).
"""
