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


# The ASCII punctuation CommonMark lets a backslash make literal (spec 2.4) that Markdown or GitHub
# act on: emphasis, code, links and images, HTML and entities (<, &), headings and list markers,
# table cells (|), strikethrough (~), autolinks (: and . of http:// and www.), mentions (@), math ($).
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+\-.!|~&@:$])")


def markdown(text: object) -> str:
    """``text`` as literal Markdown inline text (a table cell too): ``display`` first, so it is one
    line without control characters, then every character Markdown could act on is backslash-escaped."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", display(text))
