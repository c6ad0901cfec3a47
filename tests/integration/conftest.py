"""Fixtures of the integration tests only."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.support.schema_registry import RegistryServer, RegistryUnavailable


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A real schema registry (Apicurio, Confluent-compatible API) for the session.

    Built once under .cache/schema-registry/ (Maven Central), started on a free port;
    its start-up time is printed. Skips when Java or Maven is missing.
    """
    log = tmp_path_factory.mktemp("schema-registry") / "registry.log"
    try:
        server = RegistryServer(log).start()
    except RegistryUnavailable as exc:
        if "not installed" in str(exc):
            pytest.skip(str(exc))
        raise
    print(
        f"\nschema registry up at {server.url} in {server.startup_seconds:.1f} s",
        file=sys.stderr,
    )
    try:
        yield server
    finally:
        server.stop()
