"""`python -m vllm_hybridspec.patches --check-sources DIR`: static lookup of the patch targets in a vLLM tree."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_hybridspec.head_walk.upstream import installed_vllm_dir
from vllm_hybridspec.patches import ALL_PATCHES
from vllm_hybridspec.patches.__main__ import (
    OVERRIDES, SourceTree, check_sources, main, missing_imports, source_version,
)

INSTALLED = installed_vllm_dir()


def _write(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _copy_of_installed_targets(tmp_path: Path) -> Path:
    """The installed vLLM's files that the targets resolve through (re-exports, bases), nothing else."""
    reference = SourceTree(INSTALLED)
    for patch in (*ALL_PATCHES, *OVERRIDES):
        assert reference.resolve(patch.target) is not None, patch.target
    fake = tmp_path / "vllm"
    for path in reference._parsed:
        destination = fake / path.relative_to(INSTALLED)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
    shutil.copyfile(INSTALLED / "_version.py", fake / "_version.py")
    return fake


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def test_installed_sources_are_clean():
    version, findings, checked = check_sources(INSTALLED, INSTALLED)
    assert findings == []
    assert len(checked) == len(ALL_PATCHES) + len(OVERRIDES)
    num_imports, missing = missing_imports(INSTALLED)
    assert num_imports > 20 and missing == []


def test_reports_a_vllm_import_that_is_gone(tmp_path):
    package = _write(tmp_path / "ours", {"mod.py": (
        "def f():\n    from vllm.pkg import helper, gone\n    from vllm import sub\n    from . import local\n")})
    tree = _write(tmp_path / "vllm", {"pkg/__init__.py": "def helper():\n    pass\n", "sub.py": ""})
    num_imports, missing = missing_imports(tree, package)
    assert num_imports == 3
    assert [(m.patch, m.target, m.problem) for m in missing] == [("import in ours/mod.py", "vllm.pkg:gone",
                                                                   "missing import")]


def test_cli_on_installed_sources_exits_zero():
    result = subprocess.run([sys.executable, "-m", "vllm_hybridspec.patches", "--check-sources", str(INSTALLED)],
                            capture_output=True, text=True, env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 findings" in result.stdout


def test_reports_a_missing_target_and_a_changed_signature(tmp_path, capsys):
    fake = _copy_of_installed_targets(tmp_path)
    _edit(fake / "v1/worker/gpu/model_states/mamba_hybrid.py", "def postprocess_state(", "def postprocess_state_v2(")
    _edit(fake / "v1/worker/gpu/spec_decode/adaptive_verification.py", "def resolve_adaptive_cudagraph_mode(",
          "def resolve_adaptive_cudagraph_mode(added_first, ")

    assert main(["--check-sources", str(fake)]) == 1
    out = capsys.readouterr().out
    assert "missing: CommitAcceptedGdnStateMRV2" in out
    signature = next(line for line in out.splitlines() if line.startswith("signature:"))
    assert "AllowEagerAdaptiveVerification" in signature and "(added_first, mode" in signature
    assert out.count("\nmissing:") + out.count("\nsignature:") == 2


def test_follows_reexports_relative_imports_and_bases(tmp_path):
    tree = _write(tmp_path / "vllm", {
        "_version.py": "__version__ = version = '0.32.1'\n",
        "base.py": "class Base:\n    def run(self, x, /, y=1, *args, z, **kw):\n        pass\n",
        "pkg/__init__.py": "from .impl import helper as exported\nfrom .impl import *\n",
        "pkg/impl.py": "async def helper(a, *, b=2):\n    pass\n",
        "child.py": ("from vllm.base import Base\n\nclass Child(Base):\n"
                     "    @staticmethod\n    def own(q) -> int:\n        pass\n"),
        "optional.py": ("try:\n    from vllm.pkg.impl import helper\nexcept ImportError:\n    helper = None\n"
                        "if FAST:\n    def pick(a, b):\n        pass\nelse:\n    def pick(a):\n        pass\n"),
    })
    source = SourceTree(tree)
    inherited = source.resolve("vllm.child:Child.run")
    assert inherited.file == tree / "base.py" and inherited.signature == "(self, x, /, y=..., *args, z, **kw)"
    assert source.resolve("vllm.child:Child.own").signature == "@staticmethod (q) -> int"
    assert source.resolve("vllm.pkg:exported").signature == "async (a, *, b=...)"
    assert source.resolve("vllm.pkg:helper").signature == "async (a, *, b=...)"  # through the star import
    assert source.resolve("vllm.optional:helper").signature == "async (a, *, b=...)"  # the try body, not the handler
    assert source.resolve("vllm.optional:pick").signature == "(a, b)"  # the `if` branch
    assert source.resolve("vllm.child:Child.absent") is None
    assert source.resolve("vllm.nowhere:f") is None
    assert source_version(tree) == "0.32.1"


def test_patches_outside_the_version_range_are_not_checked(tmp_path):
    tree = _write(tmp_path / "vllm", {"_version.py": "__version__ = version = '0.40.0'\n"})
    assert check_sources(tree, INSTALLED) == ("0.40.0", [], [])


def test_a_folder_without_a_version_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="no __version__"):
        source_version(tmp_path)
    assert main(["--check-sources", str(tmp_path)]) == 2
    assert "is it a `vllm` package folder" in capsys.readouterr().err
