import pytest

from state import BYTES, JSON, PICKLE, STR
from state.codecs import codec_by_name


@pytest.mark.parametrize(
    ("codec", "value"),
    [(JSON, {"a": [1, 2.5, None, "x"]}), (STR, "héllo"), (BYTES, b"\x00\xff"), (PICKLE, {1, 2})],
)
def test_round_trip(codec, value) -> None:  # type: ignore[no-untyped-def]
    assert codec.decode(codec.encode(value)) == value
    assert codec_by_name(codec.name) is codec


def test_bad_bytes_raise_value_error() -> None:
    with pytest.raises(ValueError):
        JSON.decode(b"{not json")
    with pytest.raises(ValueError):
        STR.decode(b"\xff\xfe")
