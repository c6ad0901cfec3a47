import random

import pytest

from processors import key_group, murmur2

# Kafka's own vectors: UtilsTest.testMurmur2 in
# clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("data", "expected"), sorted(KAFKA_VECTORS.items()))
def test_murmur2_matches_kafka_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_key_group_matches_reference_for_random_keys() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        key = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        parts = rng.randrange(1, 64)
        assert key_group(key, parts) == (murmur2(key) & 0x7FFFFFFF) % parts
