"""Operations from the command line: the checkpoint catalog and the operator commands.

``catalog`` (checkpoints, savepoints, descriptors, triggers); one module per operator
command: ``topics``, ``send``, ``dlq``, ``reset``; ``cli_common`` (what every command
shares: loading an app and the settings, exiting). The click wiring is
:mod:`processors.cli`.
"""
