"""The DSpark walk replacement in real engines: Model Runner V2 on CPU (tests/mrv2_shim) with the tiny DSpark
drafter. Every draft step is walked twice on the same inputs, by vLLM's `_sample_sequential` and by ours
(head_walk_job.py); the engine keeps ours.

- megakernel: vLLM's CPU GDN kernels run only in bf16, which the Triton interpreter computes wrongly, so the
  kernel runs beside a random dense fp32 Qwen3 target (built by the job; the drafter's drafts are then rarely
  accepted, which the comparison does not need), with greedy drafting and with probabilistic drafting (seeded
  sampled requests and greedy ones in one batch).
- reference: the tiny hybrid Qwen3-Next target (bf16) with the torch reference walk, drafts accepted.
- top-k mode: the drafter with `dspark_draft_topk` in its config (vLLM's `_sample_sequential_topk`), through the
  top-k kernel beside the dense fp32 target, greedy and probabilistic.
"""
from pathlib import Path

import pytest

from conftest import assert_same_tokens, run_mrv2_engines

pytestmark = pytest.mark.e2e

MAX_TOKENS = 12
NUM_PROMPTS = 4
MEGAKERNEL = {"hybridspec": {"enabled": True, "head_walk": "megakernel"}}
REFERENCE = {"hybridspec": {"enabled": True, "head_walk": "reference"}}
FP32 = {"dtype": "float32"}
TOPK = 16


@pytest.fixture(scope="module")
def engines(tiny_models, module_tmp):
    dense, hybrid = str(module_tmp / "dense-fp32"), str(tiny_models.target)
    dspark = {"method": "dspark", "model": str(tiny_models.dspark), "num_speculative_tokens": 4}
    probabilistic = {**dspark, "draft_sample_method": "probabilistic"}
    topk_drafter = str(module_tmp / "dspark-topk")
    topk = {**dspark, "model": topk_drafter}
    topk_probabilistic = {**topk, "draft_sample_method": "probabilistic"}
    job = {
        "dense_target": {"out": dense, "drafter": str(tiny_models.dspark), "tokenizer": hybrid},
        "topk_drafter": {"out": topk_drafter, "drafter": str(tiny_models.dspark), "topk": TOPK},
        "engines": [
            dict(name="dense_plain", model=dense, llm_kwargs=FP32),
            dict(name="dense_greedy", model=dense, llm_kwargs=FP32, speculative_config=dspark,
                 additional_config=MEGAKERNEL),
            dict(name="dense_sampled", model=dense, llm_kwargs=FP32, speculative_config=probabilistic,
                 additional_config=MEGAKERNEL, sampling={"temperature": 0.8, "seed": 1000, "greedy_every": 2}),
            dict(name="dense_topk_greedy", model=dense, llm_kwargs=FP32, speculative_config=topk,
                 additional_config=MEGAKERNEL),
            dict(name="dense_topk_sampled", model=dense, llm_kwargs=FP32, speculative_config=topk_probabilistic,
                 additional_config=MEGAKERNEL, sampling={"temperature": 0.8, "seed": 2000, "greedy_every": 2}),
            dict(name="hybrid_plain", model=hybrid),
            dict(name="hybrid_reference", model=hybrid, speculative_config=dspark, additional_config=REFERENCE),
        ],
        "prompts": tiny_models.prompts[:NUM_PROMPTS],
        "max_tokens": MAX_TOKENS,
    }
    return run_mrv2_engines(**job, tmp_path=module_tmp, job_script=Path(__file__).with_name("head_walk_job.py"))


def assert_drafts_equal_vllms(result, through_kernel):
    walk = result["walk"]
    assert walk["walks"] > 0 and walk["compared_steps"] > 0 and walk["compared_drafts"] > 0, walk
    assert walk["differing_drafts"] == 0, walk
    assert (walk["walks_through_kernel"] == walk["walks"]) if through_kernel else walk["kernel_launches"] == 0, walk
    assert result["metrics"]["drafts"] > 0, result["metrics"]


def test_megakernel_greedy_drafts_equal_vllms(engines):
    result = engines["dense_greedy"]
    assert result["status"]["head_walk"].startswith("active: megakernel"), result["status"]
    assert_drafts_equal_vllms(result, through_kernel=True)
    assert result["walk"]["cache_entries"] == 0  # greedy drafting keeps no draft logits


def test_megakernel_seeded_sampled_drafts_and_logits_equal_vllms(engines):
    result = engines["dense_sampled"]
    assert result["status"]["head_walk"].startswith("active: megakernel"), result["status"]
    assert_drafts_equal_vllms(result, through_kernel=True)
    walk = result["walk"]
    assert walk["cache_entries"] > 0, walk
    # Random fp32 weights: the kernel's dot products may round an ulp apart from vLLM's GEMM.
    assert walk["cache_max_abs_diff"] <= 1e-4, walk


def test_megakernel_greedy_output_equals_the_target_alone(engines):
    assert_same_tokens(engines["dense_plain"], engines["dense_greedy"], "dense + DSpark megakernel walk")
    plain, mixed = engines["dense_plain"], engines["dense_sampled"]
    greedy_rows = range(0, NUM_PROMPTS, 2)  # greedy_every=2: the batch's greedy requests
    for i in greedy_rows:
        assert mixed["token_ids"][i] == plain["token_ids"][i], f"greedy request {i} beside sampled ones differs"
    sampled_rows = [mixed["token_ids"][i] for i in range(1, NUM_PROMPTS, 2)]
    assert all(len(tokens) == MAX_TOKENS for tokens in sampled_rows)


def test_topk_mode_walks_through_the_topk_kernel_with_vllms_drafts(engines):
    for name in ("dense_topk_greedy", "dense_topk_sampled"):
        result = engines[name]
        assert result["status"]["head_walk"].startswith(f"active: megakernel top-k walk (dspark_draft_topk={TOPK})"), (
            result["status"])
        assert_drafts_equal_vllms(result, through_kernel=True)
        assert result["walk"]["topk_kernel_launches"] > 0 and result["walk"]["kernel_launches"] == 0, result["walk"]
    walk = engines["dense_topk_sampled"]["walk"]
    assert walk["cache_entries"] > 0 and walk["cache_max_abs_diff"] <= 1e-4, walk
    assert_same_tokens(engines["dense_plain"], engines["dense_topk_greedy"], "dense + DSpark top-k walk")
    plain, mixed = engines["dense_plain"], engines["dense_topk_sampled"]
    for i in range(0, NUM_PROMPTS, 2):  # the batch's greedy requests
        assert mixed["token_ids"][i] == plain["token_ids"][i], f"greedy request {i} beside sampled ones differs"


def test_reference_walk_on_the_hybrid_target(engines):
    result = engines["hybrid_reference"]
    assert result["status"]["head_walk"].startswith("reference"), result["status"]
    assert_drafts_equal_vllms(result, through_kernel=False)
    assert result["metrics"]["accepted_tokens"] > 0, result["metrics"]
    assert_same_tokens(engines["hybrid_plain"], result, "hybrid + DSpark reference walk")
