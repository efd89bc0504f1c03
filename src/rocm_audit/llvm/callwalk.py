"""The bounded x86-64 call walk linkage.py runs from a library's ``.init_array`` functions.

Function extents come from ``.eh_frame_hdr``'s sorted table (through the file's view, elf/view.py),
and inside a function the only instructions looked at are ``call rel32`` (E8), ``jmp rel32`` (E9),
``call *disp32(%rip)`` (FF 15), ``jmp *disp32(%rip)`` (FF 25) and, for the objects initialisers
construct, ``mov sym@GOTPCREL(%rip), %reg``. A byte pattern that is not really an instruction would
have to point exactly at a function start, a PLT stub or a watched GOT slot to count; every walk is
bounded in functions, bytes and depth (formats.md 6).
"""

from __future__ import annotations

import array
import bisect
import itertools
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from rocm_audit.elf.view import ElfView

MAX_WALK_FUNCTIONS = 20_000
MAX_WALK_BYTES = 64 << 20
MAX_WALK_DEPTH = 6
FALLBACK_FUNCTION_BYTES = 4096  # a function's extent when .eh_frame_hdr does not give it
_CALL_PATTERN = re.compile(rb"\xe8|\xe9|\xff\x15|\xff\x25", re.DOTALL)


class IndexedStarts(Protocol):
    """.dynsym index -> address of a function the library defines (linkage.py's FunctionStarts)."""

    def __contains__(self, index: object) -> bool: ...

    def __getitem__(self, index: int) -> int: ...


def _ascending(values: Sequence[int]) -> bool:
    """Sorted already: no list of 150 000 ints to sort."""
    return all(a <= b for a, b in itertools.pairwise(values))


def _holds(values: array.array[int], address: int) -> bool:
    """address is in the sorted array values."""
    index = bisect.bisect_left(values, address)
    return index < len(values) and values[index] == address


class CodeMap:
    """Where a library's functions start, for the call walks, built once per library.

    ``extents``: .eh_frame_hdr's sorted starts (a function runs to the next one). ``callable``: every
    function .dynsym defines, sorted; a call target is a function start when either holds it. Sorted
    arrays and bisect instead of sets: an MLIR library defines 150 000 functions and describes
    400 000, and sets of them cost 40 MB where the arrays cost 5. Read on first use: most libraries
    are decided before any walk. ``function_starts``: .dynsym index -> address of each function the
    library defines (a PLT stub of one of them runs that code)."""

    def __init__(self, view: ElfView, function_starts: IndexedStarts, defined_functions: Sequence[int] = ()) -> None:
        self._view = view
        self.function_starts = function_starts
        self._defined_functions = defined_functions
        self._extents: array.array[int] | None = None
        self._callable: array.array[int] | None = None

    @property
    def extents(self) -> array.array[int] | None:
        if self._callable is None:
            self._build()
        return self._extents

    def _build(self) -> None:
        # Two sorted arrays, not one merged: sorting the merge took a list of 400 000 ints (16 MB).
        self._extents = self._view.eh_frame_function_starts()
        defined = self._defined_functions
        self._callable = array.array("Q", defined if _ascending(defined) else sorted(defined))

    def own_stubs(self, stubs: Mapping[int, int]) -> dict[int, int]:
        """PLT stub -> the library's own definition, for stubs of functions it defines."""
        return {stub: self.function_starts[index] for stub, index in stubs.items() if index in self.function_starts}

    def is_function(self, address: int) -> bool:
        if self._callable is None:
            self._build()
        assert self._callable is not None
        return _holds(self._extents or array.array("Q"), address) or _holds(self._callable, address)

    def length_at(self, address: int) -> int:
        """Bytes to read for the function at address: to the next start, at most 1 MiB."""
        extents = self.extents
        if not extents:
            return FALLBACK_FUNCTION_BYTES
        index = bisect.bisect_right(extents, address)
        end = extents[index] if index < len(extents) else address + FALLBACK_FUNCTION_BYTES
        return min(max(end - address, 1), 1 << 20)


def plt_stubs(view: ElfView, jump_slots: Mapping[int, int]) -> dict[int, int]:
    """PLT stub address -> symbol index, for stubs that jump through a JUMP_SLOT GOT entry."""
    stubs: dict[int, int] = {}
    for name in (".plt", ".plt.sec", ".plt.got"):
        section = view.by_name(name)
        if section is None or not section.has_file_bytes:
            continue
        data = view.read(section, 64 << 20)
        for found in re.finditer(rb"\xff\x25", data):
            position = found.start()
            if position + 6 > len(data):
                break
            (displacement,) = struct.unpack_from("<i", data, position + 2)
            slot = section.addr + position + 6 + displacement
            symbol = jump_slots.get(slot)
            if symbol is not None:
                stubs[section.addr + position - position % 16] = symbol
    return stubs


def init_functions(view: ElfView, relative: Mapping[int, int]) -> list[int]:
    entries: list[int] = []
    for slot, value in view.init_array_pointers():
        target = relative.get(slot, value)
        if target not in (0, 0xFFFFFFFFFFFFFFFF):
            entries.append(target)
    return entries


class _CallWalk:
    """A bounded depth-first walk over the functions some starts call, each function's code read
    once however many paths reach it; ``spent`` once the budget ran out (the walk then stops)."""

    def __init__(self, view: ElfView, code_map: CodeMap, starts: Sequence[int], max_depth: int) -> None:
        self.view = view
        self.code_map = code_map
        self.max_depth = max_depth
        self.stack = [(start, 0) for start in starts]
        self.seen: set[int] = set()
        self.spent = False

    def functions(self) -> Iterator[tuple[int, int, bytes]]:
        """(address, depth, code) of each function reached, until the stack or the budget ends."""
        spent_bytes = 0
        while self.stack:
            address, depth = self.stack.pop()
            if address in self.seen:
                continue
            self.seen.add(address)
            if len(self.seen) > MAX_WALK_FUNCTIONS or spent_bytes > MAX_WALK_BYTES:
                self.spent = True
                return
            code = self.view.read_vaddr(address, self.code_map.length_at(address))
            spent_bytes += len(code)
            yield address, depth, code

    def follow(self, target: int, depth: int) -> None:
        """Walk into ``target`` (at ``depth``) if it is a function start not walked yet and within reach."""
        if depth < self.max_depth and target not in self.seen and self.code_map.is_function(target):
            self.stack.append((target, depth))


def reaches(
    view: ElfView,
    starts: list[int],
    targets: frozenset[int],
    got_slots: frozenset[int],
    code_map: CodeMap,
    stubs: Mapping[int, int],
    own_stubs: Mapping[int, int] | None = None,
) -> tuple[bool | None, str]:
    """Whether a call walk from starts hits targets (code addresses) or got_slots (indirect).

    own_stubs maps a PLT stub of a function the library defines itself to that definition: a
    default-visibility template (``cl::opt<T>``'s constructor, instantiated in every library that
    declares an option) is called through the PLT, and in the library that is loaded first the
    lookup finds its own copy; a later copy is the same code."""
    own_stubs = own_stubs or {}
    walk = _CallWalk(view, code_map, starts, MAX_WALK_DEPTH)
    for address, depth, code in walk.functions():
        for found in _CALL_PATTERN.finditer(code):
            position = found.start()
            opcode = code[position]
            if opcode in (0xE8, 0xE9):
                if position + 5 > len(code):
                    continue
                (displacement,) = struct.unpack_from("<i", code, position + 1)
                target = address + position + 5 + displacement
                if target in targets:
                    how = "PLT" if target in stubs else "direct call"
                    return True, f"an .init_array function reaches addArgument ({how}, depth {depth + 1})"
                walk.follow(own_stubs.get(target, target), depth + 1)
            else:
                if position + 6 > len(code):
                    continue
                (displacement,) = struct.unpack_from("<i", code, position + 2)
                if address + position + 6 + displacement in got_slots:
                    return True, f"an .init_array function reaches addArgument (GOT, depth {depth + 1})"
    if walk.spent:
        return None, f"undecided: walk budget spent after {len(walk.seen)} functions"
    return False, f"no .init_array function reaches addArgument ({len(walk.seen)} functions walked)"


# mov sym@GOTPCREL(%rip), %reg: REX.W (48, or 4C for r8-r15) 8B, ModRM mod=00 rm=101.
_GOT_LOAD = re.compile(rb"[\x48\x4c]\x8b[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]", re.DOTALL)
MAX_INIT_DEPTH = 4  # the TU's _GLOBAL__sub_I_ function, GCC's __static_initialization_and_destruction_0, helpers


def initialised_slots(
    view: ElfView,
    starts: Sequence[int],
    slots: frozenset[int],
    code_map: CodeMap,
    own_stubs: Mapping[int, int],
) -> frozenset[int] | None:
    """The GOT slots (of slots) that .init_array code loads: the objects a library's static
    initialisers construct, and pass to __cxa_atexit with their destructor, are addressed that
    way in position-independent code (a default-visibility object can be interposed, so even
    the library's own code reaches it through the GOT). Constant-initialised objects (TypeIDs,
    pass IDs, tables) are never touched at load. None when the walk ran out of budget."""
    found: set[int] = set()
    walk = _CallWalk(view, code_map, starts, MAX_INIT_DEPTH)
    for address, depth, code in walk.functions():
        for load in _GOT_LOAD.finditer(code):
            position = load.start()
            if position + 7 <= len(code):
                (displacement,) = struct.unpack_from("<i", code, position + 3)
                slot = address + position + 7 + displacement
                if slot in slots:
                    found.add(slot)
        if depth + 1 >= MAX_INIT_DEPTH:
            continue  # its callees are out of reach: no need to look for them
        for call in re.finditer(rb"\xe8", code):
            position = call.start()
            if position + 5 > len(code):
                continue
            (displacement,) = struct.unpack_from("<i", code, position + 1)
            target = address + position + 5 + displacement
            walk.follow(own_stubs.get(target, target), depth + 1)
    return None if walk.spent else frozenset(found)
