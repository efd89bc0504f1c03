"""The error hierarchy. Library code raises these; only the CLI turns them into exit codes."""

from __future__ import annotations


class RocmAuditError(Exception):
    """Base of every error rocm-audit reports to a user (never a traceback). ``hint``: one more
    line saying where to look or what to try, printed after the message."""

    exit_code = 3

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(RocmAuditError):
    """Bad command line, bad rules file, missing input: exit code 2."""

    exit_code = 2


class ConfigError(UsageError):
    """A rules or policy file is invalid; names the file, line and key."""

    def __init__(self, path: str, reason: str, *, line: int | None = None, key: str | None = None):
        where = path if line is None else f"{path}:{line}"
        if key:
            where += f" [{key}]"
        super().__init__(f"{where}: {reason}")
        self.path, self.line, self.key, self.reason = path, line, key, reason


class FormatError(RocmAuditError):
    """A container or ELF structure is malformed at a given byte offset."""

    def __init__(self, fmt: str, offset: int, reason: str) -> None:
        super().__init__(f"{fmt}: {reason} (at offset {offset:#x})")
        self.fmt, self.offset, self.reason = fmt, offset, reason


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a command that changes files, between two of its changes (never inside one).

    ``made`` of ``planned`` changes were made, each complete; ``manifest`` records them (None when
    nothing was journalled). A KeyboardInterrupt still, so nothing on the way out swallows it; the
    CLI says what was done and how to finish or undo it, and exits 130."""

    def __init__(self, command: str, made: int, planned: int, manifest: str | None) -> None:
        super().__init__(f"{command}: {made} of {planned} changes made")
        self.command, self.made, self.planned, self.manifest = command, made, planned, manifest
