"""Two real Markdown parsers as oracles for escape.markdown: markdown-it-py (CommonMark with GFM
tables and strikethrough) and cmark-gfm (GitHub's own C parser, through cmarkgfm). Each returns,
per block (table cell, list item, paragraph, heading), its text split at the guarding <span>s;
any other inline element (emphasis, code, link, autolink, strikethrough, HTML) fails."""

from __future__ import annotations

from html.parser import HTMLParser

import cmarkgfm
from cmarkgfm.cmark import Options
from markdown_it import MarkdownIt

_MD = MarkdownIt("commonmark").enable(["table", "strikethrough"])
_GUARD = {"<span>", "</span>"}


def document(shown: list[str]) -> str:
    """Each escaped text in a table cell, a list item, a paragraph of its own and a heading."""
    rows = "\n".join(f"| {s} | {s} |" for s in shown)
    blocks = [f"| name | again |\n| --- | --- |\n{rows}"]
    blocks.append("\n".join(f"- {s}" for s in shown))  # one tight list
    blocks += [s for s in shown]
    blocks += [f"### {s}" for s in shown]
    return "\n\n".join(blocks) + "\n"


def markdown_it_texts(source: str, allow: frozenset[str] = frozenset()) -> list[tuple[str, list[str]]]:
    """(block kind, text pieces split at the guarding spans) of every inline run, in order.
    ``allow``: elements the renderer itself writes (strong), which split pieces too."""
    texts = []
    tokens = _MD.parse(source)
    for index, token in enumerate(tokens):
        if token.type != "inline":
            continue
        kind = tokens[index - 1].type
        pieces = [""]
        for child in token.children or []:
            if child.type == "text":
                pieces[-1] += child.content
            elif child.type == "html_inline" and child.content in _GUARD:
                pieces.append("")
            elif child.type.rsplit("_", 1)[0] in allow or (child.type == "html_inline" and child.content in allow):
                pieces.append("")
            else:
                raise AssertionError(f"{child.type} in {token.content!r}")
        texts.append((kind, pieces))
    return texts


class _Texts(HTMLParser):
    """Text of each block element of cmark-gfm's HTML; any inline element but span is an error."""

    BLOCKS = {"th", "td", "li", "p", "h3"}

    def __init__(self, allow: frozenset[str]) -> None:
        super().__init__(convert_charrefs=True)
        self.allow = allow
        self.texts: list[tuple[str, list[str]]] = []
        self.inside: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.BLOCKS:
            self.inside = tag
            self.texts.append((tag, [""]))
            return
        if tag in {"table", "thead", "tbody", "tr", "ul", "ol"}:
            return
        if tag in self.allow or f"<{tag}>" in self.allow:
            self.texts[-1][1].append("")
            return
        assert tag == "span" and not attrs and self.inside, (tag, attrs)
        self.texts[-1][1].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" or tag in self.allow:
            self.texts[-1][1].append("")
        elif tag in self.BLOCKS and tag == self.inside:
            self.inside = None

    def handle_data(self, data: str) -> None:
        if self.inside:
            self.texts[-1][1][-1] += data
        else:
            assert not data.strip(), data

    def handle_comment(self, data: str) -> None:
        raise AssertionError(f"comment {data!r}")


def cmark_gfm_texts(source: str, allow: frozenset[str] = frozenset()) -> list[tuple[str, list[str]]]:
    """The same from GitHub's parser, raw HTML kept (GitHub sanitizes after it)."""
    html = cmarkgfm.github_flavored_markdown_to_html(source, options=Options.CMARK_OPT_UNSAFE)
    parser = _Texts(allow)
    parser.feed(html)
    parser.close()
    return parser.texts
