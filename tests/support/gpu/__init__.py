"""Shared test helpers for tests/gpu (and other suites that need GPU code objects)."""
