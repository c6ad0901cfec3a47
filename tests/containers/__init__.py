"""A package so the package-scoped ``lockgate_kafka`` of conftest.py ends with these tests."""
