"""Faust's classic word count, for tests/integration/test_faust_word_count.py.

Runs ONLY in the Faust venv (.cache/bench/venvs/faust, ``benchmarks.venvs.ensure("faust")``)::

    python -m tests.integration.apps.faust_word_count worker -l info

Environment (never ``LOCKGATE_*``): FAUST_TEST_BOOTSTRAP, FAUST_TEST_APP_ID,
FAUST_TEST_SENTENCES, FAUST_TEST_WORDS, FAUST_TEST_COUNTS, FAUST_TEST_WINDOWS,
FAUST_TEST_PARTITIONS (of the words topic, so of the tables), FAUST_TEST_WINDOW_S,
FAUST_TEST_DATA_DIR.

``processing_guarantee`` stays at Faust's default (at least once). ``split`` sends every
word of a sentence keyed by the word, with the sentence's timestamp. ``count`` counts it
in a ``Table(default=int)`` and sends ``{"word": w, "count": n}`` (the running count) to
FAUST_TEST_COUNTS for every occurrence; it also counts it in a tumbling windowed table
relative to the stream (the record's timestamp) and sends ``{"word", "start", "count"}``
(start in ms, the window's current value) to FAUST_TEST_WINDOWS: the last value per
(word, start) is the window's count as Faust sees it.
"""

from __future__ import annotations

import os
from typing import Any

import faust

ENV = os.environ
WINDOW_S = int(ENV.get("FAUST_TEST_WINDOW_S", "10"))
PARTITIONS = int(ENV.get("FAUST_TEST_PARTITIONS", "4"))

app = faust.App(
    ENV["FAUST_TEST_APP_ID"],
    broker=f"kafka://{ENV['FAUST_TEST_BOOTSTRAP']}",
    datadir=ENV["FAUST_TEST_DATA_DIR"],
    consumer_auto_offset_reset="earliest",
    topic_partitions=PARTITIONS,
    web_enabled=False,
)
sentences = app.topic(ENV["FAUST_TEST_SENTENCES"], key_serializer="raw", value_serializer="raw")
words_topic = app.topic(ENV["FAUST_TEST_WORDS"], key_serializer="raw", value_serializer="raw")
counts_topic = app.topic(ENV["FAUST_TEST_COUNTS"], key_serializer="raw", value_serializer="json")
windows_topic = app.topic(ENV["FAUST_TEST_WINDOWS"], key_serializer="raw", value_serializer="json")
counts = app.Table("word-counts", default=int, key_type=str, value_type=int)
per_window = (
    app.Table("word-counts-window", default=int, key_type=str, value_type=int)
    .tumbling(WINDOW_S, expires=3600)
    .relative_to_stream()
)


@app.agent(sentences)
async def split(stream: Any) -> None:
    async for event in stream.events():
        # The classic example sends without a timestamp: the words then carry the time of
        # the send (the producer's clock), and the windows below would be wall-clock ones.
        # Passing the sentence's timestamp keeps event time across the re-keying, as
        # lockgate's key_by does.
        ts = event.message.timestamp
        for word in event.value.decode().split():
            await words_topic.send(key=word.encode(), value=word.encode(), timestamp=ts)


@app.agent(words_topic)
async def count(stream: Any) -> None:
    async for event in stream.events():
        word = event.value.decode()
        counts[word] += 1
        await counts_topic.send(key=word.encode(), value={"word": word, "count": counts[word]})
        per_window[word] += 1
        ts_ms = round(event.message.timestamp * 1000)
        start = ts_ms - ts_ms % (WINDOW_S * 1000)
        value = {"word": word, "start": start, "count": per_window[word].current()}
        await windows_topic.send(key=word.encode(), value=value)


if __name__ == "__main__":
    app.main()
