"""Generate docs/configuration.md from the settings model (``make docs``).

A unit test compares the committed file with this output, so the reference can
never drift from the code.
"""

from __future__ import annotations

from processors._settings import Settings

_HEADER = """# Configuration reference

Generated from `processors/_settings.py` by `make docs`; a test keeps it in sync.

Every setting is an environment variable with the `LOCKGATE_` prefix. Values are
read once at start-up (the model is frozen). Invalid values stop the process with
exit code 2 and a message naming the variable. `lockgate config` prints the
effective configuration with secrets masked.

librdkafka properties pass through as `LOCKGATE_KAFKA__<KEY>` with the property's
dots written as `_` (`LOCKGATE_KAFKA__SESSION_TIMEOUT_MS=10000` sets
`session.timeout.ms`); they apply to every client (producer, consumers, admin) and
librdkafka ignores, with a warning, properties that do not apply to a client.

| Variable | Default | Description |
|---|---|---|
"""

_DYNAMIC = {
    "instance_id": "the hostname",
    "state_dir": "`$XDG_STATE_HOME/lockgate` or `~/.local/state/lockgate`",
    "kafka": "(none)",
}


def render() -> str:
    """Return the Markdown reference."""
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
        rows.append(f"| `{var}` | {default} | {field.description or ''} |")
    return _HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(render(), end="")
