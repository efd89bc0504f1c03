"""Load probes run under the audited interpreter (issue "First contact", item 3).

A Python extension module takes the CPython API from the process that loads it: an extension built
for 3.12 that uses PyType_FromMetaclass (new in 3.12) cannot be loaded by a 3.11 process. rocm-audit
runs under the test suite's interpreter (3.11 here); the audited venv is a real 3.12 venv, so a probe
that ran under rocm-audit's own interpreter would be inconclusive ("undefined symbol"). Each test
shows both sides: conclusive under the audited interpreter, inconclusive under rocm-audit's own.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rocm_audit.errors import UsageError
from rocm_audit.llvm.probes import _CHILD, LoadStep, ProbeVerdict, run_probe
from rocm_audit.output.text_sections import llvm_lines
from rocm_audit.tree.discovery import PROBE_MINIMUM, ChosenBy, interpreter_for
from support.interpreters import find_python
from support.llvm.llvm_builders import FAKE_LLVM, cc_shared
from support.vendor import triton39_wheel

PY312 = find_python("3.12")
needs_312 = pytest.mark.skipif(
    PY312 is None, reason="no Python 3.12 that runs (pyenv versions dir, `pyenv prefix 3.12`, PATH)"
)

# A miniature LLVM exporter that is also a cp312 extension module: the const pointer is a data
# relocation, bound when the library is loaded whatever the binding mode (RTLD_LAZY too).
EXTENSION_312 = (
    "#include <Python.h>\n"
    + FAKE_LLVM
    + r"""
PyObject *(*const rocm_audit_needs_312)(PyTypeObject *, PyObject *, PyType_Spec *, PyObject *) = PyType_FromMetaclass;
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fake312", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_fake312(void) { return PyModule_Create(&module); }
"""
)
EXTENSION_NAME = "fake312.cpython-312-x86_64-linux-gnu.so"


def _run(*argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, (argv, done.stderr)
    return done.stdout.strip()


def _venv_312(directory: Path) -> tuple[Path, Path]:
    """A real Python 3.12 venv (no pip); returns (its bin/python, its site-packages)."""
    assert PY312 is not None
    _run(PY312, "-m", "venv", "--without-pip", str(directory))
    python = directory / "bin" / "python"
    site = Path(_run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    return python, site


@pytest.fixture(scope="module")
def venv_312_with_extensions(tmp_path_factory) -> tuple[Path, Path, list[Path]]:
    """A 3.12 venv whose site-packages holds two builds of the extension (two sonames: two
    interposable LLVM exporters, a clash the probes must decide)."""
    python, site = _venv_312(tmp_path_factory.mktemp("app312") / "venv")
    include = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['include'])")
    built = [
        cc_shared(
            site / package / EXTENSION_NAME, EXTENSION_312, f"-I{include}", f"-Wl,-soname,libfake312-{package}.so"
        )
        for package in ("pkg_a", "pkg_b")
    ]
    return python, site, built


def _no_owner_copy(source: Path, destination: Path) -> Path:
    """Hardlinks of every file of ``source`` under a directory no interpreter owns."""
    for directory, _dirs, files in os.walk(source):
        for name in files:
            target = destination / Path(directory).relative_to(source) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(Path(directory) / name, target)
    return destination


def test_the_probe_child_is_python_3_6_code():
    # The child is sent with -c to whatever interpreter is audited (discovery.PROBE_MINIMUM).
    assert PROBE_MINIMUM == (3, 6)
    ast.parse(_CHILD, feature_version=PROBE_MINIMUM)


@pytest.mark.parametrize("version", ["3.6", "3.7", "3.8"])
def test_the_probe_child_runs_under_old_pythons(tmp_path, version):
    python = find_python(version)
    if python is None:
        pytest.skip(f"no Python {version} that runs")
    library = cc_shared(tmp_path / "libplain.so", "int rocm_audit_plain(void) { return 1; }\n")
    result = run_probe("local", [LoadStep(str(library), False)], python=python)
    assert result.verdict is ProbeVerdict.CLEAN, result.detail
    assert result.instances == 1


def test_a_python_too_old_for_the_probes_is_refused_or_passed_over(tmp_path):
    python = find_python("2.7")
    if python is None:
        pytest.skip("no Python 2.7 that runs")
    with pytest.raises(
        UsageError,
        match=r"^--python .*: Python 2\.7\.\d+ cannot run the load probes \(they need Python 3\.6 or newer\)$",
    ):
        interpreter_for(python, [])
    # the owner of a 2.7 site-packages (found from the directory) is passed over, and the reason said
    site = Path(
        subprocess.run(
            [python, "-c", "import site; print(site.getsitepackages()[0])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    )
    if not site.is_dir():
        pytest.skip(f"Python 2.7 at {python} has no site-packages directory")
    fallback = interpreter_for(None, [str(site)])
    assert fallback.chosen_by is ChosenBy.OWN and fallback.executable == sys.executable
    assert "too old" in fallback.reason and "Python 2.7" in fallback.reason


@needs_312
def test_the_probe_child_loads_a_312_extension_under_312_only(venv_312_with_extensions):
    python, _site, (extension, _other) = venv_312_with_extensions
    under_312 = run_probe("global", [LoadStep(str(extension), True)], python=str(python))
    assert under_312.verdict is ProbeVerdict.CLEAN, under_312.detail
    assert sys.version_info[:2] < (3, 12), "this test proves the difference only from an older interpreter"
    under_ours = run_probe("global", [LoadStep(str(extension), True)])
    assert under_ours.verdict is ProbeVerdict.LOAD_ERROR
    assert "undefined symbol: PyType_FromMetaclass" in under_ours.detail


def _probes(report: dict) -> list[dict]:
    return [p for clash in report["clashes"] for p in clash["probes"]]


@needs_312
def test_llvm_probe_runs_under_the_audited_interpreter(llvm_cli, venv_312_with_extensions, tmp_path):
    python, site, _built = venv_312_with_extensions
    named = llvm_cli("--python", str(python), "--probe", "--format", "json").report
    owned = llvm_cli("-p", str(site), "--probe", "--format", "json").report
    assert named["probe_interpreter"]["chosen_by"] == "--python"
    assert owned["probe_interpreter"]["chosen_by"] == "owner"
    for report in (named, owned):
        assert report["probe_interpreter"]["executable"] == str(python)  # the venv's, not the base one
        assert report["probe_interpreter"]["version"].startswith("3.12.")
        assert report["clashes"] and _probes(report)
        assert all(p["verdict"] not in ("load-error", "inconclusive") for p in _probes(report)), _probes(report)
        assert any(p["verdict"] == "abort" for p in _probes(report))
        assert "LLVM008" not in {f["rule"] for f in report["findings"]}
        assert all(c["confirmed"] for c in report["clashes"])
    # The same files where no interpreter owns them: rocm-audit's own (3.11) probes, and says so.
    copy = _no_owner_copy(site, tmp_path / "plain")
    own = llvm_cli("-p", str(copy), "--probe", "--format", "json").report
    assert own["probe_interpreter"]["chosen_by"] == "rocm-audit"
    assert own["probe_interpreter"]["executable"] == sys.executable
    assert {p["verdict"] for p in _probes(own)} == {"load-error"}
    inconclusive = [f for f in own["findings"] if f["rule"] == "LLVM008"]
    assert inconclusive and all("PyType_FromMetaclass" in f["message"] for f in inconclusive)
    version = ".".join(map(str, sys.version_info[:3]))
    said = f"Probes ran under {sys.executable} (Python {version}): rocm-audit's own:"
    assert said in " ".join(llvm_cli("-p", str(copy), "--probe").output.split())  # lines wrap at 100
    # the detailed text (verbose) of the same report: the clash line says its probes were inconclusive
    text = "\n".join(llvm_lines(own, verbose=1))
    assert said in text
    clash_lines = [line for line in text.splitlines() if "interposable-exporters, fires:" in line]
    assert clash_lines and all(line.endswith(", probes inconclusive") for line in clash_lines), clash_lines
    assert "not probed" not in text


# triton 3.9.0 for 3.12: the real case of the issue (30 LLVM008 "undefined symbol: PyType_FromMetaclass").
TRITON_MEMBERS = ("triton/_C/", "triton/instrumentation/", "triton/plugins/")


@pytest.fixture(scope="module")
def venv_312_with_triton(tmp_path_factory, cache_dir) -> tuple[Path, Path]:
    python, site = _venv_312(tmp_path_factory.mktemp("triton312") / "venv")
    with zipfile.ZipFile(triton39_wheel(cache_dir)) as wheel:
        members = [m for m in wheel.namelist() if m.startswith(TRITON_MEMBERS)]
        wheel.extractall(site, members)
    return python, site


@needs_312
@pytest.mark.vendor  # a real triton wheel in a 3.12 venv
def test_triton_for_312_probes_conclusively_under_its_venv(llvm_cli, venv_312_with_triton, tmp_path):
    python, site = venv_312_with_triton
    report = llvm_cli("--python", str(python), "--probe", "--format", "json").report
    assert report["probe_interpreter"]["executable"] == str(python)
    probes = _probes(report)
    assert probes and all(p["verdict"] not in ("load-error", "inconclusive") for p in probes), probes
    assert not [f for f in report["findings"] if "PyType_FromMetaclass" in f["message"]]
    # libGPUInstrumentationTestLib.so loaded RTLD_GLOBAL before libtriton.so: a real abort
    assert any(p["verdict"] == "abort" for p in probes)
    # rocm-audit's own interpreter over the same files: the probes cannot load libtriton.so
    own = llvm_cli("-p", str(_no_owner_copy(site, tmp_path / "plain")), "--probe", "--format", "json").report
    assert own["probe_interpreter"]["chosen_by"] == "rocm-audit"
    assert any(f["rule"] == "LLVM008" and "PyType_FromMetaclass" in f["message"] for f in own["findings"])
