"""Running sum per key appended to an Apache Iceberg table, exactly once.

Input (``LOCKGATE_INPUT_TOPIC``, default ``numbers``): key = UTF-8 string, value =
``{"v": <int>, "seq": <int>}`` (as examples/running_sum.py). For every input record one
row ``(seq, key, v, total)`` is appended to the table ``LOCKGATE_ICEBERG_TABLE`` (default
``lockgate.sums_events``): ``total`` is the key's running sum. Each epoch's rows land in
the table exactly once, in one snapshot per epoch and instance, committed with the
epoch's Kafka transaction (docs/sinks.md, "Iceberg").

The catalog is pyiceberg's SQL catalog on a SQLite file, the warehouse a directory (any
pyiceberg catalog works: see :meth:`processors.App.iceberg_output`). Create the table
first (:func:`create_table`), then run::

    LOCKGATE_BOOTSTRAP_SERVERS=127.0.0.1:9092 \
    LOCKGATE_ICEBERG_CATALOG_URI=sqlite:////data/iceberg/catalog.db \
    LOCKGATE_ICEBERG_WAREHOUSE=file:///data/iceberg/warehouse \
    lockgate run examples.iceberg_sink:app

With the warehouse in an S3-compatible object store, name its endpoint (pyiceberg's
FileIO properties ``s3.endpoint``, ``s3.region`` and path-style addressing, from
``LOCKGATE_ICEBERG_S3_ENDPOINT``, ``LOCKGATE_ICEBERG_S3_REGION`` (default ``us-east-1``)
and ``LOCKGATE_ICEBERG_S3_PATH_STYLE`` (default ``true``)) and give the credentials in the
environment, never in code: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (pyarrow's
default credential chain) or pyiceberg's ``PYICEBERG_CATALOG__DEFAULT__S3__ACCESS_KEY_ID``
/ ``..._SECRET_ACCESS_KEY`` (merged into the catalog's properties)::

    LOCKGATE_ICEBERG_WAREHOUSE=s3://lakehouse/warehouse \
    LOCKGATE_ICEBERG_S3_ENDPOINT=http://objects.internal:9000 \
    AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... lockgate run examples.iceberg_sink:app

Read it back with pyiceberg: ``load_catalog("default", **catalog_properties())
.load_table("lockgate.sums_events").scan().to_arrow()``.
"""

import os
from typing import Any

from processors import App, Context

INPUT = os.environ.get("LOCKGATE_INPUT_TOPIC", "numbers")
#: The variables this app reads (declared, so ``lockgate run`` accepts them).
URI_ENV, WAREHOUSE_ENV, TABLE_ENV = (
    "LOCKGATE_ICEBERG_CATALOG_URI",
    "LOCKGATE_ICEBERG_WAREHOUSE",
    "LOCKGATE_ICEBERG_TABLE",
)
#: The S3 endpoint of the warehouse's object store (unset: AWS S3 or a local warehouse).
S3_ENDPOINT_ENV, S3_REGION_ENV, S3_PATH_STYLE_ENV = (
    "LOCKGATE_ICEBERG_S3_ENDPOINT",
    "LOCKGATE_ICEBERG_S3_REGION",
    "LOCKGATE_ICEBERG_S3_PATH_STYLE",
)
TABLE = os.environ.get(TABLE_ENV, "lockgate.sums_events")


def catalog_properties() -> dict[str, str]:
    """The SQL catalog's properties, from the environment (local defaults).

    With ``LOCKGATE_ICEBERG_S3_ENDPOINT`` set, the FileIO properties of that endpoint too
    (no credentials: they come from the environment, see the module docs).
    """
    props = {
        "type": "sql",
        "uri": os.environ.get(URI_ENV, "sqlite:///iceberg-catalog.db"),
        "warehouse": os.environ.get(WAREHOUSE_ENV, f"file://{os.path.abspath('warehouse')}"),
    }
    if endpoint := os.environ.get(S3_ENDPOINT_ENV):
        path_style = os.environ.get(S3_PATH_STYLE_ENV, "true").lower() in ("1", "true", "yes")
        props |= {
            "s3.endpoint": endpoint,
            # Given, else pyiceberg asks AWS for the bucket's region.
            "s3.region": os.environ.get(S3_REGION_ENV, "us-east-1"),
            "s3.force-virtual-addressing": "false" if path_style else "true",
        }
    return props


def create_table(properties: dict[str, str], table: str) -> None:
    """Create ``table`` (and its namespace) in the catalog, if missing: unpartitioned."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = load_catalog(properties.get("name", "default"), **properties)
    catalog.create_namespace_if_not_exists(table.rpartition(".")[0])
    schema = Schema(
        NestedField(1, "seq", LongType(), required=True),
        NestedField(2, "key", StringType(), required=True),
        NestedField(3, "v", LongType(), required=True),
        NestedField(4, "total", LongType(), required=True),
    )
    catalog.create_table_if_not_exists(table, schema)


app = App(
    "iceberg-sums",
    env=[
        "LOCKGATE_ICEBERG_CATALOG_URI",
        "LOCKGATE_ICEBERG_WAREHOUSE",
        "LOCKGATE_ICEBERG_TABLE",
        "LOCKGATE_ICEBERG_S3_ENDPOINT",
        "LOCKGATE_ICEBERG_S3_REGION",
        "LOCKGATE_ICEBERG_S3_PATH_STYLE",
    ],
)
totals = app.value_state("totals")
app.iceberg_output("events", catalog=catalog_properties(), table=TABLE)


@app.process(INPUT)
def running_sum(key: str, value: dict[str, Any], ctx: Context) -> None:
    total = (totals.value() or 0) + value["v"]
    totals.update(total)
    ctx.emit("events", key, {"seq": value["seq"], "key": key, "v": value["v"], "total": total})
