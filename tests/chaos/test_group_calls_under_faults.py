"""Network cuts during coordinator-targeted group calls: the start-up check and ``lockgate reset``.

librdkafka (2.16 and earlier, #4605) can abort the process whose DescribeConsumerGroups
timed out while its coordinator lookup was pending, once the link heals. lockgate sends
that request only from a child process (processors/_kafka/group_probe.py), both at an
instance's start-up (the subscription check) and in ``lockgate reset`` (is the app
running?). Here the link to the broker is cut at the moment that child exists, held
longer than the request's timeout, then healed:

1. **start-up**: an instance of examples/running_sum.py restarts through a slow proxy; the
   cut begins as soon as its group probe child is running. The instance must survive
   (same process), join once the link is back, and the committed output at the end must
   equal the independent model.
2. **reset**: ``lockgate reset --yes`` of the stopped app through the proxy; the cut begins
   when its probe child is running. It must exit 1 with ``cannot describe consumer
   group`` within its bound and change nothing (the committed offsets stay); after the
   heal the same command resets the app.

Runs its own broker with a proxied listener (tests/chaos/test_network_faults.py).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from tests.chaos._harness import InputFeeder, chaos_env
from tests.chaos.test_network_faults import ProxiedBroker, SplitFleet
from tests.support.checker import check, model
from tests.support.kafka import create_topic, read_all, read_inputs, unique
from tests.support.procs import LOCKGATE, ROOT, lockgate_cli, wait_until
from tests.support.toxiproxy import ToxiproxyServer

PARTITIONS = 2
SPEC = "examples.running_sum:app"
#: Longer than the probe's request timeouts (10 s at start-up, 15 s in the CLI): the
#: request times out during the cut and the link heals afterwards (#4605's sequence).
CUT_S = 17.0


def probe_children(parent: int) -> list[int]:
    """Pids of group probe processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"processors._kafka.group_probe" in cmdline:
            found.append(int(entry.name))
    return found


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def test_group_calls_survive_a_cut_and_a_heal(tmp_path: Path) -> None:
    toxiproxy = ToxiproxyServer(tmp_path / "toxiproxy.log").start()
    broker = ProxiedBroker(tmp_path / "kafka")
    fleet: SplitFleet | None = None
    feeder: InputFeeder | None = None
    try:
        broker.up()
        proxy = toxiproxy.api.create_proxy(
            "kafka-g1", broker.proxy_bootstrap, f"127.0.0.1:{broker.proxied_port}"
        )
        inp, out, app = unique("grp-in"), unique("grp-out"), unique("grp-sum")
        create_topic(broker.bootstrap, inp, PARTITIONS)
        env = chaos_env(broker.proxy_bootstrap, app, inp, out)
        env["LOCKGATE_CHECKPOINT_INTERVAL_MS"] = "500"
        env["LOCKGATE_LEAVE_GROUP_ON_STOP"] = "always"  # the restart need not wait a session
        fleet = SplitFleet(SPEC, env, tmp_path, ["g1"], overrides={})
        log = tmp_path / "g1.log"

        def count(text: str) -> int:
            return log.read_text().count(text) if log.exists() else 0

        def assigned() -> int:
            return count("assigned  key_groups")

        feeder = InputFeeder(broker.bootstrap, inp, total=200 * 3600, rate=200, keys=50)
        feeder.start()
        fleet.start("g1")
        wait_until(lambda: assigned() > 0, 90, what="first start: assigned")
        time.sleep(4)  # some epochs commit
        assert fleet.procs["g1"].terminate() == 0, fleet.logs()

        # 1. A restart whose start-up group check meets the cut.
        names = proxy.latency(400, jitter=50)  # the check takes long enough to be caught
        before, starts = assigned(), count(": started  ")
        proc = fleet.start("g1")
        pid = proc.proc.pid  # type: ignore[union-attr]
        wait_until(lambda: probe_children(pid), 90, interval=0.02, what="the start-up probe")
        proxy.disable()
        cut_at = time.monotonic()
        # The cut meets the group check: the start-up was not over when it began.
        assert count(": started  ") == starts, fleet.logs()
        print(f"start-up: probe child of {pid} seen; cut for {CUT_S}s")
        time.sleep(CUT_S)
        proxy.enable()
        for name in names:
            proxy.remove_toxic(name)
        print(f"start-up: healed after {time.monotonic() - cut_at:.1f}s")
        wait_until(lambda: assigned() > before, 120, what="the restarted instance assigned")
        assert proc.alive and proc.proc.pid == pid, fleet.logs()  # type: ignore[union-attr]
        text = log.read_text()
        print(
            "start-up log: "
            f"check begun {text.count('checking the group')}x, "
            f"describe failed {text.count('could not describe the group')}x, "
            f"probe died {text.count('the group probe process died')}x"
        )
        time.sleep(5)  # it commits after the heal
        feeder.stop()
        feeder.join(120)
        assert feeder.error is None, feeder.error
        stored = read_inputs(broker.bootstrap, inp, len(feeder.produced))
        outputs = read_all(broker.bootstrap, out, expected=len(stored), timeout=120, idle=5)
        problems = check(model(stored), outputs)
        assert problems == [], "\n".join(problems[:10]) + fleet.logs()
        assert proc.terminate() == 0, fleet.logs()

        # 2. lockgate reset of the stopped app, its group probe cut off.
        offsets = committed(broker.bootstrap, app, inp)
        assert all(o > 0 for o in offsets.values()), offsets
        cli_env = {**env, "LOCKGATE_STATE_DIR": str(fleet.state_dir("g1"))}
        names = proxy.latency(400, jitter=50)
        cli = subprocess.Popen(  # noqa: S603 - our own CLI
            [str(LOCKGATE), "reset", "--app", SPEC, "--to", "earliest", "--yes"],
            cwd=ROOT,
            env={**os.environ, **cli_env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        began = time.monotonic()
        wait_until(lambda: probe_children(cli.pid), 90, interval=0.02, what="the reset's probe")
        proxy.disable()
        stdout, stderr = cli.communicate(timeout=120)
        took = time.monotonic() - began
        proxy.enable()
        for name in names:
            proxy.remove_toxic(name)
        print(f"reset under the cut: exit {cli.returncode} after {took:.1f}s: {stderr.strip()}")
        assert cli.returncode == 1, (stdout, stderr)
        assert "cannot describe consumer group" in stderr, stderr
        assert "Traceback" not in stderr, stderr
        assert took < 15 + 10 + 30, took  # the request timeout, the probe's margin, start-up
        assert committed(broker.bootstrap, app, inp) == offsets  # nothing was reset

        done = lockgate_cli(cli_env, "reset", "--app", SPEC, "--to", "earliest", "--yes")
        assert done.returncode == 0, (done.stdout, done.stderr)
        after = committed(broker.bootstrap, app, inp)
        assert all(after[p] < offsets[p] for p in offsets), (after, offsets)
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
