"""What every command shares: the option declarations, the policy in force, rendering and exit codes.

Commands import this module; the command group (app.py) imports the commands. Nothing here
imports a command, so the CLI has no import cycle.
"""

from __future__ import annotations

import enum
import inspect
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from rocm_audit.errors import Interrupted, RocmAuditError
from rocm_audit.output.escape import display
from rocm_audit.severity import Severity

if TYPE_CHECKING:  # the outcome pulls in the rule catalogue (tomllib): not needed for --help
    from rocm_audit.outcome import CommandOutcome

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped

# The exit-code table: shown once, at the end of `rocm-audit --help` (and in README "Exit codes").
# "\b" keeps click from re-wrapping the lines of the table into one paragraph.
EXIT_CODES_HELP = """\b
Exit codes, the same for every command:
  0    clean
  1    findings at or above --fail-on (dedup/prune --check: work to do)
  2    usage or configuration error
  3    internal error
  130  interrupted"""

# Help panels: the options of each command's --help, grouped (cli/help.py prints them).
AUDIT_PANEL = "What to audit"
ACTION_PANEL = "What to do"
REPORT_PANEL = "Report"


class OutputFormat(str, enum.Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    junit = "junit"
    github = "github"
    markdown = "markdown"


class FailOn(str, enum.Enum):
    error = "error"
    warning = "warning"
    info = "info"
    never = "never"


PathsOption = Annotated[
    Optional[list[str]],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "-p",
        "--path",
        metavar="PATH",
        rich_help_panel=AUDIT_PANEL,
        help="site-packages dir, _rocm_sdk_* tree, any dir or a single file; repeatable. "
        "Default: every site-packages dir of this interpreter, or of --python.",
    ),
]
PythonOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--python",
        metavar="PATH",
        rich_help_panel=AUDIT_PANEL,
        help="Audit the site-packages dirs of this interpreter (a venv's bin/python too) instead of "
        "rocm-audit's own, so rocm-audit can live in its own venv.",
    ),
]


SkipOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--skip",
        metavar="CHECK",
        help="Leave out dedup, verify-arch, llvm, post-build or prune; repeatable.",
        rich_help_panel=ACTION_PANEL,
    ),
]

# Options several commands take with a help of their own (what is kept, what --check gates): each
# is declared once here, and a command passes its help, as in
# ``dry_run: Annotated[bool, dry_run_option("Print the plan; change nothing.")] = False``.


def targets_argument(help: str, metavar: str = "[TARGET]...") -> Any:
    """The GPU targets given as arguments (annotate ``list[str] | None``, default None)."""
    return typer.Argument(metavar=metavar, help=help, rich_help_panel=AUDIT_PANEL)


def announce_products(targets: list[str], quiet: bool) -> None:
    """Say once on stderr which processor each product name among the targets is (MI300X is gfx942)."""
    if quiet or not targets:
        return
    from rocm_audit.tree.targets import named_products

    for _, product in named_products(targets):
        typer.echo(f"{display(product.name)} is {product.processor}", err=True)


def _list_targets(value: bool) -> None:
    """--list-targets: every known processor with its features and product names, then exit 0."""
    if not value:
        return
    import textwrap

    from rocm_audit.tree.products import PRODUCT_SOURCES
    from rocm_audit.tree.targets import known_targets

    typer.echo(f"{'processor':<16}{'features':<16}products")
    for processor, features, products in known_targets():
        line = f"{processor:<16}{' '.join(features) or '-':<16}"
        for index, name in enumerate(products):  # wrapped between names, never inside one
            piece = name + ("," if index < len(products) - 1 else "")
            if index and len(line) + 1 + len(piece) > 100:
                typer.echo(line)
                line = " " * 31
            line += (" " if index else "") + piece
        typer.echo(line.rstrip())
    notes = [
        "Features follow a colon with + or -: gfx942:xnack+, gfx950:sramecc+:xnack-. A bare name "
        "means the usual setting (sramecc+ and xnack- where the processor has them).",
        "Names are read in any case; a product name with or without its brand and spaces "
        "(MI300X, Instinct MI300X, rx7900xtx).",
        "Product names from: " + "; ".join(PRODUCT_SOURCES.values()),
    ]
    for note in notes:
        typer.echo("\n" + "\n".join(textwrap.wrap(note, 100, break_on_hyphens=False)))
    raise typer.Exit(EXIT_OK)


ListTargetsOption = Annotated[
    bool,
    typer.Option(
        "--list-targets",
        is_eager=True,
        expose_value=True,
        callback=_list_targets,
        help="List every GPU processor and product name a target may be, and exit.",
        rich_help_panel=AUDIT_PANEL,
    ),
]


def sysroot_option(help: str) -> Any:
    """--sysroot DIR, the root of the system the files run on (annotate ``str``, default "/")."""
    return typer.Option("--sysroot", metavar="DIR", help=help, rich_help_panel=AUDIT_PANEL)


# The modes of a command that changes the trees (dedup, prune): apply, --dry-run, --check, --revert.


def dry_run_option(help: str) -> Any:
    """--dry-run (annotate ``bool``, default False)."""
    return typer.Option("--dry-run", help=help, rich_help_panel=ACTION_PANEL)


def check_option(help: str) -> Any:
    """--check, the CI gate (annotate ``bool``, default False)."""
    return typer.Option("--check", help=help, rich_help_panel=ACTION_PANEL)


def manifest_option(help: str) -> Any:
    """--manifest FILE, the revert manifest to append to (annotate ``str | None``, default None)."""
    return typer.Option("--manifest", metavar="FILE", help=help, rich_help_panel=ACTION_PANEL)


def revert_option(help: str) -> Any:
    """--revert MANIFEST, repeatable (annotate ``list[str] | None``, default None)."""
    return typer.Option("--revert", metavar="MANIFEST", help=help, rich_help_panel=ACTION_PANEL)


def change_mode(dry_run: bool, check: bool, revert: list[str] | None) -> str:
    """'revert', 'check', 'dry-run' or 'apply', from the mode options. Raises UsageError when
    more than one is given."""
    from rocm_audit.errors import UsageError

    if sum(bool(x) for x in (dry_run, check, revert)) > 1:
        raise UsageError("--dry-run, --check and --revert exclude each other")
    return "revert" if revert else "check" if check else "dry-run" if dry_run else "apply"


def audited_paths(paths: list[str] | None, python: str | None) -> list[str] | None:
    """-p/--path as given, else the site-packages of --python, else None (this interpreter's).
    Raises UsageError when both are given."""
    if python is None:
        return paths
    from rocm_audit.errors import UsageError

    if paths:
        raise UsageError("--python and -p/--path exclude each other: name the interpreter or the directories")
    from rocm_audit.tree.discovery import site_packages_of

    found = site_packages_of(python)
    if not found:
        raise UsageError(f"--python {python}: it reports no existing site-packages directory")
    return found


FormatOption = Annotated[
    OutputFormat,
    typer.Option(
        "--format",
        metavar="FORMAT",
        help="text, json (versioned schema), sarif (2.1.0), junit (XML), github (Actions annotations) "
        "or markdown (a job summary: append it to $GITHUB_STEP_SUMMARY).",
        rich_help_panel=REPORT_PANEL,
    ),
]
OutputOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "-o",
        "--output",
        metavar="FILE",
        help="Write the report to FILE (atomically) instead of stdout.",
        rich_help_panel=REPORT_PANEL,
    ),
]
ReportOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--report",
        metavar="FORMAT=FILE",
        help="Also write the report in FORMAT to FILE (atomically), from the same run: "
        "--report sarif=audit.sarif --report json=audit.json; repeatable.",
        rich_help_panel=REPORT_PANEL,
    ),
]
FailOnOption = Annotated[
    FailOn,
    typer.Option(
        "--fail-on",
        metavar="SEVERITY",
        help="Lowest severity that makes the exit code 1: error, warning, info or never.",
        rich_help_panel=REPORT_PANEL,
    ),
]
QuietOption = Annotated[
    bool,
    typer.Option("-q", "--quiet", help="No progress line and no summary on stderr.", rich_help_panel=REPORT_PANEL),
]
RulesOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--rules",
        metavar="FILE",
        help="TOML rules file: severity overrides, ignores (with a reason), policy settings; repeatable.",
        rich_help_panel=REPORT_PANEL,
    ),
]
VerboseOption = Annotated[
    int,
    typer.Option(
        "-v",
        "--verbose",
        count=True,
        show_default=False,
        help="Show every file of a group and each finding's detail, and log to stderr; -vv: debug log.",
        rich_help_panel=REPORT_PANEL,
    ),
]


BaselineOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--baseline",
        metavar="FILE",
        help="Fail only on findings not in FILE (made by --write-baseline); the others are counted as suppressed.",
        rich_help_panel=REPORT_PANEL,
    ),
]
WriteBaselineOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--write-baseline",
        metavar="FILE",
        help="Write this run's findings to FILE as a baseline (keys survive reinstalls and other roots).",
        rich_help_panel=REPORT_PANEL,
    ),
]


class _State:
    debug = False
    verbose = 0  # -v given before the command (rocm-audit -v check): added to the command's own


def start_logging(verbose: int) -> None:
    """Log to stderr at INFO (-v) or DEBUG (-vv and more); nothing for 0. Library code logs through
    logging.getLogger(__name__); logging is imported only when asked for (--help stays fast)."""
    if verbose <= 0:
        if "logging" in sys.modules:  # a quiet run after a -v run in one process (tests)
            sys.modules["logging"].getLogger().setLevel(sys.modules["logging"].WARNING)
        return
    import logging

    class _ToCurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
        """Writes to whatever sys.stderr is when a record is logged (a test runner swaps it)."""

        @property
        def stream(self) -> object:
            return sys.stderr

        @stream.setter
        def stream(self, value: object) -> None:
            pass

    class _ShortNames(logging.Formatter):
        """``rocm-audit: image: reading layer 0`` (the module, without the package's own name)."""

        def format(self, record: logging.LogRecord) -> str:
            record.short = record.name.removeprefix("rocm_audit.")
            return super().format(record)

    root = logging.getLogger()
    if not any(h.get_name() == "rocm-audit" for h in root.handlers):
        handler = _ToCurrentStderr()
        handler.set_name("rocm-audit")
        handler.setFormatter(_ShortNames("rocm-audit: %(short)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)


@dataclass(frozen=True, slots=True)
class Report:
    """How a command reports: the options every command shares, declared once below."""

    fmt: OutputFormat = OutputFormat.text
    output: str | None = None
    reports: tuple[str, ...] = ()  # --report FORMAT=FILE as given (parsed by ``report_files``)
    fail_on: FailOn = FailOn.error
    quiet: bool = False
    rules: tuple[str, ...] = ()
    baseline: str | None = None
    write_baseline: str | None = None
    verbose: int = 0  # -v count, before and after the command together


# name -> (annotation with the typer option, default): the shared options, in --help order.
_SHARED_OPTIONS: dict[str, tuple[object, object]] = {
    "fmt": (FormatOption, OutputFormat.text),
    "output": (OutputOption, None),
    "reports": (ReportOption, None),
    "fail_on": (FailOnOption, FailOn.error),
    "quiet": (QuietOption, False),
    "rules": (RulesOption, None),
    "baseline": (BaselineOption, None),
    "write_baseline": (WriteBaselineOption, None),
    "verbose": (VerboseOption, 0),
}


def _evaluated(produce: Callable[..., Any], parameter: inspect.Parameter) -> Any:
    """One parameter's annotation evaluated in its module (not the return annotation, so a command
    module can import ``CommandOutcome`` for type checking only and keep `--help` fast)."""
    annotation = parameter.annotation
    if isinstance(annotation, str):
        annotation = eval(annotation, produce.__globals__)  # our own source's annotation, as typing does
    return annotation


def reporting_command(
    *, shared: tuple[str, ...] = tuple(_SHARED_OPTIONS), fail_on: FailOn = FailOn.error
) -> Callable[[Callable[..., CommandOutcome]], Callable[..., None]]:
    """Declare a command from a function ``produce(report: Report, **own_options) -> CommandOutcome``.

    The shared options (``shared``, of --format, -o, --fail-on, -q, --rules, -v) are added to the
    command's signature here, after its own; the command runs ``produce`` under the policy of
    --rules, renders the outcome and exits with its code. ``fail_on`` is used when --fail-on is
    not one of the command's options."""

    def declare(produce: Callable[..., CommandOutcome]) -> Callable[..., None]:
        own = [
            parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=_evaluated(produce, parameter))
            for parameter in inspect.signature(produce).parameters.values()
            if parameter.name != "report"
        ]
        added = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=_SHARED_OPTIONS[name][1],
                annotation=_SHARED_OPTIONS[name][0],
            )
            for name in shared
        ]

        def command(**given: object) -> None:
            settings: dict[str, object] = {name: given.pop(name) for name in shared}
            settings["rules"] = tuple(typing.cast("list[str] | None", settings.get("rules")) or ())
            settings["reports"] = tuple(typing.cast("list[str] | None", settings.get("reports")) or ())
            settings.setdefault("fail_on", fail_on)
            settings["verbose"] = _State.verbose + typing.cast("int", settings.get("verbose", 0))
            report = Report(**settings)  # type: ignore[arg-type]
            start_logging(report.verbose)

            def body() -> int:
                # Every file the run will write is checked before it starts: a typo in a path must
                # not cost an image's whole audit.
                files = report_files(report)
                return emit(
                    produce(report, **given),
                    report.fmt,
                    report.output,
                    report.fail_on,
                    report.quiet,
                    baseline=report.baseline,
                    write_baseline=report.write_baseline,
                    verbose=report.verbose,
                    files=files,
                )

            run(body, list(report.rules))

        command.__signature__ = inspect.Signature([*own, *added])  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in [*own, *added]}
        command.__doc__ = produce.__doc__
        command.__name__ = produce.__name__
        command.__module__ = produce.__module__
        return command

    return declare


def fail_on_severity(fail_on: FailOn) -> Severity | None:
    return None if fail_on is FailOn.never else Severity(fail_on.value)


def emit(
    outcome: CommandOutcome,
    fmt: OutputFormat,
    output: str | None,
    fail_on: FailOn,
    quiet: bool = False,
    *,
    baseline: str | None = None,
    write_baseline: str | None = None,
    verbose: int = 0,
    files: Sequence[tuple[OutputFormat, str]] = (),
) -> int:
    """Apply the policy and the baseline, render the outcome, write it, and return the exit code.

    ``files``: more reports of the same outcome, (format, file), each written atomically before
    the main one. When the report is machine-readable or goes to a file, the one-line summary
    goes to stderr (unless quiet), so a person watching the build still sees what happened."""
    _settle_findings(outcome, baseline, write_baseline)
    threshold = fail_on_severity(fail_on)
    for file_format, path in files:
        _write_out(_rendered(outcome, file_format, threshold, verbose), path)
    _write_out(_rendered(outcome, fmt, threshold, verbose, terminal=not output), output)
    if not quiet and (fmt is not OutputFormat.text or output) and outcome.summary:
        from rocm_audit.output.layout import hold, wrap
        from rocm_audit.output.text import count_line

        # what a person reads at 100 columns, with the findings' count the exit code follows
        summary = display(outcome.summary)
        for command in map(display, outcome.summary_commands):
            summary = summary.replace(command, hold(command))
        said = [*wrap(summary), count_line(outcome.command, outcome.findings)]
        typer.echo("\n".join(said), err=True)
    if threshold is None:
        return EXIT_FINDINGS if outcome.force_failure else EXIT_OK
    return outcome.exit_code(threshold)


def _settle_findings(outcome: CommandOutcome, baseline: str | None, write_baseline: str | None) -> None:
    """Give ``outcome`` its roots, shippers and fingerprints; apply the policy's ignores, write the
    baseline when asked, and set aside the findings a baseline already knows. Raises ConfigError."""
    import dataclasses
    import os

    from rocm_audit.audit.attribution import attribute_carriers, fingerprints, with_shippers
    from rocm_audit.rulebook.policy import active_policy

    if not outcome.roots:  # the audited directories as the findings spell them (resolved)
        outcome.roots = sorted({os.path.realpath(p) for p in outcome.inputs if os.path.isdir(p)})
    shipped = outcome.findings if outcome.attributed else with_shippers(outcome.findings)
    if not outcome.attributed:
        attribute_carriers(outcome.sections)
    outcome.findings, outcome.suppressed = active_policy().apply(shipped)
    keys = fingerprints(outcome.findings, outcome.roots)
    outcome.findings = [dataclasses.replace(f, fingerprint=k) for f, k in zip(outcome.findings, keys, strict=True)]
    if write_baseline:
        from rocm_audit.audit.baseline import baseline_document
        from rocm_audit.output.report import to_json, write_atomic

        write_atomic(write_baseline, to_json(baseline_document(outcome.findings, keys)))
    if baseline:
        from rocm_audit.audit.baseline import parse_baseline, split_by_baseline
        from rocm_audit.errors import ConfigError
        from rocm_audit.tree.smallfile import read_small

        try:
            text = read_small(baseline, 256 << 20).decode("utf-8", "replace")
        except OSError as exc:
            raise ConfigError(baseline, f"cannot read baseline: {exc.strerror}") from None
        outcome.findings, known = split_by_baseline(
            outcome.findings, [f.fingerprint for f in outcome.findings], parse_baseline(text, baseline), baseline
        )
        outcome.suppressed = sorted([*outcome.suppressed, *known], key=lambda s: (s["path"], s["rule"]))


def _rendered(
    outcome: CommandOutcome, fmt: OutputFormat, threshold: Severity | None, verbose: int, *, terminal: bool = False
) -> str:
    """The report in the format asked for; ``terminal``: it goes to stdout, which may take colour."""
    if fmt is OutputFormat.json:
        from rocm_audit.output.report import build_report, to_json

        return to_json(
            build_report(
                outcome.command,
                outcome.findings,
                inputs=outcome.inputs,
                sections=outcome.sections,
                suppressed=outcome.suppressed,
            )
        )
    if fmt is OutputFormat.sarif:
        from rocm_audit.output.sarif import render_sarif

        return render_sarif(outcome)
    if fmt is OutputFormat.junit:
        from rocm_audit.output.junit import render_junit

        return render_junit(outcome, threshold)
    if fmt is OutputFormat.github:
        import os

        from rocm_audit.output.github import render_github

        return render_github(outcome, os.environ.get("GITHUB_WORKSPACE"))
    if fmt is OutputFormat.markdown:
        from rocm_audit.output.markdown import render_markdown

        return render_markdown(outcome, verbose=verbose)
    from rocm_audit.output.text import render_text, use_colour

    return render_text(outcome, verbose=verbose, colour=terminal and use_colour())


def report_files(report: Report) -> list[tuple[OutputFormat, str]]:
    """The (format, file) pairs of --report, after checking that every file the run writes (-o,
    --report, --write-baseline) can be written and that no two of them are one file. Raises
    UsageError."""
    import os

    from rocm_audit.errors import UsageError
    from rocm_audit.output.report import check_destination

    files: list[tuple[OutputFormat, str]] = []
    formats = [f.value for f in OutputFormat]
    for given in report.reports:
        name, equals, path = given.partition("=")
        if equals and name in formats and not path:  # often an unset variable: markdown="$GITHUB_STEP_SUMMARY"
            raise UsageError(f"--report {given}: no file after '{name}='", hint="is the variable naming it set?")
        if equals and name not in formats:
            raise UsageError(f"--report {given}: no report format {name!r}; the formats: {', '.join(formats)}")
        if not equals or not path:
            raise UsageError(
                f"--report {given}: expected FORMAT=FILE, FORMAT one of {', '.join(formats)}",
                hint="for example --report sarif=rocm-audit.sarif",
            )
        files.append((OutputFormat(name), path))
    named: list[tuple[str, str | None]] = [("-o", report.output), ("--write-baseline", report.write_baseline)]
    named += [(f"--report {file_format.value}=", path) for file_format, path in files]
    seen: dict[str, str] = {}
    for option, destination in named:
        if not destination:
            continue
        spelled = f"{option}{destination}" if option.endswith("=") else f"{option} {destination}"
        check_destination(destination, spelled)
        key = os.path.realpath(destination)
        if key in seen:
            raise UsageError(f"{spelled}: {seen[key]} writes this file already")
        seen[key] = spelled
    return files


def _write_out(text: str, output: str | None) -> None:
    """Write the report to ``output``, atomically, or to stdout."""
    if output:
        from rocm_audit.output.report import write_atomic

        write_atomic(output, text)
    else:
        # Renderers escape file names; backslashreplace is the net under anything they missed.
        if hasattr(sys.stdout, "buffer"):
            sys.stdout.buffer.write(text.encode("utf-8", "backslashreplace"))
        else:  # a test runner's text stream
            sys.stdout.write(text)
        sys.stdout.flush()


def interrupted_message(stopped: Interrupted) -> str:
    """What a Ctrl-C of a changing command did, and how to finish or undo it (lines of 100 columns
    at most, but for the manifest's path)."""
    import shlex

    if not stopped.made:
        return f"rocm-audit: {stopped.command} interrupted before its first change: nothing was changed."
    done = (
        f"rocm-audit: {stopped.command} interrupted: {stopped.made} of {stopped.planned} changes made, "
        "each one complete;\nthe others are untouched. To finish, run the same command again."
    )
    if stopped.manifest is None:  # a revert: undoing it is running the command it undid
        return done
    revert = f"rocm-audit {stopped.command} --revert {shlex.quote(stopped.manifest)}"
    return f"{done} To undo, run:\n  {display(revert)}"


def run(body: Callable[[], int], rules_files: list[str] | None = None) -> None:
    """Run a command body under the policy in force; map errors to exit codes (no traceback unless --debug)."""
    try:
        from rocm_audit.rulebook.policy import load_policy, using_policy

        with using_policy(load_policy(rules_files or [])):
            code = body()
    except RocmAuditError as exc:
        typer.echo(f"rocm-audit: error: {display(exc.message)}", err=True)
        if exc.hint:
            typer.echo(f"hint: {display(exc.hint)}", err=True)
        raise typer.Exit(exc.exit_code) from None
    except Interrupted as stopped:
        typer.echo(interrupted_message(stopped), err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except KeyboardInterrupt:  # a command that changes nothing, or the writing of a report
        typer.echo("rocm-audit: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - the one place internal errors are turned into exit 3
        if _State.debug:
            import traceback  # only for --debug: it costs 10-20 ms of every start

            traceback.print_exc()
        typer.echo(f"rocm-audit: internal error: {type(exc).__name__}: {display(exc)} (rerun with --debug)", err=True)
        raise typer.Exit(EXIT_INTERNAL) from None
    raise typer.Exit(code)
