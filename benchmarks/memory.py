"""Peak RSS of one instance as its key groups grow: bounded state memory vs the old defaults.

Usage::

    .venv/bin/python -m benchmarks.memory --bootstrap 127.0.0.1:59092 \\
        --partitions 4,16,32 --keys-per-group 8000 --value-bytes 1024 --limit-mib 512 \\
        [--baseline-ref 828fabf] [--fetch-defaults]

For each partition count ``N`` it creates an input topic with ``N`` partitions, produces
``N * keys-per-group`` records with distinct keys and ``value-bytes`` of payload (so the
state *per key group* is fixed and the state of the instance grows with ``N``, as when a
pod takes over the key groups of a lost node), runs one ``lockgate run
benchmarks.memory:app`` instance (reads and writes one value state per record) with
``LOCKGATE_MEMORY_LIMIT_BYTES``, waits until its committed offsets reach the end of the
input, lets two more epochs pass, and records the process's peak RSS (``VmHWM``).

``--baseline-ref`` runs the same with the tree of that git commit (``git archive`` into a
temporary directory, first on ``PYTHONPATH``): the state layer before the shared cache,
write-buffer manager and read-cache budget. Results go to stdout as a Markdown table and
to ``benchmarks/out/memory-<time>.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from processors import App, Context

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024

# -- the app: one value state, read and written per record ------------------------------

INPUT = os.environ.get("MEMBENCH_INPUT", "membench-in")
app = App("membench")
blobs = app.value_state("blobs")


@app.process(INPUT)
def keep(key: str, value: dict[str, Any], ctx: Context) -> None:
    """Read the key's state (a cache miss for a new key), then store the record."""
    blobs.value()
    blobs.update(value)


# -- the harness ------------------------------------------------------------------------


@dataclass
class Result:
    """One run: which code, how many key groups, what it took."""

    code: str
    partitions: int
    records: int
    state_mib: float
    limit_mib: int
    peak_rss_mib: float
    rss_mib: float
    seconds: float


def _produce(bootstrap: str, topic: str, partitions: int, records: int, value_bytes: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        fut.result(30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 20,
            "compression.type": "lz4",
        }
    )
    pad = "x" * value_bytes
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=f"k{i:09}", value=orjson.dumps({"i": i, "pad": pad}))
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)


def _caught_up(bootstrap: str, group: str, topic: str, partitions: int) -> bool:
    """Whether ``group`` committed every partition up to its end.

    False when the broker does not answer in time (a loaded machine): polled again.
    """
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        committed = c.committed(tps, timeout=10)
        for tp in committed:
            _, high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
            if tp.offset < high:
                return False
        return True
    except KafkaException:
        return False
    finally:
        c.close()


def _status(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            out[name] = int(rest.split()[0]) / 1024  # kB -> MiB
    return out


#: librdkafka's own defaults of the limits the memory plan sets (processors/_task/keygroups.py
#: ``MemoryPlan.fetch_config``) and no epoch bound (``MemoryPlan.epoch_bytes``): the
#: instance as it was before its input side was budgeted.
LIBRDKAFKA_FETCH_DEFAULTS = {
    "LOCKGATE_KAFKA__QUEUED_MAX_MESSAGES_KBYTES": "65536",
    "LOCKGATE_KAFKA__FETCH_MAX_BYTES": "52428800",
    "LOCKGATE_KAFKA__MAX_PARTITION_FETCH_BYTES": "1048576",
    "LOCKGATE_CHECKPOINT_MAX_BYTES": str(1 << 50),
}


def run_one(
    bootstrap: str,
    partitions: int,
    keys_per_group: int,
    value_bytes: int,
    limit_mib: int,
    code_dir: Path | None = None,
    timeout_s: float = 600,
    extra_env: dict[str, str] | None = None,
) -> Result:
    """Run one instance over ``partitions`` key groups; return its peak RSS.

    Args:
        bootstrap: the broker.
        partitions: key groups (all owned by the one instance).
        keys_per_group: distinct keys per key group (records = partitions x this).
        value_bytes: payload per record (the state value is about this big).
        limit_mib: ``LOCKGATE_MEMORY_LIMIT_BYTES`` in MiB (older code ignores it).
        code_dir: run this tree's code (``None``: this checkout).
        timeout_s: give up after this long.
        extra_env: more environment for the instance.

    Raises:
        RuntimeError: the instance exited or did not catch up in time.
    """
    tag = uuid.uuid4().hex[:8]
    topic, name = f"membench-in-{tag}", f"membench-{tag}"
    records = partitions * keys_per_group
    _produce(bootstrap, topic, partitions, records, value_bytes)
    env = {
        **os.environ,
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": name,
        "LOCKGATE_INSTANCE_ID": "m1",
        "LOCKGATE_HTTP_PORT": "0",
        "LOCKGATE_LOG_FORMAT": "console",
        "LOCKGATE_MEMORY_LIMIT_BYTES": str(limit_mib * MIB),
        "MEMBENCH_INPUT": topic,
        **(extra_env or {}),
    }
    cwd = ROOT
    if code_dir is not None:
        env["PYTHONPATH"] = str(code_dir)
        cwd = code_dir
        del env["LOCKGATE_MEMORY_LIMIT_BYTES"]  # not a setting there
    lockgate = Path(sys.executable).parent / "lockgate"
    with tempfile.TemporaryDirectory(prefix="membench-") as state:
        env["LOCKGATE_STATE_DIR"] = state
        log_path = Path(state) / "app.log"
        with log_path.open("wb") as log:
            started = time.monotonic()
            proc = subprocess.Popen(  # noqa: S603 - this venv's lockgate
                [str(lockgate), "run", "benchmarks.memory:app"],
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                while not _caught_up(bootstrap, name, topic, partitions):
                    if proc.poll() is not None:
                        raise RuntimeError(f"instance exited: {log_path.read_text()[-2000:]}")
                    if time.monotonic() - started > timeout_s:
                        raise RuntimeError(f"no catch-up in {timeout_s}s")
                    time.sleep(0.5)
                seconds = time.monotonic() - started
                time.sleep(2.0)  # the last commits' writes and trims
                status = _status(proc.pid)
            finally:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
    label = "baseline" if code_dir is not None else "bounded"
    if extra_env and code_dir is None:
        label = "state bounded, input not (librdkafka's fetch defaults, no epoch bound)"
    return Result(
        code=label,
        partitions=partitions,
        records=records,
        state_mib=round(records * (value_bytes + 40) / MIB, 1),
        limit_mib=limit_mib,
        peak_rss_mib=round(status["VmHWM"], 1),
        rss_mib=round(status["VmRSS"], 1),
        seconds=round(seconds, 1),
    )


def storage_peak(
    partitions: int, keys_per_group: int, value_bytes: int, limit_mib: int, bounded: bool
) -> float:
    """Peak RSS (MiB) of the state layer alone, in this process: call it in a fresh one.

    Opens ``partitions`` key groups the way the runtime does (``RocksDBBackend``,
    ``KeyGroup``; with ``bounded``, the ``StateMemory`` of ``limit_mib``, otherwise the old
    defaults: RocksDB's per-database options and no process budget), then runs epochs
    like the runtime's: every key group reads and writes 500 new keys through its cache,
    drains, applies the committed writes to RocksDB and trims the caches (ceiling
    ``state_cache_entries``' default), until each has ``keys_per_group`` keys. Values are
    decoded from JSON, as the runtime's are (one object per record, nothing shared).
    """
    from processors._config.settings import Settings
    from processors._task.keygroups import KeyGroup, MemoryPlan, StateMemory
    from state.base.store import META_CHECKPOINT
    from state.cache import KeyCursor
    from state.codecs import JSON
    from state.primitives import StateHandle, StoreSpec, ValueState
    from state.rocksdb import RocksDBBackend

    memory = StateMemory(MemoryPlan.of(Settings(memory_limit_bytes=limit_mib * MIB)))
    handles: dict[str, StateHandle] = {
        "blobs": ValueState(StoreSpec("blobs", "value", JSON), KeyCursor())
    }
    pad = "x" * value_bytes
    with tempfile.TemporaryDirectory(prefix="membench-store-") as root:
        backend = RocksDBBackend(Path(root), memory.rocksdb if bounded else None)
        budget = memory.read_cache if bounded else None
        kgs = [
            KeyGroup(g, backend.open("app", g, ["blobs"]), handles, budget)
            for g in range(partitions)
        ]
        batch = 500
        for epoch, start in enumerate(range(0, keys_per_group, batch)):
            for kg in kgs:
                cache = kg.caches["blobs"]
                for i in range(start, min(start + batch, keys_per_group)):
                    key = f"{kg.index}-{i:09}".encode()
                    cache.get(key)
                    cache.put(key, orjson.loads(orjson.dumps({"i": i, "pad": pad})))
                kg.db.apply({"blobs": cache.drain()}, {META_CHECKPOINT: str(epoch).encode()})
            for kg in kgs:
                for c in kg.caches.values():
                    c.trim(200_000)
        peak = _status(os.getpid())["VmHWM"]
        for kg in kgs:
            kg.close()
    return peak


def export_tree(ref: str, into: Path) -> Path:
    """Extract the tree of git commit ``ref`` into ``into`` (no change to the repository)."""
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", ref], cwd=ROOT, stdout=out, check=True)  # noqa: S607
    tree = into / "tree"
    tree.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    shutil.copy(Path(__file__), tree / "benchmarks" / "memory.py")  # the same app
    return tree


def storage_peak_in_child(
    mode: str, partitions: int, keys_per_group: int, value_bytes: int, limit_mib: int
) -> float:
    """Run :func:`storage_peak` in a fresh interpreter (``mode``: bounded or baseline)."""
    out = subprocess.run(  # noqa: S603 - this interpreter
        [
            sys.executable,
            "-m",
            "benchmarks.memory",
            "--bootstrap=-",
            f"--storage-child={mode}",
            f"--partitions={partitions}",
            f"--keys-per-group={keys_per_group}",
            f"--value-bytes={value_bytes}",
            f"--limit-mib={limit_mib}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def _storage_sweep(args: argparse.Namespace) -> int:
    print("| state layer | key groups | state (MiB) | limit (MiB) | peak RSS (MiB) |")
    print("|---|---|---|---|---|")
    for n in (int(p) for p in args.partitions.split(",")):
        for mode in ("bounded", "baseline"):
            peak = storage_peak_in_child(
                mode, n, args.keys_per_group, args.value_bytes, args.limit_mib
            )
            state = round(n * args.keys_per_group * (args.value_bytes + 40) / MIB, 1)
            print(f"| {mode} | {n} | {state} | {args.limit_mib} | {peak} |", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; print a Markdown table and write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--partitions", default="4,16,32")
    parser.add_argument("--keys-per-group", type=int, default=8000)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--limit-mib", type=int, default=512)
    parser.add_argument("--baseline-ref", default=None)
    parser.add_argument(
        "--fetch-defaults",
        action="store_true",
        help="also run this checkout without the input bounds (librdkafka's fetch "
        "defaults, no epoch bound)",
    )
    parser.add_argument(
        "--storage-child",
        choices=["bounded", "baseline"],
        default=None,
        help="internal: print storage_peak for the first partition count and exit",
    )
    parser.add_argument(
        "--storage", action="store_true", help="sweep the state layer alone (no broker)"
    )
    args = parser.parse_args(argv)
    if args.storage_child:
        peak = storage_peak(
            int(args.partitions.split(",")[0]),
            args.keys_per_group,
            args.value_bytes,
            args.limit_mib,
            args.storage_child == "bounded",
        )
        print(round(peak, 1))
        return 0
    if args.storage:
        return _storage_sweep(args)
    counts = [int(p) for p in args.partitions.split(",")]
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="membench-code-") as tmp:
        codes: list[tuple[Path | None, dict[str, str] | None]] = [(None, None)]
        if args.fetch_defaults:
            codes.append((None, LIBRDKAFKA_FETCH_DEFAULTS))
        if args.baseline_ref:
            codes.append((export_tree(args.baseline_ref, Path(tmp)), None))
        for n in counts:
            for code_dir, extra_env in codes:
                result = run_one(
                    args.bootstrap,
                    n,
                    args.keys_per_group,
                    args.value_bytes,
                    args.limit_mib,
                    code_dir,
                    extra_env=extra_env,
                )
                print(orjson.dumps(asdict(result)).decode(), flush=True)
                results.append(result)
    print()
    print("| code | key groups | records | state (MiB) | limit (MiB) | peak RSS (MiB) | s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.code} | {r.partitions} | {r.records} | {r.state_mib} | {r.limit_mib} "
            f"| {r.peak_rss_mib} | {r.seconds} |"
        )
    out = ROOT / "benchmarks" / "out" / f"memory-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"args": vars(args), "results": [asdict(r) for r in results]}
    out.write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
