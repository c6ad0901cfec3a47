"""Fixtures of the chart tests: the helm binary, built once per session when missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helm import BUILD_TIMEOUT_S, ensure_helm, find_helm

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give the chart tests room for the one-off helm build when helm is not there yet.

    The session fixture below builds helm during the setup of the first chart test, which
    counts against that test's timeout (600 s in pyproject.toml); a cold build on a loaded
    machine can take longer. Once helm is cached, the project's timeout applies unchanged.
    """
    deploy_items = [item for item in items if _HERE in Path(item.path).resolve().parents]
    if deploy_items and find_helm() is None:
        for item in deploy_items:
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S + 60))


@pytest.fixture(scope="session", autouse=True)
def helm_binary(pytestconfig: pytest.Config) -> Path:
    """Path of the pinned helm (the first session on a machine builds it: minutes).

    Output capture is suspended meanwhile, so that "building helm ..." shows on the terminal
    instead of a silent pause.
    """
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    if capture is None:
        return ensure_helm()
    with capture.global_and_fixture_disabled():
        return ensure_helm()
