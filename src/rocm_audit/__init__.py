"""rocm-audit: post-build auditor for ROCm wheel-SDK trees and container images."""

__version__ = "0.1.0"
