"""`VllmPatch`: one class per patched vLLM attribute (the pattern of ArcticInference and vllm-ascend)."""
from __future__ import annotations

import functools
import importlib
import logging
from typing import Any, Callable, ClassVar

logger = logging.getLogger("vllm.hybridspec")

PROCESSES = ("all", "frontend", "engine core", "worker")
_MARKER = "__hybridspec_patch__"


class PatchError(RuntimeError):
    pass


class VllmPatch:
    """Replaces one vLLM attribute; keeps the original; refuses to patch twice; can be reverted.

    Subclasses fill the class attributes (they also make up the manifest) and implement `replacement`.
    The class itself is the patch: its state is class-level, one patched symbol per class.
    """

    target: ClassVar[str]         # "module.path:Attr" or "module.path:Class.attr"
    what: ClassVar[str]           # one line: what the replacement does
    why: ClassVar[str]            # one line: why vLLM's own hooks do not suffice
    vllm_versions: ClassVar[str]  # PEP 440 specifier the target was read in, e.g. ">=0.32,<0.34"
    process: ClassVar[str]        # where the patched code runs: one of PROCESSES
    # True: `apply_all` (register()) leaves it alone; the component applies it when it first acts, because its
    # target module is too heavy for register() (e.g. the model runners), or has it applied when vLLM imports that
    # module (`vllm_hybridspec.patches.on_import.apply_patches_when_imported`). It stays in the manifest.
    on_demand: ClassVar[bool] = False

    _applied: ClassVar[bool] = False
    # (owner, attribute, raw original as found in owner.__dict__ or None when inherited). A tuple, because a
    # staticmethod stored directly as a class attribute would be unwrapped on access.
    _saved: ClassVar[tuple[Any, str, Any] | None] = None
    _original_function: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("target", "what", "why", "vllm_versions", "process"):
            if not getattr(cls, name, ""):
                raise TypeError(f"{cls.__name__}: patch class must set `{name}`")
        if cls.process not in PROCESSES:
            raise TypeError(f"{cls.__name__}.process: {cls.process!r} is not one of {PROCESSES}")
        if ":" not in cls.target:
            raise TypeError(f"{cls.__name__}.target: expected 'module:attr', got {cls.target!r}")
        cls._applied, cls._saved = False, None

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        """Returns the function that replaces `original` (a plain function, with `self` first for methods).

        It must behave exactly like `original` unless hybridspec is enabled for the engine at hand; check
        with `vllm_hybridspec.config.hybridspec_config_from_vllm_config(vllm_config)`.
        """
        raise NotImplementedError

    @classmethod
    def resolve(cls) -> tuple[Any, str]:
        """(owner object, attribute name) of the target; imports the target module."""
        module_name, _, path = cls.target.partition(":")
        owner: Any = importlib.import_module(module_name)
        *parents, attribute = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        if not hasattr(owner, attribute):
            raise PatchError(f"{cls.__name__}: {cls.target} does not exist in this vLLM")
        return owner, attribute

    @classmethod
    def is_applied(cls) -> bool:
        return cls._applied

    @classmethod
    def apply(cls) -> None:
        if cls._applied:
            raise PatchError(f"{cls.__name__}: already applied to {cls.target}")
        owner, attribute = cls.resolve()
        raw = owner.__dict__.get(attribute) if hasattr(owner, "__dict__") else None
        current = getattr(owner, attribute)
        holder = getattr(current, _MARKER, None) or getattr(getattr(current, "__func__", None), _MARKER, None)
        if holder is not None:
            raise PatchError(f"{cls.__name__}: {cls.target} is already patched by {holder}")

        wrapper_type = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        original = raw.__func__ if wrapper_type else current
        new = cls.replacement(original)
        if callable(original) and callable(new):
            functools.update_wrapper(new, original)
        setattr(new, _MARKER, cls.__name__)
        setattr(owner, attribute, wrapper_type(new) if wrapper_type else new)

        cls._saved = (owner, attribute, raw)
        cls._original_function = original
        cls._applied = True
        logger.debug("hybridspec patched %s (%s)", cls.target, cls.__name__)

    @classmethod
    def revert(cls) -> None:
        """Puts the original back (tests); a no-op when not applied."""
        if not cls._applied:
            return
        owner, attribute, raw = cls._saved
        if raw is not None:
            setattr(owner, attribute, raw)
        else:  # the attribute was inherited: drop ours so lookup reaches the parent again
            delattr(owner, attribute)
        cls._applied, cls._saved = False, None

    @classmethod
    def original(cls) -> Any:
        """The unpatched attribute (unwrapped from staticmethod/classmethod)."""
        if not cls._applied:
            owner, attribute = cls.resolve()
            return getattr(owner, attribute)
        return cls._original_function
