"""Generate docs/configuration.md from the settings model (``make docs``).

A unit test compares the committed file with this output, so the reference can
never drift from the code.
"""

from __future__ import annotations

from typing import Any

from processors._config.settings import (
    NON_SETTINGS_ENV,
    NON_SETTINGS_PREFIXES,
    RESERVED_KAFKA_KEYS,
    Settings,
)

_HEADER = """# Configuration reference

Generated from `processors/_config/settings.py` by `make docs`; a test keeps it in sync.

Every setting is an environment variable with the `LOCKGATE_` prefix. Values are
read once at start-up (the model is frozen). Invalid values stop the process with
exit code 2 and a message on stderr naming each variable at fault; the messages never
contain the value of a secret (`LOCKGATE_SASL_PASSWORD`, secret pass-through
properties), and a password containing a control character (a trailing newline from
a file-based Secret) is refused without being shown.

`lockgate config` is a dry run of everything `lockgate run` checks before it connects
to Kafka, and prints the effective configuration as JSON with secrets masked;
`lockgate config MODULE:APP` also loads the app and checks its definition.

Rules between settings: under `exactly_once`, `LOCKGATE_TRANSACTION_TIMEOUT_MS` must be
at least twice `LOCKGATE_CHECKPOINT_INTERVAL_MS`.

librdkafka properties pass through as `LOCKGATE_KAFKA__<KEY>` with the property's
dots written as `_` (`LOCKGATE_KAFKA__SESSION_TIMEOUT_MS=10000` sets
`session.timeout.ms`); they apply to every client (producer, consumers, admin) and
librdkafka ignores, with a warning, properties that do not apply to a client.
Properties lockgate sets itself are refused: {reserved}.

| Variable | Default | Allowed | Description |
|---|---|---|---|
"""

_UNKNOWN = """
## Unknown variables

A `LOCKGATE_*` variable that is not listed above stops `lockgate run` and `lockgate
config` with exit code 2 and the closest real name (`LOCKGATE_CHECKPOINT_INTERVAL=500`:
did you mean `LOCKGATE_CHECKPOINT_INTERVAL_MS`?), instead of being ignored. Names are
compared in upper case. Accepted besides the settings:

- `LOCKGATE_KAFKA__<KEY>`: the librdkafka pass-through.
- Variables an app reads itself, declared in code: `App("windows",
  env=["LOCKGATE_WINDOW_MS"])`; they are accepted by `lockgate run MODULE:APP` and
  `lockgate config MODULE:APP`.
- Variables of lockgate's own tooling, tests and examples, which may be inherited by a
  processor's environment:

| Variable | Read by |
|---|---|
"""

_DYNAMIC = {
    "instance_id": "the hostname",
    "state_dir": "`$XDG_STATE_HOME/lockgate` or `~/.local/state/lockgate`",
    "kafka": "(none)",
}


def _allowed(annotation: Any, metadata: list[Any]) -> str:
    """The values a field accepts: enum members or integer bounds."""
    members = getattr(annotation, "__members__", None)
    if members:
        return ", ".join(f"`{m.value}`" for m in members.values())
    low = next((m.ge for m in metadata if getattr(m, "ge", None) is not None), None)
    high = next((m.le for m in metadata if getattr(m, "le", None) is not None), None)
    if low is None and high is None:
        return ""
    if high is None:
        return f">= {low}"
    if low is None:
        return f"<= {high}"
    return f"{low}..{high}"


def render() -> str:
    """Return the Markdown reference: settings, then the accepted non-setting names."""
    rows = []
    for name, field in Settings.model_fields.items():
        var = f"LOCKGATE_{name.upper()}"
        if name == "kafka":
            var = "LOCKGATE_KAFKA__<KEY>"
        if name in _DYNAMIC:
            default = _DYNAMIC[name]
        else:
            value = field.default
            value = getattr(value, "value", value)
            default = "(none)" if value is None else f"`{value}`"
        allowed = _allowed(field.annotation, field.metadata)
        rows.append(f"| `{var}` | {default} | {allowed} | {field.description or ''} |")
    reserved = ", ".join(f"`{k}`" for k in sorted(RESERVED_KAFKA_KEYS))
    other = [f"| `{var}` | {who} |" for var, who in sorted(NON_SETTINGS_ENV.items())]
    other += [f"| `{prefix}*` | {who} |" for prefix, who in sorted(NON_SETTINGS_PREFIXES.items())]
    return (
        _HEADER.format(reserved=reserved)
        + "\n".join(rows)
        + "\n"
        + _UNKNOWN
        + "\n".join(other)
        + "\n"
    )


if __name__ == "__main__":
    print(render(), end="")
