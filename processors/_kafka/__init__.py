"""Kafka clients and their errors.

``clients`` (client configurations, the admin wrapper), ``errors`` (how a Kafka error
is classified: retry, abort, fatal, the record's own), ``faults`` (test-only fault
injection: crash points, a late commit answer).
"""
