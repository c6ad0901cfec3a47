"""The checkpoint protocol's self-contained parts, used by the runtime.

``txn`` (the transactional producer: librdkafka's resumable-call contract, a commit whose
outcome is unknown, the stop budget), ``alignment`` (the alignment state machine;
pure), ``keygroup_state`` (each key group's checkpoint facts and their committed copy),
``protocol`` (every ``lockgate-*`` header), ``control_topics`` (the control and registry
topics: names, keys, readers).
The runtime's ``Runner`` (``processors/_runtime``) uses them through its components: the
epoch sequence (``EpochCommitter``), savepoints (``SavepointParticipant``), barriers read
downstream (``BarrierAlignment``) and rebalances (``KeyGroupAssignment``).
docs/architecture.md says which invariant each owns.
"""
