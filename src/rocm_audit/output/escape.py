"""The one escaping function for text output: every name and message a text report prints passes here.

A file name may hold any byte but NUL and '/'. Printed raw, a newline in it starts a line of the
attacker's choosing in a CI log (`evil\\nok      forged-line ...`), a carriage return overwrites the
line on a terminal, an ANSI escape recolours or hides text, and undecodable bytes (held by
os.fsdecode as surrogates) break the UTF-8 encoder. All of them become backslash escapes, so one
record stays one line and starts with text rocm-audit chose.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls (U+0080-U+009F: some terminals act on them), the surrogates
# os.fsdecode uses for undecodable bytes, and the Unicode line/paragraph separators that some
# log viewers break lines on.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\udc80-\udcff]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if "\udc80" <= char <= "\udcff":
        return f"\\x{ord(char) - 0xDC00:02x}"
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def display(text: object) -> str:
    """``text`` safe for one line of a terminal or a log: unsafe characters become backslash escapes."""
    shown = str(text)
    if shown.isprintable():  # the common case, in C: no control character, no surrogate, no separator
        return shown
    return _UNSAFE.sub(_escape, shown)


# Markdown (CommonMark 0.31, GitHub-flavoured): escape only what would act, so `libk.so` and
# `verify-arch: 14 carrier(s)` stay as they are in a raw CI log.
# Anywhere: backslash, code (`), emphasis and thematic breaks (*), links and images ([ ]), HTML and
# autolinks (<), table cells (|), strikethrough (~).
_ALWAYS = frozenset("\\`*[]<|~")
# At the start of the text (it may start a line): headings, lists, block quotes, setext underlines.
_LINE_START = re.compile(r"#{1,6}(?=[ \t]|\Z)|[-+](?=[ \t]|\Z)|>|=+[ \t]*\Z|-+[ \t]*\Z|\d{1,9}(?=[.)](?:[ \t]|\Z))")
_HEADING_CLOSE = re.compile(r"(?<=[ \t])#+[ \t]*\Z")
# Entity and numeric character references (spec 2.5): `&amp;` must stay those five characters.
_ENTITY = re.compile(r"&(?=#[0-9]{1,7};|#[xX][0-9A-Fa-f]{1,6};|[A-Za-z][A-Za-z0-9]*;)")
# GFM extended autolinks (spec 6.9): `www.` after a non-alphanumeric, and `scheme://`.
_WWW_DOT = re.compile(r"(?<![A-Za-z0-9])(?i:www)\.")
# GitHub acts on the rendered text, after the parser, where a backslash is already gone: an email
# autolink (cmark-gfm's postprocess over merged text) or a mention (`@name` notifies that person
# when the report is posted as a comment), and `$...$` math. An inline element around the one
# character splits the text, the way GitHub's own docs show for `$` (<span>$</span>).
_SPAN = re.compile(r"\$|@(?=[A-Za-z0-9_-])")
_ASCII_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _kinds(char: str | None) -> frozenset[str]:
    """What a neighbour of a `_` may count as for CommonMark's flanking rules (spec 6.2):
    whitespace, punctuation or other. Unknown (the text's edge) and non-ASCII symbols may be either
    (0.31 counts Unicode symbols as punctuation, 0.30 did not); whitespace may count as punctuation
    too, since at an edge it is written as a character reference."""
    if char is None:
        return frozenset({"space", "punct", "other"})
    if char.isspace():
        return frozenset({"space", "punct"})
    if char in _ASCII_PUNCTUATION:
        return frozenset({"punct"})
    if char.isalnum():
        return frozenset({"other"})
    return frozenset({"punct", "other"})


def _underscore_may_close(before: str | None, after: str | None) -> bool:
    """Whether a run of `_` between these neighbours may close emphasis (spec 6.2, rule 4).

    Escaping every run that may close is enough: emphasis needs a closer, and the renderers' own
    text never uses `_` (bold is `**`). Openers stay, so `_rocm_sdk_core` and `lib_x.so` read as is."""
    for b in _kinds(before):
        for a in _kinds(after):
            right = b != "space" and (b != "punct" or a in ("space", "punct"))
            left = a != "space" and (a != "punct" or b in ("space", "punct"))
            if right and (not left or a == "punct"):
                return True
    return False


def markdown(text: object) -> str:
    """``text`` as literal Markdown inline text (a table cell too), escaped only where it would act.

    ``display`` first, so it is one line without control characters. Then: backslash-escapes for
    the characters that act anywhere (backslash, `, *, [, ], <, |, ~), for `_` runs that could
    close emphasis (intraword and leading ones cannot: `_rocm_sdk_core` stays), for `&` that
    starts a character reference, for the `.` of `www.` and the `:` of `://` (GFM autolinks),
    and for a heading, list, quote or underline marker at the start; `$` and a mention- or
    email-shaped `@` in ``<span>``; leading and trailing whitespace as character references
    (a table cell trims it, four spaces start a code block)."""
    shown = display(text)
    if not shown:
        return shown
    escape_at: set[int] = set()
    for match in re.finditer(r"_+", shown):
        before = shown[match.start() - 1] if match.start() else None
        after = shown[match.end()] if match.end() < len(shown) else None
        if _underscore_may_close(before, after):
            escape_at.update(range(match.start(), match.end()))
    escape_at.update(m.start() for m in _ENTITY.finditer(shown))
    escape_at.update(m.end() - 1 for m in _WWW_DOT.finditer(shown))  # the dot
    escape_at.update(m.start() for m in re.finditer(r":(?=//)", shown))
    start = _LINE_START.match(shown)
    if start:
        escape_at.add(start.end() if shown[0].isdigit() else 0)
    closing = _HEADING_CLOSE.search(shown)  # an ATX heading drops a closing `#` run
    if closing:
        escape_at.add(closing.start())
    span_at = {m.start() for m in _SPAN.finditer(shown)}
    lead = len(shown) - len(shown.lstrip())
    trail = len(shown.rstrip())
    pieces = []
    for index, char in enumerate(shown):
        if index < lead or index >= trail:
            pieces.append(f"&#{ord(char)};")
        elif index in span_at:
            pieces.append(f"<span>{char}</span>")
        elif char in _ALWAYS or index in escape_at:
            pieces.append("\\" + char)
        else:
            pieces.append(char)
    return "".join(pieces)


COMMAND = re.compile(r"`[^`\n]+`")  # a command a message gives to copy, in backticks (text and Markdown)


def code_span(text: object) -> str:
    """``text`` as a Markdown code span: literal whatever it holds (nothing inside a code span
    acts but a backtick run as long as its fence, so the fence is longer than any inside)."""
    shown = display(text)
    longest = max(map(len, re.findall(r"`+", shown)), default=0)
    fence = "`" * (longest + 1)
    # A parser strips one space from each end when both ends have one (not from text of spaces
    # only): pad when the text starts or ends with a backtick (it would join the fence) or a space.
    edges = shown[:1] + shown[-1:]
    pad = " " if shown.strip(" ") and ("`" in edges or " " in edges) else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def markdown_message(text: object) -> str:
    """A message as Markdown inline text: its backticked commands as code spans (they render as
    code and copy whole), the rest through ``markdown``. Spaces beside a command stay spaces; at
    the message's ends they become references, as ``markdown`` writes them (a block trims them)."""
    shown = display(text)
    pieces = []
    last = 0
    for match in COMMAND.finditer(shown):
        between = _prose(shown[last : match.start()], first=not last)
        # Two spans side by side would read as one backtick run: an empty span keeps them apart.
        between = between or ("<span></span>" if last else "")
        pieces += [between, code_span(match.group()[1:-1])]
        last = match.end()
    pieces.append(_prose(shown[last:], first=not last, final=True))
    return "".join(pieces)


def _prose(piece: str, *, first: bool = False, final: bool = False) -> str:
    core = piece.strip(" ")
    lead = piece[: len(piece) - len(piece.lstrip(" "))] if core else piece
    trail = piece[len(piece.rstrip(" ")) :] if core else ""
    if first:
        lead = "&#32;" * len(lead)
    if final:
        trail = "&#32;" * len(trail)
        lead = lead if core or first else "&#32;" * len(lead)
    # An underscore run at a command's edge has a backtick beside it, not what ``markdown`` saw:
    # escaped, so it can neither open nor close emphasis across the code span.
    escaped = re.sub(r"(?<!\\)_+\Z", _escape_run, re.sub(r"\A_+", _escape_run, markdown(core))) if core else ""
    return lead + escaped + trail


def _escape_run(match: re.Match[str]) -> str:
    return "\\_" * len(match.group())
