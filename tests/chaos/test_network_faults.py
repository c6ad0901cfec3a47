"""Network faults between ONE instance and the broker, through a TCP fault proxy.

Two instances of examples.running_sum:app; i1 reaches the broker only through Toxiproxy
on loopback, i2 directly. The broker has a second listener, PROXIED, advertised at the
proxy's port (docker/kafka/broker.sh, LOCKGATE_KAFKA_PROXY_PORT), so the metadata i1
gets back keeps every connection of i1 on the proxy. While input flows, with randomized
durations:

1. latency (200-500 ms on every response) for some seconds;
2. a short stall: the connections go silent, then are closed (timeout toxic);
3. connection resets (TCP RST on every connection) a few times;
4. i1 cut off completely (proxy disabled: connections closed, new ones refused) for
   longer than the session timeout plus the transaction timeout: i2 must take over all
   key groups and commit them, and i1, a zombie when it comes back, must not commit
   anything stale;
5. restored: i1 rejoins and gets key groups back.

At the end the committed output must be exact, both instances alive, and both must exit 0
on SIGTERM. The toxiproxy-server binary is built on the first run with ``go install``
(tests/support/ensure-toxiproxy.sh) and cached in ~/.cache/lockgate/tools.

This test runs its own broker (the session broker has no proxied listener).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.chaos._harness import Fleet, InputFeeder, chaos_env
from tests.conftest import BROKER, _free_port_pair
from tests.support.checker import check, model
from tests.support.kafka import create_topic, read_all, read_inputs, unique
from tests.support.ports import free_port
from tests.support.procs import AppProcess, wait_until
from tests.support.toxiproxy import ToxiproxyServer

PARTITIONS = 4
SESSION_TIMEOUT_S = 6.0  # chaos_env's LOCKGATE_KAFKA__SESSION_TIMEOUT_MS
TXN_TIMEOUT_MS = 10000
LIVEZ_RESTART_S = 20.0  # deploy/helm values: probes.liveness periodSeconds 10 x failureThreshold 3


class ProxiedBroker:
    """A private broker (docker/kafka/broker.sh) with a listener advertised at a proxy port."""

    def __init__(self, data_dir: Path) -> None:
        self.port = _free_port_pair()
        self.proxied_port, self.proxy_port = free_port(), free_port()
        while len({self.port, self.port + 1, self.proxied_port, self.proxy_port}) < 4:
            self.proxied_port, self.proxy_port = free_port(), free_port()
        self.env = {
            **os.environ,
            "LOCKGATE_KAFKA_PORT": str(self.port),
            "LOCKGATE_KAFKA_CONTROLLER_PORT": str(self.port + 1),
            "LOCKGATE_KAFKA_PROXIED_PORT": str(self.proxied_port),
            "LOCKGATE_KAFKA_PROXY_PORT": str(self.proxy_port),
            "LOCKGATE_KAFKA_DATA_DIR": str(data_dir),
            "LOCKGATE_KAFKA_PYTHON": sys.executable,
        }
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proxy_bootstrap = f"127.0.0.1:{self.proxy_port}"

    def up(self) -> None:
        subprocess.run(
            [str(BROKER), "up", "--fresh"], env=self.env, check=True, stdout=subprocess.DEVNULL
        )

    def down(self) -> None:
        subprocess.run([str(BROKER), "down"], env=self.env, check=False)


class SplitFleet(Fleet):
    """A Fleet whose instances may each override some settings (i1's bootstrap)."""

    def __init__(self, *args, overrides: dict[str, dict[str, str]], **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.overrides = overrides

    def start(self, iid: str, wipe_state: bool = False) -> AppProcess:
        shared = self.env
        self.env = {**shared, **self.overrides.get(iid, {})}
        try:
            return super().start(iid, wipe_state)
        finally:
            self.env = shared


def tcp_peer_ports(pid: int) -> set[int]:
    """Remote ports of the established TCP connections of ``pid`` (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "01" and f[9] in inodes:  # ESTABLISHED
                ports.add(int(f[2].rsplit(":", 1)[1], 16))
    return ports


class LivezWatch(threading.Thread):
    """Polls each instance's /livez; keeps the changes of its answer and the failures."""

    def __init__(self, ports: dict[str, int], t0: float) -> None:
        super().__init__(daemon=True)
        self.ports = ports
        self.t0 = t0
        self.changes: dict[str, list[str]] = {iid: [] for iid in ports}
        self.failures: dict[str, list[str]] = {iid: [] for iid in ports}
        self.longest_failing: dict[str, float] = dict.fromkeys(ports, 0.0)
        self._failing_since: dict[str, float | None] = dict.fromkeys(ports)
        self._seen_ok: set[str] = set()
        self._last: dict[str, str] = {}
        self._done = threading.Event()

    def sample(self, iid: str) -> None:
        try:
            url = f"http://127.0.0.1:{self.ports[iid]}/livez"
            with urllib.request.urlopen(url, timeout=2) as resp:
                ok, body = True, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            ok, body = False, json.loads(exc.read() or b"{}")
        except OSError as exc:
            ok, body = False, {"status": f"unreachable: {exc}"}
        state = f"{body.get('status')} {body.get('in', '')}".strip()
        now = time.monotonic()
        stamp = f"{now - self.t0:6.1f}s"
        if ok:
            self._seen_ok.add(iid)
            self._failing_since[iid] = None
        elif iid in self._seen_ok:  # not before the HTTP server first answered
            self.failures[iid].append(f"{stamp} {body}")
            since = self._failing_since[iid] or now
            self._failing_since[iid] = since
            self.longest_failing[iid] = max(self.longest_failing[iid], now - since)
        if state != self._last.get(iid):
            self._last[iid] = state
            self.changes[iid].append(f"{stamp} {state}")

    def run(self) -> None:
        while not self._done.wait(0.5):
            for iid in self.ports:
                self.sample(iid)

    def stop(self) -> None:
        self._done.set()
        self.join(5)


def metric(port: int, name: str) -> float:
    """One unlabelled-by-us sample of the instance's /metrics (summed over series)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def members(admin: AdminClient, group: str) -> dict[str, set[int]]:
    """The group's members (by instance id) and the partitions each holds.

    ``{}`` when the broker does not answer in time (a loaded machine): polled again.
    """
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(15)
    except (KafkaException, TimeoutError):
        return {}
    return {
        m.group_instance_id or m.member_id: {tp.partition for tp in m.assignment.topic_partitions}
        for m in desc.members
    }


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=15)
    finally:
        c.close()
    return {tp.partition: tp.offset for tp in tps}


def test_network_faults_between_one_instance_and_the_broker(tmp_path: Path) -> None:
    seed = int(os.environ.get("LOCKGATE_CHAOS_SEED", str(time.time_ns() % 10**9)))
    print(f"chaos seed: {seed} (set LOCKGATE_CHAOS_SEED to repeat)")
    rng = random.Random(seed)
    latency_ms, latency_s = rng.randint(200, 500), rng.uniform(5, 8)
    stall_s = rng.uniform(2.5, 4.5)
    resets = [(rng.uniform(0.3, 1.5), rng.uniform(1.5, 3)) for _ in range(rng.randint(3, 5))]
    # Longer than the session timeout (i1 leaves the group) plus the transaction timeout
    # (i2's takeover waits for i1's open transaction to be aborted), with time to spare
    # for i2 to commit i1's former key groups (it holds and commits them all within
    # 6-8 s of the cut on a 2-core machine).
    cutoff_s = rng.uniform(SESSION_TIMEOUT_S + TXN_TIMEOUT_MS / 1000 + 3, 23)
    print(
        f"plan: latency {latency_ms} ms for {latency_s:.1f}s, stall {stall_s:.1f}s, "
        f"{len(resets)} resets {[round(r, 1) for r, _ in resets]}s, cut off {cutoff_s:.1f}s"
    )

    toxiproxy = ToxiproxyServer(tmp_path / "toxiproxy.log").start()  # builds it on first use
    broker = ProxiedBroker(tmp_path / "kafka")
    fleet: SplitFleet | None = None
    feeder: InputFeeder | None = None
    try:
        broker.up()
        proxy = toxiproxy.api.create_proxy(
            "kafka-i1", broker.proxy_bootstrap, f"127.0.0.1:{broker.proxied_port}"
        )
        # Through the proxy, the metadata names the proxy: i1 never reaches the broker directly.
        md = AdminClient({"bootstrap.servers": broker.proxy_bootstrap}).list_topics(timeout=15)
        advertised = {(b.host, b.port) for b in md.brokers.values()}
        assert advertised == {("127.0.0.1", broker.proxy_port)}, advertised

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        inp, out, app = unique("net-in"), unique("net-out"), unique("net-sum")
        create_topic(broker.bootstrap, inp, PARTITIONS)
        env = chaos_env(broker.bootstrap, app, inp, out)
        env["LOCKGATE_CHECKPOINT_INTERVAL_MS"] = "500"
        env["LOCKGATE_TRANSACTION_TIMEOUT_MS"] = str(TXN_TIMEOUT_MS)
        env["LOCKGATE_HTTP_HOST"] = "127.0.0.1"
        http = {"i1": free_port(), "i2": free_port()}
        fleet = SplitFleet(
            "examples.running_sum:app",
            env,
            tmp_path,
            ["i1", "i2"],
            overrides={
                "i1": {
                    "LOCKGATE_BOOTSTRAP_SERVERS": broker.proxy_bootstrap,
                    "LOCKGATE_HTTP_PORT": str(http["i1"]),
                },
                "i2": {"LOCKGATE_HTTP_PORT": str(http["i2"])},
            },
        )
        fleet.start_all()
        # Input flows through every phase, however long the waits for a steady pair take:
        # the feeder is stopped once they are over (the total only bounds a runaway).
        feeder = InputFeeder(broker.bootstrap, inp, total=100 * 3600, rate=100, keys=40)
        feeder.start()
        t0 = time.monotonic()
        watch = LivezWatch(http, t0)
        watch.start()

        def say(text: str) -> None:
            print(f"[{time.monotonic() - t0:5.1f}s] {text}", flush=True)

        def both_hold_key_groups() -> bool:
            m = members(admin, app)
            return len(m) == 2 and all(m.values())

        def steady(after: str) -> None:
            """Both instances in the group and holding key groups: the next fault hits a
            healthy pair (each fault may knock i1 out of the group for a while)."""
            started = time.monotonic()
            wait_until(both_hold_key_groups, 90, interval=0.5, what=f"both assigned {after}")
            say(f"both instances hold key groups ({time.monotonic() - started:.1f}s {after})")

        steady("after start")
        time.sleep(rng.uniform(2, 4))
        i1_pid = fleet.procs["i1"].proc.pid  # type: ignore[union-attr]
        peers = tcp_peer_ports(i1_pid)
        assert broker.port not in peers and broker.proxied_port not in peers, peers
        assert broker.proxy_port in peers, peers

        say(f"latency {latency_ms} ms (jitter {latency_ms // 5}) for {latency_s:.1f}s")
        names = proxy.latency(latency_ms, jitter=latency_ms // 5)
        time.sleep(latency_s)
        for name in names:
            proxy.remove_toxic(name)
        steady("after the latency")

        say(f"stall: connections silent, closed after {stall_s:.1f}s")
        names = proxy.timeout(int(stall_s * 1000))
        time.sleep(stall_s)
        for name in names:
            proxy.remove_toxic(name)
        steady("after the stall")

        for active, gap in resets:
            say(f"reset_peer for {active:.1f}s")
            names = proxy.reset_peer()
            time.sleep(active)
            for name in names:
                proxy.remove_toxic(name)
            time.sleep(gap)
        steady("after the resets")

        say(f"i1 cut off for {cutoff_s:.1f}s")
        before = committed(broker.bootstrap, app, inp)
        cut = time.monotonic()
        proxy.disable()
        # i2 takes over every key group once i1's session expired ... (the cut lasts as
        # long as this takes: on a loaded machine more than the planned cutoff_s)
        wait_until(
            lambda: members(admin, app) == {"i2": set(range(PARTITIONS))},
            60,
            interval=0.5,
            what="i2 holding every key group",
        )
        say(f"i2 holds every key group ({time.monotonic() - cut:.1f}s after the cut)")
        # ... and commits them (i1's former ones too) while i1 is still away.
        wait_until(
            lambda: all(v > before[p] for p, v in committed(broker.bootstrap, app, inp).items()),
            60,
            interval=0.5,
            what="i2 committing every input partition",
        )
        say(f"i2 committed every input partition ({time.monotonic() - cut:.1f}s after the cut)")
        time.sleep(max(0.0, cutoff_s - (time.monotonic() - cut)))
        assert fleet.procs["i1"].alive, fleet.logs()

        say("i1 reconnected")
        proxy.enable()
        steady("after the reconnect")
        time.sleep(rng.uniform(3, 5))
        peers = tcp_peer_ports(i1_pid)
        assert broker.port not in peers and broker.proxied_port not in peers, peers

        feeder.stop()
        feeder.join(240)
        assert feeder.error is None, feeder.error
        stored = read_inputs(broker.bootstrap, inp, len(feeder.produced))
        outputs = read_all(broker.bootstrap, out, expected=len(stored), timeout=120, idle=5)
        say("outputs read")
        watch.stop()
        figures = {
            iid: {
                name: metric(http[iid], f"lockgate_{name}")
                for name in (
                    "epochs_committed_total",
                    "epochs_aborted_total",
                    "epoch_commit_seconds_max",
                    "records_in_total",
                )
            }
            for iid in ("i1", "i2")
            if fleet.procs[iid].alive
        }
        alive = {iid: p.alive for iid, p in fleet.procs.items()}
        codes = fleet.stop_all()
        problems = check(model(stored), outputs)
        i1_log = fleet.procs["i1"].log_text()
        for iid in ("i1", "i2"):
            print(f"{iid} /livez changes: {watch.changes[iid]}")
        print(
            f"network faults: {len(stored)} inputs, {len(outputs)} outputs, "
            f"alive before SIGTERM {alive}, exit codes {codes}, figures {figures}, "
            f"/livez failures {dict((k, len(v)) for k, v in watch.failures.items())} "
            f"(longest {watch.longest_failing}), i1 log: "
            f"'partitions lost' x{i1_log.count('partitions lost')}, "
            f"'aborting epoch' x{i1_log.count('aborting epoch')}"
        )
        assert problems == [], "\n".join(problems[:10]) + fleet.logs()
        assert alive == {"i1": True, "i2": True}, fleet.logs()
        assert codes == {"i1": 0, "i2": 0}, fleet.logs()
        # A blocking call may overrun its bound (librdkafka's send_offsets_to_transaction
        # can ignore its timeout: the runtime's watchdog abandons the producer), but no
        # instance may look dead long enough for the chart's liveness probe (period 10 s,
        # 3 failures) to restart it.
        assert max(watch.longest_failing.values()) < LIVEZ_RESTART_S, watch.failures
    except BaseException:
        if fleet is not None:
            print(fleet.logs())
        raise
    finally:
        if feeder is not None:
            feeder.stop()
        if fleet is not None:
            for p in fleet.procs.values():
                if p.alive:
                    p.kill9()
        broker.down()
        toxiproxy.stop()
