"""Messages of refused connections and missing ACLs: they name what to fix, never a secret.

The behaviour against a real authorizing broker is tested in tests/security/.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from processors._kafka.authz import AUTHORIZATION_CODES, authorization_error
from processors._kafka.clients import _refusal_message
from processors._ops.cli_common import not_authorized_text
from processors.exceptions import AuthorizationError, ConfigError

SECRET = "s3cret-Pa55word"
CONF = {
    "bootstrap.servers": "broker:9093",
    "sasl.username": "alice",
    "sasl.password": SECRET,
    "sasl.mechanism": "SCRAM-SHA-512",
}


def test_a_refused_password_names_the_user_and_the_settings_not_the_password() -> None:
    err = KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials")
    text = _refusal_message(err, CONF)
    assert text.startswith("authentication failed: broker:9093 refused the SASL credentials")
    assert "User:alice" in text and "LOCKGATE_SASL_PASSWORD_FILE" in text
    assert SECRET not in text


def test_an_untrusted_certificate_names_the_ca_setting() -> None:
    err = KafkaError(KafkaError._SSL, "SSL handshake failed: certificate verify failed")
    text = _refusal_message(err, CONF)
    assert "certificate verify failed" in text and "LOCKGATE_KAFKA__SSL_CA_LOCATION" in text
    assert SECRET not in text


def test_a_missing_acl_is_a_config_error_naming_operation_and_resource() -> None:
    exc = authorization_error("alice", "WRITE", "TRANSACTIONAL_ID", "app-i1", "DENIED")
    assert isinstance(exc, AuthorizationError) and isinstance(exc, ConfigError)  # exit 2
    assert str(exc).startswith("not authorized: User:alice lacks the WRITE ACL on ")
    assert "TRANSACTIONAL_ID app-i1 (DENIED)" in str(exc)


def test_the_cli_recognises_each_authorization_code_and_nothing_else() -> None:
    for code, resource in AUTHORIZATION_CODES.items():
        text = not_authorized_text(KafkaException(KafkaError(code, "refused")))
        assert text is not None and f"a {resource} operation" in text
    assert not_authorized_text(KafkaException(KafkaError(KafkaError._TRANSPORT, "x"))) is None
