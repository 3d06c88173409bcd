"""Scripts of eval/ loaded as modules for tests (eval/ is not a package, and the repo root never goes on
sys.path: it holds the kernel folder `triton_kernels/`)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EVAL = Path(__file__).resolve().parent.parent / "eval"


def load_eval_module(name: str):
    """`eval/<name>.py` as module `name`, loaded once; eval/ goes on sys.path for its sibling imports."""
    if str(EVAL) not in sys.path:
        sys.path.insert(0, str(EVAL))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EVAL / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
