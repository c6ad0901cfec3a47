"""The parts of the Spark savepoint tools; the public module is :mod:`state.spark`.

Private: users import from ``state.spark``, which re-exports the names. By concern:

* :mod:`.common`: what the tools share: the :class:`~state._spark.common.App` protocol,
  the time store's key layout, argument checks and running a Spark job;
* :mod:`.saved`: one app of a savepoint as read from its descriptor and manifests;
* :mod:`.reading`: :func:`~state._spark.reading.read_savepoint` and its Spark task;
* :mod:`.writing`: :func:`~state._spark.writing.write_savepoint` (bootstrap) and the
  pieces every new savepoint is written with;
* :mod:`.rewriting`: :func:`~state._spark.rewriting.rewrite_savepoint` (re-keying to
  another key-group count) and the watermark merge.

The classes and functions Spark ships to executors are module-level names of these
modules: they are pickled by reference, and executors import them from here.
"""
