"""Word count, ported from Faust's classic example (docs/faust-migration.md).

``split_app`` (app name ``word-split``) reads ``LOCKGATE_SENTENCES_TOPIC`` (default
``sentences``; value = a UTF-8 sentence, key ignored) and sends every word to the
repartition topic ``LOCKGATE_WORDS_TOPIC`` (default ``words``) keyed by the word, with the
sentence's record time as the word's event time.

``count_app`` (app name ``word-count``) reads that topic and emits

- for every occurrence, to ``LOCKGATE_COUNTS_TOPIC`` (default ``word-counts``): key = the
  word, value ``{"word": <str>, "count": <occurrences so far>}`` (Faust's ``counts[word]``);
- once per word and tumbling window of ``LOCKGATE_WORD_WINDOW_MS`` (default 60000) ms, when
  the watermark passes its end, to ``LOCKGATE_MINUTE_TOPIC`` (default
  ``word-counts-minute``): value ``{"word", "start", "end", "count"}``.

Run::

    lockgate run examples.word_count:split_app
    lockgate run examples.word_count:count_app
"""

import os
from typing import Any

from processors import App, Context, Watermarks
from state import MapState, ValueState
from state.codecs import STR

SENTENCES = os.environ.get("LOCKGATE_SENTENCES_TOPIC", "sentences")
WORDS = os.environ.get("LOCKGATE_WORDS_TOPIC", "words")
COUNTS = os.environ.get("LOCKGATE_COUNTS_TOPIC", "word-counts")
MINUTE = os.environ.get("LOCKGATE_MINUTE_TOPIC", "word-counts-minute")
WINDOW_MS = int(os.environ.get("LOCKGATE_WORD_WINDOW_MS", "60000"))

split_app = App(
    "word-split",
    env=[
        "LOCKGATE_SENTENCES_TOPIC",
        "LOCKGATE_WORDS_TOPIC",
        "LOCKGATE_COUNTS_TOPIC",
        "LOCKGATE_MINUTE_TOPIC",
        "LOCKGATE_WORD_WINDOW_MS",
    ],
)
(
    split_app.stream(SENTENCES, value=STR, watermarks=Watermarks.monotonous())
    .flat_map(str.split)
    .key_by(lambda word: word, WORDS)
)

count_app = App("word-count", env=split_app.env)
totals: ValueState[int] = count_app.value_state("word-counts")
#: Occurrences of the word per open window, by window start (Faust's windowed table).
windows: MapState[int] = count_app.map_state("word-counts-minute")


@count_app.process(WORDS, outputs=[COUNTS, MINUTE], watermarks=Watermarks.monotonous())
def count(word: str, _value: Any, ctx: Context) -> None:
    """Count the word; emit its running count; count it in its event-time window."""
    n = (totals.value() or 0) + 1
    totals.update(n)
    ctx.emit(COUNTS, word, {"word": word, "count": n})
    start = ctx.event_time - ctx.event_time % WINDOW_MS
    end = start + WINDOW_MS
    if end - 1 <= ctx.timers.watermark:
        return  # its window fired already: late (Faust would change a closed window)
    windows.put(str(start), (windows.get(str(start)) or 0) + 1)
    ctx.timers.set_event_time(end - 1, str(start))


@count_app.on_timer
def window_closed(word: str, ctx: Any) -> None:
    """The watermark passed a window's end: emit its final count, once."""
    start = int(ctx.name)
    n = windows.get(ctx.name) or 0
    windows.remove(ctx.name)
    ctx.emit(MINUTE, word, {"word": word, "start": start, "end": start + WINDOW_MS, "count": n})
