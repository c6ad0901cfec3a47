"""``lockgate console``: a small web console over a running lockgate deployment.

One concern per module:

* :mod:`~processors._ops.console.graph` — the pipeline graph (apps and topics) from the
  registry, and its SVG layout (pure);
* :mod:`~processors._ops.console.instances` — instance HTTP endpoints: where they are
  and what their ``/metrics`` and ``/readyz`` say;
* :mod:`~processors._ops.console.data` — the snapshot: registry, checkpoint catalog
  (:mod:`processors._ops.catalog`), lag, throughput, dead letters, savepoints;
* :mod:`~processors._ops.console.jobs` — savepoint trigger and cancel run in the
  background;
* :mod:`~processors._ops.console.pages` — the server-rendered HTML (templates);
* :mod:`~processors._ops.console.server` — the HTTP server, its routes and the token check;
* :mod:`~processors._ops.console.command` — the ``lockgate console`` click command.

See docs/console.md.
"""
