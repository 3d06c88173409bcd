"""The vLLM patch of the head walk (listed in `vllm_hybridspec.patches.ALL_PATCHES`) and when it is applied.

The patched method lives in Model Runner V2's speculator package, which register() must not import (it runs in
every vLLM process, API server included). `apply_on_import()`, called by register(), applies the patch the
moment vLLM itself imports that module, which only a worker running a DSpark speculator does.
"""
from __future__ import annotations

from typing import Any, Callable

from vllm_hybridspec.patches.base import VllmPatch
from vllm_hybridspec.patches.on_import import apply_patches_when_imported


class UseHybridSpecHeadWalk(VllmPatch):
    target = "vllm.v1.worker.gpu.spec_decode.dspark.speculator:DSparkSpeculator._sample_sequential"
    what = ("walks DSpark's Markov head with the resident-W2 megakernel (or its reference), filling the drafts, "
            "the draft logits cache, acceptance estimates and confidences as vLLM's loop does; applied when vLLM "
            "imports the DSpark speculator")
    why = ("vLLM 0.32 has no hook for the walk; 0.33's `sample_sequential` hook is read from the draft model "
           "instance, which a plugin cannot reach without a second patch. The replacement keeps that hook's "
           "contract and runs vLLM's method (hook included) whenever it declines")
    vllm_versions = ">=0.32,<0.34"
    process = "worker"
    on_demand = True

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def _sample_sequential(self: Any, num_reqs: int, head_hidden: Any) -> None:
            from vllm_hybridspec.head_walk.walk import sample_sequential

            if not sample_sequential(self, num_reqs, head_hidden):
                original(self, num_reqs, head_hidden)

        return _sample_sequential


HEAD_WALK_PATCHES: list[type[VllmPatch]] = [UseHybridSpecHeadWalk]

def apply_on_import(vllm_version: str | None = None) -> None:
    """Applies UseHybridSpecHeadWalk once vLLM imports its target module (now, if it already has)."""
    apply_patches_when_imported(HEAD_WALK_PATCHES, vllm_version)
