"""A real Faust word count and its lockgate port (examples/word_count.py) on the same input.

One 1-partition sentences topic gets N sentences from a small vocabulary, in order, with
explicit event times (``base + i * 100`` ms), then one *flush* sentence far ahead that moves
lockgate's watermark past every window of the data. Both systems read that same topic:

- Faust (faust-streaming in the benchmark venv, ``benchmarks.venvs.ensure("faust")``;
  tests/integration/apps/faust_word_count.py as a ``worker`` subprocess, default
  ``processing_guarantee``, i.e. at least once): split agent -> words topic keyed by word ->
  count agent with ``Table(default=int)``, sending the running count of every occurrence,
  and a tumbling windowed table ``.relative_to_stream()`` whose current value it sends per
  occurrence;
- lockgate: ``split_app`` and ``count_app`` as ``lockgate run`` processes, read with
  read_committed.

Compared where the semantics agree: per word, lockgate's running counts must be exactly
``1..n`` (no duplicate, none missing) with ``n`` the model's count; Faust's final count per
word must equal the model's, and since the worker runs without a crash its per-word sequence
too. Per (word, window) lockgate's single fired window result, Faust's last windowed-table
value and the model must agree (the windows of the flush sentence never fire in lockgate and
are left out).

Where Faust is weaker (not exercised here, no crash is injected): at least once by default,
so after a crash a word can be counted twice and its sends repeated (lockgate commits state,
outputs and offsets in one transaction); windowed tables go by wall-clock time unless
``relative_to_stream``/``relative_to_field``, and a record sent without a timestamp (the
classic example's split agent) carries the send time, so the Faust app here passes the
sentence's timestamp itself; a Faust window has no completeness (its value changes with every
record, there is no "final" output) and no late-record handling, while lockgate fires each
window once on the watermark and keeps late words out of fired windows.

The port reads its own variables (examples/word_count.py: App(..., env=[
"LOCKGATE_SENTENCES_TOPIC", "LOCKGATE_WORDS_TOPIC", "LOCKGATE_COUNTS_TOPIC",
"LOCKGATE_MINUTE_TOPIC", "LOCKGATE_WORD_WINDOW_MS"])).
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from benchmarks import venvs
from tests.support.kafka import create_topic, read_all, unique
from tests.support.procs import ROOT, AppProcess

SENTENCES = 300
VOCAB = "the cat dog saw a bird on mat ran far big red".split()
WINDOW_MS = 10_000
PARTITIONS = 4
FLUSH = "flush-word"


def _faust_python() -> Path:
    try:
        venvs.ensure("faust")  # built once, cached under .cache/bench/venvs/faust
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"the Faust venv could not be built (no network?): {e}")
    return venvs.python("faust")


def _produce(bootstrap: str, topic: str, sentences: list[tuple[int, str]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for ts, sentence in sentences:
        p.produce(topic, sentence.encode(), timestamp=ts)
    assert p.flush(30) == 0


def _by_word(msgs: list[Any]) -> dict[str, list[Any]]:
    """Output values per key word, in offset order (a word lives on one partition)."""
    out: dict[str, list[Any]] = defaultdict(list)
    for m in sorted(msgs, key=lambda m: (m.partition(), m.offset())):
        out[m.key().decode()].append(orjson.loads(m.value()))
    return out


def test_faust_and_lockgate_word_counts_agree(kafka_bootstrap: str, tmp_path: Path) -> None:
    faust_py = _faust_python()
    t0 = time.monotonic()
    rng = random.Random(11)
    base = (int(time.time() * 1000) - 600_000) // WINDOW_MS * WINDOW_MS
    sentences = [
        (base + i * 100, " ".join(rng.choice(VOCAB) for _ in range(rng.randint(3, 8))))
        for i in range(SENTENCES)
    ]
    flush_ts = base + SENTENCES * 100 + 5 * WINDOW_MS
    sentences.append((flush_ts, FLUSH))
    model = Counter(w for _, s in sentences for w in s.split())
    windows = Counter(
        (w, ts - ts % WINDOW_MS) for ts, s in sentences for w in s.split() if ts < flush_ts
    )
    words_total = sum(model.values())

    topics = {
        k: unique(f"wc-{k}")
        for k in ("sentences", "lg-words", "lg-counts", "lg-minute", "f-words", "f-counts", "f-win")
    }
    create_topic(kafka_bootstrap, topics["sentences"], 1)
    for k in ("lg-words", "f-words", "f-counts", "f-win"):
        create_topic(kafka_bootstrap, topics[k], PARTITIONS)
    faust_id = unique("faust-wc")
    # Faust creates its table changelogs itself, but it checked them before this broker
    # showed their partitions (PartitionsMismatch: "... changelog topic has 0 partitions").
    for table in ("word-counts", "word-counts-window"):
        compact = {"cleanup.policy": "compact"}
        create_topic(kafka_bootstrap, f"{faust_id}-{table}-changelog", PARTITIONS, compact)
    _produce(kafka_bootstrap, topics["sentences"], sentences)

    faust_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("LOCKGATE_", "VIRTUAL_ENV"))},
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "FAUST_TEST_BOOTSTRAP": kafka_bootstrap,
        "FAUST_TEST_APP_ID": faust_id,
        "FAUST_TEST_SENTENCES": topics["sentences"],
        "FAUST_TEST_WORDS": topics["f-words"],
        "FAUST_TEST_COUNTS": topics["f-counts"],
        "FAUST_TEST_WINDOWS": topics["f-win"],
        "FAUST_TEST_PARTITIONS": str(PARTITIONS),
        "FAUST_TEST_WINDOW_S": str(WINDOW_MS // 1000),
        "FAUST_TEST_DATA_DIR": str(tmp_path / "faust-data"),
    }
    faust_log = open(tmp_path / "faust.log", "wb")  # noqa: SIM115 - closed below
    faust = subprocess.Popen(
        [str(faust_py), "-m", "tests.integration.apps.faust_word_count", "worker", "-l", "info"],
        cwd=ROOT,
        env=faust_env,
        stdout=faust_log,
        stderr=subprocess.STDOUT,
    )
    lg_env = {
        "LOCKGATE_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "LOCKGATE_SENTENCES_TOPIC": topics["sentences"],
        "LOCKGATE_WORDS_TOPIC": topics["lg-words"],
        "LOCKGATE_COUNTS_TOPIC": topics["lg-counts"],
        "LOCKGATE_MINUTE_TOPIC": topics["lg-minute"],
        "LOCKGATE_WORD_WINDOW_MS": str(WINDOW_MS),
        "LOCKGATE_CHECKPOINT_INTERVAL_MS": "300",
        "LOCKGATE_INSTANCE_ID": "i1",
    }
    procs = [
        AppProcess(
            f"examples.word_count:{name}",
            {
                **lg_env,
                "LOCKGATE_APP_NAME": unique(name.replace("_", "-")),
                "LOCKGATE_STATE_DIR": str(tmp_path / name),
            },
            tmp_path / f"{name}.log",
        ).start()
        for name in ("split_app", "count_app")
    ]

    def logs() -> str:
        if not faust_log.closed:
            faust_log.flush()
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(tmp_path.glob("*.log"))
        )

    try:
        lg_counts = read_all(kafka_bootstrap, topics["lg-counts"], words_total, timeout=60, idle=2)
        lg_minute = read_all(kafka_bootstrap, topics["lg-minute"], len(windows), timeout=30, idle=2)
        uncommitted = "read_uncommitted"  # Faust does not use transactions by default
        f_counts = read_all(
            kafka_bootstrap, topics["f-counts"], words_total, 60, idle=2, isolation=uncommitted
        )
        f_win = read_all(
            kafka_bootstrap, topics["f-win"], words_total, 30, idle=1, isolation=uncommitted
        )
        faust_alive = faust.poll() is None
        codes = [p.terminate(60) for p in procs]
    finally:
        for p in procs:
            if p.alive:
                p.kill9()
        faust.terminate()
        try:
            faust.wait(30)
        except subprocess.TimeoutExpired:
            faust.kill()
            faust.wait(10)
        faust_log.close()
    elapsed = time.monotonic() - t0
    assert faust_alive, f"the Faust worker exited early (code {faust.returncode})\n{logs()}"
    assert codes == [0, 0], logs()

    # lockgate: per word exactly 1..n, n = the model's count (exactly once).
    lg = _by_word(lg_counts)
    assert {w: [v["count"] for v in vs] for w, vs in lg.items()} == {
        w: list(range(1, n + 1)) for w, n in model.items()
    }, logs()
    assert all(v["word"] == w for w, vs in lg.items() for v in vs)
    # Faust: final count per word = the model's; without a crash, the sequence is 1..n too.
    fa = _by_word(f_counts)
    assert {w: vs[-1]["count"] for w, vs in fa.items()} == dict(model), logs()
    assert {w: [v["count"] for v in vs] for w, vs in fa.items()} == {
        w: list(range(1, n + 1)) for w, n in model.items()
    }, logs()
    # Windows: lockgate fires each once with the final count; Faust's last value agrees.
    lg_windows = Counter()
    for m in lg_minute:
        v = orjson.loads(m.value())
        assert v["end"] == v["start"] + WINDOW_MS
        lg_windows[(v["word"], v["start"])] += v["count"]
    assert len(lg_minute) == len(windows), logs()
    assert lg_windows == windows, logs()
    f_windows = {
        (w, v["start"]): v["count"]
        for w, vs in _by_word(f_win).items()
        for v in vs
        if v["start"] < flush_ts - flush_ts % WINDOW_MS
    }
    assert f_windows == dict(windows), logs()
    print(f"{words_total} words, {len(windows)} windows, {elapsed:.1f}s")
