"""A job on a real Spark standalone cluster (master + 2 workers on 127.0.0.1).

The cluster runs from the pyspark distribution itself (``tests/support/spark_cluster.py``);
the driver program (``_cluster_job.py``) runs in a subprocess, because the pytest process
already holds the shared local SparkContext and a process may have only one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest

from processors._dsl.partitioner import key_group, murmur2
from processors._spark.job import code_archive, is_local_master
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.procs import lockgate_cli
from tests.support.spark_cluster import StandaloneCluster, session_members

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("_cluster_job.py")
JOB_TIMEOUT_S = 90


def _run_driver(
    master_url: str, app_name: str, out: Path, cluster: StandaloneCluster
) -> tuple[float, dict[str, Any]]:
    """Run the driver program to completion in its own session; return (wall s, its result)."""
    # Its own driver: never attach to a gateway of this process; examples/ comes from
    # the script's own sys.path entry, not PYTHONPATH.
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PYTHONPATH" and not k.startswith("PYSPARK_GATEWAY_")
    }
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(JOB), master_url, app_name, str(out)],
        cwd=out.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    finally:
        for pid in session_members({proc.pid}):  # its JVM, should it outlive it
            os.kill(pid, signal.SIGKILL)
    wall = time.monotonic() - t0
    text = output.decode(errors="replace")
    assert proc.returncode == 0, (
        f"driver exited with {proc.returncode}\n{text[-6000:]}\n{cluster.log_tails(30)}"
    )
    return wall, json.loads(out.read_text())


def _application(cluster: StandaloneCluster, app_name: str) -> dict[str, Any]:
    """The master's record of application ``app_name`` once it has completed."""
    deadline = time.monotonic() + 15
    while True:
        status = cluster.status()
        done = [app for app in status["completedapps"] if app["name"] == app_name]
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert done, f"{app_name} not among the completed apps: {json.dumps(status)[:3000]}"
    return dict(done[0])


@pytest.mark.timeout(180)
@pytest.mark.skipif(
    not (os.environ.get("JAVA_HOME") or shutil.which("java")), reason="needs a Java runtime"
)
def test_job_runs_in_the_executors_of_a_standalone_cluster(
    tmp_path: Path, kafka_bootstrap: str, names: Any
) -> None:
    app_name = f"lockgate-cluster-test-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "result.json"
    with StandaloneCluster(
        workers=2, cores_per_worker=1, memory="1g", work_dir=tmp_path / "cluster"
    ) as cluster:
        sids = set(cluster.pids())
        workers = set(cluster.worker_pids())
        print(f"\ncluster start: {cluster.start_seconds:.1f} s")
        assert re.fullmatch(r"spark://127\.0\.0\.1:\d+", cluster.master_url)
        status = cluster.status()
        assert status["aliveworkers"] == 2
        assert {w["host"] for w in status["workers"]} == {"127.0.0.1"}
        listening = cluster.listening()
        assert {host for host, _ in listening} == {"127.0.0.1"}, listening
        master_port = int(cluster.master_url.rsplit(":", 1)[1])
        ui_port = int(cluster.web_ui.rsplit(":", 1)[1])
        assert {master_port, ui_port} <= {port for _, port in listening}
        assert len(listening) == 2 + 2 * 2  # rpc + web UI of the master and each worker

        wall, result = _run_driver(cluster.master_url, app_name, out, cluster)
        print(
            f"driver wall: {wall:.1f} s (session up {result['session_seconds']:.1f} s, "
            f"job {result['job_seconds']:.2f} s)"
        )
        app = _application(cluster, app_name)
        assert app["state"] == "FINISHED"
        assert len(list(cluster.work_dir.glob(f"worker-*/{app['id']}/*"))) == 2

        # lockgate backfill on the cluster: the app and lockgate shipped to the executors.
        bf_app, inp, bf_out = names("cl-sum"), names("cl-sum-in"), names("cl-sum-out")
        create_topic(kafka_bootstrap, inp, 2)
        produce_numbers(kafka_bootstrap, inp, ((f"k{i % 13}", i % 7, i) for i in range(2000)))
        env = {
            "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "LOCKGATE_APP_NAME": bf_app,
            "LOCKGATE_INPUT_TOPIC": inp,
            "LOCKGATE_OUTPUT_TOPIC": bf_out,
            "LOCKGATE_SAVEPOINT_DIR": str(tmp_path / "sp"),
        }
        t0 = time.monotonic()
        bf = lockgate_cli(
            env,
            "backfill",
            "examples.running_sum:app",
            "--master",
            cluster.master_url,
            timeout=150,
        )
        print(f"backfill on the cluster: {time.monotonic() - t0:.1f} s")
        assert bf.returncode == 0, bf.stderr[-5000:] + cluster.log_tails(30)
        bf_run = _application(cluster, f"lockgate-backfill-{bf_app}")
        assert bf_run["state"] == "FINISHED"
        got = read_all(kafka_bootstrap, bf_out, expected=2000, idle=1)
        problems = check(model(read_inputs(kafka_bootstrap, inp, 2000)), got)
        assert problems == [] and len(got) == 2000, problems[:5]

    rows = sorted(result["rows"], key=lambda row: row["index"])
    assert [row["index"] for row in rows] == [0, 1, 2, 3]
    expected_group = key_group(b"a", 4)
    assert expected_group == (murmur2(b"a") & 0x7FFFFFFF) % 4
    for i, row in enumerate(rows):
        assert row["key_group"] == expected_group
        # running_sum over v = i, i+1, i+2
        assert row["sums"] == [i, 2 * i + 1, 3 * i + 3]
        # Imported from the shipped archive, not from the checkout or the editable install.
        for module, path in row["files"].items():
            assert re.search(r"lockgate-code-[0-9a-f]{16}\.zip/", path), (module, path)
    pids = {row["pid"] for row in rows}
    assert os.getpid() not in pids and result["driver_pid"] not in pids
    # Each task ran in a Python worker started by a worker daemon's executor (same
    # session), and both workers got tasks.
    assert {row["sid"] for row in rows} == workers, (rows, workers)
    # Stopped: nothing the cluster started is left.
    assert session_members(sids) == {}


def test_code_archive_zips_packages_without_caches(tmp_path: Path) -> None:
    src = tmp_path / "src"
    pkg = src / "mypkg"
    (pkg / "sub" / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text("Y = 2\n")
    (pkg / "sub" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"junk")
    (pkg / "stale.pyc").write_bytes(b"junk")
    (src / "single.py").write_text("Z = 3\n")
    sys.path.insert(0, str(src))
    try:
        first = code_archive(["mypkg", "single", "mypkg"], tmp_path / "a.zip")
        second = code_archive(["single", "mypkg"], tmp_path / "b.zip")
    finally:
        sys.path.remove(str(src))
    with zipfile.ZipFile(first) as archive:
        assert sorted(archive.namelist()) == [
            "mypkg/__init__.py",
            "mypkg/sub/__init__.py",
            "mypkg/sub/mod.py",
            "single.py",
        ]
    assert first.read_bytes() == second.read_bytes()  # deterministic
    probe = subprocess.run(
        [sys.executable, "-c", "import mypkg.sub.mod, single; print(mypkg.sub.mod.__file__)"],
        env={**os.environ, "PYTHONPATH": str(first)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == str(first / "mypkg" / "sub" / "mod.py")


def test_code_archive_refuses_what_cannot_be_shipped(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must end with .zip"):
        code_archive(["processors"], tmp_path / "code.tar")
    with pytest.raises(ValueError, match="top-level"):
        code_archive(["processors.cli"], tmp_path / "code.zip")
    with pytest.raises(ValueError, match="no modules"):
        code_archive([], tmp_path / "code.zip")
    with pytest.raises(ModuleNotFoundError):
        code_archive(["no_such_module_xyz"], tmp_path / "code.zip")
    with pytest.raises(ValueError, match="pure-Python"):
        code_archive(["sys"], tmp_path / "code.zip")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local-cluster[2,1,1024]", True),
        ("spark://127.0.0.1:7077", True),
        ("spark://localhost:7077", True),
        ("spark://127.0.0.1:7077,localhost:7078", True),
        ("spark://10.0.0.5:7077", False),
        ("spark://127.0.0.1:7077,spark-master:7077", False),
        ("yarn", False),
        ("k8s://https://127.0.0.1:6443", False),
    ],
)
def test_is_local_master(master: str, local: bool) -> None:
    assert is_local_master(master) is local
