"""Enabling hybridspec on a model without Gated DeltaNet layers warns and leaves the GDN parts to vLLM."""
import pytest

from conftest import base_env, run_engines

pytestmark = pytest.mark.e2e


def test_enabled_on_dense_model_warns_and_falls_back(tiny_models, tmp_path):
    speculative = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
    engines = [
        dict(name="plain", model=str(tiny_models.dense)),
        dict(name="enabled", model=str(tiny_models.dense), speculative_config=speculative,
             additional_config={"hybridspec": {"enabled": True, "routing_correction": True}}),
    ]
    prompts = ["a b c d a b c d a b c", "one two one two one two"]
    results = run_engines(engines, prompts, 16, base_env(), tmp_path)
    assert "has no Gated DeltaNet layers: GDN-specific parts fall back to plain vLLM" in results["_log"]
    status = results["enabled"]["status"]
    assert status["gdn_verify"] == "fallback: model Qwen3ForCausalLM has no GDN layers"
    assert status["routing_correction"].startswith("fallback: ")  # no MoE router (or another missing piece)
    assert results["enabled"]["token_ids"] == results["plain"]["token_ids"]
