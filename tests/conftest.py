"""Shared fixtures. Engine tests start vLLM in a subprocess (tests/e2e_job.py) so that each module controls
what vLLM sees at import time (VLLM_PLUGINS, the Model Runner V2 shim); one subprocess per module runs all
of that module's engines."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
MRV2_SHIM = TESTS / "mrv2_shim"
TINY_CACHE = Path(os.environ.get("HYBRIDSPEC_TINY_CACHE", REPO / ".tiny"))


def base_env(**overrides: str | None) -> dict[str, str]:
    """The environment for a vLLM subprocess: in-process engine, repo root never on sys.path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TRITON_")) and k != "PYTHONPATH"}
    env.update(PYTHONSAFEPATH="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false")
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def mrv2_env(**overrides: str | None) -> dict[str, str]:
    """Model Runner V2 on CPU through the test-only Triton-interpreter shim (tests/mrv2_shim)."""
    return base_env(PYTHONPATH=str(MRV2_SHIM), TRITON_INTERPRET="1", VLLM_USE_V2_MODEL_RUNNER="1", **overrides)


@pytest.fixture(scope="session")
def tiny_models():
    """The tiny models (vllm_hybridspec.tiny), built once and cached under .tiny/<builder hash>/."""
    from vllm_hybridspec.tiny import ensure_tiny_models

    return ensure_tiny_models(TINY_CACHE, log=lambda message: print(message, file=sys.stderr))


def run_engines(engines: list[dict], prompts: list[str], max_tokens: int, env: dict[str, str],
                tmp_path: Path, timeout: float = 900, job_script: Path = TESTS / "e2e_job.py", **job: object) -> dict:
    """Runs engines (see tests/e2e_job.py) in one subprocess; returns {name: result} and "_log".

    `job_script`: a component's job (e.g. tests/gdn/gdn_job.py, built on e2e_job.py); `job`: further keys of the
    job file that script reads (e.g. head_walk_job.py's `dense_target`)."""
    job_file, out_file = tmp_path / "job.json", tmp_path / "out.json"
    job_file.write_text(json.dumps({"engines": engines, "prompts": prompts, "max_tokens": max_tokens, **job}))
    proc = subprocess.run(
        [sys.executable, str(job_script), str(job_file), str(out_file)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
    )
    log = proc.stdout + proc.stderr
    (tmp_path / "engines.log").write_text(log)
    if proc.returncode != 0:
        raise AssertionError(f"engine subprocess failed (rc {proc.returncode}):\n{log[-6000:]}")
    results = json.loads(out_file.read_text())
    results["_log"] = log
    return results


def run_mrv2_engines(engines: list[dict], prompts: list[str], max_tokens: int, tmp_path: Path, **kwargs) -> dict:
    """`run_engines` under Model Runner V2 (`mrv2_env`), checking from the log that V2 really ran (vLLM falls
    back to V1 silently when it cannot)."""
    results = run_engines(engines, prompts, max_tokens, mrv2_env(), tmp_path, **kwargs)
    assert "Using V2 Model Runner" in results["_log"]
    return results


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory, request):
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])


def write_synthetic_profile(path: Path, max_length: int, note: str) -> None:
    """A made-up CPU-test latency profile (not a measurement) for lengths 1..max_length: each extra verified token
    costs a quarter of a one-token pass, so drafts with a low estimated survival are not worth verifying and the
    policy trims (leaving room for the routing correction's probe tokens)."""
    from vllm_hybridspec.latency_profile import LatencyProfile

    lengths = list(range(1, max_length + 1))
    LatencyProfile(
        device="cpu-test", model="tiny", variant="synthetic",
        batch_sizes=[1, 4], lengths=lengths,
        t_us=[[100.0 + 25.0 * (n - 1) for n in lengths], [400.0 + 100.0 * (n - 1) for n in lengths]],
        meta={"note": note},
    ).save(path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_same_tokens(reference: dict, other: dict, label: str) -> None:
    for i, (want, got) in enumerate(zip(reference["token_ids"], other["token_ids"], strict=True)):
        assert got == want, f"{label}: prompt {i} differs\n want {reference['texts'][i]!r}\n got  {other['texts'][i]!r}"
