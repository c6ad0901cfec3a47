"""The stop budget under a network cut: SIGTERM to exit within ``stop_budget_s``.

One instance of examples/running_sum.py reaches its private broker only through a TCP
fault proxy (the broker's PROXIED listener, as in test_network_faults.py). While input
flows, it is stopped twice, each time cut off from the broker:

1. **black hole during an unanswered final commit**: the final commit's answer comes late
   (``LOCKGATE_TEST_LATE_COMMIT=stop:...``, processors/_kafka/faults.py) and the connections go
   silent right after the SIGTERM (a ``timeout`` toxic that never closes them): the
   replacement producer cannot initialise, the committed offsets cannot be read, the
   consumer cannot leave;
2. **connections refused**: the proxy is disabled (every connection closed, new ones
   refused) a moment before the SIGTERM.

Each stop must end within the documented budget (processors/_checkpoint/txn.py ``stop_budget_s``)
with exit code 0, and the committed output at the end must equal the independent model:
what the stops left unfinished is settled by the coordinator and the restarted instance.
"""

from __future__ import annotations

import time
from pathlib import Path

from processors._checkpoint.txn import stop_budget_s
from tests.chaos._harness import InputFeeder, chaos_env
from tests.chaos.test_network_faults import ProxiedBroker, SplitFleet
from tests.support.checker import check, model
from tests.support.kafka import create_topic, read_all, read_inputs, unique
from tests.support.procs import wait_until
from tests.support.toxiproxy import ToxiproxyServer

TXN_TIMEOUT_MS = 10_000
#: What the budget allows (no group leave: LOCKGATE_LEAVE_GROUP_ON_STOP=never here).
BUDGET_S = stop_budget_s(TXN_TIMEOUT_MS / 1000, False)


def test_stop_within_budget_when_cut_off(tmp_path: Path) -> None:
    toxiproxy = ToxiproxyServer(tmp_path / "toxiproxy.log").start()
    broker = ProxiedBroker(tmp_path / "kafka")
    fleet: SplitFleet | None = None
    feeder: InputFeeder | None = None
    took: dict[str, float] = {}
    try:
        broker.up()
        proxy = toxiproxy.api.create_proxy(
            "kafka-s1", broker.proxy_bootstrap, f"127.0.0.1:{broker.proxied_port}"
        )
        inp, out, app = unique("stop-in"), unique("stop-out"), unique("stop-sum")
        create_topic(broker.bootstrap, inp, 2)
        env = chaos_env(broker.proxy_bootstrap, app, inp, out)
        env["LOCKGATE_TRANSACTION_TIMEOUT_MS"] = str(TXN_TIMEOUT_MS)
        env["LOCKGATE_CHECKPOINT_INTERVAL_MS"] = "2000"
        env["LOCKGATE_LEAVE_GROUP_ON_STOP"] = "never"
        late = {"LOCKGATE_TEST_LATE_COMMIT": "stop:1:120"}
        fleet = SplitFleet("examples.running_sum:app", env, tmp_path, ["s1"], overrides={})
        feeder = InputFeeder(broker.bootstrap, inp, total=300 * 3600, rate=300, keys=100)
        feeder.start()

        def start(overrides: dict[str, str], phase: str) -> None:
            assert fleet is not None
            log = tmp_path / "s1.log"
            before = log.read_text().count("assigned  key_groups") if log.exists() else 0
            fleet.overrides = {"s1": overrides}
            fleet.start("s1")
            wait_until(
                lambda: log.read_text().count("assigned  key_groups") > before,
                90,
                what=f"{phase}: assigned",
            )

        def stop_cut_off(phase: str, cut: object) -> None:
            assert fleet is not None
            proc = fleet.procs["s1"]
            time.sleep(5)  # some epochs commit, one is open
            proc.signal(15)
            started = time.monotonic()
            if phase == "black hole":
                time.sleep(1)  # the real commit went through; its answer is late
            cut()  # type: ignore[operator]
            code = proc.wait(BUDGET_S + 30)
            took[phase] = time.monotonic() - started
            print(f"{phase}: stopped in {took[phase]:.1f}s (budget {BUDGET_S:.0f}s), exit {code}")
            assert code == 0, proc.log_text()[-4000:]
            assert took[phase] <= BUDGET_S, proc.log_text()[-4000:]

        # 1. black hole after an unanswered final commit
        start(late, "black hole")
        names: list[str] = []
        stop_cut_off("black hole", lambda: names.extend(proxy.timeout(0)))
        log1 = fleet.procs["s1"].log_text()
        assert "late commit: answering in" in log1, log1[-3000:]
        for name in names:
            proxy.remove_toxic(name)

        # 2. connections refused
        start({}, "refused")
        stop_cut_off("refused", proxy.disable)
        proxy.enable()

        # the rest, uninterrupted
        start({}, "the rest")
        time.sleep(5)
        feeder.stop()
        feeder.join(60)
        assert feeder.error is None, feeder.error
        stored = read_inputs(broker.bootstrap, inp, len(feeder.produced))
        outputs = read_all(broker.bootstrap, out, expected=len(stored), timeout=180, idle=5)
        codes = fleet.stop_all()
        problems = check(model(stored), outputs)
        print(f"stop budget: {len(stored)} inputs, {len(outputs)} outputs, took {took}")
        assert problems == [], "\n".join(problems[:10]) + fleet.logs()
        assert codes == {"s1": 0}, fleet.logs()
    except BaseException:
        if fleet is not None:
            fleet.report_and_kill()
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
