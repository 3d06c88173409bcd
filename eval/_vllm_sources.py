"""Run vLLM's own Triton kernels without vLLM: copy their source files out of the pinned wheel.

    from _vllm_sources import extract
    names = extract(["vllm/model_executor/layers/mamba/ops/causal_conv1d.py",
                     "vllm/third_party/flash_linear_attention/ops/fused_sigmoid_gating.py"], "/tmp/vsrc")
    sys.path.insert(0, "/tmp/vsrc"); mod = importlib.import_module(names["vllm.model_executor.layers.mamba.ops.causal_conv1d"])

Files keep their package path under a top-level package `vllm_extracted`. Imports of vLLM's Triton/platform
helpers are rewritten to a small shim (`vllm_extracted._shim`: triton, tl, tldevice, a CUDA-or-interpreter
`current_platform`, NULL_BLOCK_ID, PAD_SLOT_ID, ...); imports of other extracted files are rewritten to their new
names; relative imports stay as they are, so extract a module's relative dependencies too. A top-level import of
any other vLLM module is refused with the list of what is missing (indented, conditional imports are kept).
The copies are vLLM's code (Apache-2.0): keep `dest` in a git-ignored folder, never commit it.
"""
import re
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENDOR_TREE = REPO / ".vendor" / "vllm033"  # unpacked wheel: VENDOR_TREE/vllm/...
VENDOR_WHEEL_GLOB = "vllm-0.33.0-*.whl"
PACKAGE = "vllm_extracted"

SHIM = '''"""Stand-ins for the vLLM helpers that extracted kernel files import."""
import contextlib

import torch
import triton
import triton.language as tl
import triton.language.extra.libdevice as tldevice

NULL_BLOCK_ID = 0
PAD_SLOT_ID = -1
LOG2E = 1.4426950408889634
LOGE2 = 0.6931471805599453


class _Platform:
    """Answers as a CUDA machine without PDL; on a machine without CUDA (Triton interpreter) as a GPU too,
    so that files pick their Triton path rather than vLLM's CPU ops."""

    def is_cuda(self):
        return True

    def is_cuda_alike(self):
        return True

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cpu(self):
        return False

    def is_arch_support_pdl(self):
        return False

    def has_device_capability(self, capability, device_id=0):
        if not torch.cuda.is_available():
            return False
        major, minor = torch.cuda.get_device_capability(device_id)
        want = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return major * 10 + minor >= want

    def is_device_capability_family(self, capability, device_id=0):
        if not torch.cuda.is_available():
            return False
        major, _ = torch.cuda.get_device_capability(device_id)
        return major * 10 == capability // 10 * 10

    def get_device_capability(self, device_id=0):
        return torch.cuda.get_device_capability(device_id) if torch.cuda.is_available() else None


current_platform = _Platform()


def gpu_sync_allowed(*args, **kwargs):
    return contextlib.nullcontext()


def async_tensor_h2d(data, dtype=None, device=None, pin_memory=False, **kwargs):
    return torch.tensor(data, dtype=dtype, device=device)
'''
SHIM_NAMES = {
    "vllm.triton_utils": {"triton", "tl", "tldevice", "LOG2E", "LOGE2"},
    "vllm.platforms": {"current_platform"},
    "vllm.v1.attention.backends.utils": {"NULL_BLOCK_ID", "PAD_SLOT_ID"},
    "vllm.utils.gpu_sync_debug": {"gpu_sync_allowed"},
    "vllm.utils.torch_utils": {"async_tensor_h2d"},
}
_FROM_IMPORT = re.compile(r"^(?P<indent>\s*)from (?P<module>vllm(?:\.\w+)*) import (?P<names>.+)$")
_PLAIN_IMPORT = re.compile(r"^\s*import vllm\b")


def _module_name(path):
    """'vllm/a/b.py' or 'vllm.a.b' -> 'vllm.a.b'."""
    path = str(path)
    return path[: -len(".py")].replace("/", ".") if path.endswith(".py") else path


def _read_source(module):
    relative = module.replace(".", "/") + ".py"
    tree_file = VENDOR_TREE / relative
    if tree_file.exists():
        return tree_file.read_text()
    wheels = sorted((REPO / ".vendor").glob(VENDOR_WHEEL_GLOB))
    if not wheels:
        raise FileNotFoundError(f"neither {tree_file} nor a {VENDOR_WHEEL_GLOB} under {REPO / '.vendor'}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        return wheel.read(relative).decode()


def _rewrite(source, module, extracted):
    """Rewrite vLLM imports of one file; returns (text, unresolved top-level imports)."""
    lines, unresolved = [], []
    for line_no, line in enumerate(source.splitlines(), 1):
        match = _FROM_IMPORT.match(line)
        if match:
            target, names = match["module"], match["names"]
            imported = {n.strip().split(" as ")[0] for n in names.strip("() \\").split(",") if n.strip()}
            if target in extracted:
                line = f"{match['indent']}from {PACKAGE}{target[len('vllm'):]} import {names}"
            elif target in SHIM_NAMES and imported <= SHIM_NAMES[target]:
                line = f"{match['indent']}from {PACKAGE}._shim import {names}"
            elif not match["indent"]:
                unresolved.append(f"{module}:{line_no}: {line.strip()}")
        elif _PLAIN_IMPORT.match(line) and not line.startswith((" ", "\t")):
            unresolved.append(f"{module}:{line_no}: {line.strip()}")
        lines.append(line)
    return "\n".join(lines) + "\n", unresolved


def extract(module_paths, dest):
    """Copy vLLM modules (paths 'vllm/x/y.py' or dotted 'vllm.x.y') under dest/vllm_extracted.

    Returns {original dotted name: importable dotted name}; put `dest` on sys.path to import them.
    """
    modules = [_module_name(p) for p in module_paths]
    for module in modules:
        if not module.startswith("vllm."):
            raise ValueError(f"not a vLLM module: {module}")
    dest = Path(dest)
    root = dest / PACKAGE
    root.mkdir(parents=True, exist_ok=True)
    (root / "__init__.py").write_text('"""vLLM kernel sources copied by eval/_vllm_sources.py (do not commit)."""\n')
    (root / "_shim.py").write_text(SHIM)
    extracted, problems, names = set(modules), [], {}
    for module in modules:
        text, unresolved = _rewrite(_read_source(module), module, extracted)
        problems += unresolved
        parts = module.split(".")[1:]
        package_dir = root.joinpath(*parts[:-1])
        package_dir.mkdir(parents=True, exist_ok=True)
        for depth in range(len(parts) - 1):
            init = root.joinpath(*parts[: depth + 1], "__init__.py")
            if not init.exists():
                init.write_text("")
        (package_dir / f"{parts[-1]}.py").write_text(text)
        names[module] = PACKAGE + module[len("vllm"):]
    if problems:
        raise ImportError("extracted files import vLLM modules that were not extracted:\n  " + "\n  ".join(problems))
    return names


# The kernels of vLLM 0.33's GDN spec-decode path: conv + fused gating delta rule.
GDN_VERIFY_MODULES = [
    "vllm/model_executor/layers/mamba/ops/causal_conv1d.py",
    "vllm/third_party/flash_linear_attention/ops/fused_sigmoid_gating.py",
]


def extract_definitions(module_path, names, dest, out_name, preamble, replace=None):
    """Copy only the named top-level definitions (functions with their decorators, assignments) of one vLLM
    module into dest/vllm_extracted/<out_name>.py, after `preamble` (the caller's imports and stand-ins for
    what the definitions use). For modules whose top-level imports pull in half of vLLM (fused_moe.py).

    `replace` maps exact source lines (stripped) to their replacement (indentation kept), e.g. an indented
    vLLM import inside a function. Any vLLM import left in the copied text is refused.
    Returns the importable dotted name.
    """
    import ast
    module = _module_name(module_path)
    source = _read_source(module)
    tree = ast.parse(source)
    lines = source.splitlines()
    found = {}
    for node in tree.body:
        node_names = [node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else \
            [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        for name in node_names:
            if name in names:
                start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
                found[name] = "\n".join(lines[start - 1:node.end_lineno])
    missing = [n for n in names if n not in found]
    if missing:
        raise ImportError(f"{module} has no top-level definition(s) {missing}")
    body = "\n\n\n".join(found[n] for n in names)
    out_lines = []
    for line in body.splitlines():
        stripped = line.strip()
        if replace and stripped in replace:
            line = line[: len(line) - len(line.lstrip())] + replace[stripped]
        elif _FROM_IMPORT.match(line) or re.match(r"^\s*import vllm\b", line):
            raise ImportError(f"{module}: copied definitions import vLLM: {stripped}")
        out_lines.append(line)
    root = Path(dest) / PACKAGE
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "__init__.py").exists():
        (root / "__init__.py").write_text('"""vLLM kernel sources copied by eval/_vllm_sources.py (do not commit)."""\n')
    if not (root / "_shim.py").exists():
        (root / "_shim.py").write_text(SHIM)
    header = f'"""Definitions {", ".join(names)} copied from {module} (vLLM, Apache-2.0) by eval/_vllm_sources.py."""\n'
    (root / f"{out_name}.py").write_text(header + preamble.strip("\n") + "\n\n\n" + "\n".join(out_lines) + "\n")
    return f"{PACKAGE}.{out_name}"


def extract_wheel_files(prefix, dest_dir, accept=lambda name: True):
    """Copy data files of the wheel under `prefix` (e.g. the fused-MoE config folder) into dest_dir; returns
    the copied file names."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    copied = []
    tree_dir = VENDOR_TREE / prefix
    if tree_dir.is_dir():
        for f in sorted(tree_dir.iterdir()):
            if f.is_file() and accept(f.name):
                (dest_dir / f.name).write_bytes(f.read_bytes())
                copied.append(f.name)
        if copied:
            return copied
    wheels = sorted((REPO / ".vendor").glob(VENDOR_WHEEL_GLOB))
    if not wheels:
        raise FileNotFoundError(f"neither {tree_dir} nor a {VENDOR_WHEEL_GLOB} under {REPO / '.vendor'}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        for info in wheel.infolist():
            name = info.filename
            if name.startswith(prefix.rstrip("/") + "/") and not name.endswith("/"):
                base = name.rsplit("/", 1)[-1]
                if "/" not in name[len(prefix.rstrip("/")) + 1:] and accept(base):
                    (dest_dir / base).write_bytes(wheel.read(name))
                    copied.append(base)
    return copied


def fix_interpreter_masks():
    """Triton interpreter only: vLLM's causal_conv1d_update builds a mask as (int64 scalar < int) & bool tensor,
    which the interpreter keeps as int64 and then refuses in tl.load/tl.store ('mask has unsupported dtype');
    compiled Triton reads it as a boolean. Casts every interpreted load/store mask to bool (idempotent)."""
    import numpy as np
    import triton.runtime.interpreter as interpreter

    native = interpreter._interpreter
    if getattr(native, "_hybridspec_bool_masks", False):
        return
    load, store = native.load, native.store
    native.load = lambda ptrs, mask, other, dtype: load(ptrs, mask.astype(np.bool_), other, dtype)
    native.store = lambda ptrs, value, mask: store(ptrs, value, mask.astype(np.bool_))
    native._hybridspec_bool_masks = True


if __name__ == "__main__":
    out = extract(GDN_VERIFY_MODULES, sys.argv[1] if len(sys.argv) > 1 else REPO / ".vendor" / "extracted")
    print("\n".join(f"{k} -> {v}" for k, v in out.items()))

