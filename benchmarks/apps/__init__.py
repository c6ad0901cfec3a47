"""The benchmark workloads, one module per system (each runs in its system's venv)."""
