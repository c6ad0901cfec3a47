"""Runnable lockgate example apps (they double as end-to-end test fixtures)."""
