"""The checkpoint protocol's self-contained parts, used by the runtime.

``txn`` (the transactional producer: librdkafka's resumable-call contract, a commit whose
outcome is unknown, the stop budget), ``alignment`` (the alignment state machine;
pure), ``keygroup_state`` (each key group's checkpoint facts and their committed copy),
``protocol`` (every ``lockgate-*`` header), ``control_topics`` (the control and registry
topics: names, keys, readers).
The epoch commit is still a layer of the runtime's ``Runner`` (``processors/_runtime``);
savepoints, barriers read downstream and rebalances are its components
(``SavepointParticipant``, ``BarrierAlignment``, ``KeyGroupAssignment``).
docs/architecture.md says which invariant each owns.
"""
