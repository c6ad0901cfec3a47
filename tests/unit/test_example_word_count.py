"""examples/word_count.py (the Faust word count, ported) in the TestDriver.

The split app sends every word keyed by itself; the count app emits the running count of a
word per occurrence and, when the watermark passes a window's end, the window's final
count, once; a word arriving after its window fired is not counted in it.
"""

from __future__ import annotations

from collections import Counter

from examples.word_count import COUNTS, MINUTE, WINDOW_MS, WORDS, count_app, split_app
from processors.testing import TestDriver


def test_split_sends_each_word_keyed_by_itself() -> None:
    d = TestDriver(split_app)
    out = d.send("s1", "the cat saw the dog", timestamp=5)
    assert [(e.topic, e.key, e.value) for e in out] == [
        (WORDS, w, w) for w in ["the", "cat", "saw", "the", "dog"]
    ]


def test_running_counts_and_window_counts_match_a_model() -> None:
    d = TestDriver(count_app)
    sentences = [(0, "a b a"), (30_000, "b c"), (61_000, "a a"), (125_000, "c")]
    running: Counter[str] = Counter()
    expected_running = []
    per_window: Counter[tuple[str, int]] = Counter()
    got_running = []
    fired = []
    for ts, sentence in sentences:
        for word in sentence.split():
            running[word] += 1
            expected_running.append((word, running[word]))
            per_window[(word, ts - ts % WINDOW_MS)] += 1
            for e in d.send(word, word, timestamp=ts):
                if e.topic == COUNTS:
                    got_running.append((e.key, e.value["count"]))
                else:  # the word moved the watermark past a window's end
                    fired.append(e)
    assert got_running == expected_running
    fired += [e for e in d.advance_watermark(10 * WINDOW_MS) if e.topic == MINUTE]
    assert sorted((e.key, e.value["start"], e.value["count"]) for e in fired) == sorted(
        (w, start, n) for (w, start), n in per_window.items()
    )
    assert all(e.value["end"] == e.value["start"] + WINDOW_MS for e in fired)


def test_a_word_after_its_window_fired_is_not_counted_in_it() -> None:
    d = TestDriver(count_app)
    d.send("a", "a", timestamp=1_000)
    fired = [e for e in d.advance_watermark(WINDOW_MS) if e.topic == MINUTE]
    assert [(e.key, e.value["count"]) for e in fired] == [("a", 1)]
    late = d.send("a", "a", timestamp=2_000)  # its window [0, 60000) fired already
    assert [(e.topic, e.value["count"]) for e in late] == [(COUNTS, 2)]
    assert [e for e in d.advance_watermark(10 * WINDOW_MS) if e.topic == MINUTE] == []
