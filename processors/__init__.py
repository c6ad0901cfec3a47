"""Lockgate's processing runtime and user API.

Define an :class:`App`, declare keyed state and outputs, and run it with
``lockgate run module:app``. Everything here is public; modules starting with
``_`` are internal.
"""

from processors._app import App, OutputSpec, Stream
from processors._context import Context
from processors._partitioner import key_group, murmur2
from processors._runtime import Runner, run_app
from processors._settings import Guarantee, OnError, Settings, load_settings
from processors.exceptions import (
    ConfigError,
    FatalKafkaError,
    LockgateError,
    TopicError,
    UserCodeError,
)
from state.codecs import BYTES, JSON, PICKLE, STR, Codec

__all__ = [
    "BYTES",
    "JSON",
    "PICKLE",
    "STR",
    "App",
    "Codec",
    "ConfigError",
    "Context",
    "FatalKafkaError",
    "Guarantee",
    "LockgateError",
    "OnError",
    "OutputSpec",
    "Runner",
    "Settings",
    "Stream",
    "TopicError",
    "UserCodeError",
    "key_group",
    "load_settings",
    "murmur2",
    "run_app",
]
