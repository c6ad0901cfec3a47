"""Inputs, processes and the independent checker of the two-app click pipeline.

examples/click_pipeline.py: ``click_app`` turns clicks (key = user, value ``{"region",
"seq"}``) into one record per click on the internal topic user-counts (key = region, value
``{"user", "count", "seq"}``); ``region_app`` turns each of those into one record on
region-totals (key = region, value ``{"total"}``). The apps declare their own topic variables,
``App(..., env=["LOCKGATE_CLICKS_TOPIC", "LOCKGATE_USER_COUNTS_TOPIC"])``; the tests build
their environment here only.

The model is computed from the clicks topic as stored (partition order), independently of
lockgate: per user, the k-th click (in the order its partition holds them) must give exactly
one user-counts record ``{"user": u, "count": k, "seq": <its seq>}`` keyed by its region, in
that order; per region, region-totals must be exactly ``1, 2, ..., n`` in order, where ``n`` is
the region's number of clicks. Records with a ``lockgate-type`` header (barriers, written by
the runtime into the internal topic) are skipped, as any reader that is not lockgate would.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from processors import key_group
from tests.chaos._harness import Fleet
from tests.support.kafka import unique
from tests.support.ports import free_port
from tests.support.procs import AppProcess

CLICK_SPEC = "examples.click_pipeline:click_app"
REGION_SPEC = "examples.click_pipeline:region_app"
CONTROL_HEADER = "lockgate-type"

#: One click as produced and as stored: (user, region, seq).
Click = tuple[str, str, int]


@dataclass(frozen=True)
class Topics:
    """Unique names of one pipeline run: topics and both apps' names (consumer groups)."""

    clicks: str
    counts: str
    totals: str
    click_app: str
    region_app: str

    @classmethod
    def fresh(cls, prefix: str) -> Topics:
        return cls(
            clicks=unique(f"{prefix}-clicks"),
            counts=unique(f"{prefix}-user-counts"),
            totals=unique(f"{prefix}-region-totals"),
            click_app=unique(f"{prefix}-click-counts"),
            region_app=unique(f"{prefix}-region-totals"),
        )


def pipeline_env(bootstrap: str, topics: Topics, app_name: str, **extra: str) -> dict[str, str]:
    """The environment of one app of the pipeline (both apps accept all three topics)."""
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": app_name,
        "LOCKGATE_CLICKS_TOPIC": topics.clicks,
        "LOCKGATE_USER_COUNTS_TOPIC": topics.counts,
        "LOCKGATE_OUTPUT_TOPIC": topics.totals,
    }
    env.update(extra)
    return env


# ----------------------------------------------------------------------------- inputs


def user_region(index: int, regions: int) -> tuple[str, str]:
    """User ``index`` and its home region: every user clicks in one region only."""
    return f"user-{index}", f"region-{index % regions}"


def random_clicks(n: int, users: int, regions: int, seed: int) -> list[Click]:
    rng = random.Random(seed)
    return [(*user_region(rng.randrange(users), regions), seq) for seq in range(n)]


def _click_producer(bootstrap: str, client: dict[str, Any] | None = None) -> Producer:
    return Producer(
        {
            **(client or {}),
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,  # no reordering on retries
            "linger.ms": 5,
        }
    )


def _produce(p: Producer, topic: str, click: Click) -> None:
    user, region, seq = click
    while True:
        try:
            p.produce(topic, orjson.dumps({"region": region, "seq": seq}), user.encode())
            return
        except BufferError:
            p.poll(0.1)


def produce_clicks(
    bootstrap: str, topic: str, clicks: Iterable[Click], client: dict[str, Any] | None = None
) -> None:
    """Produce ``clicks`` (``client``: extra librdkafka settings, e.g. SASL_SSL; also below)."""
    p = _click_producer(bootstrap, client)
    for n, click in enumerate(clicks):
        _produce(p, topic, click)
        if n % 2000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


class ClickFeeder(threading.Thread):
    """Produces clicks at a steady rate; ``produced`` is what it sent, in order.

    ``total`` is an upper bound: :meth:`stop` ends the input earlier. ``only``: click
    only as users whose key group (of ``partitions``) is in it, so the other key groups
    of the clicks topic get no input (an idle upstream instance).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        total: int,
        rate: float,
        users: int,
        regions: int,
        only: set[int] | None = None,
        partitions: int = 4,
    ) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.total, self.rate = total, rate
        self.users, self.regions = users, regions
        self.user_ids = [
            i
            for i in range(users * (1 if only is None else 4 * partitions))
            if only is None or key_group(user_region(i, regions)[0].encode(), partitions) in only
        ][:users]
        self.produced: list[Click] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        """Produce nothing more (what was produced is flushed); then ``join()``."""
        self._halt.set()

    def run(self) -> None:
        try:
            p = _click_producer(self.bootstrap)
            started = time.monotonic()
            for seq in range(self.total):
                if self._halt.is_set():
                    break
                user = self.user_ids[(seq * 7919) % len(self.user_ids)]
                click = (*user_region(user, self.regions), seq)
                _produce(p, self.topic, click)
                self.produced.append(click)
                ahead = seq / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    self._halt.wait(ahead)
                p.poll(0)
            assert p.flush(60) == 0
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


# ----------------------------------------------------------------------------- processes


class PipelineFleet(Fleet):
    """A :class:`Fleet` whose instances may each get their own HTTP (health) port.

    A port is picked at an instance's first start and kept across its restarts, like a pod's.
    """

    def __init__(
        self, spec: str, env: dict[str, str], root: Path, ids: list[str], ports: bool = False
    ) -> None:
        super().__init__(spec, env, root, ids)
        self.ports: dict[str, int] = {}
        self._with_ports = ports

    def start(self, iid: str, wipe_state: bool = False) -> AppProcess:
        if wipe_state:
            shutil.rmtree(self.state_dir(iid), ignore_errors=True)
        env = {
            **self.env,
            "LOCKGATE_INSTANCE_ID": iid,
            "LOCKGATE_STATE_DIR": str(self.state_dir(iid)),
        }
        if self._with_ports:
            env["LOCKGATE_HTTP_PORT"] = str(self.ports.setdefault(iid, free_port()))
        proc = AppProcess(self.spec, env, self.root / f"{iid}.log").start()
        self.procs[iid] = proc
        self.starts += 1
        return proc


# ----------------------------------------------------------------------------- reading


def is_control(m: Any) -> bool:
    return any(k == CONTROL_HEADER for k, _ in (m.headers() or []))


def read_topic(
    bootstrap: str,
    topic: str,
    expected: int,
    timeout: float = 60.0,
    idle: float = 3.0,
    client: dict[str, Any] | None = None,
) -> list[Any]:
    """Every committed record of ``topic`` (read_committed), control records included.

    Stops once ``expected`` records *without* a ``lockgate-type`` header arrived and no such
    record came for ``idle`` seconds, or at ``timeout``. Returned in (partition, offset) order.
    """
    c = Consumer(
        {
            **(client or {}),
            "bootstrap.servers": bootstrap,
            "group.id": unique("pipeline-reader"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    out: list[Any] = []
    try:
        deadline = time.monotonic() + timeout
        while True:  # the app may not have created the topic yet
            md = c.list_topics(topic, timeout=10).topics[topic]
            if md.error is None and md.partitions:
                break
            if time.monotonic() > deadline:
                return []
            time.sleep(0.2)
        c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
        data = 0
        last = time.monotonic()
        while time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                err = m.error()
                if err is None:
                    out.append(m)
                    if not is_control(m):
                        # Idle writers send barriers every interval: only data counts
                        # as activity.
                        data += 1
                        last = time.monotonic()
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(err)
            if data >= expected and time.monotonic() - last > idle:
                break
    finally:
        c.close()
    out.sort(key=lambda m: (m.partition(), m.offset()))
    return out


def count_committed_data(bootstrap: str, topic: str, timeout: float = 30.0) -> int:
    """The records of ``topic`` without a ``lockgate-type`` header below its current end.

    The end is each partition's high watermark when called; every record below it is
    read (read_committed: once its transaction ended) and none beyond it is counted, so
    this returns soon even while records keep coming (a read until ``idle`` seconds
    without records would run to its timeout then).
    """
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("pipeline-counter"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    data = 0
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        if md.error is not None or not md.partitions:
            raise RuntimeError(f"topic {topic}: {md.error}")
        ends = {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in md.partitions
        }
        c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
        pending = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(pending)} not read to {ends}")
            for m in c.consume(1000, 0.5):
                err = m.error()
                if err is None:
                    if m.offset() < ends[m.partition()]:
                        data += not is_control(m)
                    if m.offset() >= ends[m.partition()] - 1:
                        pending.discard(m.partition())
                elif err.code() == KafkaError._PARTITION_EOF:
                    if m.offset() >= ends[m.partition()]:
                        pending.discard(m.partition())
                else:
                    raise RuntimeError(err)
            for tp in c.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
    finally:
        c.close()
    return data


def read_clicks(
    bootstrap: str, topic: str, expected: int, client: dict[str, Any] | None = None
) -> list[Click]:
    """The clicks as stored, in (partition, offset) order: the order the app sees."""
    return [
        (m.key().decode(), v["region"], v["seq"])
        for m in read_topic(bootstrap, topic, expected, idle=0.5, client=client)
        for v in [orjson.loads(m.value())]
    ]


def data_records(msgs: Iterable[Any]) -> list[tuple[str, dict[str, Any]]]:
    """(key, decoded value) of every record that is not a lockgate control record."""
    return [(m.key().decode(), orjson.loads(m.value())) for m in msgs if not is_control(m)]


def barrier_partitions(msgs: Iterable[Any]) -> Counter[int]:
    """Barrier records per partition."""
    return Counter(
        m.partition() for m in msgs if dict(m.headers() or []).get(CONTROL_HEADER) == b"barrier"
    )


# ----------------------------------------------------------------------------- checking


@dataclass
class Model:
    """What the pipeline must output, from the stored clicks alone."""

    counts: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    regions: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, clicks: Iterable[Click]) -> Model:
        counts: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        regions: Counter[str] = Counter()
        for user, region, seq in clicks:
            k = len(counts[user]) + 1
            counts[user].append((region, {"user": user, "count": k, "seq": seq}))
            regions[region] += 1
        return cls(dict(counts), regions)


def _first(items: Iterable[Any], n: int = 5) -> list[Any]:
    """The ``n`` smallest items (ints first, anything else by its text)."""
    return sorted(items, key=lambda x: (0, x, "") if isinstance(x, int) else (1, 0, repr(x)))[:n]


def check_pipeline(model: Model, counts_msgs: list[Any], totals_msgs: list[Any]) -> list[str]:
    """Compare both committed outputs with the model; return the problems found.

    ``counts_msgs`` and ``totals_msgs`` are in (partition, offset) order (:func:`read_topic`).
    """
    problems: list[str] = []
    # user-counts: per user exactly the model's records, in order.
    got: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    counts_per_region: Counter[str] = Counter()
    for key, value in data_records(counts_msgs):
        got[str(value.get("user"))].append((key, value))
        counts_per_region[key] += 1
    for user in sorted(set(model.counts) | set(got), key=_natural):
        e, g = model.counts.get(user, []), got.get(user, [])
        if e == g:
            continue
        seqs = [v.get("seq") for _, v in g]
        dups = [s for s, n in Counter(seqs).items() if n > 1]
        missing = {v["seq"] for _, v in e} - set(seqs)
        at = next(
            (i for i, (a, b) in enumerate(zip(e, g, strict=False)) if a != b), min(len(e), len(g))
        )
        problems.append(
            f"user-counts {user}: expected {len(e)} records, got {len(g)}; "
            f"duplicated seqs {_first(dups)}{'...' if len(dups) > 5 else ''} ({len(dups)}), "
            f"missing seqs {_first(missing)}{'...' if len(missing) > 5 else ''} ({len(missing)}); "
            f"first difference at #{at}: expected {e[at] if at < len(e) else None}, "
            f"got {g[at] if at < len(g) else None}"
        )
    # region-totals: per region exactly 1..n, n = the region's clicks; no control records.
    controls = sum(1 for m in totals_msgs if is_control(m))
    if controls:
        problems.append(f"region-totals: {controls} records with a {CONTROL_HEADER} header")
    totals: dict[str, list[Any]] = defaultdict(list)
    for key, value in data_records(totals_msgs):
        totals[key].append(value["total"] if set(value) == {"total"} else repr(value))
    for region in sorted(set(model.regions) | set(totals), key=_natural):
        n, seen = model.regions.get(region, 0), totals.get(region, [])
        if counts_per_region[region] != n:
            problems.append(
                f"user-counts {region}: {counts_per_region[region]} records keyed by the region, "
                f"expected {n}"
            )
        if seen == list(range(1, n + 1)):
            continue
        dups = [t for t, c in Counter(seen).items() if c > 1]
        missing = set(range(1, n + 1)) - {t for t in seen if isinstance(t, int)}
        at = next((i for i, t in enumerate(seen) if t != i + 1), len(seen))
        problems.append(
            f"region-totals {region}: expected totals 1..{n}, got {len(seen)} records; "
            f"duplicated {_first(dups)} ({len(dups)}), missing {_first(missing)} "
            f"({len(missing)}); first difference at #{at}: "
            f"got {seen[max(0, at - 2) : at + 3]} around it"
        )
    return problems


def _natural(name: str) -> tuple[str, int]:
    prefix, _, num = name.rpartition("-")
    return (prefix, int(num)) if num.isdigit() else (name, -1)
