"""Shared test helpers for tests/llvm."""
