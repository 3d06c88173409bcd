"""vLLM loads the plugin in every process it starts, and only when VLLM_PLUGINS selects it."""
import subprocess
import sys

import pytest

from conftest import TESTS, base_env

PROBE = (
    "from vllm.plugins import load_general_plugins; load_general_plugins(); load_general_plugins();"
    "from vllm_hybridspec.patches import ValidateHybridSpecConfig as P; print('APPLIED', P.is_applied())"
)


@pytest.mark.parametrize("selection, applied", [(None, True), ("hybridspec", True), ("other_plugin", False),
                                                ("other_plugin,hybridspec", True), ("", False)])
def test_vllm_plugins_selects_the_plugin(tmp_path, selection, applied):
    env = base_env(VLLM_PLUGINS=selection)
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"APPLIED {applied}" in proc.stdout


ENGINE = """
import sys
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], enforce_eager=True, kv_cache_memory_bytes=256 * 2**20, max_model_len=256,
              enable_prefix_caching=False, additional_config={"hybridspec": {"enabled": True}},
              speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    out = llm.generate(["one two three"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    print("TEXT", repr(out[0].outputs[0].text))
"""


@pytest.mark.e2e
def test_plugin_registers_in_every_engine_process(tiny_models, tmp_path):
    """With a multi-process engine (front end + engine core, which hosts the worker on CPU) and the model
    inspection subprocess, register() runs in each of them, and runs its body only once per process."""
    trace = tmp_path / "trace.txt"
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    env = base_env(VLLM_ENABLE_V1_MULTIPROCESSING="1", PYTHONPATH=str(TESTS / "plugin_trace"),
                   HYBRIDSPEC_TEST_REGISTER_TRACE=str(trace))
    proc = subprocess.run([sys.executable, str(script), str(tiny_models.target)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert "TEXT" in proc.stdout
    pids = {line.split()[0] for line in trace.read_text().splitlines()}
    assert len(pids) >= 2, trace.read_text()
    # The engine-core process logs the registration (logging is configured there before plugins load).
    assert "vllm-hybridspec 0.1.0 registered in process" in proc.stdout + proc.stderr
