"""What runs per key group inside an epoch, the same way under the runtime and TestDriver.

``keygroups`` (a key group's stores and caches, the restorer), ``time`` (the time
service: watermarks and timers), ``interleave`` (timestamp order across a key group's
inputs), ``global_tables`` (the global-table reader).
"""
