"""Fresh-volume failover time vs state size, with and without state snapshots.

Usage: ``.venv/bin/python -m benchmarks.failover`` (``make bench-failover``). Writes
``benchmarks/RESULTS-failover.md`` and the raw numbers to
``benchmarks/out/failover-<stamp>/results.json`` (``--report RESULTS_JSON`` rewrites the
report from them).

Per state size N (``BENCH_FAILOVER_KEYS``, default ``1000000,10000000``): N records, one per
key, go through the running sum (``benchmarks/apps/lockgate_apps.py``, exactly-once, 1 s
checkpoints, ``BENCH_FAILOVER_PARTITIONS`` key groups, one instance) with state snapshots on
(``LOCKGATE_STATE_SNAPSHOT_INTERVAL_MS``: ``BENCH_FAILOVER_SNAPSHOT_MS``, default 10 s, into a
local directory), then the instance is killed with SIGKILL. Each failover round deletes the
state directory (a pod on a fresh volume), produces 8 probe records, starts a new instance
and times it from the process spawn until the group's committed input offsets include the
probes (its first committed epoch after the restore: interpreter start, imports, group join,
fencing, restore, one epoch), then kills it with SIGKILL again. Rounds alternate between
snapshots off (the whole changelog is replayed) and on (newest snapshot + changelog tail), the
order flipping every repeat (``BENCH_FAILOVER_REPEAT``, default 3), so a load change on the
shared machine hits both; then a third round with a long tail: an instance with snapshots off
first changes ``BENCH_FAILOVER_TAIL`` keys (default 500,000), so the restore replays that
many changelog records after the snapshot. Each round checks the probe keys' latest
outputs (their sums count every probe so far: the restored state was right for them). The
restore columns come from the instance's own log lines ('key group state downloaded from a
snapshot', 'key group restored').

``BENCH_FAILOVER_S3=seaweedfs`` adds a remote snapshot store on SeaweedFS (a real
S3-compatible object store, tests/support/seaweedfs.py, on loopback); ``BENCH_FAILOVER_S3=moto``
one on moto's standalone S3 API server
(``moto_server``, a real HTTP server speaking the S3 API over loopback, its store in memory:
not a production object store) is started as a process of its own on
``BENCH_FAILOVER_S3_PORT`` (default: a free port). After the load, the local snapshot store
is copied to ``s3://lockgate-bench-snapshots/<run>`` (the same snapshots, byte for byte),
and the rounds alternate between three modes: without, with (the local directory) and
``with_s3`` (the instance downloads from the S3 server through s3fs, as
``LOCKGATE_STATE_SNAPSHOT_DIR=s3://...`` with ``AWS_ENDPOINT_URL`` does in production); the
order rotates every repeat. ``BENCH_FAILOVER_S3=http://host:port`` uses that S3 endpoint
instead (credentials from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``; the bucket must
exist).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from benchmarks import broker, data, proc
from benchmarks.admin import Admin, GroupOffsets
from benchmarks.machine import machine, uptime
from benchmarks.paths import BENCH_DIR, LOCKGATE_BIN
from benchmarks.progress import say
from benchmarks.run import _produce_keys, _restore_stats, _wait_committed

PROBES = 8
#: The bucket of the S3 rounds (created on a moto server; must exist on another endpoint).
S3_BUCKET = "lockgate-bench-snapshots"
#: Credentials of the moto server (any values are accepted by it).
_MOTO_ENV = {
    "AWS_ACCESS_KEY_ID": "lockgate-bench",
    "AWS_SECRET_ACCESS_KEY": "lockgate-bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Store:
    """The remote snapshot store of the ``with_s3`` rounds: an S3 endpoint and its env."""

    def __init__(self, spec: str, log_dir: Path) -> None:
        self._server: subprocess.Popen[bytes] | None = None
        self._weed: Any = None
        if spec == "seaweedfs":
            from tests.support.seaweedfs import SeaweedFS

            log_dir.mkdir(parents=True, exist_ok=True)
            self._weed = SeaweedFS(log_dir / "seaweedfs-data", log_dir / "seaweedfs.log")
            self._weed.start()
            self._weed.create_bucket(S3_BUCKET)
            self.endpoint = self._weed.endpoint
            self.env = {**_MOTO_ENV, "AWS_ENDPOINT_URL": self.endpoint}
        elif spec == "moto":
            port = int(os.environ.get("BENCH_FAILOVER_S3_PORT", "0")) or _free_port()
            exe = Path(sys.executable).with_name("moto_server")
            log_dir.mkdir(parents=True, exist_ok=True)
            with (log_dir / "moto-server.log").open("wb") as out:
                self._server = subprocess.Popen(
                    [str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out
                )
            self.endpoint = f"http://127.0.0.1:{port}"
            self.env = {**_MOTO_ENV, "AWS_ENDPOINT_URL": self.endpoint}
        else:
            self.endpoint = spec
            self.env = {k: os.environ.get(k, _MOTO_ENV[k]) for k in _MOTO_ENV} | {
                "AWS_ENDPOINT_URL": spec
            }
        try:
            self.fs = self._open_fs()
            if self._server is not None:
                if self._server.poll() is not None:  # e.g. its port was taken
                    raise RuntimeError(f"moto_server exited: see {log_dir / 'moto-server.log'}")
                self.fs.mkdir(S3_BUCKET)
        except BaseException:
            self.close()
            raise

    def _open_fs(self) -> Any:
        import s3fs

        deadline = time.monotonic() + 30
        while True:
            fs = s3fs.S3FileSystem(
                endpoint_url=self.endpoint,
                key=self.env["AWS_ACCESS_KEY_ID"],
                secret=self.env["AWS_SECRET_ACCESS_KEY"],
                skip_instance_cache=True,
            )
            try:
                fs.ls("")
                return fs
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def upload(self, local: Path, prefix: str) -> tuple[int, float]:
        """Copy the local snapshot store ``local`` to ``s3://<bucket>/<prefix>``: (bytes, s)."""
        t = time.monotonic()
        files = [f for f in local.rglob("*") if f.is_file()]
        for f in files:
            self.fs.put_file(str(f), f"{S3_BUCKET}/{prefix}/{f.relative_to(local).as_posix()}")
        return sum(f.stat().st_size for f in files), time.monotonic() - t

    def size(self, prefix: str) -> int:
        return int(self.fs.du(f"{S3_BUCKET}/{prefix}"))

    def remove(self, prefix: str) -> None:
        self.fs.rm(f"{S3_BUCKET}/{prefix}", recursive=True)

    def close(self) -> None:
        if self._server is not None:
            self._server.terminate()
            self._server.wait(30)
        if self._weed is not None:
            self._weed.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ints(name: str, default: str) -> list[int]:
    return [int(x) for x in os.environ.get(name, default).replace("_", "").split(",") if x]


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _snapshot_stats(log: Path) -> tuple[int, float, int]:
    """Key groups downloaded from a snapshot, their summed seconds and bytes."""
    count, seconds, size = 0, 0.0, 0
    for line in log.read_text(errors="replace").splitlines():
        if "key group state downloaded from a snapshot" not in line:
            continue
        count += 1
        for part in line.split():
            if part.startswith("seconds="):
                seconds += float(part.split("=", 1)[1])
            elif part.startswith("bytes="):
                size += int(part.split("=", 1)[1])
    return count, seconds, size


def _probe_sums(bootstrap: str, topic: str, partitions: int) -> dict[str, int]:
    """The latest committed output sum of each probe key (from the partitions' tails)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "failover-probe-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        ends = {}
        for p in range(partitions):
            _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends[p] = high
        c.assign([TopicPartition(topic, p, max(0, ends[p] - 400)) for p in range(partitions)])
        probes = {data.key_of(i).decode() for i in range(PROBES)}
        latest: dict[str, tuple[int, int]] = {}
        done: set[int] = set()
        deadline = time.monotonic() + 60
        while len(done) < partitions and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error():
                    continue
                if m.offset() + 1 >= ends[m.partition()]:
                    done.add(m.partition())
                key = (m.key() or b"").decode()
                if key in probes:
                    value = orjson.loads(m.value())
                    if key not in latest or value["seq"] > latest[key][0]:
                        latest[key] = (value["seq"], value["sum"])
            for p in range(partitions):
                if c.position([TopicPartition(topic, p)])[0].offset >= ends[p]:
                    done.add(p)
        return {k: v[1] for k, v in latest.items()}
    finally:
        c.close()


def _size(keys: int, cfg: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    bootstrap = cfg["bootstrap"]
    partitions = cfg["partitions"]
    admin = Admin(bootstrap)
    tag = f"{cfg['run_id']}-{keys}"
    topic, output, app = f"bench.fo{tag}.in", f"bench.fo{tag}.out", f"bench-fo{tag}"
    admin.create({topic: partitions}, {"retention.ms": "-1"})
    admin.create({output: partitions})
    state = out_dir / "state" / tag
    snaps = out_dir / "snapshots" / tag
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    say(f"{keys:,} keys: producing")
    t = time.monotonic()
    _produce_keys(bootstrap, topic, range(keys), 0)
    produce_s = time.monotonic() - t
    env = {
        "BENCH_INPUT": topic,
        "BENCH_OUTPUT": output,
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": app,
        "LOCKGATE_INSTANCE_ID": "f1",
        "LOCKGATE_STATE_DIR": str(state),
        "LOCKGATE_GUARANTEE": "exactly_once",
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "1000",
        "LOCKGATE_HTTP_PORT": "0",
        "LOCKGATE_LOG_FORMAT": "console",
        "LOCKGATE_STATE_SNAPSHOT_INTERVAL_MS": str(cfg["snapshot_ms"]),
        "PYTHONPATH": str(BENCH_DIR.parent),
    }
    with_snaps = {**env, "LOCKGATE_STATE_SNAPSHOT_DIR": str(snaps)}
    argv = [str(LOCKGATE_BIN), "run", "benchmarks.apps.lockgate_apps:running_sum"]
    groups = GroupOffsets(bootstrap, app, topic, partitions)
    say(f"{keys:,} keys: loading through the app (snapshots every {cfg['snapshot_ms']} ms)")
    p = proc.Proc(argv, with_snaps, logs / f"{tag}-load.log")
    load_s = _wait_committed(groups, keys, p, 3600)
    expected = keys

    def refresh_snapshots(p: proc.Proc, log: Path) -> None:
        """Make every key group of the running ``p`` snapshot its whole state now.

        Snapshots are taken at commits that change a key group, at most once per interval:
        the last one may be up to an interval behind. One more record for 64 keys (neither
        probes nor, being at most 64 of them, a real change of the tail), an interval later,
        makes every key group take one, and the uploads are waited for.
        """
        nonlocal expected
        uploaded = log.read_text(errors="replace").count("state snapshot uploaded")
        time.sleep(cfg["snapshot_ms"] / 1000 + 1)
        _produce_keys(bootstrap, topic, range(keys - 64, keys), expected)
        expected += 64
        _wait_committed(groups, expected, p, 600)
        deadline = time.monotonic() + 600
        while log.read_text(errors="replace").count("state snapshot uploaded") < (
            uploaded + partitions
        ):
            if time.monotonic() > deadline:
                raise TimeoutError("the snapshots were not uploaded")
            time.sleep(0.5)

    refresh_snapshots(p, logs / f"{tag}-load.log")
    p.kill9()
    say(f"  loaded in {load_s:.1f}s, snapshots of the whole state uploaded; killed")
    row: dict[str, Any] = {
        "keys": keys,
        "produce_seconds": round(produce_s, 1),
        "load_seconds": round(load_s, 1),
        "rounds": [],
    }
    s3: S3Store | None = cfg.get("s3")
    modes: tuple[str, ...] = ("without", "with")
    with_s3 = env
    if s3 is not None:
        copied, copy_s = s3.upload(snaps, tag)
        row["s3_copy_bytes"], row["s3_copy_seconds"] = copied, round(copy_s, 2)
        say(f"  snapshot store copied to {s3.endpoint} ({copied / 1e6:.0f} MB in {copy_s:.1f}s)")
        with_s3 = {**env, **s3.env, "LOCKGATE_STATE_SNAPSHOT_DIR": f"s3://{S3_BUCKET}/{tag}"}
        modes = ("without", "with", "with_s3")
    probes_sent = 0
    tail = min(cfg["tail"], keys - PROBES - 64)
    # Without and with alternate (the order rotates each repeat); then the long-tail
    # rounds, each leaving a fresh snapshot of everything for the next.
    plan = [
        (rep, mode)
        for rep in range(1, cfg["repeat"] + 1)
        for mode in modes[(rep - 1) % len(modes) :] + modes[: (rep - 1) % len(modes)]
    ]
    if tail > 0:
        plan += [(rep, "with_tail") for rep in range(1, cfg["repeat"] + 1)]
    for rep, mode in plan:
        if mode == "with_tail":
            # The previous round left the whole state on the volume: an instance with
            # snapshots off changes `tail` keys (the changelog after the newest snapshot
            # grows by that much), then it is killed too.
            _produce_keys(bootstrap, topic, range(keys - tail, keys), expected)
            expected += tail
            prep = proc.Proc(argv, env, logs / f"{tag}-tail-prep-r{rep}.log")
            _wait_committed(groups, expected, prep, 1800)
            prep.kill9()
        shutil.rmtree(state, ignore_errors=True)
        _produce_keys(bootstrap, topic, range(PROBES), expected)
        expected += PROBES
        probes_sent += 1
        log = logs / f"{tag}-{mode}-r{rep}.log"
        load_before = _loadavg()
        round_env = {"without": env, "with_s3": with_s3}
        p = proc.Proc(argv, round_env.get(mode, with_snaps), log)
        took = _wait_committed(groups, expected, p, 1800, since=p.started)
        if mode == "with_tail":
            refresh_snapshots(p, log)  # the next long-tail round starts from here
        p.kill9()
        restored, restore_s = _restore_stats(log)
        from_snap, snap_s, snap_bytes = _snapshot_stats(log)
        sums = _probe_sums(bootstrap, output, partitions)
        ok = sums == {data.key_of(i).decode(): 1 + probes_sent for i in range(PROBES)}
        r = {
            "rep": rep,
            "mode": mode,
            "seconds": round(took, 2),
            "restored_records": restored,
            "restore_seconds": round(restore_s, 2),
            "snapshot_key_groups": from_snap,
            "snapshot_seconds": round(snap_s, 2),
            "snapshot_bytes": snap_bytes,
            "load_avg_1m": load_before,
            "probes_ok": ok,
        }
        row["rounds"].append(r)
        say(
            f"  {mode} snapshots (run {rep}): first commit {took:.2f}s after the start; "
            f"{from_snap} from snapshots ({snap_bytes / 1e6:.0f} MB, {snap_s:.2f}s), "
            f"{restored:,} changelog records in {restore_s:.2f}s; load {load_before:.1f}; "
            f"probes {'ok' if ok else f'WRONG {sums}'}"
        )
    groups.close()
    shutil.rmtree(state, ignore_errors=True)
    snap_size = sum(f.stat().st_size for f in snaps.rglob("*") if f.is_file())
    row["snapshot_store_bytes"] = snap_size
    shutil.rmtree(snaps, ignore_errors=True)
    if s3 is not None:
        row["s3_store_bytes"] = s3.size(tag)
        s3.remove(tag)
    admin.admin.delete_topics([topic, output])
    return row


def _summary(row: dict[str, Any], mode: str, field: str) -> tuple[float, float, float]:
    values = [r[field] for r in row["rounds"] if r["mode"] == mode]
    return statistics.median(values), min(values), max(values)


def _report(results: dict[str, Any]) -> str:
    lines = [
        "# Fresh-volume failover: whole changelog vs snapshot + changelog tail",
        "",
        "Measured by `benchmarks/failover.py` (`make bench-failover`, or `make bench`'s "
        f"failover step) on {results['started']}, "
        f"{results['total_seconds'] / 60:.1f} min, on {results['machine']['cpu']} "
        f"({results['machine']['cores']} cores, {results['machine']['memory_gib']} GiB). "
        "The machine is shared (others run tests on it): load before "
        f"`{results['uptime_before']}`, after "
        f"`{results['uptime_after']}`; each round's 1-minute load average is in the raw JSON "
        "and summarised below.",
        "",
        "Time: from the restarted instance's process spawn until its first commit after the "
        "restore (the probes' offsets committed). Without: snapshots off, every key group "
        "replays its whole changelog. With: each key group downloads its newest snapshot "
        "(a local directory, so the copy is a local disk copy) and replays the changelog "
        "after it (the probes: the snapshot was taken after the last change). With_tail: "
        f"the same after {results.get('tail', 0):,} more keys were changed by an instance "
        "with snapshots off, so the changelog after the newest snapshot holds that many "
        "records (a snapshot interval's worth of changes at that rate). "
        f"{results['partitions']} key groups, one instance, exactly-once, 1 s checkpoints, "
        f"snapshots every {results['snapshot_ms']} ms; {results['repeat']} rounds per mode, "
        "without and with alternating (the order rotates each repeat), with_tail after them.",
        "",
    ]
    if results.get("s3"):
        lines += [
            f"With_s3: as with, but the snapshot store is `s3://{S3_BUCKET}/<run>` on "
            f"{results['s3']}; the local store's snapshots were copied there after the load, "
            "byte for byte, and are downloaded by the instance through s3fs; it rotates with "
            "the two others. "
            + (
                "moto's server is a real HTTP server speaking the S3 API over loopback, with "
                "an in-memory store: not a production object store (no network latency, no "
                "throttling, one Python process serving every request)."
                if "moto" in str(results["s3"])
                else "SeaweedFS is a real S3-compatible object store (objects in volume files "
                "on disk), here on loopback: no network latency between the instance and it."
            ),
            "",
        ]
    lines += [
        "| keys | mode | failover s median | min | max | restore s median "
        "(download + changelog) | snapshot download s median (min-max) | changelog records "
        "replayed (median) | snapshot MB | load avg (min-max) | probes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in results["sizes"]:
        for mode in ("without", "with", "with_s3", "with_tail"):
            rounds = [r for r in row["rounds"] if r["mode"] == mode]
            if not rounds:
                continue
            med, lo, hi = _summary(row, mode, "seconds")
            # 'key group restored' seconds include the snapshot's download
            rest = statistics.median(r["restore_seconds"] for r in rounds)
            recs = statistics.median(r["restored_records"] for r in rounds)
            mb = statistics.median(r["snapshot_bytes"] for r in rounds) / 1e6
            loads = [r["load_avg_1m"] for r in rounds]
            ok = "ok" if all(r["probes_ok"] for r in rounds) else "WRONG"
            # the summed seconds of the key groups' 'state downloaded from a snapshot' lines
            dl = [r["snapshot_seconds"] for r in rounds]
            dl_text = f"{statistics.median(dl):.2f} ({min(dl):.2f}-{max(dl):.2f})"
            lines.append(
                f"| {row['keys']:,} | {mode} | {med:.2f} | {lo:.2f} | {hi:.2f} | {rest:.2f} | "
                f"{dl_text if mode != 'without' else '-'} | {recs:,.0f} | {mb:.0f} | "
                f"{min(loads):.1f}-{max(loads):.1f} | {ok} |"
            )
    lines += [
        "",
        "Settings: " + " ".join(f"`{k}={v}`" for k, v in sorted(results["settings"].items()) if v),
        "",
    ]
    for row in results["sizes"]:
        lines.append(
            f"- {row['keys']:,} keys: produced in {row['produce_seconds']} s, loaded through the "
            f"app in {row['load_seconds']} s; snapshot store at the end: "
            f"{row.get('snapshot_store_bytes', 0) / 1e6:.0f} MB"
            + (
                f"; copied to the S3 server in {row['s3_copy_seconds']} s "
                f"({row['s3_copy_bytes'] / 1e6:.0f} MB), S3 store at the end "
                f"{row.get('s3_store_bytes', 0) / 1e6:.0f} MB."
                if "s3_copy_bytes" in row
                else "."
            )
        )
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    if sys.argv[1:2] == ["--report"]:  # rewrite the report from a run's results.json
        results = json.loads(Path(sys.argv[2]).read_text())
        (BENCH_DIR / "RESULTS-failover.md").write_text(_report(results))
        return 0
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = Path(os.environ.get("BENCH_FAILOVER_OUT") or BENCH_DIR / "out" / f"failover-{stamp}")
    out_dir.mkdir(parents=True, exist_ok=True)
    port = int(os.environ.get("BENCH_KAFKA_PORT", "49092"))
    external = os.environ.get("BENCH_BROKER", "")
    cfg = {
        "bootstrap": external or f"127.0.0.1:{port}",
        "partitions": _ints("BENCH_FAILOVER_PARTITIONS", "4")[0],
        "repeat": _ints("BENCH_FAILOVER_REPEAT", "3")[0],
        "snapshot_ms": _ints("BENCH_FAILOVER_SNAPSHOT_MS", "10000")[0],
        "tail": _ints("BENCH_FAILOVER_TAIL", "500000")[0],
        "run_id": stamp[-6:],
    }
    sizes = _ints("BENCH_FAILOVER_KEYS", "1000000,10000000")
    s3_spec = os.environ.get("BENCH_FAILOVER_S3", "")
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "uptime_before": uptime(),
        "partitions": cfg["partitions"],
        "repeat": cfg["repeat"],
        "snapshot_ms": cfg["snapshot_ms"],
        "tail": cfg["tail"],
        "s3": (
            "moto's standalone S3 server (moto_server, a separate process on loopback)"
            if s3_spec == "moto"
            else "SeaweedFS (weed server: master, volume, filer and S3 gateway, on loopback)"
            if s3_spec == "seaweedfs"
            else s3_spec
        ),
        "settings": {k: os.environ.get(k, "") for k in os.environ if k.startswith("BENCH_")},
        "sizes": [],
        "errors": [],
    }
    t0 = time.monotonic()
    code = 0
    if not external:
        broker.up(port)
    try:
        if s3_spec:
            cfg["s3"] = S3Store(s3_spec, out_dir / "logs")
        for keys in sizes:
            try:
                results["sizes"].append(_size(keys, cfg, out_dir))
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                say(f"  !! {keys} keys failed: {exc!r}")
                results["errors"].append(f"{keys}: {exc!r}")
                code = 1
            (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        if cfg.get("s3") is not None:
            cfg["s3"].close()
        if not external:
            broker.down(port)
        results["uptime_after"] = uptime()
        results["total_seconds"] = round(time.monotonic() - t0, 1)
        (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    md = Path(os.environ.get("BENCH_FAILOVER_REPORT") or BENCH_DIR / "RESULTS-failover.md")
    md.write_text(_report(results))
    say(f"wrote {md} and {out_dir / 'results.json'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
