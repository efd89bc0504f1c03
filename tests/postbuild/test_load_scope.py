"""Symbols resolved in the real load scope (POST006, POST007), judged against real RTLD_NOW loads.

Every library here is built at test time by gcc/g++ with a deliberate mismatch: a stand-in of one
SONAME that exports a subset of the real library, an older build behind a consumer linked against a
newer one (versioned symbols), an abi3 module built against Python 3.12 headers and audited for
the 3.11 that runs this suite, a weak undefined symbol, a DT_SYMBOLIC library, a library linked
without its own dependency (its consumer maps it), a missing library. The oracle is the real
loader: each ELF is loaded alone with RTLD_NOW in a child of the audited interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from rocm_audit.audit.check import CheckOptions, run_check
from rocm_audit.postbuild.symbols import Resolver, host_of_interpreter, symbol_findings
from rocm_audit.tree.discovery import resolve_roots
from rocm_audit.tree.inventory import FileKind, build_inventory
from rocm_audit.tree.loader import HostView, LoaderModel
from support.interpreters import find_python
from support.postbuild.loadscope import compare
from support.vendor import APP_WHEELS, PIP_TARGET_312

SITE = "lib/python3.11/site-packages"


def build(output: Path, source: str, *flags: str, cxx: bool = False, version_script: str | None = None) -> Path:
    """A shared library from ``source`` (C, or C++ when ``cxx``), with a version script if given."""
    output.parent.mkdir(parents=True, exist_ok=True)
    suffix = ".cc" if cxx else ".c"
    source_path = output.parent / f".{output.name}{suffix}"
    source_path.write_text(source)
    argv = ["g++" if cxx else "gcc", "-shared", "-fPIC", "-O1", "-o", str(output), str(source_path), *flags]
    if version_script is not None:
        script = output.parent / f".{output.name}.map"
        script.write_text(version_script)
        argv.append(f"-Wl,--version-script={script}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    for leftover in output.parent.glob(f".{output.name}.*"):
        leftover.unlink()
    return output


def python_include(version: str) -> str:
    python = find_python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine to build an extension with its headers")
    done = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A 3.11 site-packages with every mismatch; the libraries consumers were linked against sit
    in build/ (not installed)."""
    top = tmp_path_factory.mktemp("loadscope")
    real, site = top / "build", top / SITE
    lib = site / "pkg" / "lib"
    origin = "-Wl,--enable-new-dtags,-rpath,$ORIGIN"

    # 1. A stand-in of libfull.so.1 that exports a subset of the real one.
    full = 'namespace rocm { int scale(int x) { return 2 * x; } }\nextern "C" int full_one(void) { return 1; }\n'
    build(real / "libfull.so.1", full, "-Wl,-soname,libfull.so.1", cxx=True)
    build(lib / "libfull.so.1", 'extern "C" int full_one(void) { return 1; }\n', "-Wl,-soname,libfull.so.1", cxx=True)
    build(
        lib / "libsubset_user.so",
        'namespace rocm { int scale(int); }\nextern "C" int full_one(void);\n'
        'extern "C" int use(void) { return rocm::scale(full_one()); }\n',
        f"-L{real}",
        "-l:libfull.so.1",
        origin,
        cxx=True,
    )

    # 2. An older build behind a consumer linked against a newer one (versioned symbols).
    newer = "V_1 { global: v_a; local: *; };\nV_2 { global: v_b; v_c; } V_1;\n"
    older = "V_1 { global: v_a; local: *; };\nV_2 { global: v_b; } V_1;\n"
    body = "int v_a(void) { return 1; }\nint v_b(void) { return 2; }\n"
    build(real / "libv.so.1", body + "int v_c(void) { return 3; }\n", "-Wl,-soname,libv.so.1", version_script=newer)
    build(lib / "libv.so.1", body, "-Wl,-soname,libv.so.1", version_script=older)
    build(
        lib / "libnewer_user.so",
        "int v_a(void); int v_c(void);\nint use(void) { return v_a() + v_c(); }\n",
        f"-L{real}",
        "-l:libv.so.1",
        origin,
    )

    # 3. An abi3 module built against Python 3.12 headers, using API 3.12 added.
    build(
        site / "pkg" / "_typed.abi3.so",
        "#define Py_LIMITED_API 0x030C0000\n#include <Python.h>\n"
        "void *data_of(PyObject *o, PyTypeObject *t) { return PyObject_GetTypeData(o, t); }\n"
        'static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_typed", 0, -1, 0};\n'
        "PyMODINIT_FUNC PyInit__typed(void) { return PyModule_Create(&def); }\n",
        f"-I{python_include('3.12')}",
    )
    # ... and a module for the audited interpreter, built against its own headers: quiet.
    build(
        site / "pkg" / f"_fine{sysconfig.get_config_var('EXT_SUFFIX')}",
        "#include <Python.h>\nPyObject *one(void) { return PyLong_FromLong(1); }\n"
        'static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_fine", 0, -1, 0};\n'
        "PyMODINIT_FUNC PyInit__fine(void) { return PyModule_Create(&def); }\n",
        f"-I{sysconfig.get_paths()['include']}",
    )

    # 4. A weak undefined symbol nothing defines: bound to 0, the load goes on.
    build(
        lib / "libweak.so",
        "extern int absent_fn(void) __attribute__((weak));\nint w(void) { return absent_fn ? absent_fn() : 0; }\n",
    )

    # 5. DT_SYMBOLIC: its own definition binds first; a dependency's too.
    build(
        lib / "libsymbolic.so",
        "int full_one(void);\nint own(void) { return 4; }\nint s(void) { return own() + full_one(); }\n",
        "-Wl,-Bsymbolic",
        f"-L{lib}",
        "-l:libfull.so.1",
        origin,
    )

    # 6. A library linked without its dependency: alone it fails, its consumer maps it.
    build(lib / "libdep.so", "int dep_fn(void) { return 5; }\n", "-Wl,-soname,libdep.so")
    build(lib / "libunder.so", "int dep_fn(void);\nint u(void) { return dep_fn(); }\n", "-Wl,-soname,libunder.so")
    build(
        lib / "libunder_user.so",
        "int u(void);\nint uu(void) { return u(); }\n",
        f"-L{lib}",
        "-Wl,--no-as-needed",
        "-l:libdep.so",
        "-l:libunder.so",
        origin,
    )

    # 7. A missing library (POST002), whose symbols are never repeated as missing symbols.
    build(real / "libgone.so", "int gone_fn(void) { return 6; }\n", "-Wl,-soname,libgone.so")
    build(
        lib / "libgone_user.so", "int gone_fn(void);\nint g(void) { return gone_fn(); }\n", f"-L{real}", "-l:libgone.so"
    )
    return site


def check_findings(site: Path) -> dict[str, list]:
    outcome = run_check(
        [str(site)], CheckOptions(python=sys.executable, skip=frozenset({"dedup", "verify-arch", "llvm", "prune"}))
    )
    found: dict[str, list] = {}
    for finding in outcome.findings:
        found.setdefault(finding.rule, []).append(finding)
    return found


def test_findings_name_missing_symbols_per_library(tree: Path) -> None:
    found = check_findings(tree)
    by_file = {os.path.basename(f.path): f for f in found.get("POST006", [])}
    assert sorted(by_file) == ["libnewer_user.so", "libsubset_user.so"]
    subset = by_file["libsubset_user.so"]
    assert subset.severity.value == "error"
    assert "rocm::scale(int)" in subset.message and "full_one" not in subset.message
    assert subset.data["expected_from"] == {"none of its libraries": ["_ZN4rocm5scaleEi"]}
    newer = by_file["libnewer_user.so"]
    assert newer.data["missing"] == ["v_c"]
    assert newer.data["expected_from"] == {"libv.so.1 (version V_2)": ["v_c"]}
    (python_api,) = found["POST007"]
    assert python_api.path.endswith("_typed.abi3.so")
    assert python_api.data["missing"] == ["PyObject_GetTypeData"]
    expected = ".".join(map(str, sys.version_info[:2]))
    assert python_api.data["interpreter"] == expected and f"Python {expected}" in python_api.message
    # The missing library is POST002 only, never again as missing symbols.
    assert [os.path.basename(f.path) for f in found["POST002"]] == ["libgone_user.so"]


def test_static_verdicts_agree_with_real_loads(tree: Path) -> None:
    """Every ELF of the tree: the static verdict against a real RTLD_NOW load under 3.11."""
    inventory = build_inventory(resolve_roots([str(tree)])[0])
    loader = LoaderModel(host=HostView("/", known_elf_keys=inventory.elf_keys()))
    libpython = os.path.join(sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME"))
    shared = sysconfig.get_config_var("Py_ENABLE_SHARED")
    host = host_of_interpreter(sys.executable, sys.version, libpython if shared else "", True, "test")
    resolver = Resolver(loader, host, inventory)
    paths = sorted(r.path for r in inventory.by_kind(FileKind.SHARED_LIBRARY))
    figures = compare(resolver, sys.executable, paths)
    assert figures.elfs == 12, figures.line()
    assert not figures.false_errors and not figures.unreported and not figures.other_reason, figures
    # The mismatches really fail (and the underlinked library alone), the rest really loads.
    assert figures.fails == 5 and figures.loads == 7, figures.line()


# The real vendor wheels of the first-contact journey, less flydsl (tests/support/vendor.py pins them).
VENDOR_WHEELS = [w for w in APP_WHEELS if not w[0].startswith("flydsl")]
PIP_TARGET = PIP_TARGET_312
# The subset stand-in: the HIP runtime without one function every HIP consumer calls.
DROPPED = ("libamdhip64.so.7", "hipGetDeviceCount")


def host_of(python: str) -> tuple[str, str]:
    """(sys.executable, its shared libpython or "") of another interpreter."""
    done = subprocess.run(
        [
            python,
            "-c",
            "import os, sys, sysconfig as s; v = s.get_config_var; print(sys.executable); "
            "print(os.path.join(v('LIBDIR'), v('INSTSONAME')) if v('Py_ENABLE_SHARED') else '')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    executable, libpython = done.stdout.splitlines()
    return executable, libpython


@pytest.mark.slow
def test_vendor_wheels_with_generated_standins(tmp_path: Path, cache_dir: str) -> None:
    """Every ELF of six real vendor wheels (3.12 site), their absent ROCm/CUDA/oneAPI libraries
    replaced by stand-ins generated from what they import, one stand-in missing one function:
    the static verdict against a real RTLD_NOW load under Python 3.12."""
    from support.postbuild.standins import build_standin, plan_standins
    from support.vendor import install_members, pinned_wheel

    python = find_python("3.12")
    if python is None:
        pytest.skip("no Python 3.12 on this machine: the wheels are built for it")
    site = tmp_path / "lib" / "python3.12" / "site-packages"
    for spec, name, digest in VENDOR_WHEELS:
        install_members(pinned_wheel(cache_dir, spec, name, digest, PIP_TARGET), site)
    executable, libpython = host_of(python)
    host = host_of_interpreter(executable, "3.12", libpython, True, "Python 3.12")
    inventory = build_inventory(resolve_roots([str(site)])[0])
    paths = sorted(r.path for r in inventory.by_kind(FileKind.SHARED_LIBRARY))

    identities = {r.path: r.identity for r in inventory.files}
    bare = Resolver(LoaderModel(host=HostView("/", known_elf_keys=inventory.elf_keys())), host, inventory)
    bare.prepare(paths)
    consumers = []
    for path in paths:
        scope = bare.scope(path)
        missing = [name for requester, name in scope.missing if requester == path]
        own = bare.references(path, identities[path]) or ()
        unbound = {ref.name for ref in bare.unbound(own, scope)}
        consumers.append((path, missing, {ref.name for ref in own} - unbound))
    plans = plan_standins(consumers)
    assert DROPPED[0] in plans and DROPPED[1] in plans[DROPPED[0]].symbols
    # ... and an older build: the first stand-in whose consumers ask for versioned symbols lacks
    # the first of them (its version node stays defined).
    drops = {DROPPED[0]: [DROPPED[1]]}
    versioned = sorted((soname, name) for soname, plan in plans.items() for name, (_k, v) in plan.symbols.items() if v)
    assert versioned, "no consumer asks a missing library for a versioned symbol"
    drops.setdefault(versioned[0][0], []).append(versioned[0][1])
    standins = tmp_path / "standins"
    for soname, plan in plans.items():
        build_standin(standins, plan, drop=drops.get(soname, []))

    loader = LoaderModel(ld_library_path=(str(standins),), host=HostView("/", known_elf_keys=inventory.elf_keys()))
    resolver = Resolver(loader, host, inventory)
    figures = compare(resolver, executable, paths, library_path=str(standins))
    print(figures.line(), sorted(figures.failing.items()))
    assert not figures.false_errors, figures.false_errors
    assert len(figures.unreported) + len(figures.other_reason) <= figures.fails // 100, figures
    # The stand-ins really take the loads to symbol resolution: the dropped function fails some.
    # The findings people read: one POST006 per library that really fails, naming what it lacks.
    reported = {f.path: f for f in symbol_findings(inventory, loader, host) if f.rule == "POST006"}
    assert sorted(reported) == sorted(figures.failing), sorted(reported)
    assert all(DROPPED[1] in f.data["missing"] or versioned[0][1] in f.data["missing"] for f in reported.values())
    named = set(figures.failing.values())
    assert DROPPED[1] in named and versioned[0][1] in named, figures.failing


def test_image_interpreter_read_from_its_files(tree: Path, tmp_path: Path) -> None:
    """An unpacked Debian-shaped root: /usr/bin/python3.11 (statically linked: its own exported
    symbols are the Python API) is read, never run (it is not even executable here); the abi3
    module from the 3.12 headers is named against Python 3.11 of the image."""
    interpreter = Path("/usr/bin/python3.11")
    if not interpreter.is_file():
        pytest.skip("no Debian python3.11 to lay into the root")
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    copied = root / "usr" / "bin" / "python3.11"
    copied.write_bytes(interpreter.read_bytes())
    copied.chmod(0o644)
    libs = root / "lib" / "x86_64-linux-gnu"
    libs.mkdir(parents=True)
    for name in ("libc.so.6", "libm.so.6", "libz.so.1", "libexpat.so.1", "ld-linux-x86-64.so.2"):
        (libs / name).write_bytes(Path("/lib/x86_64-linux-gnu", name).read_bytes())
    site = root / "usr" / "lib" / "python3" / "dist-packages"
    site.mkdir(parents=True)
    for module in ("_typed.abi3.so", "_fine" + sysconfig.get_config_var("EXT_SUFFIX")):
        (site / module).write_bytes((tree / "pkg" / module).read_bytes())
    outcome = run_check(
        [str(site)], CheckOptions(sysroot=str(root), skip=frozenset({"dedup", "verify-arch", "llvm", "prune"}))
    )
    found = [(f.rule, os.path.basename(f.path), f.data.get("interpreter")) for f in outcome.findings]
    assert found == [("POST007", "_typed.abi3.so", "3.11")], found
    (finding,) = outcome.findings
    assert "Python 3.11 of the image (/usr/bin/python3.11)" in finding.detail


@pytest.mark.parametrize("with_lone_user", [False, True], ids=["every-consumer-maps-it", "one-consumer-does-not"])
def test_an_underlinked_library_is_judged_in_every_load_that_maps_it(tmp_path: Path, with_lone_user: bool) -> None:
    """libunder.so uses dep_fn without needing libdep.so. A consumer that maps libdep.so too loads
    it; one that needs only libunder.so fails with 'undefined symbol: dep_fn' (real RTLD_NOW loads).
    POST006 stays quiet only when every load that maps libunder.so binds the name."""
    lib = tmp_path / SITE / "pkg" / "lib"
    origin = "-Wl,--enable-new-dtags,-rpath,$ORIGIN"
    build(lib / "libdep.so", "int dep_fn(void) { return 5; }\n", "-Wl,-soname,libdep.so")
    build(lib / "libunder.so", "int dep_fn(void);\nint u(void) { return dep_fn(); }\n", "-Wl,-soname,libunder.so")
    consumer = "int u(void);\nint uu(void) { return u(); }\n"
    build(lib / "libfull_user.so", consumer, f"-L{lib}", "-Wl,--no-as-needed", "-l:libdep.so", "-l:libunder.so", origin)
    if with_lone_user:
        build(lib / "liblone_user.so", consumer, f"-L{lib}", "-Wl,--no-as-needed", "-l:libunder.so", origin)
    real = {
        name: subprocess.run(
            [
                sys.executable,
                "-c",
                "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW)",
                str(lib / name),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stderr
        for name in ("libfull_user.so", "liblone_user.so")
        if (lib / name).exists()
    }
    assert real["libfull_user.so"] == ""
    assert ("undefined symbol: dep_fn" in real["liblone_user.so"]) if with_lone_user else "liblone_user.so" not in real
    reported = [os.path.basename(f.path) for f in check_findings(tmp_path / SITE).get("POST006", [])]
    assert reported == (["libunder.so"] if with_lone_user else [])
