"""Exactly-once when a commit's answer comes after the runtime's budget.

``commit_transaction`` reaches the coordinator and commits, but the answer comes late:
the client keeps reporting the retriable "retry call to resume" timeout past the
runtime's budget (the transaction timeout), as when the link to the coordinator stalls
after EndTxn reached it. The fault is injected at the client boundary
(``LOCKGATE_TEST_LATE_COMMIT``, processors/_kafka/faults.py); everything else is real: the
broker, RocksDB, two instances of examples/running_sum.py. The runtime must learn the
outcome from the broker (a new producer's init_transactions ends the transaction, the
group's stable committed offsets name the epoch) and go on from the committed epoch
instead of processing it again. Some commits never reach the coordinator at all
(``LOCKGATE_TEST_UNSENT_COMMIT``: EndTxn never sent): those must be found not committed
and replayed. The committed output must equal the independent model.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from tests.chaos._harness import Fleet, InputFeeder, chaos_env
from tests.support.checker import check, model
from tests.support.kafka import create_topic, read_all, read_inputs, unique
from tests.support.procs import wait_until

#: Late by more than the 10 s transaction timeout of chaos_env: beyond the retry budget.
LATE_S = 13


def _count(logs: str, text: str) -> int:
    return len(re.findall(re.escape(text), logs))


def _settles(log: str) -> list[tuple[str, str]]:
    """Each settle of one instance's log: (the fault injected before it, its outcome).

    The fault is ``late``, ``unsent`` or ``none`` (a real commit failure); the outcome
    ``rolled forward`` or ``replayed``.
    """
    found = []
    fault = "none"
    for line in log.splitlines():
        if "late commit: answering in" in line:
            fault = "late"
        elif "unsent commit: EndTxn never sent" in line:
            fault = "unsent"
        elif "had committed: going on from it" in line:
            found.append((fault, "rolled forward"))
            fault = "none"
        elif "did not commit: the epoch is replayed" in line:
            found.append((fault, "replayed"))
            fault = "none"
    return found


def _exact_outputs(bootstrap: str, inp: str, out: str, produced: int) -> list[str]:
    """The problems of the committed output against the model of the stored input."""
    outputs = read_all(bootstrap, out, expected=produced, timeout=240, idle=5)
    print(f"{produced} inputs, {len(outputs)} outputs")
    return check(model(read_inputs(bootstrap, inp, produced)), outputs)


def test_epoch_commits_without_an_answer_are_settled(kafka_bootstrap: str, tmp_path: Path) -> None:
    inp, out, app = unique("late-in"), unique("late-out"), unique("late-sum")
    create_topic(kafka_bootstrap, inp, 4)
    env = chaos_env(kafka_bootstrap, app, inp, out)
    env["LOCKGATE_TEST_LATE_COMMIT"] = f"0.2:{LATE_S}"
    # ... and some never reach the coordinator at all: those must be replayed.
    env["LOCKGATE_TEST_UNSENT_COMMIT"] = "0.08"
    env["LOCKGATE_CHECKPOINT_INTERVAL_MS"] = "200"
    seed = os.environ.get("LOCKGATE_CHAOS_SEED", str(time.time_ns() % 10**9))
    print(f"chaos seed: {seed} (set LOCKGATE_CHAOS_SEED={seed} to repeat which commits fail)")
    fleet = Fleet("examples.running_sum:app", env, tmp_path, ["u1", "u2"])
    for iid in fleet.ids:
        fleet.env["LOCKGATE_TEST_FAULT_SEED"] = f"{seed}-{iid}"
        fleet.start(iid)
    # Input flows until the faults happened (the total only bounds a runaway).
    feeder = InputFeeder(kafka_bootstrap, inp, total=500 * 400, rate=500, keys=300)
    feeder.start()
    try:
        wait_until(
            lambda: (
                _count(fleet.logs_full(), "late commit: answering in") >= 4
                and _count(fleet.logs_full(), "unsent commit: EndTxn never sent") >= 2
            ),
            timeout=300,
            what="four commits answered late and two never sent",
        )
        feeder.stop()
        feeder.join(60)
        assert not feeder.is_alive() and feeder.error is None, feeder.error
        problems = _exact_outputs(kafka_bootstrap, inp, out, len(feeder.produced))
        codes = fleet.stop_all()
    except BaseException:
        fleet.report_and_kill()
        raise
    finally:
        feeder.stop()
    assert problems == [], "\n".join(problems[:20]) + fleet.logs()
    # Every late commit committed on the broker: its settle must roll it forward; every
    # unsent one did not: its settle must replay it. (A real commit failure may be settled
    # too, either way: an abortable commit error is an unknown outcome.)
    verdicts = [_settles(p.log_text()) for p in fleet.procs.values()]
    pairs = [pair for per_instance in verdicts for pair in per_instance]
    print(f"settles (injected fault, outcome): {pairs}")
    late = [outcome for fault, outcome in pairs if fault == "late"]
    unsent = [outcome for fault, outcome in pairs if fault == "unsent"]
    assert len(late) >= 4 and set(late) == {"rolled forward"}, pairs
    assert len(unsent) >= 2 and set(unsent) == {"replayed"}, pairs
    assert codes == {"u1": 0, "u2": 0}, fleet.logs()


def test_final_commit_answered_late_at_sigterm(kafka_bootstrap: str, tmp_path: Path) -> None:
    inp, out, app = unique("late-stop-in"), unique("late-stop-out"), unique("late-stop")
    create_topic(kafka_bootstrap, inp, 2)
    env = chaos_env(kafka_bootstrap, app, inp, out)
    # Long epochs (the longest the 10 s transaction timeout allows): the SIGTERM lands
    # half-way through one, with many processed, uncommitted records (not during an
    # epoch's own commit, which would leave the final epoch empty).
    env["LOCKGATE_CHECKPOINT_INTERVAL_MS"] = "5000"
    env["LOCKGATE_TEST_LATE_COMMIT"] = f"stop:1:{LATE_S}"
    fleet = Fleet("examples.running_sum:app", env, tmp_path, ["s1"])
    proc = fleet.start("s1")
    feeder = InputFeeder(kafka_bootstrap, inp, total=6_000, rate=400, keys=200)
    try:
        wait_until(lambda: "assigned" in proc.log_text(), timeout=90, what="assignment")
        feeder.start()
        time.sleep(7.5)
        proc.signal(15)
        stopped = time.monotonic()
        code = proc.wait(90)
        took = time.monotonic() - stopped
        first = proc.log_text()
        assert code == 0, first[-4000:]
        assert "late commit: answering in" in first, first[-4000:]
        assert "had committed: going on from it" in first, first[-4000:]
        # The stop fits its budget: the commit's deadline (10 s), a new producer and the
        # committed-offsets read, and the consumer's close.
        assert took < 45, f"stop took {took:.0f}s"
        fleet.env = {k: v for k, v in env.items() if k != "LOCKGATE_TEST_LATE_COMMIT"}
        fleet.start("s1")
        feeder.join(60)
        assert not feeder.is_alive() and feeder.error is None, feeder.error
        problems = _exact_outputs(kafka_bootstrap, inp, out, len(feeder.produced))
        codes = fleet.stop_all()
    except BaseException:
        fleet.report_and_kill()
        raise
    finally:
        feeder.stop()
    print(f"stop with a late final commit took {took:.1f}s")
    assert problems == [], "\n".join(problems[:20]) + fleet.logs()
    assert codes == {"s1": 0}, fleet.logs()
