"""/livez fails during a real stall of the loop; /readyz fails while key groups restore."""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
from pathlib import Path

from tests.integration._util import http_get
from tests.support.checker import check, model
from tests.support.kafka import create_topic, produce_numbers, read_all, read_inputs
from tests.support.ports import free_port
from tests.support.procs import AppProcess, wait_until


def _env(bootstrap: str, names, tmp_path: Path, port: int, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": bootstrap,
        "LOCKGATE_APP_NAME": names("probes"),
        "LOCKGATE_INPUT_TOPIC": names("probes-in"),
        "LOCKGATE_OUTPUT_TOPIC": names("probes-out"),
        "LOCKGATE_STATE_DIR": str(tmp_path / "state"),
        "LOCKGATE_INSTANCE_ID": "i1",
        "LOCKGATE_HTTP_PORT": str(port),
        "LOCKGATE_HTTP_HOST": "127.0.0.1",
    }
    env.update(extra)
    return env


class _Poller(threading.Thread):
    """Polls one probe every ``interval`` seconds; keeps (time, status, body)."""

    def __init__(self, port: int, path: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.port, self.path, self.interval = port, path, interval
        self.seen: list[tuple[float, int, str]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            code, body = http_get(self.port, self.path, timeout=2)
            self.seen.append((time.monotonic(), code, body))
            time.sleep(self.interval)


def test_livez_fails_while_user_code_stalls_the_loop(
    kafka_bootstrap: str, names, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    # The handler sleeps 4 s on seq 100: longer than the 1 s liveness timeout, well inside
    # the epoch budget (15 s), so it is a plain stall of the loop (no bounded call).
    env = _env(
        kafka_bootstrap, names, tmp_path, port, LOCKGATE_LIVENESS_TIMEOUT_MS="1000",
        LOCKGATE_TRANSACTION_TIMEOUT_MS="30000", LOCKGATE_CHECKPOINT_INTERVAL_MS="300",
        SLOW_APP_SLEEP_MS="0", SLOW_APP_STALL_SEQ="100", SLOW_APP_STALL_MS="4000",
    )  # fmt: skip
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 1)
    inputs = [(f"k{i % 7}", i % 13, i) for i in range(300)]
    produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], inputs)
    poller = _Poller(port, "/livez", 0.1)
    app = AppProcess("tests.integration.apps.slow:app", env, tmp_path / "app.log").start()
    poller.start()
    try:
        out = read_all(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=300, idle=1)
        wait_until(lambda: poller.seen and poller.seen[-1][1] == 200, 10, what="/livez 200")
    finally:
        poller.done.set()
        code = app.terminate()
    assert code == 0, app.log_text()[-3000:]
    assert check(model(read_inputs(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 300)), out) == []
    failed = [(t, json.loads(b)) for t, c, b in poller.seen if c == 503]
    assert failed, [c for _, c, _ in poller.seen]
    assert all(body["status"] == "stalled" for _, body in failed), failed[:3]
    assert max(body["last_progress_s"] for _, body in failed) >= 2.5
    # 503 for most of the stall (4 s - 1 s timeout), not a blip
    assert failed[-1][0] - failed[0][0] >= 2.0, failed
    codes = [c for _, c, _ in poller.seen if c]
    assert codes[0] == 200 and codes[-1] == 200


def test_readyz_fails_during_a_restore(kafka_bootstrap: str, names, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    keys = 40_000
    env = _env(
        kafka_bootstrap, names, tmp_path, port, LOCKGATE_CHECKPOINT_INTERVAL_MS="500",
        LOCKGATE_RESTORE_BATCH_RECORDS="500",
    )  # fmt: skip
    create_topic(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], 1)
    rng = random.Random(3)
    inputs = [(f"key-{i}", rng.randrange(100), i) for i in range(keys)]
    produce_numbers(kafka_bootstrap, env["LOCKGATE_INPUT_TOPIC"], inputs)
    app = AppProcess("examples.running_sum:app", env, tmp_path / "a.log").start()
    try:
        read_all(kafka_bootstrap, env["LOCKGATE_OUTPUT_TOPIC"], expected=keys, idle=1, timeout=120)
    finally:
        assert app.terminate() == 0
    shutil.rmtree(tmp_path / "state")  # the restart restores all 40,000 keys

    poller = _Poller(port, "/readyz", 0.01)
    poller.start()
    live = _Poller(port, "/livez", 0.05)
    live.start()
    app = AppProcess("examples.running_sum:app", env, tmp_path / "b.log").start()
    try:
        wait_until(
            lambda: poller.seen and poller.seen[-1][1] == 200, 120, interval=0.1, what="ready"
        )
    finally:
        poller.done.set()
        live.done.set()
        code = app.terminate()
    log = app.log_text()
    assert code == 0, log[-3000:]
    restored = [int(x.split("records=")[1].split()[0]) for x in log.splitlines() if "restored" in x]
    assert restored == [keys], restored
    took = float(
        next(x for x in log.splitlines() if "restored" in x).split("seconds=")[1].split()[0]
    )
    answered = [(t, c, json.loads(b)) for t, c, b in poller.seen if c]
    first_ok = next(i for i, (_, c, _) in enumerate(answered) if c == 200)
    not_ready = answered[:first_ok]
    assert not_ready, "the instance reported ready before restoring"
    assert all(c == 503 for _, c, _ in not_ready)
    # 503 for the whole restore, and never ready again before the end
    assert not_ready[-1][0] - not_ready[0][0] >= 0.8 * took, (took, len(not_ready))
    assert all(c == 200 for _, c, _ in answered[first_ok:])
    # The first restore happens inside the first assignment, so /readyz names it "joining"
    # (readyz checks joined before restoring); later restores say "restoring".
    assert {b["status"] for _, _, b in not_ready} <= {"joining", "restoring"}
    assert all(c == 200 for _, c, _ in live.seen if c), "/livez must stay up during a restore"
    # after the restore: ready, owning the key group
    assert json.loads(poller.seen[-1][2]) == {"status": "ready", "key_groups": 1}
