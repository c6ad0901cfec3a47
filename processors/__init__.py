"""Lockgate's processing runtime and user API.

Define an :class:`App`, declare keyed state and outputs, and run it with
``lockgate run module:app``. Everything here is public; modules starting with
``_`` are internal.
"""

from processors._config.settings import Guarantee, OnError, Settings, load_settings
from processors._dsl.app import App, OperatorInfo, Stream
from processors._dsl.context import Context
from processors._dsl.partitioner import key_group, murmur2
from processors._dsl.topics import OutputSpec, TopicConfig
from processors._runtime.runner import Runner, run_app
from processors._sinks.errors import SinkRowError
from processors._sinks.iceberg import IcebergOutput
from processors._sinks.postgres import PostgresOutput
from processors._task.time import NO_WATERMARK, TimerContext, Timers, Watermarks
from processors.exceptions import (
    ConfigError,
    FatalKafkaError,
    LockgateError,
    TopicError,
    UserCodeError,
)
from processors.windows import (
    Count,
    CountAggregator,
    Global,
    Session,
    Sliding,
    Tumbling,
    WindowResult,
)
from state.codecs import BYTES, JSON, PICKLE, STR, Codec, FaustRecord, Model

__all__ = [
    "BYTES",
    "JSON",
    "NO_WATERMARK",
    "PICKLE",
    "STR",
    "App",
    "Codec",
    "ConfigError",
    "Context",
    "Count",
    "CountAggregator",
    "FaustRecord",
    "FatalKafkaError",
    "Global",
    "Guarantee",
    "IcebergOutput",
    "LockgateError",
    "Model",
    "OnError",
    "OperatorInfo",
    "OutputSpec",
    "PostgresOutput",
    "Runner",
    "Session",
    "Settings",
    "SinkRowError",
    "Sliding",
    "Stream",
    "TimerContext",
    "Timers",
    "TopicConfig",
    "TopicError",
    "Tumbling",
    "UserCodeError",
    "Watermarks",
    "WindowResult",
    "key_group",
    "load_settings",
    "murmur2",
    "run_app",
]
