"""Property-based tests of settings parsing: secrets never reach a message or a dump."""

import os
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from processors import ConfigError, load_settings

# Secrets long enough that finding them by chance in a message is impossible, drawn from
# characters that are legal in an environment variable (no NUL, no surrogates).
SECRETS = st.text(
    alphabet=string.ascii_letters + string.digits + string.punctuation + " ",
    min_size=12,
    max_size=40,
).filter(lambda s: s.strip() == s)

BAD_COMPANIONS = st.sampled_from(
    [
        {"LOCKGATE_CHECKPOINT_INTERVAL_MS": "abc"},
        {"LOCKGATE_CHECKPOINT_INTERVAL_MS": "5000", "LOCKGATE_TRANSACTION_TIMEOUT_MS": "1000"},
        {"LOCKGATE_GUARANTEE": "twice"},
        {"LOCKGATE_KAFKA__GROUP_ID": "x"},
        {"LOCKGATE_CHECKPOINT_INTERVAL": "500"},
        {"LOCKGATE_KAFKA__": "y"},
        {"LOCKGATE_INSTANCE_ID": "has space"},
    ]
)
SECRET_VARS = st.sampled_from(
    [
        "LOCKGATE_SASL_PASSWORD",
        "LOCKGATE_KAFKA__SASL_PASSWORD",
        "LOCKGATE_KAFKA__SSL_KEY_PASSWORD",
        "LOCKGATE_KAFKA__SASL_OAUTHBEARER_CLIENT_SECRET",
    ]
)


@pytest.fixture(autouse=True)
def _no_lockgate_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("LOCKGATE_"):
            monkeypatch.delenv(name)


@settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(secret=SECRETS, var=SECRET_VARS, bad=BAD_COMPANIONS, newline=st.booleans())
def test_no_configuration_error_contains_a_secret(
    secret: str, var: str, bad: dict[str, str], newline: bool
) -> None:
    env = {var: secret + ("\n" if newline else ""), **bad}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with pytest.raises(ConfigError) as err:
            load_settings()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert secret not in str(err.value)


@settings(max_examples=100, deadline=None, database=None)
@given(secret=SECRETS, var=SECRET_VARS)
def test_valid_settings_mask_every_secret(secret: str, var: str) -> None:
    baseline = load_settings()
    # The property is about the secret's value; text the dump contains anyway does not count.
    assume(secret not in str(baseline.masked()) + repr(baseline) + str(baseline))
    os.environ[var] = secret
    try:
        s = load_settings()
    finally:
        del os.environ[var]
    assert secret not in str(s.masked()) + repr(s) + str(s)
    assert secret in s.kafka_config().values()


@settings(max_examples=100, deadline=None, database=None)
@given(
    interval=st.integers(min_value=10, max_value=600_000),
    timeout=st.integers(min_value=1000, max_value=900_000),
    eos=st.booleans(),
)
def test_epoch_rule_accepts_exactly_the_safe_combinations(
    interval: int, timeout: int, eos: bool
) -> None:
    guarantee = "exactly_once" if eos else "at_least_once"
    ok = not eos or timeout >= 2 * interval
    if ok:
        s = load_settings(
            checkpoint_interval_ms=interval, transaction_timeout_ms=timeout, guarantee=guarantee
        )
        assert (s.checkpoint_interval_ms, s.transaction_timeout_ms) == (interval, timeout)
    else:
        with pytest.raises(ConfigError, match="at least twice"):
            load_settings(
                checkpoint_interval_ms=interval, transaction_timeout_ms=timeout, guarantee=guarantee
            )
