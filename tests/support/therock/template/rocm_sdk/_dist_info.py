"""Distribution facts of the fixture's ROCm SDK (written from TheRock rocm_sdk/_dist_info.py's behaviour).

The fixture's packager appends ``__version__``, ``PY_PACKAGE_SUFFIX_NONCE``, the target families and, for a
kpack-split build, the ``rocm-sdk-libraries`` override, as TheRock's py_packaging.py ``Parameters`` does.
"""

from __future__ import annotations

import importlib.util
import os


class PackageEntry:
    """One distribution: logical name, dist-name template (``{target_family}`` if per family), pure package."""

    def __init__(
        self, logical_name: str, dist_package_template: str, *, pure_py_package_name: str, required: bool = False
    ) -> None:
        self.logical_name = logical_name
        self.dist_package_template = dist_package_template
        self.pure_py_package_name = pure_py_package_name
        self.required = required
        ALL_PACKAGES[logical_name] = self

    @property
    def is_target_specific(self) -> bool:
        return "{target_family}" in self.dist_package_template

    def get_dist_package_name(self, target_family: str | None = None) -> str:
        if self.is_target_specific and target_family is None:
            raise ValueError(f"{self.logical_name} is target specific")
        # Package names drop the xnack suffix (gfx942:xnack+ -> gfx942), as upstream.
        family = target_family.split(":")[0] if target_family is not None else ""
        return self.dist_package_template.format(target_family=family)

    def get_py_package_name(self, target_family: str | None = None) -> str:
        # The platform dir: "_" + dist name with "_" for "-" + the build's nonce (upstream PackageEntry).
        return "_" + self.get_dist_package_name(target_family).replace("-", "_") + PY_PACKAGE_SUFFIX_NONCE

    def has_py_package(self, target_family: str | None = None) -> bool:
        return importlib.util.find_spec(self.get_py_package_name(target_family)) is not None


class LibraryEntry:
    """A public library found by short name: package, relpath under the platform dir, glob."""

    def __init__(self, shortname: str, package_name: str, so_pattern: str, posix_relpath: str = "lib") -> None:
        self.shortname = shortname
        self.package = ALL_PACKAGES[package_name]
        self.so_pattern = so_pattern
        self.posix_relpath = posix_relpath
        ALL_LIBRARIES[shortname] = self


def determine_target_family() -> str:
    """ROCM_SDK_TARGET_FAMILY, else the default (the fixture has no offload-arch, so discovery finds nothing)."""
    family = os.getenv("ROCM_SDK_TARGET_FAMILY") or DEFAULT_TARGET_FAMILY
    if family not in AVAILABLE_TARGET_FAMILIES:
        raise ValueError(f"ROCM_SDK_TARGET_FAMILY={family} not available ({', '.join(AVAILABLE_TARGET_FAMILIES)})")
    return family


ALL_PACKAGES: dict[str, PackageEntry] = {}
ALL_LIBRARIES: dict[str, LibraryEntry] = {}

PackageEntry("meta", "rocm", pure_py_package_name="rocm_sdk", required=True)
PackageEntry("core", "rocm-sdk-core", pure_py_package_name="rocm_sdk_core", required=True)
PackageEntry("libraries", "rocm-sdk-libraries-{target_family}", pure_py_package_name="rocm_sdk_libraries")
PackageEntry("device", "rocm-sdk-device-{target_family}", pure_py_package_name="rocm_sdk_device")
PackageEntry("devel", "rocm-sdk-devel", pure_py_package_name="rocm_sdk_devel")
PackageEntry("profiler", "rocm-profiler", pure_py_package_name="rocm_profiler")

LibraryEntry("amdhip64", "core", "libamdhip64.so*")
LibraryEntry("hiprtc", "core", "libhiprtc.so*")
LibraryEntry("amd_comgr", "core", "libamd_comgr.so*")
LibraryEntry("rocm_kpack", "core", "librocm_kpack.so*")
LibraryEntry("rocm_sysdeps_liblzma", "core", "librocm_sysdeps_liblzma.so.*", "lib/rocm_sysdeps/lib")
LibraryEntry("rocm-openblas", "core", "librocm-openblas.so.*", "lib/host-math/lib")
LibraryEntry("hipblas", "libraries", "libhipblas.so*")
LibraryEntry("miopen", "libraries", "libMIOpen.so*")

__version__ = "DEFAULT"
PY_PACKAGE_SUFFIX_NONCE: str = "_DEFAULT"
DEFAULT_TARGET_FAMILY: str = "DEFAULT"
AVAILABLE_TARGET_FAMILIES: list[str] = []

# ---- lines appended by the fixture's packager follow ----
