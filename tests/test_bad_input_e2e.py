"""A malformed `hybridspec` section stops `LLM()` and the OpenAI server before any engine starts."""
import json
import subprocess
import sys

import pytest

from conftest import base_env

pytestmark = pytest.mark.e2e

LLM_SCRIPT = """
import json, sys
from vllm import LLM
if __name__ == "__main__":
    LLM(model=sys.argv[1], enforce_eager=True, kv_cache_memory_bytes=256 * 2**20,
        additional_config={"hybridspec": json.loads(sys.argv[2])})
    print("ENGINE STARTED")
"""


def test_llm_construction_fails_naming_the_key(tiny_models, tmp_path):
    script = tmp_path / "llm.py"
    script.write_text(LLM_SCRIPT)
    section = {"enabled": True, "verify_length": "sometimes"}
    proc = subprocess.run([sys.executable, str(script), str(tiny_models.target), json.dumps(section)],
                          env=base_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "ENGINE STARTED" not in output
    assert "hybridspec.verify_length: Input should be 'adaptive' or 'fixed'" in output
    assert "Initializing a V1 LLM engine" not in output  # failed while building the config


def test_server_start_fails_naming_the_key(tiny_models, tmp_path):
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_models.target),
        "--host", "127.0.0.1", "--port", "0", "--enforce-eager", "--kv-cache-memory-bytes", str(256 * 2**20),
        "--additional-config", json.dumps({"hybridspec": {"enabled": True, "max_verify_lenght": 4}}),
    ]
    proc = subprocess.run(command, env=base_env(VLLM_ENABLE_V1_MULTIPROCESSING="1"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "hybridspec.max_verify_lenght: unknown key; did you mean 'max_verify_length'?" in output
    assert "Initializing a V1 LLM engine" not in output
