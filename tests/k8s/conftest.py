"""The Kubernetes tier: a real single-node cluster (deploy/k8s/cluster.sh) for the chart.

Runs only with ``LOCKGATE_TEST_K8S=1`` (``make test-k8s``). The session fixture builds the
images and the cluster's parts (cached after the first run), starts the cluster, and tears it
down at the end (set ``LOCKGATE_TEST_K8S_KEEP=1`` to keep it running for a post-mortem; then
``deploy/k8s/cluster.sh down`` by hand). Measured times are printed in the terminal summary.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.k8s.kube import TIMES, Cluster, cluster_sh

ENABLED = os.environ.get("LOCKGATE_TEST_K8S") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "k8s: needs root and builds/starts a Kubernetes cluster")
    config.addinivalue_line(
        "markers",
        "k8s_long: a longer Kubernetes scenario: make test-k8s runs it, make test does not",
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMES:
        terminalreporter.section("k8s tier: measured times")
        for name, seconds in TIMES.items():
            terminalreporter.write_line(f"{seconds:8.1f} s  {name}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if not ENABLED:
        pytest.skip("the Kubernetes tier runs with LOCKGATE_TEST_K8S=1 (make test-k8s)")
    if os.geteuid() != 0:
        pytest.skip("the Kubernetes tier needs root (kubelet, containerd, bridges)")
    try:
        yield Cluster.up()
    finally:
        if os.environ.get("LOCKGATE_TEST_K8S_KEEP") != "1":
            cluster_sh("down", timeout=600)
