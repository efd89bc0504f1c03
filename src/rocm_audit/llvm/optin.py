"""Libraries nothing loads unless a person asks for them: test and instrumentation libraries.

triton 3.9.0 ships ``triton/instrumentation/libGPUInstrumentationTestLib.so``, an LLVM pass plugin
for its own instrumentation tests. Its LLVM clashes with ``libtriton.so`` are real, but the library
is never mapped by ``import triton`` or by compiling a kernel: no file needs it (DT_NEEDED), it is no
Python module, and libtriton.so opens pass plugins only from the paths in ``LLVM_PASS_PLUGIN_PATH``
(triton's ``_test_runner.py`` sets it to this file for the instrumentation tests; checked on the real
wheel, whose ``import triton`` maps libtriton.so and no test library). A clash confined to such a
library aborts a process only when someone loads it on purpose, so it is a warning, not an error,
and the finding says why (docs: "LLVM clashes").
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable

from rocm_audit.findings import Finding, Severity

# A file-name word or a directory that marks test or instrumentation code.
_MARK_WORDS = frozenset({"test", "tests", "testlib", "testing"})
_MARK_DIRS = frozenset({"test", "tests", "testing", "instrumentation"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_EXTENSION_MODULE = re.compile(r"\.(cpython-[^.]+|abi3)\.so$")


def is_marked_as_test(path: str) -> bool:
    """The file's name has the word Test (``libFooTestLib.so``, ``test_foo.so``), or a directory
    of its path is a test or instrumentation folder."""
    directory, name = os.path.split(path)
    words = {w.lower() for w in _WORD.findall(name.split(".so", 1)[0])}
    return bool(words & _MARK_WORDS) or any(part.lower() in _MARK_DIRS for part in directory.split("/")[-3:])


def opt_in_libraries(libraries: Iterable[tuple[str, str | None]], needed_names: set[str]) -> set[str]:
    """Of ``(path, soname)`` pairs, the libraries that no DT_NEEDED names, that are no Python
    extension module, and that are marked as test or instrumentation code."""
    return {
        path
        for path, soname in libraries
        if os.path.basename(path) not in needed_names
        and (soname is None or soname not in needed_names)
        and not _EXTENSION_MODULE.search(path)
        and is_marked_as_test(path)
    }


def soften_opt_in(findings: list[Finding], opt_in: set[str]) -> list[Finding]:
    """Errors whose files include an opt-in library become warnings that say so."""
    if not opt_in:
        return findings
    softened = []
    for one in findings:
        involved = [p for p in (one.path, *one.related_paths) if p in opt_in]
        if one.severity is Severity.ERROR and one.rule.startswith("LLVM") and involved:
            # The clash needs every library it names loaded together: each opt-in one too.
            names = " and ".join(os.path.basename(p) for p in involved)
            loaded = (
                "is loaded: a test or instrumentation library"
                if len(involved) == 1
                else "are loaded: test or instrumentation libraries"
            )
            one = dataclasses.replace(
                one,
                severity=Severity.WARNING,
                message=f"{one.message} (only if {names} {loaded} that nothing here loads)",
                data={**one.data, "opt_in_library": involved},
            )
        softened.append(one)
    return softened
