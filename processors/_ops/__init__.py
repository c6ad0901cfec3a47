"""Operations from the command line: the checkpoint catalog and the operator commands.

``catalog`` (the checkpoint and savepoint API the CLI and the console import, re-exported
from ``errors``, ``pipelines``, ``savepoint_requests``, ``client``, ``checkpoints`` and
``savepoints``); one module per operator command: ``topics``, ``send``, ``dlq``,
``reset``; ``cli_common`` (what every command shares: loading an app and the settings,
exiting). The click wiring is :mod:`processors.cli`.
"""
