"""How every summary counts LLVM clashes (text, Markdown, the stderr line): one definition, on the
report's clash records, light enough for the renderers to import."""

from __future__ import annotations

from rocm_audit.report_types import LlvmClash


def clash_counts(records: list[LlvmClash]) -> tuple[int, int]:
    """(clashes that can abort or crash a process, harmless ones). A clash whose verdict is clean,
    or whose finding is only information, is harmless."""
    harmful = sum(1 for c in records if c.get("verdict", "abort") != "clean" and c["severity"] != "info")
    return harmful, len(records) - harmful
