"""The independent checker of examples/postgres_sink.py's tables against a model.

The model is computed from the input as stored in Kafka (``read_inputs``: per key in
partition order), never from the app: per key the running total of ``v``. The tables must
hold exactly: one ``<table>_events`` row per input ``seq`` (none missing, none twice) with
the key's running total at that record, and one ``<table>`` row per key with the final
total, count and last seq.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from tests.support.postgres import PostgresServer


def expected_tables(
    inputs: list[tuple[str, int, int]],
) -> tuple[dict[int, tuple[str, int, int]], dict[str, tuple[int, int, int]]]:
    """(seq -> (key, v, total), key -> (total, count, last seq)) of an uninterrupted run."""
    events: dict[int, tuple[str, int, int]] = {}
    sums: dict[str, tuple[int, int, int]] = {}
    for key, v, seq in inputs:
        total, count, _ = sums.get(key, (0, 0, -1))
        sums[key] = (total + v, count + 1, seq)
        events[seq] = (key, v, total + v)
    return events, sums


def check_tables(pg: PostgresServer, table: str, inputs: list[tuple[str, int, int]]) -> list[str]:
    """The differences between the tables and the model (``[]``: exact)."""
    events, sums = expected_tables(inputs)
    problems: list[str] = []
    rows = pg.execute(f"SELECT seq, key, v, total FROM {table}_events")  # noqa: S608 - test
    seen = Counter(r[0] for r in rows)
    dup = sorted(s for s, n in seen.items() if n > 1)
    if dup:
        problems.append(f"{len(dup)} events written more than once, e.g. seq {dup[:5]}")
    missing = sorted(set(events) - set(seen))
    if missing:
        problems.append(f"{len(missing)} events missing, e.g. seq {missing[:5]}")
    extra = sorted(set(seen) - set(events))
    if extra:
        problems.append(f"{len(extra)} events of no input, e.g. seq {extra[:5]}")
    wrong = [r for r in rows if r[0] in events and tuple(r[1:]) != events[r[0]]]
    if wrong:
        problems.append(
            f"{len(wrong)} events differ from the model, e.g. {wrong[0]} != {events[wrong[0][0]]}"
        )
    got = {r[0]: tuple(r[1:]) for r in pg.execute(f"SELECT key, total, count, seq FROM {table}")}  # noqa: S608
    bad = defaultdict(list)
    for key in set(got) | set(sums):
        if got.get(key) != sums.get(key):
            bad["sums"].append(f"{key}: table {got.get(key)} model {sums.get(key)}")
    if bad["sums"]:
        problems.append(f"{len(bad['sums'])} keys' sums differ: " + "; ".join(bad["sums"][:5]))
    prepared = pg.execute("SELECT gid FROM pg_prepared_xacts")
    if prepared:
        problems.append(f"prepared transactions left: {[p[0] for p in prepared][:5]}")
    return problems
