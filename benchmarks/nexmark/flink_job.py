"""One Nexmark query as Flink SQL on a local mini-cluster (run by the Flink venv's python).

``python benchmarks/nexmark/flink_job.py QUERY`` with ``BENCH_BOOTSTRAP``, ``BENCH_INPUT``,
``BENCH_OUTPUT``, ``BENCH_GROUP``, ``NEXMARK_DELAY_MS``, ``NEXMARK_CONNECTOR_JAR`` and
``BENCH_STATE_DIR`` set by the harness (benchmarks/nexmark/harness.py). Stdlib and
PyFlink only: this file runs in the Flink venv, not the project's. ``python
benchmarks/nexmark/flink_job.py --serve DIR`` runs query after query in one process (one
gateway JVM, a fresh table environment and mini-cluster job per query), as requested by
files in ``DIR`` (``serve``; the harness's ``--flink-shared-jvm`` and ``make bench``).

Setup: parallelism 1 (``NEXMARK_PARALLELISM``), checkpoints every second (exactly-once
mode, state on the heap, checkpoints to ``BENCH_STATE_DIR``), a bounded Kafka source
(earliest offset to the offsets at start, ``read_committed``), a Kafka sink with
``sink.delivery-guarantee = exactly-once`` and a transactional id prefix. The job ends
when the source is drained: the end of input fires every window, the final checkpoint
commits the last transaction.

The source table is the Nexmark suite's one-table JSON shape (``ddl_kafka.sql``, with
``dateTime`` as epoch ms) with an event-time column and a watermark of
``NEXMARK_DELAY_MS``; the views ``person``, ``auction`` and ``bid`` filter on
``event_type``; the query SQL is the suite's (NX ``resources/queries/qN.sql``), its sink
columns as they select (q7's sink names its columns in the select's order, see
docs/benchmarks.md). Times leave as epoch ms.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

SOURCE_DDL = """
CREATE TABLE events (
  event_type INT,
  person ROW<id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING,
             state STRING, `dateTime` BIGINT, extra STRING>,
  auction ROW<id BIGINT, itemName STRING, description STRING, initialBid BIGINT,
              reserve BIGINT, `dateTime` BIGINT, expires BIGINT, seller BIGINT,
              category BIGINT, extra STRING>,
  bid ROW<auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
          `dateTime` BIGINT, extra STRING>,
  `end` BIGINT,
  ts_ms AS COALESCE(bid.`dateTime`, auction.`dateTime`, person.`dateTime`, `end`),
  `dateTime` AS TO_TIMESTAMP_LTZ(
      COALESCE(bid.`dateTime`, auction.`dateTime`, person.`dateTime`, `end`), 3),
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '{delay_s}' SECOND
) WITH (
  'connector' = 'kafka',
  'topic' = '{input}',
  'properties.bootstrap.servers' = '{bootstrap}',
  'properties.group.id' = '{group}',
  'properties.isolation.level' = 'read_committed',
  'scan.startup.mode' = 'earliest-offset',
  'scan.bounded.mode' = 'latest-offset',
  'format' = 'json',
  'json.fail-on-missing-field' = 'false'
)
"""

VIEWS = [
    """CREATE VIEW person AS SELECT person.id, person.name, person.emailAddress,
       person.creditCard, person.city, person.state, `dateTime`, person.extra,
       ts_ms FROM events WHERE event_type = 0""",
    """CREATE VIEW auction AS SELECT auction.id, auction.itemName, auction.description,
       auction.initialBid, auction.reserve, `dateTime`, auction.expires, auction.seller,
       auction.category, auction.extra, ts_ms FROM events WHERE event_type = 1""",
    """CREATE VIEW bid AS SELECT bid.auction, bid.bidder, bid.price, bid.channel,
       bid.url, `dateTime`, bid.extra, ts_ms FROM events WHERE event_type = 2""",
]

#: query -> (sink columns, INSERT ... SELECT); dateTime leaves as epoch ms (ts_ms)
QUERIES: dict[str, tuple[str, str]] = {
    "q0": (
        "auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` BIGINT, extra STRING",
        "INSERT INTO sink SELECT auction, bidder, price, ts_ms, extra FROM bid",
    ),
    "q1": (
        "auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), `dateTime` BIGINT, extra STRING",
        "INSERT INTO sink SELECT auction, bidder, 0.908 * price AS price, ts_ms, extra FROM bid",
    ),
    "q2": (
        "auction BIGINT, price BIGINT",
        "INSERT INTO sink SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
    ),
    "q3": (
        "name STRING, city STRING, state STRING, id BIGINT",
        """INSERT INTO sink
        SELECT P.name, P.city, P.state, A.id
        FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
        WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    ),
    "q5": (
        "auction BIGINT, num BIGINT",
        """INSERT INTO sink
        SELECT AuctionBids.auction, AuctionBids.num
         FROM (
           SELECT auction, count(*) AS num, window_start AS starttime,
                  window_end AS endtime
           FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND,
                          INTERVAL '10' SECOND))
           GROUP BY auction, window_start, window_end
         ) AS AuctionBids
         JOIN (
           SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
           FROM (
             SELECT count(*) AS num, window_start AS starttime, window_end AS endtime
             FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND,
                            INTERVAL '10' SECOND))
             GROUP BY auction, window_start, window_end
           ) AS CountBids
           GROUP BY CountBids.starttime, CountBids.endtime
         ) AS MaxBids
         ON AuctionBids.starttime = MaxBids.starttime AND
            AuctionBids.endtime = MaxBids.endtime AND
            AuctionBids.num >= MaxBids.maxn""",
    ),
    "q7": (
        # the suite's sink is (auction, bidder, price, ...) but its SELECT gives
        # (auction, price, bidder, ...): here the sink names them as selected
        "auction BIGINT, price BIGINT, bidder BIGINT, `dateTime` BIGINT, extra STRING",
        """INSERT INTO sink
        SELECT B.auction, B.price, B.bidder, B.ts_ms, B.extra
        FROM bid B
        JOIN (
          SELECT MAX(price) AS maxprice, window_end AS `dateTime`
          FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
          GROUP BY window_start, window_end
        ) B1
        ON B.price = B1.maxprice
        WHERE B.`dateTime` BETWEEN B1.`dateTime` - INTERVAL '10' SECOND
                               AND B1.`dateTime`""",
    ),
    "q8": (
        "id BIGINT, name STRING, starttime BIGINT",
        """INSERT INTO sink
        SELECT P.id, P.name,
          CAST(TIMESTAMPDIFF(SECOND, TIMESTAMP '1970-01-01 00:00:00', P.starttime)
               AS BIGINT) * 1000
        FROM (
          SELECT id, name, window_start AS starttime, window_end AS endtime
          FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
          GROUP BY id, name, window_start, window_end
        ) P
        JOIN (
          SELECT seller, window_start AS starttime, window_end AS endtime
          FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
          GROUP BY seller, window_start, window_end
        ) A
        ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""",
    ),
}

SINK_DDL = """
CREATE TABLE sink ({columns}) WITH (
  'connector' = 'kafka',
  'topic' = '{output}',
  'properties.bootstrap.servers' = '{bootstrap}',
  'properties.transaction.timeout.ms' = '600000',
  'sink.delivery-guarantee' = 'exactly-once',
  'sink.transactional-id-prefix' = '{group}-tx',
  'format' = 'json',
  'json.encode.decimal-as-plain-number' = 'true'
)
"""


def run_query(query: str, output: str, group: str, state_dir: str) -> None:
    """Run ``query`` to the end of its bounded input, writing ``output``."""
    from pyflink.common import Configuration  # type: ignore[import-not-found,unused-ignore]
    from pyflink.table import EnvironmentSettings, TableEnvironment  # type: ignore[import-not-found,unused-ignore]

    env = os.environ
    params = {
        "bootstrap": env["BENCH_BOOTSTRAP"],
        "input": env["BENCH_INPUT"],
        "output": output,
        "group": group,
        "delay_s": f"{int(env.get('NEXMARK_DELAY_MS', '4000')) / 1000:.3f}",
    }
    conf = Configuration()
    # NEXMARK_PARALLELISM: the harness's --parallelism (default 1: one core, like one
    # lockgate instance)
    conf.set_string("parallelism.default", env.get("NEXMARK_PARALLELISM", "1"))
    conf.set_string("execution.checkpointing.interval", "1 s")
    conf.set_string("execution.checkpointing.mode", "EXACTLY_ONCE")
    conf.set_string("execution.checkpointing.dir", f"file://{state_dir}/checkpoints")
    conf.set_string("state.backend.type", "hashmap")
    conf.set_string("pipeline.jars", f"file://{env['NEXMARK_CONNECTOR_JAR']}")
    conf.set_string("table.local-time-zone", "UTC")
    conf.set_string("rest.bind-port", "0")
    conf.set_string("restart-strategy.type", "none")  # a failure ends the run
    builder = EnvironmentSettings.new_instance().in_streaming_mode()
    settings = builder.with_configuration(conf).build()
    t_env = TableEnvironment.create(settings)
    t_env.execute_sql(SOURCE_DDL.format(**params))
    for view in VIEWS:
        t_env.execute_sql(view)
    columns, insert = QUERIES[query]
    t_env.execute_sql(SINK_DDL.format(columns=columns, **params))
    print(f"flink-job: {query} submitting at {time.time():.3f}", flush=True)
    result = t_env.execute_sql(insert)
    result.wait()
    print(f"flink-job: {query} finished at {time.time():.3f}", flush=True)


def serve(control: Path) -> int:
    """Run queries one after another in this process (one gateway JVM): each request is
    a file ``<n>.json`` (``query``, ``output``, ``group``, ``state_dir``) in ``control``;
    the answer ``<n>.done`` holds ``ok`` or the error; the file ``stop`` ends the loop."""
    done: set[str] = set()
    while not (control / "stop").exists():
        todo = sorted(f for f in control.glob("*.json") if f.stem not in done)
        if not todo:
            time.sleep(0.05)
            continue
        req = todo[0]
        done.add(req.stem)
        try:
            args = json.loads(req.read_text())
            run_query(args["query"], args["output"], args["group"], args["state_dir"])
            answer = "ok"
        except Exception as exc:  # noqa: BLE001 - answered, the next request still runs
            answer = f"failed: {exc!r}"[:2000]
        tmp = control / f"{req.stem}.tmp"
        tmp.write_text(answer)
        tmp.replace(control / f"{req.stem}.done")
    return 0


def main() -> int:
    """``QUERY``: run it (``BENCH_OUTPUT``, ``BENCH_GROUP``, ``BENCH_STATE_DIR``);
    ``--serve DIR``: run the queries requested in ``DIR`` (see :func:`serve`)."""
    if sys.argv[1] == "--serve":
        return serve(Path(sys.argv[2]))
    env = os.environ
    run_query(sys.argv[1], env["BENCH_OUTPUT"], env["BENCH_GROUP"], env["BENCH_STATE_DIR"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
