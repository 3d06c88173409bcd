"""Each component's patch module imports on its own, before the patch framework (no circular import)."""
import os
import subprocess
import sys

import pytest

COMPONENT_PATCH_MODULES = [
    ("vllm_hybridspec.gdn.patches", "GDN_PATCHES"),
    ("vllm_hybridspec.head_walk.patches", "HEAD_WALK_PATCHES"),
    ("vllm_hybridspec.adaptive.patches", "ADAPTIVE_PATCHES"),
    ("vllm_hybridspec.routing_wiring.patches", "ROUTING_PATCHES"),
    ("vllm_hybridspec.patches.config_validation", None),
    ("vllm_hybridspec.patches.on_import", None),
]


@pytest.mark.parametrize("module, patches", COMPONENT_PATCH_MODULES, ids=[m for m, _ in COMPONENT_PATCH_MODULES])
def test_component_patch_module_imports_first(module, patches, tmp_path):
    code = (
        "import sys, importlib;"
        f"m = importlib.import_module({module!r});"
        "from vllm_hybridspec.patches import ALL_PATCHES;"
        f"ours = getattr(m, {patches!r}) if {patches!r} else [];"
        "assert all(p in ALL_PATCHES for p in ours), 'not in ALL_PATCHES';"
        "print('OK', len(ALL_PATCHES))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout
