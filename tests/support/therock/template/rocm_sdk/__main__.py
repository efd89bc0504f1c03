"""``rocm-sdk`` CLI of the fixture: path, init, test, version, targets (TheRock rocm_sdk/__main__.py)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import unittest
from pathlib import Path

from . import _dist_info as di


def _devel_root_or_exit() -> Path:
    from . import _devel

    try:
        return _devel.get_devel_root()
    except ModuleNotFoundError as error:
        print(f"ERROR: {error}", file=sys.stderr)
        sys.exit(1)


def _do_path(args: argparse.Namespace) -> None:
    root = _devel_root_or_exit()
    print(root / "lib" / "cmake" if args.cmake else root / "bin" if args.bin else root)


def _do_init(args: argparse.Namespace) -> None:
    root = _devel_root_or_exit()
    if not args.quiet:
        print(f"Devel contents expanded to '{root}'")


def _do_test(args: argparse.Namespace) -> None:
    modules = ["rocm_sdk.tests.base_test"]
    if di.ALL_PACKAGES["libraries"].has_py_package(di.determine_target_family()):
        modules.append("rocm_sdk.tests.libraries_test")
    else:
        print("NOTE: Skipping libraries tests (not installed for this arch)")
    # The devel platform dir may not exist yet (populated on demand), so look for the pure package.
    if importlib.util.find_spec("rocm_sdk_devel") is not None:
        modules.append("rocm_sdk.tests.devel_test")
    loader = unittest.TestLoader()
    suite = unittest.TestSuite(loader.loadTestsFromName(name) for name in modules)
    if loader.errors:
        print(f"WARNING: Test discovery had errors: {loader.errors}")
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    if not result.wasSuccessful():
        sys.exit(1)


def _do_version(args: argparse.Namespace) -> None:
    print(di.__version__)


def _do_targets(args: argparse.Namespace) -> None:
    core = importlib.import_module(di.ALL_PACKAGES["core"].get_py_package_name())
    dist_info_path = Path(core.__file__).parent / "share" / "therock" / "dist_info.json"
    print(json.loads(dist_info_path.read_text())["dist_amdgpu_targets"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rocm-sdk")
    commands = parser.add_subparsers(required=True)
    path_parser = commands.add_parser("path")
    kind = path_parser.add_mutually_exclusive_group(required=True)
    for flag in ("--cmake", "--bin", "--root"):
        kind.add_argument(flag, action="store_true")
    path_parser.set_defaults(func=_do_path)
    commands.add_parser("test").set_defaults(func=_do_test)
    commands.add_parser("version").set_defaults(func=_do_version)
    commands.add_parser("targets").set_defaults(func=_do_targets)
    init_parser = commands.add_parser("init")
    init_parser.add_argument("--quiet", action="store_true")
    init_parser.set_defaults(func=_do_init)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.func(args)


if __name__ == "__main__":
    main()
