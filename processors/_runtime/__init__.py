"""One running instance: ``Runner`` and the components it owns.

``runner`` (``Runner``: wiring, the little state its parts share, bounded waits, life
cycle, the per-record loop) has no base class. The components it owns keep their own
state and are given what they read:

* ``epoch`` (``EpochCommitter``: the commit sequence, abort, rewind, settling a commit
  without an answer; the producer);
* ``rebalance`` (``KeyGroupAssignment``: assign and restore, revoke, lost);
* ``barriers`` (``BarrierAlignment``: barriers read downstream: alignment, completion,
  watermarks);
* ``savepoints`` (``SavepointParticipant``: requests, halts, restores);
* ``bounded_end`` (``BoundedEnd``: a bounded run's end phase);
* ``open_epoch`` (``OpenEpoch``: the open epoch's flags and released records, what the
  loop and the epoch sequence both write: records consumed, the deadline);
* ``output`` (``OutputWriter``: everything produced, the epoch's output errors);
* ``startup`` (topics and access before joining), ``gauges`` (lag and watermark),
  ``membership`` (``GroupWatch``: the group-probe child's checks), ``query_routing``
  (``QueryRouter``: ``/state`` answers), ``operator_plan`` (operator ids onto a
  savepoint's stores).

Beside them: ``health`` (probes and metrics over HTTP), ``query`` (the HTTP side of
queryable state), ``kubernetes`` (is this pod scaled away?).
"""
