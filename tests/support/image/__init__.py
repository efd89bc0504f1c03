"""Shared test helpers for tests/image."""
