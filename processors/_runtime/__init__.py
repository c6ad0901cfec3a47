"""One running instance: ``Runner`` and the layers it is assembled from.

``runner`` (``Runner``: wiring, life cycle, the per-record loop) is built by
inheritance from ``core`` (the state the layers share, bounded waits) <- ``epoch`` (the
commit sequence, abort, rewind, settling a commit without an answer). The components
the layers use own their state and are given what they read:

* ``rebalance`` (``KeyGroupAssignment``: assign and restore, revoke, lost);
* ``barriers`` (``BarrierAlignment``: barriers read downstream: alignment, completion,
  watermarks);
* ``savepoints`` (``SavepointParticipant``: requests, halts, restores);
* ``bounded_end`` (``BoundedEnd``: a bounded run's end phase);
* ``open_epoch`` (``OpenEpoch``: the open epoch's flags and released records);
* ``output`` (``OutputWriter``: everything produced, the epoch's output errors);
* ``startup`` (topics and access before joining), ``gauges`` (lag and watermark),
  ``membership`` (``GroupWatch``: the group-probe child's checks), ``query_routing``
  (``QueryRouter``: ``/state`` answers), ``operator_plan`` (operator ids onto a
  savepoint's stores).

Beside them: ``health`` (probes and metrics over HTTP), ``query`` (the HTTP side of
queryable state), ``kubernetes`` (is this pod scaled away?).
"""
