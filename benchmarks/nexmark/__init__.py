"""Nexmark on Kafka: lockgate, Flink SQL and Quix Streams (python -m benchmarks.nexmark)."""
