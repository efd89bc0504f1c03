"""The typer CLI: parse, call one library function, render, exit. The only layer that prints.

Exit codes, the same on every command: 0 no finding at or above --fail-on; 1 findings at or above
it (or `dedup --check` found work); 2 usage or configuration error; 3 internal error.
Heavy modules (pyelftools, lief, msgpack, zstandard, docker) are imported inside command bodies so
`rocm-audit --help` stays fast.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, Optional

import typer

from rocm_audit import __version__
from rocm_audit.errors import RocmAuditError
from rocm_audit.findings import Severity
from rocm_audit.outcome import CommandOutcome

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3

EPILOG = ("Exit codes: 0 clean; 1 findings at or above --fail-on (dedup --check: work to do); "
          "2 usage or configuration error; 3 internal error.")


class OutputFormat(str, enum.Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    junit = "junit"
    github = "github"


class FailOn(str, enum.Enum):
    error = "error"
    warning = "warning"
    info = "info"
    never = "never"


PathsOption = Annotated[
    Optional[list[str]],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option("-p", "--path", metavar="PATH",
                 help="site-packages dir, _rocm_sdk_* tree, any dir or a single file; repeatable. "
                      "Default: every site-packages dir of this interpreter."),
]
FormatOption = Annotated[OutputFormat, typer.Option(
    "--format", help="text, json (versioned schema), sarif (2.1.0), junit (XML) or github (Actions annotations).")]
OutputOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("-o", "--output", metavar="FILE", help="Write the report to FILE (atomically) instead of stdout."),
]
FailOnOption = Annotated[
    FailOn, typer.Option("--fail-on", help="Lowest severity that makes the exit code 1.")]
QuietOption = Annotated[bool, typer.Option("-q", "--quiet", help="No progress line and no summary on stderr.")]
RulesOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--rules", metavar="FILE",
                 help="TOML rules file: severity overrides, ignores (with a reason), policy settings; repeatable."),
]


class _State:
    debug = False
    verbose = 0


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"rocm-audit {__version__}")
        raise typer.Exit(EXIT_OK)


def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of internal errors.")] = False,
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="More log output on stderr.")] = 0,
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    _State.debug = debug
    _State.verbose = verbose
    if verbose:
        import logging

        logging.basicConfig(level=logging.DEBUG if verbose > 1 else logging.INFO,
                            format="rocm-audit: %(name)s: %(message)s", stream=sys.stderr)


def fail_on_severity(fail_on: FailOn) -> Severity | None:
    return None if fail_on is FailOn.never else Severity(fail_on.value)


def emit(outcome: CommandOutcome, fmt: OutputFormat, output: str | None, fail_on: FailOn,
         quiet: bool = False) -> int:
    """Apply the policy, render the outcome, write it, and return the exit code.

    When the report is machine-readable or goes to a file, the one-line summary goes to stderr
    (unless quiet), so a person watching the build still sees what happened."""
    from rocm_audit.rulebook.policy import active_policy

    outcome.findings, outcome.suppressed = active_policy().apply(outcome.findings)
    threshold = fail_on_severity(fail_on)
    if fmt is OutputFormat.json:
        from rocm_audit.output.report import build_report, to_json

        text = to_json(build_report(outcome.command, outcome.findings, inputs=outcome.inputs,
                                    sections=outcome.sections, suppressed=outcome.suppressed))
    elif fmt is OutputFormat.sarif:
        from rocm_audit.output.sarif import render_sarif

        text = render_sarif(outcome)
    elif fmt is OutputFormat.junit:
        from rocm_audit.output.junit import render_junit

        text = render_junit(outcome, threshold)
    elif fmt is OutputFormat.github:
        from rocm_audit.output.github import render_github

        text = render_github(outcome)
    else:
        from rocm_audit.output.text import render_text

        text = render_text(outcome)
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
    if not quiet and (fmt is not OutputFormat.text or output) and outcome.summary:
        typer.echo(outcome.summary, err=True)
    if threshold is None:
        return EXIT_FINDINGS if outcome.force_failure else EXIT_OK
    return outcome.exit_code(threshold)


def run(body: Callable[[], int], rules_files: list[str] | None = None) -> None:
    """Run a command body under the policy in force; map errors to exit codes (no traceback unless --debug)."""
    try:
        from rocm_audit.rulebook.policy import load_policy, using_policy

        with using_policy(load_policy(rules_files or [])):
            code = body()
    except RocmAuditError as exc:
        typer.echo(f"rocm-audit: error: {exc.message}", err=True)
        raise typer.Exit(exc.exit_code) from None
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - the one place internal errors are turned into exit 3
        if _State.debug:
            traceback.print_exc()
        typer.echo(f"rocm-audit: internal error: {type(exc).__name__}: {exc} (rerun with --debug)", err=True)
        raise typer.Exit(EXIT_INTERNAL) from None
    raise typer.Exit(code)


# command name -> (module in rocm_audit.cli.commands, extra settings); each module imports only typer
# and this module.
_COMMANDS: dict[str, tuple[str, dict[str, Any]]] = {
    "dedup": ("dedup", {}),
    "verify-arch": ("verify_arch", {}),
    "llvm": ("llvm", {}),
    "check": ("check", {}),
    "image": ("image", {"no_args_is_help": True}),
    "scan": ("scan", {}),
    "rules": ("rules", {}),
}


def _new_app(names: Iterable[str]) -> typer.Typer:
    """The rocm-audit command group with the named commands."""
    import importlib

    group = typer.Typer(
        name="rocm-audit",
        help="Audit ROCm wheel-SDK trees and images: duplicate SDK libraries, GPU targets, LLVM option clashes.",
        epilog=EPILOG,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    group.callback()(_root)
    for name in names:
        module, settings = _COMMANDS[name]
        command = importlib.import_module(f"rocm_audit.cli.commands.{module}").command
        group.command(name, epilog=EPILOG, **settings)(command)
    return group


app: typer.Typer  # the whole command group, built on first use by __getattr__


def __getattr__(name: str) -> Any:
    """``app``, the whole command group (tests, documentation tools), is built on first use:
    main() builds only the group a run needs."""
    if name == "app":
        global app
        app = _new_app(_COMMANDS)
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextlib.contextmanager
def _collector_tuned_for_one_run() -> Iterator[None]:
    """A run allocates many long-lived small objects (an inventory, findings) and few cycles: keep
    the objects that exist already (imported modules) out of every collection and collect the young
    generation less often. The cyclic collector otherwise re-walks the whole inventory again and
    again: 10-30 ms of a 0.4 s dedup --check over 4,000 files (bench/README.md). mypy's entry
    point makes the same trade. Undone afterwards for callers that live on (tests)."""
    import gc

    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    # Click builds every registered command on each call (~10 ms for all seven): for a run of one
    # command, a group holding only that one. The global options are flags, so the first word that
    # is not an option names the command; anything else (--help, a typo) gets the whole group.
    named = next((a for a in args if not a.startswith("-")), None)
    target = _new_app([named] if named in _COMMANDS else _COMMANDS)
    try:
        # Without standalone mode click returns the code of typer.Exit instead of exiting.
        with _collector_tuned_for_one_run():
            returned = target(args=args, prog_name="rocm-audit", standalone_mode=False)
        return returned if isinstance(returned, int) else EXIT_OK
    except typer.Exit as done:
        return int(done.exit_code)
    except SystemExit as done:  # click raises it for --help in some versions
        return int(done.code or 0)
    except KeyboardInterrupt:
        typer.echo("rocm-audit: interrupted", err=True)
        return 130
    except Exception as exc:  # click usage errors when standalone_mode is False
        # typer >= 0.26 vendors click (typer._click), older typer uses click itself: duck-type.
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()  # type: ignore[attr-defined]
            return EXIT_USAGE
        if type(exc).__name__ == "Abort":
            return 130
        if _State.debug:
            traceback.print_exc()
        typer.echo(f"rocm-audit: internal error: {type(exc).__name__}: {exc}", err=True)
        return EXIT_INTERNAL


def entry() -> None:
    """The console script: main(), then leave without tearing the interpreter down.

    By then everything the run opened is closed, its temporary directories are removed and its
    helper processes are reaped (each in its own ``with``/``finally``); what interpreter teardown
    would add is freeing every object and module one by one: 30-50 ms, a third of
    ``rocm-audit --help`` and a tenth of a dedup --check over 4 GB (bench/README.md)."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (| head) or a closed stream
            pass
    if "logging" in sys.modules:  # -v: flush the handlers as the exit hook would
        sys.modules["logging"].shutdown()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
