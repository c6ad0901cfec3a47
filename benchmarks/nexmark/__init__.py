"""Nexmark on Kafka: lockgate and Flink SQL (python -m benchmarks.nexmark)."""
