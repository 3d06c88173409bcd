"""The adaptive-length wiring without an engine: budget split, host budget, latency sources, runner patches."""
from types import SimpleNamespace

import pytest
import torch

from vllm_hybridspec.adaptive.budget import assign_drafts, draft_budget
from vllm_hybridspec.adaptive.latency import FlatProfile, TokenCurveProfile, latency_model
from vllm_hybridspec.adaptive.patches import (
    AllowEagerAdaptiveVerification,
    UseHybridSpecLengthPolicy,
    _check_device_query_lens,
)


def naive_assign(confidences, capacities, budget, min_drafts):
    pairs = []
    for b, row in enumerate(confidences.tolist()):
        survival = 1.0
        for k, c in enumerate(row):
            survival *= min(max(c, 0.0), 1.0)
            if k < capacities[b]:
                pairs.append((k < min_drafts, survival, -(b * len(row) + k), b))
    counts = [0] * len(capacities)
    for *_, b in sorted(pairs, reverse=True)[:budget]:
        counts[b] += 1
    return counts


@pytest.mark.parametrize("batch,k,min_drafts", [(1, 1, 0), (3, 4, 1), (5, 7, 2), (8, 15, 1)])
def test_assign_drafts_matches_naive_ranking(batch, k, min_drafts):
    generator = torch.Generator().manual_seed(batch * 100 + k)
    for _ in range(20):
        confidences = torch.rand(batch, k, generator=generator)
        capacities = torch.randint(0, k + 1, (batch,), generator=generator, dtype=torch.int32)
        forced = int(capacities.clamp(max=min_drafts).sum())
        budget = int(torch.randint(forced, int(capacities.sum()) + 1, (1,), generator=generator))
        got = assign_drafts(confidences, capacities, budget, min_drafts=min_drafts)
        assert got.tolist() == naive_assign(confidences, capacities.tolist(), budget, min_drafts)
        assert int(got.sum()) == budget and bool((got <= capacities).all())
        assert bool((got >= capacities.clamp(max=min_drafts)).all())


def test_draft_budget_flat_profile_verifies_every_surviving_draft():
    latency = latency_model(FlatProfile(), max_batch=4, max_len=5)
    scheduled = torch.tensor([4, 2, 0], dtype=torch.int32)
    lengths = draft_budget(torch.full((3, 4), 0.5), scheduled, latency, min_drafts=1, max_drafts=3, max_budget=99)
    assert lengths.tolist() == [3, 2, 0]
    capped = draft_budget(torch.full((3, 4), 0.5), scheduled, latency, min_drafts=1, max_drafts=3, max_budget=2)
    assert int(capped.sum()) == 2


def test_draft_budget_scans_past_a_step_in_the_cost():
    """T jumps at L = 3 -> 4 and is flat behind it (a kernel switch): the host budget is the best prefix over every
    count (last step's confidences make a global scan lossless), not the first count where the next draft stops
    paying."""
    from vllm_hybridspec.latency_profile import LatencyProfile

    rows = [1000, 1050, 1100, 1600, 1610, 1620, 1630, 1640]
    profile = LatencyProfile("d", "m", "v", [1], list(range(1, 9)), [rows])
    latency = latency_model(profile, max_batch=1, max_len=8)
    lengths = draft_budget(torch.full((1, 7), 0.9), torch.tensor([7]), latency, min_drafts=0, max_drafts=7,
                           max_budget=99)
    assert lengths.tolist() == [7]


def test_draft_budget_trims_unlikely_drafts_on_a_costly_profile():
    # 9 ms fixed + 1 ms per token: a draft pays off only if it survives with more than ~0.2
    latency = latency_model(TokenCurveProfile([(1, 10.0), (64, 73.0)], "test"), max_batch=2, max_len=5)
    confidences = torch.tensor([[0.99, 0.99, 0.99, 0.99], [0.1, 0.1, 0.1, 0.1]])
    lengths = draft_budget(confidences, torch.tensor([4, 4]), latency, min_drafts=0, max_drafts=4, max_budget=8)
    assert lengths.tolist() == [4, 0]


def test_token_curve_profile_prices_total_tokens():
    profile = TokenCurveProfile([(1, 0.5), (8, 1.0), (32, 2.0)], "test")
    assert profile.interpolate(1, 8) == pytest.approx(1000.0)
    assert profile.interpolate(4, 8) == pytest.approx(2000.0)
    assert profile.interpolate(2, 2.5) == pytest.approx(500.0 + 500.0 * 4 / 7)
    with pytest.raises(ValueError, match="at least one"):
        TokenCurveProfile([], "empty")


def test_eager_mode_is_left_alone_full_graphs_go_to_vllm():
    calls = []
    resolve = AllowEagerAdaptiveVerification.replacement(lambda mode, **kw: calls.append(mode) or "vllm")
    eager = SimpleNamespace(has_full_cudagraphs=lambda: False)
    full = SimpleNamespace(has_full_cudagraphs=lambda: True)
    assert resolve(eager, piecewise_capture_available=False) is eager
    assert resolve(full, piecewise_capture_available=True) == "vllm" and calls == [full]


def test_backend_reading_host_query_lens_is_refused():
    def group(name, ok):
        backend = type(name, (), {"supports_device_cpu_query_lens_mismatch": classmethod(lambda cls: ok)})
        return SimpleNamespace(layer_names=["layer"], backend=backend)

    _check_device_query_lens([[group("CPUAttentionBackend", True), group("BlockParallelGDNBackend", True)]], None)
    with pytest.raises(ValueError, match="GDNAttentionBackend attention backend does not support"):
        _check_device_query_lens([[group("GDNAttentionBackend", False)]], None)


def test_manager_patch_is_vllms_own_without_hybridspec():
    create = UseHybridSpecLengthPolicy.replacement(lambda **kw: "vllm manager")
    plain = SimpleNamespace(additional_config={}, speculative_config=SimpleNamespace(num_speculative_tokens=4))
    assert create(vllm_config=plain, enable_adaptive_verification=True) == "vllm manager"
    fixed = SimpleNamespace(additional_config={"hybridspec": {"enabled": True}},
                            speculative_config=SimpleNamespace(num_speculative_tokens=4))
    assert create(vllm_config=fixed, enable_adaptive_verification=True) == "vllm manager"
