"""One running instance: ``Runner`` and the layers it is assembled from.

``runner`` (``Runner``: wiring, life cycle, the per-record loop) is built by linear
inheritance from ``core`` (the state the layers share, producing) <- ``savepoints``
(requests, exports, halts, restores) <- ``epoch`` (the commit sequence, abort, rewind,
settling a commit without an answer) <- ``rebalance`` (assign and restore, revoke,
lost) <- ``barriers`` (barriers read downstream: alignment, completion, watermarks).
Beside it: ``health`` (probes and metrics over HTTP), ``query`` (queryable state),
``group_probe`` (group descriptions from a child process), ``kubernetes`` (is this pod
scaled away?).
"""
