"""A module without any App."""

value = 1
