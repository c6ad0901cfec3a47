"""Savepoints in an S3-compatible object store, as the chart configures the pods.

A real S3 API server (moto's, in-process on a free port) and s3fs: the processor image's
``s3`` extra. The endpoint reaches s3fs the two ways the chart renders it for
``savepoints.endpointUrl``: ``AWS_ENDPOINT_URL`` (botocore) and ``FSSPEC_S3_ENDPOINT_URL``
(fsspec's configuration); the credentials come from ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` (the chart's ``savepoints.credentials.env``). Skipped when s3fs or
moto is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from state.savepoint import SavepointError, SavepointStore, StoreFile
from tests.support.ports import free_port

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

SP = "sp-20250102T030405Z-a1b2c3"
BUCKET = "lockgate-savepoints"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "lockgate")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "lockgate-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3fs.S3FileSystem.clear_instance_cache()


def _make_bucket(endpoint: str) -> None:
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)


def _round_trip(root: str) -> None:
    store = SavepointStore(root)
    items = [(b"", b""), (b"\x00", b"\xff" * 100), (b"k", b"v")]
    sf = store.write_store(SP, "app", 3, "s", items)
    store.write_manifest(SP, "app", 3, {"stores": {"s": sf.to_dict()}})
    store.write_descriptor(SP, {"app": "app"})
    assert store.list_savepoints() == [SP]
    assert store.list_key_groups(SP, "app") == [3]
    back = StoreFile.from_dict(store.read_manifest(SP, "app", 3)["stores"]["s"])
    assert list(store.read_store(SP, "app", 3, "s", back)) == items
    store.verify_store(SP, "app", 3, "s", back)
    assert store.read_descriptor(SP) == {"app": "app"}
    with pytest.raises(SavepointError, match="not found"):
        store.read_manifest(SP, "app", 4)


def test_aws_endpoint_url(
    endpoint: str, credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _make_bucket(endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    _round_trip(f"s3://{BUCKET}/aws-endpoint")


def test_fsspec_s3_endpoint_url(
    endpoint: str, credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsspec.config

    _make_bucket(endpoint)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    # What fsspec reads from the environment at import (the pod has the variable from the start).
    conf: dict[str, Any] = {}
    fsspec.config.set_conf_env(conf, {"FSSPEC_S3_ENDPOINT_URL": endpoint})
    assert conf == {"s3": {"endpoint_url": endpoint}}
    monkeypatch.setattr(fsspec.config, "conf", conf)
    _round_trip(f"s3://{BUCKET}/fsspec-endpoint")


def test_a_missing_savepoint_in_the_bucket_is_a_savepoint_error(
    endpoint: str, credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _make_bucket(endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    store = SavepointStore(f"s3://{BUCKET}/empty")
    with pytest.raises(SavepointError):
        store.read_descriptor(SP)


def test_an_unreachable_store_is_a_savepoint_error(
    credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore's connection errors are not ``OSError``: the store still fails as a savepoint.

    (Seen on the Kubernetes tier: with the object store down, ``EndpointConnectionError``
    escaped the export and ended the processors instead of failing the savepoint.)
    """
    import fsspec.config

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    conf = {"s3": {"endpoint_url": dead, "config_kwargs": {"retries": {"max_attempts": 1}}}}
    monkeypatch.setattr(fsspec.config, "conf", conf)
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    store = SavepointStore(f"s3://{BUCKET}/down")
    with pytest.raises(SavepointError, match="EndpointConnectionError"):
        store.write_store(SP, "app", 0, "s", [(b"k", b"v")])
    with pytest.raises(SavepointError, match="EndpointConnectionError"):
        store.write_manifest(SP, "app", 0, {"stores": {}})
    with pytest.raises(SavepointError, match="EndpointConnectionError"):
        store.read_descriptor(SP)


def test_a_filesystem_error_of_another_kind_is_a_savepoint_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Any filesystem package's own error fails the savepoint; the data's errors stay."""
    from fsspec.implementations.memory import MemoryFileSystem

    class StoreDown(Exception):
        pass

    store = SavepointStore("memory://lockgate-down")
    with pytest.raises(ValueError):  # not increasing by key: the caller's error, unchanged
        store.write_store(SP, "app", 0, "s", [(b"b", b""), (b"a", b"")])

    def down(*args: Any, **kwargs: Any) -> None:
        raise StoreDown("the service is unavailable")

    monkeypatch.setattr(MemoryFileSystem, "open", down)
    with pytest.raises(SavepointError, match="StoreDown: the service is unavailable"):
        store.write_store(SP, "app", 0, "s", [(b"k", b"v")])
    with pytest.raises(SavepointError, match="StoreDown"):
        store.read_descriptor(SP)
