"""The patch manifest, and a static check of the patch targets in another vLLM source tree.

    python -m vllm_hybridspec.patches                        # the manifest as a Markdown table
    python -m vllm_hybridspec.patches --check-sources DIR    # DIR: a `vllm` package folder (e.g. an unpacked wheel)

`--check-sources` reads DIR's version from DIR/_version.py (or DIR/version.py) and, for every patch whose
`vllm_versions` admits it and every vLLM method our subclasses override (`OVERRIDES`), finds the target in DIR by
parsing the files (module file, class, method or function, following `from x import name` re-exports and base
classes) and compares its parameter list, decorators and return annotation with the same target in the installed
vLLM. It also checks that every name our package imports from vLLM (`from vllm.x import y`, lazy ones too) exists
in DIR. Nothing in DIR is imported or executed, so a GPU build's sources can be checked on a CPU machine.
Exit status: 0 when every target has the installed signature and every import resolves, 1 otherwise."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

_MAX_HOPS = 8  # re-exports and base classes followed before giving up (vLLM's chains are 1-2 long)


@dataclasses.dataclass(frozen=True)
class Definition:
    """Where a target is defined and how it is called, as written in the source."""

    file: Path
    line: int
    signature: str  # decorators, parameters, return: "@staticmethod (x, *, mode=...) -> int"; "" for no function


@dataclasses.dataclass(frozen=True)
class Finding:
    patch: str
    target: str
    problem: str  # "missing" or "signature"
    detail: str


@dataclasses.dataclass(frozen=True)
class Override:
    """A vLLM method that one of our subclasses overrides: it binds us like a patch target, but no patch names it."""

    target: str
    name: str  # our subclass
    vllm_versions: str = ">=0.32,<0.34"


_GDN_LAYER = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn:QwenGatedDeltaNetAttention"
_GDN_BUILDER = "vllm.v1.attention.backends.gdn_attn:GDNAttentionMetadataBuilder"
_ADAPTIVE = "vllm.v1.worker.gpu.spec_decode.adaptive_verification:AdaptiveVerificationManager"
OVERRIDES = (
    *(Override(f"{_GDN_LAYER}.{method}", "BlockParallelGatedDeltaNet (gdn/layer.py)") for method in (
        "__init__", "get_state_shape", "get_kv_cache_spec", "get_attn_backend", "forward_cpu", "_forward_core")),
    *(Override(f"{_GDN_BUILDER}.{method}", "BlockParallelGDNMetadataBuilder (gdn/backend.py)") for method in (
        "__init__", "build", "update_block_table", "get_varlen_cudagraph_max_query_len")),
    *(Override(f"vllm.v1.attention.backends.gdn_attn:GDNAttentionBackend.{method}",
               "BlockParallelGDNBackend (gdn/backend.py)") for method in (
        "get_builder_cls", "supports_device_cpu_query_lens_mismatch")),
    *(Override(f"{_ADAPTIVE}.{method}", "HybridSpecVerificationManager (adaptive/manager.py)") for method in (
        "__init__", "set_cost_curves", "record_confidences", "get_num_tokens", "reallocate_drafts")),
)


def source_version(vllm_dir: Path) -> str:
    """The `__version__` string constant of DIR/_version.py or DIR/version.py (read, not imported)."""
    for name in ("_version.py", "version.py"):
        path = vllm_dir / name
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and isinstance(getattr(node.value, "value", None), str):
                if any(isinstance(t, ast.Name) and t.id in ("__version__", "version") for t in node.targets):
                    return node.value.value
    raise ValueError(f"{vllm_dir}: no __version__ string in _version.py or version.py (is it a `vllm` package folder?)")


def _module_file(vllm_dir: Path, module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != "vllm":
        return None
    base = vllm_dir.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _statements(body: list[ast.stmt]):
    """The statements of a module or class body, with those under `if` / `try` (optional imports, platform
    branches). Where the last binding wins, the `if` branch and the `try` body win over `else` and the handlers
    (they are yielded last): the branch a CUDA build with its optional packages takes."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _statements(node.orelse)
            yield from _statements(node.body)
        elif isinstance(node, ast.Try):
            for block in (*(handler.body for handler in node.handlers), node.body, node.orelse, node.finalbody):
                yield from _statements(block)
        else:
            yield node


def _signature(node: ast.AST) -> str:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return ""
    decorators = " ".join("@" + ast.unparse(d) for d in node.decorator_list)
    args = node.args
    positional = args.posonlyargs + args.args
    first_default = len(positional) - len(args.defaults)
    params = []
    for i, arg in enumerate(positional):
        params.append(arg.arg + ("=..." if i >= first_default else ""))
        if args.posonlyargs and i == len(args.posonlyargs) - 1:
            params.append("/")
    if args.vararg:
        params.append("*" + args.vararg.arg)
    elif args.kwonlyargs:
        params.append("*")
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        params.append(arg.arg + ("=..." if default is not None else ""))
    if args.kwarg:
        params.append("**" + args.kwarg.arg)
    prefix = "async " if isinstance(node, ast.AsyncFunctionDef) else ""
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""  # 0.33 grew a 4th return value
    return f"{decorators + ' ' if decorators else ''}{prefix}({', '.join(params)}){returns}"


class SourceTree:
    """Static lookups in one `vllm` package folder."""

    def __init__(self, vllm_dir: Path) -> None:
        self.vllm_dir = vllm_dir
        self._parsed: dict[Path, ast.Module] = {}

    def _parse(self, path: Path) -> ast.Module:
        if path not in self._parsed:
            self._parsed[path] = ast.parse(path.read_text(), filename=str(path))
        return self._parsed[path]

    def _binding(self, module: str, name: str, hops: int) -> tuple[Path, ast.AST] | None:
        """The class / function / assignment that `name` is bound to at the top level of `module`."""
        path = _module_file(self.vllm_dir, module)
        if path is None or hops > _MAX_HOPS:
            return None
        found = None
        for node in _statements(self._parse(path).body):  # the last binding wins, as at run time
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                found = (path, node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    found = (path, node)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    source = _absolute(module, path.name == "__init__.py", node)
                    if (alias.asname or alias.name) == name:
                        found = self._binding(source, alias.name, hops + 1) or (path, node)
                    elif alias.name == "*":  # `from .parallel_state import *` (vllm/distributed/__init__.py)
                        found = self._binding(source, name, hops + 1) or found
        return found

    def _member(self, module: str, cls: ast.ClassDef, name: str, hops: int) -> tuple[Path, ast.AST] | None:
        """`name` in the class body, else in its bases (looked up in the class's module), in MRO-ish order."""
        path = _module_file(self.vllm_dir, module)
        for node in _statements(cls.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return path, node
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return path, node
        if hops > _MAX_HOPS:
            return None
        for base in cls.bases:
            if isinstance(base, ast.Subscript):  # a generic: `Builder[Metadata]`
                base = base.value
            if not isinstance(base, ast.Name):
                continue  # `module.Class` bases: not followed (none among our targets)
            bound = self._class_in(module, base.id, hops + 1)
            if bound is not None:
                found = self._member(bound[0], bound[1], name, hops + 1)
                if found is not None:
                    return found
        return None

    def _class_in(self, module: str, name: str, hops: int) -> tuple[str, ast.ClassDef] | None:
        """(module that defines it, class node) for a class name visible at the top level of `module`."""
        path = _module_file(self.vllm_dir, module)
        if path is None or hops > _MAX_HOPS:
            return None
        result = None
        for node in _statements(self._parse(path).body):
            if isinstance(node, ast.ClassDef) and node.name == name:
                result = (module, node)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, path.name == "__init__.py", node)
                        result = self._class_in(source, alias.name, hops + 1)
        return result

    def resolve(self, target: str) -> Definition | None:
        """The definition of "module:Attr" or "module:Class.attr", or None where it does not exist."""
        module, _, qualname = target.partition(":")
        first, *rest = qualname.split(".")
        if not rest:
            bound = self._binding(module, first, 0)
        else:
            located = self._class_in(module, first, 0)
            bound = None
            for part in rest:
                if located is None:
                    return None
                bound = self._member(located[0], located[1], part, 0)
                located = None
                if bound is not None and isinstance(bound[1], ast.ClassDef):
                    located = (module, bound[1])
        if bound is None or isinstance(bound[1], ast.ImportFrom):  # imported from outside vLLM: not checkable
            return None
        path, node = bound
        return Definition(path, node.lineno, _signature(node))


def check_sources(vllm_dir: Path, reference_dir: Path, patches=None) -> tuple[str, list[Finding], list[str]]:
    """(DIR's version, findings, checked lines) for the patches (default: ALL_PATCHES and OVERRIDES) whose
    vllm_versions admit DIR's version.

    A checked line names the patch and where its target is defined in DIR and in the reference tree."""
    if patches is None:
        from vllm_hybridspec.patches import ALL_PATCHES

        patches = [*ALL_PATCHES, *OVERRIDES]
    version = source_version(vllm_dir)
    try:
        parsed = Version(version)
    except InvalidVersion as error:
        raise ValueError(f"{vllm_dir}: version {version!r} is not a PEP 440 version") from error
    tree, reference = SourceTree(vllm_dir), SourceTree(reference_dir)
    findings, checked = [], []
    for patch in patches:
        if parsed not in SpecifierSet(patch.vllm_versions):
            continue
        name = getattr(patch, "__name__", None) or patch.name
        found, expected = tree.resolve(patch.target), reference.resolve(patch.target)
        checked.append(f"{name} {patch.target}: {_where(found) if found else 'missing'}; installed "
                       f"{_where(expected) if expected else 'missing'}")
        if found is None:
            findings.append(Finding(name, patch.target, "missing", f"not found under {vllm_dir}"))
            continue
        if expected is None:
            findings.append(Finding(name, patch.target, "missing",
                                    f"not found in the installed vLLM ({reference_dir}), found at {_where(found)}"))
        elif found.signature != expected.signature:
            findings.append(Finding(name, patch.target, "signature",
                                    f"{_where(found)}: {found.signature or 'not a function'}; installed "
                                    f"{_where(expected)}: {expected.signature or 'not a function'}"))
    return version, findings, checked


def vllm_imports(package_dir: Path) -> list[tuple[str, str, str]]:
    """(file, module, name) of every absolute `from vllm... import name` in our package, lazy ones included."""
    found = set()
    for path in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "vllm":
                relative = path.relative_to(package_dir.parent).as_posix()
                found.update((relative, node.module, alias.name) for alias in node.names)
    return sorted(found)


def missing_imports(vllm_dir: Path, package_dir: Path | None = None) -> tuple[int, list[Finding]]:
    """(number of distinct imported vLLM names, those neither bound in their module nor a submodule in DIR)."""
    package_dir = package_dir or Path(__file__).resolve().parents[1]
    tree = SourceTree(vllm_dir)
    names, findings = set(), []
    for file, module, name in vllm_imports(package_dir):
        names.add((module, name))
        if _module_file(vllm_dir, f"{module}.{name}") is None and tree._binding(module, name, 0) is None:
            findings.append(Finding(f"import in {file}", f"{module}:{name}", "missing import", "not found"))
    return len(names), findings


def _where(definition: Definition) -> str:
    parts = definition.file.parts
    inner = parts[len(parts) - 1 - parts[::-1].index("vllm"):] if "vllm" in parts else parts
    return f"{'/'.join(inner)}:{definition.line}"


def _installed_vllm_dir() -> Path:
    from vllm_hybridspec.head_walk.upstream import installed_vllm_dir

    found = installed_vllm_dir()
    if found is None:
        raise SystemExit("--check-sources compares with the installed vLLM, and none is importable")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_hybridspec.patches", description=__doc__.split("\n")[0])
    parser.add_argument("--check-sources", metavar="DIR", type=Path,
                        help="a `vllm` package folder whose patch targets to compare with the installed vLLM's")
    args = parser.parse_args(argv)
    if args.check_sources is None:
        from vllm_hybridspec.patches import manifest_table

        print(manifest_table())
        return 0
    reference_dir = _installed_vllm_dir()
    try:
        version, findings, checked = check_sources(args.check_sources, reference_dir)
    except (ValueError, OSError, SyntaxError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    num_imports, import_findings = missing_imports(args.check_sources)
    print(f"vLLM {version} at {args.check_sources} against the installed vLLM at {reference_dir}: "
          f"{len(checked)} patch targets and overridden methods in range, {len(findings)} findings; "
          f"{num_imports} names vllm_hybridspec imports from vLLM, {len(import_findings)} missing")
    for line in checked:
        print(f"checked: {line}")
    for finding in findings + import_findings:
        print(f"{finding.problem}: {finding.patch} {finding.target}: {finding.detail}")
    return 1 if findings or import_findings else 0


if __name__ == "__main__":
    sys.exit(main())
