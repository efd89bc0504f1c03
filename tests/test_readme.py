"""The README and the documentation site: short README, real sample output, no dead references.

- README.md has at most 250 lines; everything else lives in docs/ (mkdocs.yml).
- The README's quick-start output is what rocm-audit prints today (scripts/readme_sample.py runs it).
- No page links to a file outside the repository, cites notes that are not in it, or names an
  internal issue number (an upstream one names its project: "TheRock issue 7818").
- The site builds with `mkdocs build --strict` (about a second), reference pages included, and
  its tables render as tables.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 250
# Pages docs/_hooks/reference.py generates at build time (never committed).
GENERATED = {DOCS / "reference" / name for name in ("cli.md", "rules.md", "report.md")}


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_readme_is_short_and_has_the_sections_people_look_for():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move details into docs/"
    headings = [line for line in lines if line.startswith("#")]
    assert any(re.match(r"^#+ .*(test|develop)", h, re.IGNORECASE) for h in headings), headings
    order = [next(i for i, h in enumerate(headings) if h.startswith(f"## {name}")) for name in (
        "Set-up", "Quick start", "In a Dockerfile", "Use in CI", "Test", "Documentation")]  # fmt: skip
    assert order == sorted(order), headings


def test_setup_command_one_only_reads():
    """Command 1 audits and changes nothing: no applying dedup or prune, no --revert."""
    setup = re.search(r"^## Set-up.*?```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.S | re.M)
    assert setup, "README has no set-up block"
    commands = [line for line in setup.group(1).splitlines() if line.strip() and not line.startswith("#")]
    assert commands[-1] == "./scripts/test" and len(commands) == 2, commands
    audit = commands[0].rsplit("&&", 1)[-1].split()
    assert audit[0].endswith("rocm-audit") and audit[1] == "check", audit
    assert not {"dedup", "prune", "--revert"} & set(audit), audit


def test_getting_started_shows_the_readme_set_up_commands():
    def setup_block(text: str) -> str:
        found = re.search(r"```sh\n(# 1\. .*?)```", text, re.S)
        assert found, "no set-up block"
        return found.group(1)

    readme = setup_block(README.read_text(encoding="utf-8"))
    assert setup_block((DOCS / "getting-started.md").read_text(encoding="utf-8")) == readme


def _fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def test_docs_show_the_readme_dockerfile_and_github_actions_snippets():
    """The README keeps the Dockerfile step and the GitHub Actions job (tests/image runs them as
    written); docs/dockerfile-ci.md shows the same text, beside GitLab CI."""
    readme = README.read_text(encoding="utf-8")
    page = (DOCS / "dockerfile-ci.md").read_text(encoding="utf-8")
    assert _fenced(readme, "dockerfile") == _fenced(page, "dockerfile")[:1] and _fenced(readme, "dockerfile")
    assert _fenced(readme, "yaml") == _fenced(page, "yaml")[:1] and len(_fenced(page, "yaml")) == 2


def test_readme_sample_output_is_current():
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "readme_sample.py")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, (
        "README.md's sample output differs from a fresh run: run `python scripts/readme_sample.py --write`\n"
        + done.stdout[-4000:]
        + done.stderr[-2000:]
    )


# ---------------------------------------------------------------------------------------------
# References a reader cannot follow

_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<a\s[^>]*href=\"([^\"]+)\"")
_NOTES = re.compile(r"\b(peers|formats)\.md\b|(?<![\w./-])shared/(?!kpack\b)|/work/")
# "issue 17", "issues 15-19", "issue-17", "PR 8137", "#16": internal unless a project is named
# right before it ("TheRock issue 7818", "rocm-systems PR 10685", "TheRock's PR 8137").
_NUMBERED = re.compile(r"\b(?:issues?|PRs?|pull requests?)[\s-]+#?\d+|(?<![\w&/(\]#`-])#\d+\b", re.IGNORECASE)
# A project name: CamelCase (TheRock, PyTorch), capitals (LLVM, CLR), owner/name, a hyphenated
# name (rocm-systems), or one of a few plain names; "See issue 17" names no project.
_PROJECT_BEFORE = re.compile(
    r"(?:\b[A-Z][a-z]+[A-Z]\w*|\b[A-Z]{2,}\w*|\b[\w.-]+/[\w.-]+|\b[a-z]+-[\w-]+"
    r"|\b(?:Triton|triton|Docker|docker|pip|glibc|Mesa|jax|zstd|Python|kaniko|mkdocs))(?:'s)?\s+$"
)


def _outside_repo(page: Path, target: str) -> bool:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
        return False  # a URL or an anchor on the same page
    path = target.split("#", 1)[0]
    resolved = (page.parent / path).resolve()
    if resolved in GENERATED:
        return False  # made by the site's hook when it is built
    return not resolved.is_relative_to(REPO) or not resolved.exists()


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_link_leaves_the_repository(page: Path):
    text = page.read_text(encoding="utf-8")
    bad = [t for m in _LINK.finditer(text) for t in m.groups() if t and _outside_repo(page, t)]
    assert not bad, f"{page.relative_to(REPO)} links to files outside the repository or missing: {bad}"


def _unfollowable(text: str) -> tuple[list[str], list[str]]:
    """(private notes cited, issue numbers of no project) in a page's text."""
    notes = [m.group(0) for m in _NOTES.finditer(text)]
    internal = []
    for match in _NUMBERED.finditer(text):
        before = text[max(0, match.start() - 40) : match.start()]
        if not _PROJECT_BEFORE.search(before):
            line = text.count("\n", 0, match.start()) + 1
            internal.append(f"line {line}: {match.group(0)!r}")
    return notes, internal


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_private_notes_or_internal_issue_numbers(page: Path):
    notes, internal = _unfollowable(page.read_text(encoding="utf-8"))
    assert not notes, f"{page.relative_to(REPO)} cites files that are not in the repository: {notes}"
    assert not internal, f"{page.relative_to(REPO)} names issue numbers of no project: {internal}"


def test_generated_references_cite_nothing_a_reader_cannot_follow():
    """The reference pages come from the program's own texts (help, rules/*.toml, the schema's
    descriptions): the same rules hold for them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "_hooks" / "reference.py")
    assert spec and spec.loader
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    import rocm_audit

    schema = Path(rocm_audit.__file__).parent / "schemas" / "report-v1.json"
    generated = {
        "reference/cli.md": hook.cli_reference(),
        "reference/rules.md": hook.rule_reference(),
        "reference/report.md": hook.report_reference(schema),
    }
    for name, text in generated.items():
        notes, internal = _unfollowable(text)
        assert not notes and not internal, (name, notes, internal)
        assert "README" not in text, f"{name}: the README's sections moved to docs/; name the page"


def test_the_scans_catch_what_they_are_for():
    """The patterns above on the shapes they must catch and the ones they must let through."""
    for internal in (
        "(issue 16)",
        "after issues 15-19",
        "the issue-17 target",
        "see #12",
        "PR 8137 says",
        "See issue 17",
    ):
        match = _NUMBERED.search(internal)
        assert match and not _PROJECT_BEFORE.search(internal[: match.start()]), internal
    for upstream in ("TheRock issue 7818", "rocm-systems PR 10685", "TheRock's PR 8137", "ROCm/TheRock#42"):
        match = _NUMBERED.search(upstream)
        assert match is None or _PROJECT_BEFORE.search(upstream[: match.start()]), upstream
    assert _NOTES.search("see formats.md 2.9") and _NOTES.search("(peers.md 1)")
    assert _NOTES.search("in shared/docs/style.md") and not _NOTES.search("rocm-systems `shared/kpack`")
    assert _outside_repo(README, "../peers.md") and _outside_repo(README, "/etc/passwd")
    assert not _outside_repo(README, "docs/dedup.md#keeper-rule") and not _outside_repo(README, "https://x.org")


# ---------------------------------------------------------------------------------------------
# The site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        pytest.fail("mkdocs is not installed: pip install -e '.[test]' (the docs extra)")
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(target)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return target


def test_site_builds_strict_with_generated_references(site: Path):
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    from rocm_audit.cli.app import _COMMANDS

    for name in _COMMANDS:  # every command has its section
        assert f'id="{name}"' in cli, name
    assert "--fail-on" in cli and "--python" in cli
    rules = (site / "reference" / "rules" / "index.html").read_text(encoding="utf-8")
    from rocm_audit.rulebook.catalogue import shipped_catalogue

    for rule_id in shipped_catalogue().rules:
        assert f'id="{rule_id.lower()}"' in rules, rule_id
    report = (site / "reference" / "report" / "index.html").read_text(encoding="utf-8")
    assert 'id="def-finding"' in report and "<code>related_paths</code>" in report
    # generated, never committed
    assert not (DOCS / "reference").exists()


def test_every_table_renders_as_a_table(site: Path):
    """A Markdown table row separated from its table (text between rows) renders as a paragraph
    starting with '|': none may be left, e.g. the dependencies table's tomli row."""
    dependencies = (site / "dependencies" / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<td><code>tomli</code></td>|<td>tomli</td>", dependencies), "tomli row is no table row"
    for html in site.rglob("*.html"):
        stray = re.findall(r"<p>\s*\|[^<]*\|", html.read_text(encoding="utf-8"))
        assert not stray, f"{html.relative_to(site)}: table rows rendered as text: {stray[:2]}"
        shown = re.findall(r"<code>[^<]*\\\|[^<]*</code>", html.read_text(encoding="utf-8"))
        assert not shown, f"{html.relative_to(site)}: an escaped | shows its backslash in code: {shown[:2]}"
