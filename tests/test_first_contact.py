"""A new user's first five minutes, on a real application venv.

rocm-audit runs under this suite's interpreter (its own venv, as the README installs it); the
application is a Python 3.12 venv of real PyPI wheels pinned by sha256 (jax-rocm7 plugin and pjrt,
cupy-rocm-7-0, onnxruntime-rocm, triton 3.9.0, bitsandbytes, flydsl: 2.8 GB, 5,600 files). The
journey is the one the README walks: check, verify-arch (with mistyped targets), dedup --dry-run,
prune --dry-run, llvm --probe, scan --targets, image on an archive, a baseline. Each step asserts
what a person reads: exit codes, width, order, counts that agree, words, suggestions.

Marked ``journey`` (a 700 MB download once, a 2.8 GB venv per run): scripts/test runs it in CI and
with ROCM_AUDIT_JOURNEY=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.files import scratch_dir
from support.interpreters import python312
from support.vendor import APP_WHEELS, PIP_TARGET_312, pinned_wheel

pytestmark = pytest.mark.journey

WIDTH = 100
SEVERITY_ORDER = {"ERROR": 0, "WARNING": 1, "INFO": 2}
JARGON = ("fires:", "global-local", "global-global", "decided by", "first-global", "registrant")


@pytest.fixture(scope="module")
def app_venv(tmp_path_factory, cache_dir) -> Iterator[Path]:
    """The application venv: Python 3.12 with the pinned wheels, installed by its own pip."""
    interpreter = python312()
    if interpreter is None:
        pytest.skip("no working CPython 3.12 on this machine (the journey audits a 3.12 venv)")
    wheels = [pinned_wheel(cache_dir, spec, name, digest, PIP_TARGET_312) for spec, name, digest in APP_WHEELS]
    with scratch_dir(tmp_path_factory, "journey") as home:
        venv = home / "app"
        subprocess.run([interpreter, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        # This suite's pip installs into the 3.12 venv: the venv needs no pip of its own.
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps"]
            + ["--no-index", "--no-compile", *map(str, wheels)],
            check=True,
            timeout=900,
        )
        yield venv


def _rocm_audit(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it (not a terminal: no progress, no colour)."""
    script = Path(sys.executable).with_name("rocm-audit")
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_ARCH", "GITHUB_WORKSPACE")}
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=900, check=False, env=env, cwd=cwd
    )


def _site(venv: Path) -> Path:
    (site,) = venv.glob("lib/python3.12/site-packages")
    return site


def _assert_readable(text: str) -> None:
    """Every line fits 100 columns (a lone long path may not), errors come before warnings and
    warnings before info, and nothing internal leaks."""
    for line in text.splitlines():
        assert len(line) <= WIDTH or " " not in line.strip(), f"{len(line)} columns: {line!r}"
    ranks = [SEVERITY_ORDER[m.group(1)] for m in re.finditer(r"^(ERROR|WARNING|INFO) ", text, re.MULTILINE)]
    assert ranks == sorted(ranks), "findings are not ordered errors, warnings, info"
    for word in JARGON:
        assert word not in text, f"internal word {word!r} in default output"


def test_first_check_passes_and_reads_well(app_venv):
    python = str(app_venv / "bin" / "python")
    text_run = _rocm_audit("check", "--python", python)
    json_run = _rocm_audit("check", "--python", python, "--format", "json")
    # Nothing here is the user's error to fix: triton's test-library clash is a warning.
    assert text_run.returncode == 0, text_run.stdout + text_run.stderr
    text = text_run.stdout
    _assert_readable(text)
    site = os.path.realpath(_site(app_venv))
    assert text.splitlines()[0] == f"paths relative to {site}"
    assert site + "/" not in text, "a path under the audited root is shown absolute"
    report = json.loads(json_run.stdout)
    counts = {s: sum(1 for f in report["findings"] if f["severity"] == s) for s in ("error", "warning", "info")}
    last = text.rstrip("\n").splitlines()[-1]
    # One entry per cause: far fewer entries than findings, and every finding in one group; the
    # count line says how many entries the findings make.
    entries = re.findall(r"^(?:ERROR|WARNING|INFO) ", text, re.MULTILINE)
    groups = {f["group"] for f in report["findings"]}
    assert len(entries) == len(groups) < len(report["findings"])
    assert last == (
        f"check: {counts['error']} errors, {counts['warning']} warnings, {counts['info']} info".replace(
            " 1 errors", " 1 error"
        ).replace(" 1 warnings", " 1 warning")
        + f" (in {len(entries)} entries above)"
    )
    # The ROCm conclusion is one entry naming the library most files miss.
    rocm = [line for line in text.splitlines() if "needs ROCm libraries" in line]
    assert len(rocm) == 1 and "libamdhip64.so.7" in text
    # A test library's clash names who ships it and where to report it.
    clash = next(f for f in report["findings"] if f["rule"] == "LLVM002")
    assert clash["severity"] == "warning" and clash["data"]["opt_in_library"]
    assert clash["shipped_by"]["name"] == "triton" and clash["shipped_by"]["report_to"].startswith("https://")
    assert "shipped by triton 3.9.0" in text
    # Each such clash names every opt-in library it needs, and the verb agrees with their number
    # (triton 3.9.0 has one clash that needs two of them loaded together).
    for finding in (f for f in report["findings"] if f["data"].get("opt_in_library")):
        names = [os.path.basename(p) for p in finding["data"]["opt_in_library"]]
        verb = "is loaded" if len(names) == 1 else "are loaded"
        assert f"(only if {' and '.join(names)} {verb}:" in finding["message"], finding["message"]
    assert any(len(f["data"].get("opt_in_library", ())) == 2 for f in report["findings"])


def test_verbose_shows_the_detail(app_venv):
    text = _rocm_audit("check", "--python", str(app_venv / "bin" / "python"), "-v").stdout
    assert "fix:" in text and "libbitsandbytes_rocm64.so" in text
    for line in text.splitlines():
        assert len(line) <= WIDTH or " " not in line.strip()


def test_a_baseline_turns_todays_findings_green_and_a_new_one_red(app_venv, tmp_path):
    python = str(app_venv / "bin" / "python")
    baseline = tmp_path / "baseline.json"
    first = _rocm_audit("check", "--python", python, "--fail-on", "warning", "--write-baseline", str(baseline))
    assert first.returncode == 1  # warnings fail at --fail-on warning
    again = _rocm_audit("check", "--python", python, "--fail-on", "warning", "--baseline", str(baseline))
    assert again.returncode == 0, again.stdout
    assert re.search(r"^\d+ findings suppressed: \d+ by .*baseline\.json$", again.stdout, re.MULTILINE)
    # A new problem: an extension module built for another interpreter (POST003, an error).
    site = _site(app_venv)
    stray = site / "cupy" / "stray.cpython-311-x86_64-linux-gnu.so"
    shutil.copy2(next((site / "cupy" / "cuda").glob("cub.*.so")), stray)
    try:
        new = _rocm_audit("check", "--python", python, "--fail-on", "warning", "--baseline", str(baseline))
    finally:
        stray.unlink()
    assert new.returncode == 1
    findings = [line for line in new.stdout.splitlines() if re.match(r"(ERROR|WARNING|INFO) ", line)]
    # Only the new file's findings fail the run; the error is the ABI mismatch.
    assert findings and all(" cupy/stray.cpython-311-x86_64-linux-gnu.so: " in line for line in findings)
    assert findings[0].startswith("ERROR POST003 cupy/stray.cpython-311")


def test_dry_runs_change_nothing_and_fit(app_venv):
    python = str(app_venv / "bin" / "python")
    site = _site(app_venv)
    before = {p: p.lstat().st_ino for p in site.rglob("*.so*")}
    for args in (["dedup", "--dry-run"], ["prune", "--dry-run", "gfx942", "gfx950"]):
        run = _rocm_audit(*args, "--python", python)
        assert run.returncode == 0, run.stdout + run.stderr
        _assert_readable(run.stdout)
    assert {p: p.lstat().st_ino for p in site.rglob("*.so*")} == before
    prune = _rocm_audit("prune", "--dry-run", "gfx942", "gfx950", "--python", python).stdout
    assert re.search(r"device code [\d.,]+ [KMG]iB on disk", prune)


def test_scan_targets_is_one_line_per_file_with_a_count(app_venv):
    plugin = _site(app_venv) / "jax_plugins" / "xla_rocm7" / "xla_rocm_plugin.so"
    run = _rocm_audit("scan", "--targets", "-p", str(plugin))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) < 12, run.stdout
    _assert_readable(run.stdout)
    objects = int(re.search(r"([\d,]+) code objects for", run.stdout).group(1).replace(",", ""))
    assert objects > 1000
    assert re.search(rf"1 file, {objects:,} GPU code objects$", run.stdout, re.MULTILINE)


def test_probes_run_under_the_application_interpreter(app_venv):
    python = str(app_venv / "bin" / "python")
    run = _rocm_audit("llvm", "--probe", "--python", python, "--format", "json")
    report = json.loads(run.stdout)
    assert report["probe_interpreter"]["version"].startswith("3.12"), report["probe_interpreter"]
    inconclusive = [f for f in report["findings"] if f["rule"] == "LLVM008"]
    assert not inconclusive, inconclusive[:3]
    assert any(f["rule"] == "LLVM005" for f in report["findings"])  # the test library's abort, confirmed
    text = _rocm_audit("llvm", "--probe", "--python", python).stdout
    _assert_readable(text)
    assert "Probes ran under" in text and "not probed" not in text


def test_targets_as_users_type_them(app_venv):
    python = str(app_venv / "bin" / "python")
    typo = _rocm_audit("verify-arch", "gfx9500", "--python", python)
    assert typo.returncode == 2 and "did you mean gfx950?" in typo.stderr and not typo.stdout
    assert all(len(line) <= WIDTH for line in typo.stderr.splitlines())
    feature = _rocm_audit("verify-arch", "gfx942:xnack", "--python", python)
    assert feature.returncode == 2 and "gfx942:xnack+ or gfx942:xnack-" in feature.stderr
    product = _rocm_audit("verify-arch", "MI300X", "--python", python)
    assert product.returncode == 0 and "MI300X is gfx942" in product.stderr
    upper = _rocm_audit("verify-arch", "GFX942", "--python", python)
    assert upper.returncode == 0 and upper.stdout == product.stdout


def test_image_archive_takes_positional_targets(app_venv, tmp_path):
    from support.image.layer_writers import docker_save, layer

    site = _site(app_venv)
    prefix = "usr/local/lib/python3.12/site-packages/"
    entries = [
        (prefix + str(path.relative_to(site)), path.read_bytes())
        for path in sorted((site / "jax_rocm7_plugin").rglob("*"))
        if path.is_file() and not path.is_symlink()
    ]
    archive = docker_save(tmp_path / "app.tar", [layer(*entries)], tag="app/image:1")
    run = _rocm_audit("image", "--archive", str(archive), "gfx942", "gfx950")
    assert run.returncode in (0, 1), run.stderr
    assert "IMG001" not in run.stdout
    _assert_readable(run.stdout)
    assert "gfx942" in run.stdout and "gfx950" in run.stdout
    assert re.search(r"^image: \d+ errors?, \d+ warnings?, \d+ info( \(in \d+ entr(y|ies) above\))?$", run.stdout, re.M)


def test_image_of_the_application_reports_what_full_extraction_reports(app_venv, tmp_path):
    """The application's site-packages as one layer: keeping only the blocks the checks read
    (image/trim.py) gives the report of writing every byte, on less than half the disk."""
    from rocm_audit.image import merge
    from rocm_audit.image.audit import ImageOptions, extract_archive, new_state
    from support.image.layer_writers import docker_save_of_directories
    from support.image.reports import comparable

    archive = docker_save_of_directories(
        tmp_path / "app.tar", [[(_site(app_venv), "usr/local/lib/python3.12/site-packages")]]
    )
    reports = {}
    for mode in ("default", "full"):
        out = tmp_path / f"{mode}.json"
        args = ["image", "--archive", str(archive), "gfx942", "gfx950", "--format", "json", "-o", str(out)]
        run = _rocm_audit(*args, *(["--full"] if mode == "full" else []))
        assert run.returncode in (0, 1), run.stderr
        reports[mode] = comparable(out.read_text())
    assert reports["default"] == reports["full"]
    work = tmp_path / "work"
    work.mkdir()
    state = new_state(str(work), ImageOptions())
    extract_archive(str(archive), str(work), state)
    merge.finish(state)
    files = [os.path.join(d, f) for d, _, names in os.walk(state.root) for f in names]
    allocated = sum(os.lstat(p).st_blocks * 512 for p in files)
    assert allocated < archive.stat().st_size * 0.4, (allocated, archive.stat().st_size)
