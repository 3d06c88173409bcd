"""The vLLM patch of the head walk (listed in `vllm_hybridspec.patches.ALL_PATCHES`) and when it is applied.

The patched method lives in Model Runner V2's speculator package, which register() must not import (it runs in
every vLLM process, API server included). `apply_on_import()`, called by register(), applies the patch the
moment vLLM itself imports that module, which only a worker running a DSpark speculator does.
"""
from __future__ import annotations

import importlib.abc
import logging
import sys
import threading
from typing import Any, Callable

from vllm_hybridspec.patches.base import VllmPatch

logger = logging.getLogger("vllm.hybridspec")


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

_lock = threading.Lock()


def apply_on_import(vllm_version: str | None = None) -> None:
    """Applies UseHybridSpecHeadWalk once vLLM imports its target module (now, if it already has)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from vllm_hybridspec.versions import installed_vllm

    version = vllm_version or installed_vllm()[1]
    if Version(version) not in SpecifierSet(UseHybridSpecHeadWalk.vllm_versions):
        return
    module_name = UseHybridSpecHeadWalk.target.partition(":")[0]
    with _lock:
        if module_name in sys.modules:
            _apply()
        elif not any(isinstance(finder, _ApplyAfterImport) for finder in sys.meta_path):
            sys.meta_path.insert(0, _ApplyAfterImport(module_name))


def _apply() -> None:
    if not UseHybridSpecHeadWalk.is_applied():
        UseHybridSpecHeadWalk.apply()
        logger.debug("hybridspec: applied %s on import", UseHybridSpecHeadWalk.__name__)


class _ApplyAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of one module so that the patch follows its execution."""

    def __init__(self, module_name: str) -> None:
        self.module_name = module_name

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module_name:
            return None
        sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._loader
        with _lock:
            _apply()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
