"""The savepoint tools of ``state/spark.py`` on the shared local Spark session.

* a savepoint written file by file (``SavepointStore``) reads back as DataFrames with
  exactly the bytes written, decoded with the app's codecs on request; a corrupt file
  fails the read (the tasks verify checksums);
* a savepoint bootstrapped from a DataFrame for ``examples/running_sum.py`` restores:
  the app, run as a process with ``--from-savepoint`` over new input, continues every
  key's sum and count from the bootstrapped ones (checked against the model);
* a rewrite to another key-group count moves every entry to its murmur2 key group and
  merges the watermark records conservatively (lowest), and refuses what it cannot merge;
* mistakes (duplicate keys, a wrong key-group count, offsets that do not fit) give
  clear errors; a savepoint for the wrong key-group count is refused by the app.
"""

from __future__ import annotations

import importlib.util
import struct
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from processors import App
from processors._dsl.partitioner import key_group
from processors._task.time import TIME_STORE, Watermarks, timer_key
from state import spark as spark_tools
from state.savepoint import (
    SavepointError,
    SavepointStore,
    StoreFile,
    build_descriptor,
    new_savepoint_id,
)
from state.spark import read_savepoint, rewrite_savepoint, write_savepoint
from tests.support.checker import check
from tests.support.kafka import create_topic, produce_numbers, read_all
from tests.support.procs import ROOT, AppProcess

RUNNING_SUM = ROOT / "examples" / "running_sum.py"


def load_running_sum(monkeypatch: pytest.MonkeyPatch, inp: str, out: str) -> App:
    """A fresh import of examples/running_sum.py reading ``inp`` (as its processes will)."""
    monkeypatch.setenv("LOCKGATE_INPUT_TOPIC", inp)
    monkeypatch.setenv("LOCKGATE_OUTPUT_TOPIC", out)
    spec = importlib.util.spec_from_file_location(f"rs_{uuid.uuid4().hex}", RUNNING_SUM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app: App = module.app
    return app


def demo_app(topic: str) -> App:
    """An app declaring the stores of :func:`handmade_savepoint` (with event time)."""
    app = App("handmade")
    app.value_state("totals")
    app.list_state("seen")

    @app.process(topic, watermarks=Watermarks.bounded(10))
    def handle(key: Any, value: Any, ctx: Any) -> None:  # pragma: no cover - never run
        pass

    return app


def wm_record(wm: int, high: dict[str, int], **extra: Any) -> bytes:
    record = {"wm": wm, "max": high, "writers": {}, "expected": {}, "internal": [], "pending": []}
    record.update(extra)
    return orjson.dumps(record)


def handmade_savepoint(
    root: Path, app: str, topic: str, p: int, watermarks: dict[int, bytes] | None = None
) -> tuple[str, dict[str, set[tuple[int, bytes, bytes]]]]:
    """Write a savepoint of ``p`` key groups file by file; return its id and entries.

    Stores ``totals`` (value), ``seen`` (list) and ``lockgate.time`` (timers of some
    keys, and the watermark records ``watermarks`` by key group, default one each).
    """
    location = SavepointStore(str(root))
    sp_id = new_savepoint_id()
    keys = [f"key-{i}".encode() for i in range(40)]
    written: dict[str, set[tuple[int, bytes, bytes]]] = {"totals": set(), "seen": set()}
    written[TIME_STORE] = set()
    if watermarks is None:
        watermarks = {g: wm_record(1000 + g, {topic: 1011 + g}) for g in range(p)}
    schemas = {
        "seen": {"kind": "list", "codec": "json"},
        "totals": {"kind": "value", "codec": "json"},
        TIME_STORE: {"kind": "value", "codec": "json"},
    }
    manifests = {}
    for g in range(p):
        mine = sorted(k for k in keys if key_group(k, p) == g)
        entries = {
            "totals": [(k, orjson.dumps([i, i + 1])) for i, k in enumerate(mine)],
            "seen": [(k, orjson.dumps([k.decode()] * 2)) for k in mine[::2]],
            TIME_STORE: sorted(
                [(timer_key(b"e", 5000 + i, k), orjson.dumps(["u"])) for i, k in enumerate(mine)]
                + ([(b"w", watermarks[g])] if g in watermarks else [])
            ),
        }
        stores = {}
        for name, items in entries.items():
            info = location.write_store(sp_id, app, g, name, items)
            stores[name] = {**schemas[name], **info.to_dict()}
            written[name] |= {(g, k, v) for k, v in items}
        manifests[g] = {
            "key_group": g,
            "checkpoint": 77,
            "offsets": {topic: 10 * g},
            "align": {},
            "stores": stores,
            "error": None,
        }
        location.write_manifest(sp_id, app, g, manifests[g])
    registry = {app: {"inputs": [topic], "stores": schemas, "state_version": "x"}}
    descriptor = build_descriptor(sp_id, 77, True, 1, 1, registry, {app: manifests}, [app])
    location.write_descriptor(sp_id, descriptor)
    return sp_id, written


def stored_entries(root: Path, sp_id: str, app: str) -> dict[str, set[tuple[int, bytes, bytes]]]:
    """Every entry of every store of ``app`` in a savepoint, read directly (verified)."""
    location = SavepointStore(str(root))
    out: dict[str, set[tuple[int, bytes, bytes]]] = {}
    for m in location.read_descriptor(sp_id)["apps"][app]["manifests"]:
        g = m["key_group"]
        for name, entry in m["stores"].items():
            items = location.read_store(sp_id, app, g, name, StoreFile.from_dict(entry))
            out.setdefault(name, set()).update((g, k, v) for k, v in items)
    return out


def rows_of(df: Any) -> set[tuple[int, bytes, bytes]]:
    return {(r.key_group, bytes(r.key), bytes(r.value)) for r in df.collect()}


# ------------------------------------------------------------------ reading


def test_read_savepoint_returns_what_was_written(spark: Any, tmp_path: Path) -> None:
    sp_id, written = handmade_savepoint(tmp_path, "handmade", "in", 3)
    frames = read_savepoint(spark, str(tmp_path), sp_id, "handmade")
    assert sorted(frames) == sorted(written)
    for name, df in frames.items():
        assert df.columns == ["key_group", "key", "value"]
        assert rows_of(df) == written[name], name
    # One task per key group (files are read by the executors, not the driver).
    assert frames["totals"].rdd.getNumPartitions() == 3

    decoded = read_savepoint(
        spark, str(tmp_path), sp_id, "handmade", store="totals", decode=demo_app("in")
    )
    assert decoded.columns == ["key_group", "key", "value", "key_text", "value_json"]
    got = {r.key_text: (r.key_group, orjson.loads(r.value_json)) for r in decoded.collect()}
    assert len(got) == 40
    for text, (g, value) in got.items():
        assert g == key_group(text.encode(), 3)
        assert value == orjson.loads(
            next(v for gg, k, v in written["totals"] if k == text.encode())
        )
    timers = read_savepoint(
        spark, str(tmp_path), sp_id, "handmade", store=TIME_STORE, decode=demo_app("in")
    ).collect()
    watermark_rows = [r for r in timers if bytes(r.key) == b"w"]
    assert len(watermark_rows) == 3 and all(r.key_text is None for r in watermark_rows)
    assert {r.key_text for r in timers if r.key_text} == {f"key-{i}" for i in range(40)}

    # A corrupt file fails the read: the tasks verify each file before using it.
    (victim,) = (tmp_path / sp_id / "handmade" / "1").glob("totals.*.lgs")  # its export's token
    data = bytearray(victim.read_bytes())
    data[20] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(Exception, match="corrupt"):
        read_savepoint(spark, str(tmp_path), sp_id, "handmade", store="totals").collect()

    with pytest.raises(SavepointError, match="no store 'nope'"):
        read_savepoint(spark, str(tmp_path), sp_id, "handmade", store="nope")
    with pytest.raises(SavepointError, match="has no app 'other'"):
        read_savepoint(spark, str(tmp_path), sp_id, "other")


# ------------------------------------------------------------------ rewriting


def test_rewrite_moves_every_entry_and_merges_watermarks(spark: Any, tmp_path: Path) -> None:
    # Key group 1 never saw event time: no watermark record.
    wms = {0: wm_record(500, {"in": 600}), 2: wm_record(900, {"in": 950, "gone": 1})}
    sp_id, written = handmade_savepoint(tmp_path, "handmade", "in", 4, wms)
    before = sorted((tmp_path / sp_id).rglob("*"))
    stamps = {p: p.stat().st_mtime_ns for p in before}
    for new_p in (8, 2):
        new_id = rewrite_savepoint(
            spark,
            str(tmp_path),
            sp_id,
            "handmade",
            new_p,
            offsets={"in4": list(range(new_p))},
            topics={"in": "in4"},
            new_app_name="handmade2",
        )
        descriptor = SavepointStore(str(tmp_path)).read_descriptor(new_id)
        info = descriptor["apps"]["handmade2"]
        assert info["key_groups"] == new_p and info["inputs"] == ["in4"]
        assert [m["offsets"] for m in info["manifests"]] == [{"in4": g} for g in range(new_p)]
        saved = stored_entries(tmp_path, new_id, "handmade2")
        for name in ("totals", "seen"):
            got = saved[name]
            assert {(k, v) for _, k, v in got} == {(k, v) for _, k, v in written[name]}
            assert all(g == key_group(k, new_p) for g, k, _ in got)
        got = saved[TIME_STORE]
        timers = {(g, k, v) for g, k, v in got if k != b"w"}
        assert {(k, v) for _, k, v in timers} == {
            (k, v) for _, k, v in written[TIME_STORE] if k != b"w"
        }
        assert all(g == key_group(k[10:], new_p) for g, k, _ in timers)
        merged = {g: orjson.loads(v) for g, k, v in got if k == b"w"}
        if new_p == 8:
            # 8 = 2 x 4: new group g only gets keys of old group g % 4.
            assert sorted(merged) == [0, 2, 4, 6]
            assert merged[0]["wm"] == merged[4]["wm"] == 500
            assert merged[0]["max"] == {"in4": 600}  # renamed
            assert merged[2]["max"] == {"in4": 950, "gone": 1}
        else:
            # gcd(4, 2) = 2: new group 0 gets keys of old groups 0 and 2: the lowest of
            # both ("gone" was seen by one only); new group 1 those of 1 and 3, which
            # never saw event time: no record (the lowest watermark there is).
            assert sorted(merged) == [0]
            assert merged[0]["wm"] == 500
            assert merged[0]["max"] == {"in4": 600}
    assert {p: p.stat().st_mtime_ns for p in sorted((tmp_path / sp_id).rglob("*"))} == stamps


def test_rewrite_refuses_upstream_watermarks_and_bad_counts(spark: Any, tmp_path: Path) -> None:
    wms = {g: wm_record(5, {"in": 9}, writers={"in": {"up/0": [5, False]}}) for g in range(2)}
    sp_id, _ = handmade_savepoint(tmp_path, "handmade", "in", 2, wms)
    with pytest.raises(SavepointError, match="upstream-writer state"):
        rewrite_savepoint(spark, str(tmp_path), sp_id, "handmade", 4, offsets={"in": 0})
    with pytest.raises(SavepointError, match="key_groups must be an int >= 1"):
        rewrite_savepoint(spark, str(tmp_path), sp_id, "handmade", 0, offsets={"in": 0})
    with pytest.raises(SavepointError, match="has 2 offsets, expected one per key group"):
        rewrite_savepoint(spark, str(tmp_path), sp_id, "handmade", 3, offsets={"in": [0, 0]})
    with pytest.raises(SavepointError, match="no offsets for input topic"):
        rewrite_savepoint(
            spark, str(tmp_path), sp_id, "handmade", 3, offsets={"in": 0}, topics={"in": "x"}
        )


# ------------------------------------------------------------------ bootstrapping


def test_bootstrapped_savepoint_restores_into_running_sum(  # type: ignore[no-untyped-def]
    spark: Any, kafka_bootstrap: str, names, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = 3
    name, inp, out = names("boot"), names("boot-in"), names("boot-out")
    create_topic(kafka_bootstrap, inp, p)
    app = load_running_sum(monkeypatch, inp, out)
    sp_dir = tmp_path / "savepoints"
    initial = {f"key-{i}": [1000 * i, i] for i in range(30)}  # [sum, count]
    df = spark.createDataFrame(sorted(initial.items()), "key string, value array<long>")
    sp_id = write_savepoint(
        df, str(sp_dir), app, "totals", key_groups=p, offsets={inp: "earliest"}, app_name=name
    )

    saved = read_savepoint(spark, str(sp_dir), sp_id, name, decode=app)
    assert sorted(saved) == ["totals"]
    rows = saved["totals"].collect()
    assert {r.key_text: orjson.loads(r.value_json) for r in rows} == initial
    assert all(r.key_group == key_group(r.key_text.encode(), p) for r in rows)
    manifests = SavepointStore(str(sp_dir)).read_descriptor(sp_id)["apps"][name]["manifests"]
    assert [m["offsets"] for m in manifests] == [{inp: 0}] * p

    batch = [(f"key-{(i * 7) % 35}", i % 11, i) for i in range(600)]  # 5 keys are new
    produce_numbers(kafka_bootstrap, inp, batch)
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": name,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_SAVEPOINT_DIR": str(sp_dir),
        "LOCKGATE_FROM_SAVEPOINT": sp_id,
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
    }
    proc = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    try:
        msgs = read_all(kafka_bootstrap, out, expected=len(batch), timeout=90, idle=1)
    finally:
        assert proc.terminate() == 0, proc.log_text()[-3000:]
    assert "seeded from a savepoint" in proc.log_text()
    expected: dict[str, list[dict[str, int]]] = {}
    totals = {k: list(v) for k, v in initial.items()}
    for key, v, seq in batch:  # one partition per key: per-key order is production order
        total = totals.setdefault(key, [0, 0])
        total[0] += v
        total[1] += 1
        expected.setdefault(key, []).append({"sum": total[0], "count": total[1], "seq": seq})
    assert check(expected, msgs) == [], proc.log_text()[-3000:]


def test_bootstrap_mistakes_give_clear_errors(  # type: ignore[no-untyped-def]
    spark: Any, kafka_bootstrap: str, names, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, inp, out = names("boot-bad"), names("boot-bad-in"), names("boot-bad-out")
    app = load_running_sum(monkeypatch, inp, out)
    url = str(tmp_path / "savepoints")
    dup = spark.createDataFrame(
        [("a", [1, 1]), ("b", [2, 1]), ("a", [3, 1])], "key string, value array<long>"
    )
    with pytest.raises(SavepointError, match=r"duplicate key 'a' in store 'totals'"):
        write_savepoint(dup, url, app, "totals", key_groups=2, offsets={inp: 0})
    assert SavepointStore(url).list_savepoints() == []  # no descriptor: nothing restorable

    good = spark.createDataFrame([("a", [1, 1])], "key string, value array<long>")
    with pytest.raises(SavepointError, match="key_groups must be an int >= 1"):
        write_savepoint(good, url, app, "totals", key_groups=0, offsets={inp: 0})
    with pytest.raises(SavepointError, match=r"has 2 offsets, expected one per key group"):
        write_savepoint(good, url, app, "totals", key_groups=3, offsets={inp: [0, 5]})
    with pytest.raises(SavepointError, match="no offsets for input topic"):
        write_savepoint(good, url, app, "totals", key_groups=3, offsets={"other": 0})
    with pytest.raises(SavepointError, match="has no store 'total'"):
        write_savepoint(good, url, app, "total", key_groups=3, offsets={inp: 0})
    with pytest.raises(SavepointError, match="null value"):
        nulls = spark.createDataFrame([("a", None)], "key string, value array<long>")
        write_savepoint(nulls, url, app, "totals", key_groups=3, offsets={inp: 0})

    # Written for 3 key groups, started on a 2-partition input: the app refuses it.
    sp_id = write_savepoint(good, url, app, "totals", key_groups=3, offsets={inp: 0}, app_name=name)
    create_topic(kafka_bootstrap, inp, 2)
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_APP_NAME": name,
        "LOCKGATE_INPUT_TOPIC": inp,
        "LOCKGATE_OUTPUT_TOPIC": out,
        "LOCKGATE_SAVEPOINT_DIR": url,
        "LOCKGATE_FROM_SAVEPOINT": sp_id,
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
    }
    proc = AppProcess("examples.running_sum:app", env, tmp_path / "app.log").start()
    code = proc.wait(90)
    assert code == 2, proc.log_text()[-3000:]
    assert "was saved with 3 key groups, its inputs now have 2 partitions" in proc.log_text()


def test_timer_key_layout_matches_the_runtime() -> None:
    """state/_spark/reading.py reads timer keys as b"t" + kind + be64(time + 2**63) + raw key."""
    assert spark_tools.TIME_STORE == TIME_STORE
    key = timer_key(b"e", -5, b"abc")
    assert key[:2] == b"te" and key[10:] == b"abc"
    assert struct.unpack(">Q", key[2:10])[0] - 2**63 == -5


def test_watermark_contributors_and_merge() -> None:
    """A new key group merges exactly the old groups whose keys murmur2 can send it."""
    keys = [f"k{i}".encode() for i in range(3000)]
    for old, new in [(2, 4), (4, 2), (4, 6), (3, 5), (6, 4)]:
        for g in range(old):
            reached = {key_group(k, new) for k in keys if key_group(k, old) == g}
            assert reached == set(spark_tools._contributors(g, old, new)), (old, new, g)
    a = {"wm": 10, "max": {"t": 20, "u": 5}, "writers": {}, "pending": []}
    b = {"wm": 7, "max": {"t": 30}}
    merged = spark_tools.merge_watermarks([a, b], 2, {"t": "t2"})
    assert merged is not None and merged["wm"] == 7 and merged["max"] == {"t2": 20}
    assert spark_tools.merge_watermarks([a], 2, {}) is None  # one never saw event time
    with pytest.raises(SavepointError, match="upstream-writer state"):
        spark_tools.merge_watermarks([{**a, "pending": [["t", 1, "w/0", 2, 5, False]]}], 1, {})
