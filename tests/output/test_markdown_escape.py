"""escape.markdown against real parsers: markdown-it-py (CommonMark with GFM tables and
strikethrough) and cmark-gfm (GitHub's own C parser, through cmarkgfm: tables, autolinks,
strikethrough). Each hostile name, put in a table cell, a list item, a paragraph and a heading,
must parse back to exactly its displayed text, with no element but the <span> that guards `$` and
`@`; ordinary names must come out with no escape at all, so raw CI logs stay readable.
"""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser

import cmarkgfm
import pytest
from cmarkgfm.cmark import Options
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from rocm_audit.output.escape import display, markdown, markdown_message
from support.markdown_oracles import cmark_gfm_texts, document, markdown_it_texts

HOSTILE = [
    "a*b*c_d_.so",
    "[x](y)",
    "![i](j)",
    "[^1]",
    "[ ] task",
    "<script>",
    "<http://x>",
    "x<!-- c -->y",
    "a|b",
    "a\\|b",
    "`tick`",
    "``",
    "&amp;",
    "&#64;",
    "&#x40;x",
    "1. list",
    "2) item",
    "# head",
    "x ##",
    "- item",
    "+ item",
    "* item",
    "> quote",
    "---",
    "===",
    "***",
    "___",
    "www.evil.com",
    "x www.evil.com",
    "x_www.evil.com",
    "(www.evil.com)",
    "http://x",
    "https://evil.example/a",
    "ftp://evil.example",
    "mailto:a@b.co",
    "a@b.co",
    "@someone",
    "x @org/team",
    "$m$",
    "$$x$$",
    "~~s~~",
    "~s~",
    "\\",
    "back\\slash",
    "trail\\",
    "\\*",
    "  lead",
    "trail  ",
    "    code",
    " ",
    "_a_",
    "__b__",
    "x_y_",
    "a_ b_",
    "*_",
    "é_x_é",
    "©_x_©",
    "**",
    "line\nbreak",
    "tab\there",
    "\x1b[31mred",
    os.fsdecode(b"k\xff\xfe.so"),
    "x](https:\\\\evil.example)<img src=y>|@someone $m$ *b* www.evil.example",
]

ORDINARY = [
    "libk.so",
    "verify-arch: 14 carrier(s)",
    "/x/site-packages/_rocm_sdk_core/lib/libamdhip64.so.7",
    "_rocm_sdk_libraries_gfx94X_dcgpu/lib/librocblas.so.5",
    "gfx942:sramecc+:xnack-",
    "pkg/kernels (copy).hsaco",
    "libfoo.so.1.2.3",
    "it's 50% done!",
    "{x}=a-b_c.d",
    "3 of 31 carriers",
    "cross-layer",
]


def _check_github_text(pieces: list[str], original: str) -> None:
    """What GitHub does to rendered text, per text node: mentions and email autolinks need `@` and a
    name in one node; `$...$` math needs two `$` with text between them in one node."""
    for piece in pieces:
        assert not re.search(r"@[A-Za-z0-9_-]", piece), (piece, original)
        assert "$" not in piece or piece == "$", (piece, original)


@pytest.mark.parametrize("parse", [markdown_it_texts, cmark_gfm_texts], ids=["markdown-it-py", "cmark-gfm"])
def test_hostile_names_parse_back_to_their_text(parse):
    shown = [markdown(name) for name in HOSTILE]
    texts = parse(document(shown))
    header = 2  # the table's header cells
    expected = [display(name) for name in HOSTILE]
    table = texts[header : header + 2 * len(HOSTILE)]
    rest = texts[header + 2 * len(HOSTILE) :]
    assert len(rest) == 3 * len(HOSTILE), [t for t in texts]
    cells = [table[i] for i in range(0, len(table), 2)] + [table[i] for i in range(1, len(table), 2)]
    for (kind, pieces), original in zip(cells + rest, expected * 5, strict=True):
        assert "".join(pieces) == original, (kind, pieces, original)
        _check_github_text(pieces, original)


@pytest.mark.parametrize("name", ORDINARY)
def test_ordinary_names_are_not_escaped(name):
    assert markdown(name) == name
    (_, pieces), *_ = markdown_it_texts(f"| {name} |\n| --- |\n")
    assert pieces == [name]


_names = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"]) | st.sampled_from(list("\\`*_[]<>|~&#$@:./-+=!() \t\n")),
    min_size=1,
    max_size=24,
)  # an empty name has no paragraph of its own to compare


@settings(max_examples=400, deadline=None)
@given(names=st.lists(_names, min_size=1, max_size=3))
def test_any_text_parses_back_to_itself(names):
    """Whatever the name, both parsers read back exactly the displayed text, in every context."""
    shown = [markdown(n) for n in names]
    for parse in (markdown_it_texts, cmark_gfm_texts):
        texts = parse(document(shown))[2:]
        table, rest = texts[: 2 * len(names)], texts[2 * len(names) :]
        cells = [table[i] for i in range(0, len(table), 2)] + [table[i] for i in range(1, len(table), 2)]
        for (kind, pieces), name in zip(cells + rest, [display(n) for n in names] * 5, strict=True):
            assert "".join(pieces) == name, (parse.__name__, kind, pieces, name)
            _check_github_text(pieces, name)


class _CodeAndText(HTMLParser):
    """cmark-gfm's HTML of one list item as (kind, text) runs: "code" for <code>, else "text"."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.runs: list[tuple[str, str]] = []
        self.kind = "text"

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        assert tag in ("ul", "li", "code", "span"), tag
        self.kind = "code" if tag == "code" else self.kind

    def handle_endtag(self, tag: str) -> None:
        self.kind = "text" if tag == "code" else self.kind

    def handle_data(self, data: str) -> None:
        _add(self.runs, self.kind, data)


def _add(runs: list[tuple[str, str]], kind: str, text: str) -> None:
    if runs and runs[-1][0] == kind == "text":
        runs[-1] = (kind, runs[-1][1] + text)
    elif text:
        runs.append((kind, text))


def _markdown_it_runs(source: str) -> list[tuple[str, str]]:
    runs: list[tuple[str, str]] = []
    for token in MarkdownIt("commonmark").parse(source):
        for child in token.children or []:
            if child.type == "code_inline":
                runs.append(("code", child.content))
            elif child.type == "text":
                _add(runs, "text", child.content)
            else:
                assert child.type == "html_inline" and child.content in ("<span>", "</span>"), child
    return runs


_command = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"]) | st.sampled_from(list("\\*_[]<>|~&$@ ")),
    min_size=1,
    max_size=20,
)


@settings(max_examples=300, deadline=None)
@given(before=_names, command=_command, after=_names)
def test_a_message_renders_its_commands_as_code_and_the_rest_as_text(before, command, after):
    """A backticked command becomes a code span holding exactly its text (a file name in it cannot
    end the span or start markup); the prose around it reads back exactly, in both parsers."""
    message = f"{before} `{command}` {after}"
    shown = display(message)
    expected: list[tuple[str, str]] = []
    last = 0
    for match in re.finditer(r"`([^`\n]+)`", shown):  # what the message holds as commands
        _add(expected, "text", shown[last : match.start()])
        expected.append(("code", match.group(1)))
        last = match.end()
    _add(expected, "text", shown[last:])
    source = f"- {markdown_message(message)}\n"
    assert _markdown_it_runs(source) == expected
    html = cmarkgfm.github_flavored_markdown_to_html(source, options=Options.CMARK_OPT_UNSAFE)
    parser = _CodeAndText()
    parser.feed(html)
    parser.close()
    assert [(k, t.strip("\n") if k == "text" else t) for k, t in parser.runs if (k, t.strip()) != ("text", "")] == [
        (k, t) for k, t in expected if (k, t.strip()) != ("text", "")
    ]
