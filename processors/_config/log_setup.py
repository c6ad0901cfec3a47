"""Structured logging: one JSON object per line on stderr (or readable console lines)."""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

import orjson

_STD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Formats records as JSON with the ``extra`` fields at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the JSON line of ``record``."""
        data: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(data, default=str).decode()


class ConsoleFormatter(logging.Formatter):
    """Readable single lines: ``time level logger msg key=value...``."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the console line of ``record``."""
        extras = " ".join(
            f"{k}={v}"
            for k, v in record.__dict__.items()
            if k not in _STD and not k.startswith("_")
        )
        line = (
            f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
            f"{record.levelname:<7} {record.name}: {record.getMessage()}"
        )
        if extras:
            line += f"  {extras}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(level: str, fmt: str) -> None:
    """Send lockgate's logs to stderr in ``fmt`` ("json" or "console") at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ConsoleFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


LIBRDKAFKA_LOGGER = "lockgate.librdkafka"

# confluent-kafka's C trampoline calls ``logger.log(level, "%s [%s] %s", fac, name, buf)``
# with the syslog level already mapped: 0-2 CRITICAL, 3 ERROR, 4 WARNING, 5-6 INFO, 7 DEBUG.
_RDKAFKA_FORMAT = "%s [%s] %s"
_THREAD_PREFIX = re.compile(r"\[thrd:([^\]]*)\]: ")


class _LibrdkafkaLogger(logging.Logger):
    """Turns confluent-kafka's log calls into structured records (see :func:`librdkafka_logger`)."""

    def __init__(self, client: str) -> None:
        super().__init__(LIBRDKAFKA_LOGGER)
        self.client = client
        # Not registered with the logging manager (one per client, same name): the level and
        # handlers come from the registered "lockgate.librdkafka" logger and its ancestors.
        self.parent = logging.getLogger(LIBRDKAFKA_LOGGER)

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging API
        """Like :meth:`logging.Logger.isEnabledFor`, without the cache.

        The manager does not know this logger, so it could not invalidate a cache when
        the level of ``lockgate.librdkafka`` changes later.
        """
        if self.disabled or self.manager.disable >= level:
            return False
        return level >= self.getEffectiveLevel()

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        """Log one librdkafka line as a structured record (other calls pass through)."""
        if not (msg == _RDKAFKA_FORMAT and len(args) == 3 and not kwargs):
            super().log(level, msg, *args, **kwargs)
            return
        if not self.isEnabledFor(level):
            return
        facility, name, text = (str(a) for a in args)
        extra = {"client": self.client, "facility": facility, "rdkafka_name": name}
        m = _THREAD_PREFIX.match(text)
        if m is not None:
            extra["rdkafka_thread"] = m.group(1)
            text = text[m.end() :]
        self._log(level, text, (), extra=extra)


def librdkafka_logger(client: str) -> logging.Logger:
    """Return a logger to pass as the ``logger`` property of a confluent-kafka client.

    With it, librdkafka writes no raw ``%3|...|FAC|...`` lines to stderr: each log line
    becomes a record of the logger ``lockgate.librdkafka`` (level and handlers are those of
    that logger and its ancestors, so :func:`configure` formats it as JSON or console) with:

    - ``msg``: librdkafka's text, without its ``[thrd:...]:`` prefix;
    - ``client``: ``client`` as given (lockgate's name for the handle: "producer", ...);
    - ``facility``: librdkafka's facility (``FAIL``, ``TXNERR``, ``REQTMOUT``...);
    - ``rdkafka_name``: the handle's name (``<client.id>#<producer|consumer>-<n>``);
    - ``rdkafka_thread``: the librdkafka thread, when the line names one;
    - the level: confluent-kafka maps syslog levels 0-2 to CRITICAL, 3 to ERROR,
      4 to WARNING, 5-6 to INFO and 7 (``debug`` contexts) to DEBUG.

    Delivery contract (confluent-kafka): librdkafka queues log lines (``log.queue``) on the
    handle's main queue, and they are emitted on the Python thread that serves it: a
    Producer's ``poll()``/``flush()`` (and the transactional calls that flush), a Consumer's
    ``consume()``/``poll()`` (its main queue is forwarded to the consumer queue), an
    AdminClient's ``poll()`` only. Lines wait in memory until then, and a record's time is
    the time it was served, not the time librdkafka wrote it.

    Args:
        client: a short name for the client, added to every record as ``client``.
    """
    return _LibrdkafkaLogger(client)
