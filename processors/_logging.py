"""Structured logging: one JSON object per line on stderr (or readable console lines)."""

from __future__ import annotations

import logging
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
