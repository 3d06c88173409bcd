"""Applying patches when vLLM imports a module (for targets too heavy for register() to import).

`apply_when_imported(module_name, callback)` runs `callback()` right after `module_name` has executed (now, when
it already has): a `sys.meta_path` finder that finds nothing itself wraps the module's real loader once.
`apply_patches_when_imported(patches)` is the usual use: it applies the given `on_demand` patches (those not yet
applied) when vLLM imports their target module, if the running vLLM is in their version range.
"""
from __future__ import annotations

import dataclasses
import importlib.abc
import logging
import sys
import threading
from typing import Any, Callable, Sequence

from vllm_hybridspec.patches.base import VllmPatch

logger = logging.getLogger("vllm.hybridspec")

_lock = threading.RLock()


def apply_when_imported(module_name: str, callback: Callable[[], None]) -> None:
    """Calls `callback()` once `module_name` is imported (now, if it already is); an equal callback only once."""
    with _lock:
        if module_name in sys.modules:
            callback()
            return
        for finder in sys.meta_path:
            if isinstance(finder, _ApplyAfterImport) and finder.module_name == module_name:
                if callback not in finder.callbacks:
                    finder.callbacks.append(callback)
                return
        sys.meta_path.insert(0, _ApplyAfterImport(module_name, [callback]))


@dataclasses.dataclass(frozen=True)
class _ApplyPatches:
    patches: tuple[type[VllmPatch], ...]

    def __call__(self) -> None:
        for patch in self.patches:
            if not patch.is_applied():
                patch.apply()
                logger.debug("hybridspec: applied %s on import", patch.__name__)


def apply_patches_when_imported(patches: Sequence[type[VllmPatch]], vllm_version: str | None = None) -> None:
    """Applies `patches` when vLLM imports their target module (one module for all of them), if the running
    vLLM (or `vllm_version`) is in every patch's `vllm_versions`."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from vllm_hybridspec.versions import installed_vllm

    version = vllm_version or installed_vllm()[1]
    if any(Version(version) not in SpecifierSet(patch.vllm_versions) for patch in patches):
        return
    module_names = {patch.target.partition(":")[0] for patch in patches}
    if len(module_names) != 1:
        raise ValueError(f"patches with different target modules: {sorted(module_names)}")
    apply_when_imported(module_names.pop(), _ApplyPatches(tuple(patches)))


class _ApplyAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of one module so that the callbacks follow its execution."""

    def __init__(self, module_name: str, callbacks: list[Callable[[], None]]) -> None:
        self.module_name = module_name
        self.callbacks = callbacks

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
        spec.loader = _PatchingLoader(spec.loader, self.callbacks)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, callbacks: list[Callable[[], None]]) -> None:
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._loader
        with _lock:
            for callback in self._callbacks:
                callback()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
