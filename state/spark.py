r"""Savepoint tools on Spark: a State Processor API for lockgate savepoints.

Three operations on the savepoints of :mod:`state.savepoint`, run as Spark jobs so
that a savepoint of any size is read and written by the executors, one task per key
group (the driver only handles descriptors and manifests):

* :func:`read_savepoint` — a savepoint's stores as DataFrames
  (``key_group``, ``key``, ``value``; decoded ``key_text``/``value_json`` on request);
* :func:`write_savepoint` — bootstrap state: a complete, restorable savepoint built
  from a DataFrame of keys and values (Flink's ``BootstrapTransformation``);
* :func:`rewrite_savepoint` — the same state re-keyed to another key-group count
  (rescaling; :mod:`processors.rescale` copies the input topics to match).

Placement: an entry of a user store (value, list, map, reducing, aggregating state,
tables, window stores) is keyed by the record's raw key, the key as the app's key
codec encodes it, and lives in key group ``key_group(raw_key, P)``, Kafka's murmur2
partition of the key (:func:`processors._dsl.partitioner.key_group`). The time store
``lockgate.time`` holds timers keyed ``b"t" + kind + be64(time + 2**63) + raw_key``
(placed by their raw key) and one watermark record ``b"w"`` per key group.

Importing this module needs neither pyspark nor a Spark session; the functions import
pyspark when called. Executors need lockgate (and the codecs of the app, when they are
not built-in ones) importable, as for any PySpark job.
"""

from __future__ import annotations

from state._spark import common as _common
from state._spark.common import App as App
from state._spark.reading import read_savepoint
from state._spark.rewriting import _contributors as _contributors
from state._spark.rewriting import check_rewritable, merge_watermarks, rewrite_savepoint
from state._spark.saved import SavedApp, load_saved_app
from state._spark.writing import write_savepoint

__all__ = [
    "TIME_STORE",
    "OffsetSpec",
    "SavedApp",
    "check_rewritable",
    "load_saved_app",
    "merge_watermarks",
    "read_savepoint",
    "rewrite_savepoint",
    "write_savepoint",
]

# Bound here again (the same objects): the API reference reads the descriptions of a
# module's data from its own source.
#: The store of watermarks and timers (the same name as ``processors._task.time.TIME_STORE``).
TIME_STORE = _common.TIME_STORE
#: Where a restored app starts reading one input, given as one offset for every key group (an
#: int >= 0, or ``"earliest"`` for 0), a sequence with one offset per key group, or a
#: mapping key group -> offset covering every key group.
OffsetSpec = _common.OffsetSpec
