"""The typer CLI: parse, call one library function, render, exit. The only layer that prints.

Exit codes, the same on every command (common.EXIT_CODES_HELP, shown once in `rocm-audit --help`):
0 clean; 1 findings at or above --fail-on (dedup/prune --check: work to do); 2 usage or
configuration error; 3 internal error; 130 interrupted.
Heavy modules (pyelftools, lief, msgpack, zstandard, docker) are imported inside command bodies so
`rocm-audit --help` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Annotated, Any

import typer

from rocm_audit import __version__
from rocm_audit.cli.common import EXIT_CODES_HELP, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, _State, start_logging
from rocm_audit.output.escape import display


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"rocm-audit {__version__}")
        raise typer.Exit(EXIT_OK)


def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of internal errors.")] = False,
    verbose: Annotated[
        int,
        typer.Option(
            "-v",
            "--verbose",
            count=True,
            show_default=False,
            help="Same as -v after the command (more detail, a log on stderr).",
        ),
    ] = 0,
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    _State.debug = debug
    _State.verbose = verbose  # a reporting command adds it to its own -v count
    start_logging(verbose)


# command name -> (module in rocm_audit.cli.commands, extra settings); each module imports only typer
# and this module.
_COMMANDS: dict[str, tuple[str, dict[str, Any]]] = {
    "dedup": ("dedup", {}),
    "prune": ("prune", {}),
    "verify-arch": ("verify_arch", {}),
    "llvm": ("llvm", {}),
    "check": ("check", {}),
    "image": ("image", {"no_args_is_help": True}),
    "scan": ("scan", {}),
    "rules": ("rules", {}),
    "explain": ("explain", {"no_args_is_help": True}),
}


def _new_app(names: Iterable[str]) -> typer.Typer:
    """The rocm-audit command group with the named commands."""
    import importlib

    from rocm_audit.cli.help import HELP_WIDTH, PanelledCommand, summary_of

    group = typer.Typer(
        name="rocm-audit",
        help="Audit ROCm wheel-SDK trees and images: duplicate SDK libraries, GPU targets, LLVM option clashes.",
        epilog=EXIT_CODES_HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"max_content_width": HELP_WIDTH},
    )
    group.callback()(_root)
    for name in names:
        module, settings = _COMMANDS[name]
        command = importlib.import_module(f"rocm_audit.cli.commands.{module}").command
        # The first docstring paragraph, whole, in the command list (click would cut it at ~45 columns).
        group.command(name, cls=PanelledCommand, short_help=summary_of(command), **settings)(command)
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
    # The one catch-all (docs/style.md 2.6-2.7): click's usage errors, then any other error as exit 3.
    except Exception as exc:  # noqa: BLE001
        # typer >= 0.26 vendors click (typer._click), older typer uses click itself: duck-type.
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()  # type: ignore[attr-defined]
            return EXIT_USAGE
        if type(exc).__name__ == "Abort":
            return 130
        if _State.debug:
            import traceback  # only for --debug: it costs 10-20 ms of every start

            traceback.print_exc()
        typer.echo(f"rocm-audit: internal error: {type(exc).__name__}: {display(exc)}", err=True)
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
