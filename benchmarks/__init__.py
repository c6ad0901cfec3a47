"""Benchmarks: lockgate vs a raw confluent-kafka loop, Quix Streams and Faust (``make bench``)."""
