"""A TheRock-faithful ROCm wheel-SDK install, built from first principles at test time.

    from support.therock import build_therock_install
    install = build_therock_install(tmp_path, nonce="", legacy_families=(), kpack=True)
    install.run_rocm_sdk("test"); install.split("per-tree"); install.preload_after_devel_hip()

See ``install.TheRockInstall`` for the API and ``BEHAVIOURS`` for what is reproduced and where upstream does it.
"""

from __future__ import annotations

from support.therock.install import SPLIT_KINDS, TheRockInstall, build_therock_install, cached_index

__all__ = ["BEHAVIOURS", "SPLIT_KINDS", "TheRockInstall", "build_therock_install", "cached_index"]

# Every TheRock behaviour the fixture reproduces -> the upstream file/function it follows (ROCm/TheRock 89553ce
# unless marked; py_packaging.py = build_tools/_therock_utils/py_packaging.py, rocm_sdk/ =
# build_tools/packaging/python/templates/rocm/src/rocm_sdk/). Reproduced by own code, none copied.
BEHAVIOURS: dict[str, str] = {
    "versioned libs + SONAME symlinks in build artifacts (name_component_family, stage prefix)": "build_tools/_therock_utils/artifacts.py (ArtifactName), CMake install layout",
    "artifact dirs hold artifact_manifest.txt (one stage prefix a line); comgr is part of amd-llvm"
    " (compiler/amd-comgr/stage), the kpack runtime is core-kpack": "build_tools/_therock_utils/artifacts.py"
    " ArtifactCatalog; compiler/artifact-amd-llvm.toml; core/artifact-core-kpack.toml",
    "base_lib_generic (base/aux-overlay/stage) holds dist_info.json and therock_manifest.json (flags."
    "KPACK_SPLIT_ARTIFACTS); a Linux build needs a profiler artifact": "base/aux-overlay/CMakeLists.txt;"
    " build_tools/build_python_packages.py load_therock_manifest / run",
    "core also takes core-hip's dev component, minus **/cmake/**; devel = runtime artifact names (profiler"
    " excluded) minus the test component": "build_tools/build_python_packages.py core_artifact_filter / run;"
    " py_packaging.py populate_devel_files",
    "runtime wheels hold no symlinks; only the SONAME file is materialised, other names -> soname_aliases": "py_packaging.py PopulatedDistPackage.populate_runtime_files / _populate_runtime_symlink",
    "dangling and directory symlinks dropped from runtime wheels": "py_packaging.py _populate_runtime_symlink",
    "executable symlinks become compiled exec stubs (dladdr-relative execv)": "py_packaging.py _populate_runtime_symlink; build_tools/_therock_utils/exe_stub_gen.py",
    "relpaths already materialised in a package are skipped": "py_packaging.py populate_runtime_files (files.has)",
    "DT_RPATH via patchelf --add-rpath then --set-rpath --force-rpath; $ORIGIN/../../_rocm_sdk_core/...": "py_packaging.py _extend_rpath / _normalize_rpath; build_tools/build_python_packages.py rpath_dep calls",
    "core rpaths lib/llvm/lib, lib/rocm_sysdeps/lib; libraries lib, sysdeps, host-math, llvm; device lib, sysdeps": "build_tools/build_python_packages.py run / _run_kpack_split",
    ".hsaco/.co classified by suffix, not as shared objects": "py_packaging.py get_file_type",
    "share/therock/dist_info.json with dist_amdgpu_targets; `rocm-sdk targets` prints it": "rocm_sdk/__main__.py _do_targets",
    "platform dir = '_' + dist name ('-' -> '_') + PY_PACKAGE_SUFFIX_NONCE verbatim (every tree renamed; CI's"
    " nonce is the bare run id: _rocm_sdk_core17154321)": "rocm_sdk/_dist_info.py PackageEntry.get_py_package_name;"
    " py_packaging.py Parameters (version_suffix); .github/workflows/multi_arch_build_native_linux_packages.yml"
    " (--version-suffix ARTIFACT_RUN_ID)",
    "_dist_info.py generated: __version__, nonce, families, kpack-split 'rocm-sdk-libraries' override": "py_packaging.py Parameters.__init__ / PopulatedDistPackage.__init__",
    "devel members: SONAME alias -> symlink to SONAME; materialised elsewhere -> '../'*N + platform dir + relpath;"
    " source symlink transcribed; else copy2": "py_packaging.py _populate_devel_file / _find_populated",
    "devel = generic artifacts only (no per-arch), platform tree stored as rocm_sdk_devel/_devel.tar[.xz];"
    " members in unsorted os.walk order (member_order='walk'; 'sorted'/'reverse' pin one)": "py_packaging.py"
    " populate_devel_files",
    "device wheels rocm-sdk-device-<arch> overlay _rocm_sdk_libraries (only package), Requires-Dist libraries==V;"
    " RECORD lists _rocm_sdk_libraries/__init__.py": "templates/rocm-sdk-device/setup.py; build_python_packages.py _run_kpack_split",
    "device files copied with rpath patching; .devel_links/<arch>.json {version, links:[{relpath, target}]}": "py_packaging.py populate_device_files / _emit_devel_links_manifest",
    "rocm meta with extras libraries, devel, device (the detected family; GPU-less: DEFAULT_TARGET_FAMILY),"
    " device-<arch>, device-all; console script rocm-sdk (no profiler extra: no rocm-profiler wheel here)": "templates/rocm/setup.py; rocm_sdk/_dist_info.py build_per_target_extras, determine_target_family (static"
    " wheel here, sdist upstream)",
    "legacy per-family rocm-sdk-libraries-<family> wheels (own platform dir, embedded device files, co-installable)": "build_tools/build_python_packages.py _run_legacy; templates/rocm-sdk-libraries/setup.py",
    "kpack split: HIPK wrapper in .hipFatBinSegment -> .rocm_kpack_ref {kpack_search_paths, kernel_name};"
    " .hip_fatbin NOBITS; .kpack/<artifact>_<arch>.kpack; generic .kpack/<artifact>.kpm": "stellaraccident/rocm-kpack ae4f1c2 python/rocm_kpack/artifact_splitter.py, binutils.py, kpack.py",
    "kpack TOC key = '<stage prefix>/<relpath in prefix>' (build path, e.g. the .so.5.0.0 file), kernel_name ="
    " artifact prefix, search path '../.kpack/<artifact>.kpm'": "rocm-kpack ae4f1c2 artifact_splitter.py",
    "init/path/test expand devel under fcntl.lockf on RECORD; rows 'path,,'; parent dirs rmtree'd on first touch;"
    " tarball unlinked last; done = _rocm_sdk_devel/__init__.py and no tarball": "rocm_sdk/_devel.py get_devel_root / _expand_devel_contents / _lock_and_expand",
    "member symlink -> hardlink when its target is an extracted file; seven bin/amd* kept; dir symlinks and"
    " aliases whose target is not yet extracted stay symlinks (member order)": "rocm_sdk/_devel.py _lock_and_expand",
    "_reconcile_device_links on every call; version match ignoring .postN; _devel_link_ok rejects symlinks and"
    " other inodes; RECORD rows deduplicated; .devel_reconcile.lock": "rocm_sdk/_devel.py _reconcile_device_links",
    "link targets (tarball symlinks, .devel_links targets) joined onto the parent's realpath with '..' collapsed"
    " before use": "rocm_sdk/_devel.py _resolve_link_target (29d0b362c, 'fixes #7537', PR 7541; not on main at"
    " 89553ce, whose _devel.py joins dest.parent / target: on Linux both name the same file)",
    "kpack_flow='gfxarch': reference '../.kpack/<artifact>_@GFXARCH@.kpack' + kernel_name '<prefix>/<build relpath>',"
    " TOC keys '<kernel_name>#<i>', no .kpm": "ROCm/rocm-systems shared/kpack python/rocm_kpack/artifact_splitter.py"
    " (compute_kpack_search_pattern, process_fat_binaries, inject_kpack_references), built by TheRock"
    " core/CMakeLists.txt (rocm-kpack from THEROCK_ROCM_SYSTEMS_SOURCE_DIR/shared/kpack)",
    "find_libraries (glob, first sorted match) and preload_libraries (ctypes.CDLL absolute path, RTLD_GLOBAL)": "rocm_sdk/__init__.py",
    "`rocm-sdk test`: base, libraries (each .so in a subprocess after preload amd_comgr, amdhip64, hiprtc,"
    " rocm_kpack), devel (layout, path, llvm symlink, .so loads, testLibrariesMirroredIntoDevel)": "rocm_sdk/__main__.py _do_test; rocm_sdk/tests/libraries_test.py, devel_test.py",
    "comgr registers an LLVM cl::opt 'spirv-expand-step' into libLLVM (DT_NEEDED); two inodes abort (#7818);"
    " libamdhip64 DT_NEEDED libamd_comgr.so.3": "https://github.com/ROCm/TheRock/issues/7818; formats.md 1.5, 3.2",
}
