"""The Iceberg sink's two-phase commit against a real pyiceberg SQL catalog, without Kafka.

A SQLite catalog and a local warehouse under tmp_path (tests/support/iceberg_model.py);
the main protocol test also with the warehouse on a SeaweedFS server (a real
S3-compatible object store, tests/support/s3_server.py).
What the epoch protocol relies on, one step at a time: prepared files are invisible, the
commit appends them in one snapshot naming the epoch, an abort deletes them; a key group
taken over is settled by its committed token (that epoch appended once, any other
deleted; a marker left after an append deleted alone); a zombie's late commit never
appends twice, also after the new owner went on; a commit refused for a concurrent one is
retried; a locked catalog makes the epoch abort and the pending append waits for it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processors import App
from processors._checkpoint.protocol import writer_header
from processors._sinks import Sinks
from processors._sinks.errors import SinkRowError, SinkUnavailable
from processors._sinks.iceberg import IcebergOutput, IcebergSink
from processors.exceptions import ConfigError
from tests.support.iceberg_model import Warehouse
from tests.support.s3_server import S3Server

APP = "ice-app"
TABLE = "lockgate.events"


@pytest.fixture
def wh(tmp_path: Path) -> Warehouse:
    w = Warehouse(tmp_path / "iceberg")
    w.create(TABLE)
    return w


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3") / "s3-server.log")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["file", "s3"])
def any_wh(request: pytest.FixtureRequest, tmp_path: Path) -> Warehouse:
    """A warehouse in a local directory, or in a bucket of the S3 API server."""
    if request.param == "file":
        w = Warehouse(tmp_path / "iceberg")
    else:
        bucket = f"lake-{tmp_path.name.lower().replace('_', '-')[-40:]}".rstrip("-")
        w = Warehouse(tmp_path / "iceberg", request.getfixturevalue("s3_server"), bucket)
    w.create(TABLE)
    return w


def _sinks(wh: Warehouse) -> Sinks:
    return Sinks(APP, {"t": IcebergOutput("t", wh.properties, TABLE)}, 10.0)


def _write(s: Sinks, g: int, seq: int) -> None:
    s.write("t", writer_header(APP, g), f"k{g}", {"seq": seq, "key": f"k{g}", "v": 1, "total": 1})


def _seqs(wh: Warehouse) -> list[int]:
    return sorted(r["seq"] for r in wh.rows(TABLE))


def _files(wh: Warehouse) -> list[str]:
    return wh.files(wh.catalog().load_table(TABLE).location(), "data", ".parquet")


def _sink(s: Sinks) -> IcebergSink:
    sink = s._sinks["t"]
    assert isinstance(sink, IcebergSink)
    return sink


def test_declaration_rules() -> None:
    app = App("ice-decl")
    spec = app.iceberg_output("t", catalog={"type": "sql"}, table="ns.t")
    assert app.sinks == {"t": spec} and spec.mode == "append"
    with pytest.raises(ConfigError, match="declared twice"):
        app.iceberg_output("t", catalog="c", table="ns.t")
    with pytest.raises(ConfigError, match="already declared as an Iceberg output"):
        app.output("t")
    with pytest.raises(ConfigError, match="mode must be 'append'"):
        app.iceberg_output("u", catalog="c", table="ns.t", mode="upsert")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="namespace.name"):
        app.iceberg_output("u", catalog="c", table="t")
    with pytest.raises(ConfigError, match="catalog must be"):
        app.iceberg_output("u", catalog=3, table="ns.t")  # type: ignore[arg-type]
    sink = IcebergSink("a", spec)
    with pytest.raises(SinkRowError, match="mapping"):
        sink.add(0, "k", None)
    with pytest.raises(ConfigError, match="exactly_once"):
        Sinks("a", {"t": spec}, 10.0, exactly_once=False)


def test_secrets_are_masked_in_the_repr_and_in_catalog_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pyiceberg.catalog

    props = {
        "type": "sql",
        "uri": "postgresql://lockgate:pg-password-1@db/catalog",
        "warehouse": "s3://lake/warehouse",
        "s3.endpoint": "http://objects:9000",
        "s3.access-key-id": "AKIDEXAMPLE",
        "s3.secret-access-key": "s3-secret-1",
        "s3.session-token": "s3-token-1",
    }
    spec = IcebergOutput("t", props, "ns.t")
    text = repr(spec)
    for secret in ("pg-password-1", "s3-secret-1", "s3-token-1"):
        assert secret not in text
    assert "http://objects:9000" in text and "AKIDEXAMPLE" in text and "lockgate:***@db" in text
    # pyiceberg names every property when it cannot tell the catalog's type: masked; the
    # environment's secrets too (pyiceberg merges PYICEBERG_CATALOG__* into the properties).
    monkeypatch.setenv("PYICEBERG_CATALOG__DEFAULT__S3__SECRET_ACCESS_KEY", "env-secret-1")

    def refuse(name: str, **properties: str) -> None:
        merged = {**properties, "s3.secret-access-key": "env-secret-1"}
        raise ValueError(f"Could not initialize catalog with the following properties: {merged}")

    monkeypatch.setattr(pyiceberg.catalog, "load_catalog", refuse)
    bare = IcebergOutput(
        "t", {k: v for k, v in props.items() if k != "s3.secret-access-key"}, "ns.t"
    )
    with pytest.raises(RuntimeError, match="ValueError: Could not initialize") as err:
        bare.load_catalog()
    for secret in ("pg-password-1", "env-secret-1", "s3-token-1"):
        assert secret not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__

    def other(name: str, **properties: str) -> None:
        raise ValueError("no secret here")

    monkeypatch.setattr(pyiceberg.catalog, "load_catalog", other)
    with pytest.raises(ValueError, match="no secret here"):
        spec.load_catalog()  # errors without a secret pass as they are


def test_prepare_commit_abort_and_settle(any_wh: Warehouse) -> None:
    wh = any_wh
    a = _sinks(wh)
    a.settle([(0, None), (1, None)])
    _write(a, 0, 1)
    _write(a, 1, 2)
    a.prepare("tok1", [0, 1], time.monotonic())
    assert _seqs(wh) == [] and len(_files(wh)) == 2 and len(wh.markers(TABLE)) == 2
    a.commit()
    assert _seqs(wh) == [1, 2] and wh.markers(TABLE) == []
    snap = wh.catalog().load_table(TABLE).current_snapshot()
    assert snap is not None
    assert snap.summary is not None
    props: dict[str, Any] = snap.summary.additional_properties
    assert props["lockgate.app"] == APP and props["lockgate.epochs"] == "0=tok1,1=tok1"
    # An aborted epoch leaves nothing.
    _write(a, 0, 3)
    a.prepare("tok2", [0, 1], time.monotonic())
    a.abort()
    assert _seqs(wh) == [1, 2] and len(_files(wh)) == 2 and wh.markers(TABLE) == []
    # A crash before the Kafka commit: the next owner deletes the prepared files.
    _write(a, 0, 3)
    _write(a, 1, 4)
    a.prepare("tok3", [0, 1], time.monotonic())
    b = _sinks(wh)
    b.settle([(0, "tok1"), (1, "tok1")])
    assert _seqs(wh) == [1, 2] and len(_files(wh)) == 2 and wh.markers(TABLE) == []
    # A crash after the Kafka commit, before the append: the next owner appends.
    _write(b, 0, 5)
    _write(b, 1, 6)
    b.prepare("tok4", [0, 1], time.monotonic())
    c = _sinks(wh)
    c.settle([(0, "tok4"), (1, "tok4")])
    assert _seqs(wh) == [1, 2, 5, 6] and wh.markers(TABLE) == [] and len(_files(wh)) == 4
    # The new owner goes on; then the zombie's late append of tok4 arrives: the register
    # of key group 1 says tok4 (in already), that of 0 names a later epoch (taken over).
    _write(c, 0, 7)
    c.prepare("tok6", [0, 1], time.monotonic())
    c.commit()
    b.commit()
    assert _seqs(wh) == [1, 2, 5, 6, 7]
    # A zombie prepares an epoch Kafka will refuse, and dies: the next settle deletes it.
    _write(b, 0, 8)
    b.prepare("tokZ", [0], time.monotonic())
    d = _sinks(wh)
    d.settle([(0, "tok6"), (1, "tok4")])
    assert _seqs(wh) == [1, 2, 5, 6, 7] and wh.markers(TABLE) == [] and len(_files(wh)) == 5
    for s in (a, b, c, d):
        s.close(None)


def test_a_marker_left_after_the_append_is_deleted_alone(wh: Warehouse) -> None:
    a = _sinks(wh)
    a.settle([(0, None)])
    _write(a, 0, 1)
    a.prepare("tok1", [0], time.monotonic())
    marker = Path(wh.markers(TABLE)[0])
    location = Path(wh.catalog().load_table(TABLE).location().removeprefix("file://"))
    body = next((location / "lockgate").rglob(marker.name)).read_bytes()
    a.commit()
    # As if the committer died between the append and the marker's deletion.
    (location / "lockgate" / APP / "t" / marker.name).write_bytes(body)
    b = _sinks(wh)
    b.settle([(0, "tok1")])
    assert _seqs(wh) == [1] and wh.markers(TABLE) == [] and len(_files(wh)) == 1


def test_a_commit_refused_for_a_concurrent_one_is_retried(wh: Warehouse) -> None:
    a, b = _sinks(wh), _sinks(wh)
    a.settle([(0, None)])
    b.settle([(1, None)])
    _write(a, 0, 1)
    _write(b, 1, 2)
    a.prepare("tokA", [0], time.monotonic())
    b.prepare("tokB", [1], time.monotonic())
    sink_a = _sink(a)
    real = sink_a._append
    calls: list[str] = []

    def racing(table: Any, parts: Any, job: Any, why: str) -> None:
        calls.append(why)
        if len(calls) == 1:
            b.commit()  # lands between a's load and a's commit
        real(table, parts, job, why)

    sink_a._append = racing  # type: ignore[method-assign]
    a.commit()
    assert len(calls) == 2, calls  # refused once (CommitFailedException), then appended
    assert _seqs(wh) == [1, 2]
    props = wh.catalog().load_table(TABLE).properties
    assert props[f"lockgate:{APP}:t:0"] == "tokA" and props[f"lockgate:{APP}:t:1"] == "tokB"


def test_a_locked_catalog_aborts_the_epoch_and_the_append_waits(wh: Warehouse) -> None:
    a = _sinks(wh)
    a.settle([(0, None)])
    _write(a, 0, 1)
    a.prepare("tok1", [0], time.monotonic())
    locked = wh.lock_catalog(3.0)
    a.commit()  # cannot append now: pending
    assert _sink(a).has_pending()
    _write(a, 0, 2)
    with pytest.raises(SinkUnavailable):
        a.prepare("tok2", [0], time.monotonic() - 10 + 0.5)  # a short bound left
    a.abort()
    locked.join()
    a.tidy([0])
    assert not _sink(a).has_pending() and _seqs(wh) == [1]
    _write(a, 0, 2)
    a.prepare("tok3", [0], time.monotonic())
    a.commit()
    assert _seqs(wh) == [1, 2] and wh.markers(TABLE) == [] and len(_files(wh)) == 2
