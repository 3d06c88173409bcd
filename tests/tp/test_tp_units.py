"""Per-rank logic that a CPU engine never reaches: the adaptive length's start-up latency curves under tensor
parallelism. vLLM times the target while it captures CUDA graphs, on every rank separately; the ranks must still
plan each batch alike, or they would verify different tokens of it."""
from types import SimpleNamespace

import torch

RANK0_DRAFT = [(1, 0.20), (4, 0.30)]
RANK0_VERIFY = [(1, 1.0), (8, 2.0), (32, 4.0)]


class Rank1Group:
    """The TP group seen from rank 1: a broadcast from rank 0 returns rank 0's object, whatever rank 1 passed."""

    world_size, rank_in_group = 2, 1

    def __init__(self):
        self.broadcasts = 0

    def broadcast_object(self, obj, src=0):
        assert src == 0
        self.broadcasts += 1
        return (RANK0_DRAFT, RANK0_VERIFY)


def test_auto_profile_plans_every_rank_with_rank_0s_curves(monkeypatch):
    import vllm.distributed.parallel_state as parallel_state
    from vllm.v1.worker.gpu.spec_decode import adaptive_verification as vllm_adaptive

    from vllm_hybridspec.adaptive.manager import manager_class

    group = Rank1Group()
    monkeypatch.setattr(parallel_state, "get_tp_group", lambda: group)
    monkeypatch.setattr(vllm_adaptive, "get_tp_group", lambda: group)
    manager = object.__new__(manager_class())
    manager.__dict__.update(
        profile_setting="auto", num_speculative_steps=4, min_drafts=1, max_drafts=4, device_lengths=False,
        probing=False, _cudagraph_limit=0,
        req_states=SimpleNamespace(max_num_reqs=4, max_num_batched_tokens=64, device=torch.device("cpu")),
    )
    rank1_draft, rank1_verify = [(1, 0.9), (4, 1.9)], [(1, 9.0), (8, 19.0), (32, 49.0)]  # its own timings

    manager.set_cost_curves(rank1_draft, rank1_verify)

    assert group.broadcasts >= 1
    assert manager.profile.tokens == [n for n, _ in RANK0_VERIFY]
    assert manager.profile.us == [1000.0 * ms for _, ms in RANK0_VERIFY]
    rank0 = object.__new__(manager_class())
    rank0.__dict__.update({k: v for k, v in manager.__dict__.items() if k not in ("profile", "latency")})
    rank0.set_cost_curves(RANK0_DRAFT, RANK0_VERIFY)
    # same verify-time tables on both ranks, so the same lengths for the same confidences
    for batch in (1, 4):
        for length in range(1, 6):
            assert manager.profile.interpolate(batch, length) == rank0.profile.interpolate(batch, length)
    assert torch.equal(torch.as_tensor(manager.cost_tables[0]), torch.as_tensor(rank0.cost_tables[0]))


def _parallel(**sizes):
    fields = {"tensor_parallel_size": 1, "data_parallel_size": 1, "prefill_context_parallel_size": 1, **sizes}
    return SimpleNamespace(parallel_config=SimpleNamespace(**fields))


def test_routing_is_local_under_tensor_parallelism_only():
    """The routing step's buffers follow the rank's own token positions: with data or prefill-context parallelism
    vLLM's MoE layers may route other ranks' tokens too, so the routing correction and the device cut fall back."""
    from vllm_hybridspec.routing_wiring.step import routing_not_local_reason

    assert routing_not_local_reason(_parallel()) is None
    assert routing_not_local_reason(_parallel(tensor_parallel_size=4)) is None
    assert "data parallelism" in routing_not_local_reason(_parallel(tensor_parallel_size=2, data_parallel_size=2))
    assert "prefill context" in routing_not_local_reason(_parallel(prefill_context_parallel_size=2))
    assert routing_not_local_reason(SimpleNamespace()) is None  # a config without parallel settings


def test_device_cut_and_probes_fall_back_with_data_parallelism(monkeypatch):
    import vllm.config

    from vllm_hybridspec import status
    from vllm_hybridspec.adaptive.manager import manager_class
    from vllm_hybridspec.config import HybridSpecConfig

    fake = _parallel(tensor_parallel_size=2, data_parallel_size=2)
    fake.model_config = SimpleNamespace(hf_text_config=SimpleNamespace(num_hidden_layers=4, num_experts=4,
                                                                        num_experts_per_tok=2))
    monkeypatch.setattr(vllm.config, "get_current_vllm_config", lambda: fake)
    manager = SimpleNamespace(min_drafts=1, max_drafts=4)
    enabled, note = manager_class()._device_lengths_enabled(manager, HybridSpecConfig(device_verify_length=True))
    assert not enabled and "data parallelism" in note
    status.reset()
    assert manager_class()._routing_is_correctable(manager, "routing_correction") is False
    assert status.snapshot()["routing_correction"].startswith("fallback: data parallelism"), status.snapshot()
    fake.parallel_config.data_parallel_size = 1
    assert manager_class()._device_lengths_enabled(manager, HybridSpecConfig(device_verify_length=True))[0]
    assert manager_class()._routing_is_correctable(manager, "routing_correction") is True


def test_routing_correction_falls_back_on_a_target_without_routed_experts(monkeypatch):
    """A dense target (no expert count) took the correction's path and failed building its step on the missing
    `num_experts_per_tok`; it falls back with a reason now, and a Mixtral-style `num_local_experts` counts as MoE."""
    import vllm.config

    from vllm_hybridspec import status
    from vllm_hybridspec.adaptive.manager import manager_class
    from vllm_hybridspec.plugin import model_has_moe_router
    from vllm_hybridspec.routing_wiring.step import routed_expert_count

    fake = _parallel(tensor_parallel_size=1)
    fake.model_config = SimpleNamespace(hf_text_config=SimpleNamespace(num_hidden_layers=4))
    monkeypatch.setattr(vllm.config, "get_current_vllm_config", lambda: fake)
    manager = SimpleNamespace(min_drafts=1, max_drafts=4)
    status.reset()
    assert manager_class()._routing_is_correctable(manager, "routing_correction") is False
    assert "no routed MoE layer" in status.snapshot()["routing_correction"], status.snapshot()
    assert not model_has_moe_router(fake.model_config)
    mixtral = SimpleNamespace(num_hidden_layers=4, num_local_experts=8, num_experts_per_tok=2)
    fake.model_config = SimpleNamespace(hf_text_config=mixtral)
    assert manager_class()._routing_is_correctable(manager, "routing_correction") is True
    assert model_has_moe_router(fake.model_config) and routed_expert_count(mixtral) == 8
    # The plan judges as the manager does: experts without a top-k (or without a MoE layer) are no router.
    for hf in (SimpleNamespace(num_hidden_layers=4, num_experts=8),
               SimpleNamespace(num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, mlp_only_layers=[0, 1])):
        fake.model_config = SimpleNamespace(hf_text_config=hf)
        status.reset()
        assert not model_has_moe_router(fake.model_config)
        assert manager_class()._routing_is_correctable(manager, "routing_correction") is False
