"""Nothing of ours is importable as `triton_kernels`: vLLM probes for that top-level name (OpenAI's MoE
kernels) and would pick up our kernel folder instead of its bundled copy."""
import importlib.metadata
import subprocess
import sys

from conftest import REPO

PROBE = (
    "import importlib.util, json;"
    "spec = importlib.util.find_spec('triton_kernels');"
    "ours = importlib.util.find_spec('hybridspec_kernels');"
    "print(json.dumps([spec and spec.origin, spec and list(spec.submodule_search_locations or []), ours.origin]))"
)


def _probe(cwd, extra_env=None):
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _inside_repo(path):
    return path is not None and str(path).startswith(str(REPO) + "/") and "/.venv/" not in str(path)


def test_triton_kernels_never_resolves_into_the_repository(tmp_path):
    for cwd, env in [(tmp_path, None), (REPO, {"PYTHONSAFEPATH": "1"}), (REPO / "tests", None)]:
        origin, locations, ours = _probe(cwd, env)
        assert not _inside_repo(origin), (cwd, origin)
        assert not any(_inside_repo(location) for location in locations or []), (cwd, locations)
        assert not _inside_repo(ours), (cwd, ours)  # the installed copy, not the source folder


def test_installed_distribution_has_no_top_level_triton_kernels():
    files = importlib.metadata.files("vllm-hybridspec") or []
    top_level = {str(f).split("/", 1)[0] for f in files}
    assert "hybridspec_kernels" in top_level and "vllm_hybridspec" in top_level
    assert "triton_kernels" not in top_level
