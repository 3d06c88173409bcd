"""The adaptive-length wiring without an engine: budget split, host budget, device cut, latency sources, runner
patches, the device_verify_length key."""
from types import SimpleNamespace

import pytest
import torch

from vllm_hybridspec.adaptive.budget import assign_drafts, device_verify_lengths, draft_budget
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


def test_vllms_refusal_under_full_graphs_names_hybridspecs_switch():
    """With full CUDA graphs vLLM's own factory runs its backend checks; its refusal tells the user to pass
    enable_adaptive_verification=false, which hybridspec set: ours says which hybridspec setting to change."""
    def vllm_factory(**kwargs):
        raise ValueError("Adaptive verification replays decode cudagraphs whose per-request query lengths vary up to "
                         "16, but GDNAttentionBackend allows none. Pass enable_adaptive_verification=false in the "
                         "speculative config, or use a backend that does.")

    create = UseHybridSpecLengthPolicy.replacement(vllm_factory)
    config = SimpleNamespace(
        additional_config={"hybridspec": {"enabled": True, "verify_length": "adaptive"}},
        speculative_config=SimpleNamespace(num_speculative_tokens=15),
        compilation_config=SimpleNamespace(cudagraph_mode=SimpleNamespace(has_full_cudagraphs=lambda: True)))
    with pytest.raises(ValueError, match=r"hybridspec.verify_length.*GDNAttentionBackend allows none.*'fixed'.*"
                                         r"gdn_verify=block_parallel") as raised:
        create(vllm_config=config, enable_adaptive_verification=True)
    assert isinstance(raised.value.__cause__, ValueError)


def _concave_latency(batch):
    """T(L) concave in L (each extra token cheaper than the one before, as unique experts saturate)."""
    from vllm_hybridspec.latency_profile import LatencyProfile

    rows = [1000, 1250, 1450, 1600, 1720, 1820, 1900, 1970]
    profile = LatencyProfile("d", "m", "v", [1, 8], list(range(1, 9)), [rows, [8 * r for r in rows]])
    return latency_model(profile, max_batch=batch, max_len=8)


@pytest.mark.parametrize("seed", range(6))
def test_device_cut_is_the_lookahead_capped_by_the_split(seed):
    from vllm_hybridspec.policy import choose_verify_lengths

    gen = torch.Generator().manual_seed(seed)
    batch, k, min_drafts = 1 + seed, 7, seed % 2
    latency = _concave_latency(batch)
    conf, stale = torch.rand(batch, k, generator=gen), torch.rand(batch, k, generator=gen)
    capacities = torch.randint(0, k + 1, (batch,), generator=gen, dtype=torch.int32)
    forced = int(capacities.clamp(max=min_drafts).sum())
    budget = int(torch.randint(forced, int(capacities.sum()) + 1, (1,), generator=gen))
    scheduled = assign_drafts(conf, capacities, budget, min_drafts=min_drafts)
    got = device_verify_lengths(conf, stale, capacities, scheduled, latency, min_drafts=min_drafts, max_drafts=k)
    policy = choose_verify_lengths(conf, capacities, latency, min_drafts=min_drafts, max_drafts=k, lookahead=True,
                                   forecast_confidences=stale).num_drafts
    assert got.tolist() == torch.minimum(scheduled, policy).tolist()
    assert bool((got <= scheduled).all()) and bool((got >= scheduled.clamp(max=min_drafts)).all())


@pytest.mark.parametrize("seed", range(12))
def test_device_cut_is_a_stopping_time(seed):
    """Whether request b verifies its draft k (split, then cut) never depends on the confidences of b's later
    positions (functions of the draft token x_k and beyond): resampling them leaves the decision unchanged.
    This is what keeps the cut lossless under sampling (budget.py's docstring)."""
    gen = torch.Generator().manual_seed(100 + seed)
    batch, k, min_drafts = 1 + seed % 5, 3 + seed % 5, seed % 2
    latency = _concave_latency(batch)
    stale = torch.rand(batch, k, generator=gen)
    capacities = torch.full((batch,), k, dtype=torch.int32)
    # half the seeds: the host scheduled every draft (the cut alone decides)
    budget = batch * k if seed % 2 == 0 else int(torch.randint(batch * min_drafts, batch * k + 1, (1,), generator=gen))

    def verified(conf):
        scheduled = assign_drafts(conf, capacities, budget, min_drafts=min_drafts)
        return device_verify_lengths(conf, stale, capacities, scheduled, latency, min_drafts=min_drafts,
                                     max_drafts=k)

    for _ in range(25):
        conf = 0.3 + 0.7 * torch.rand(batch, k, generator=gen)
        base = verified(conf)
        for b in range(batch):
            for position in range(k - 1):
                other = conf.clone()
                other[b, position + 1:] = 0.3 + 0.7 * torch.rand(k - position - 1, generator=gen)
                assert (verified(other)[b] > position) == (base[b] > position), (b, position)


def test_device_cut_bad_shapes():
    latency = _concave_latency(2)
    conf = torch.rand(2, 4)
    with pytest.raises(ValueError, match="stale_confidences"):
        device_verify_lengths(conf, torch.rand(2, 3), torch.tensor([4, 4]), torch.tensor([2, 2]), latency,
                              min_drafts=0, max_drafts=4)
    with pytest.raises(ValueError, match="scheduled"):
        device_verify_lengths(conf, conf, torch.tensor([4, 4]), torch.tensor([2]), latency, min_drafts=0,
                              max_drafts=4)


def test_device_verify_length_key():
    from vllm_hybridspec.config import HybridSpecConfig

    assert HybridSpecConfig().device_verify_length is False
    assert HybridSpecConfig.from_section({"device_verify_length": True}).device_verify_length is True
    with pytest.raises(ValueError, match=r"hybridspec\.device_verify_length"):
        HybridSpecConfig.from_section({"device_verify_length": "no"})


def test_device_cut_needs_a_moe_target(monkeypatch):
    """On a target without routed experts neutralising saves nothing: the cut stays off, with a logged reason."""
    import vllm.config

    from vllm_hybridspec.adaptive import manager as manager_module
    from vllm_hybridspec.config import HybridSpecConfig

    logged = []
    monkeypatch.setattr(manager_module.logger, "info", lambda message, *args: logged.append(message % args))
    decide = manager_module.manager_class()._device_lengths_enabled
    manager = SimpleNamespace(min_drafts=1, max_drafts=4)
    on = HybridSpecConfig(device_verify_length=True)

    def target(**hf):
        fake = SimpleNamespace(model_config=SimpleNamespace(hf_text_config=SimpleNamespace(num_hidden_layers=4, **hf)))
        monkeypatch.setattr(vllm.config, "get_current_vllm_config", lambda: fake)

    target()
    enabled, note = decide(manager, on)
    assert not enabled and "without MoE" in note
    assert any("saves nothing" in line or "save nothing" in line for line in logged), logged
    target(num_experts=4, num_experts_per_tok=2)
    assert decide(manager, on) == (True, "device cut on (unadmitted drafts neutralised)")
    assert not decide(manager, HybridSpecConfig())[0]  # off by default
    assert not decide(SimpleNamespace(min_drafts=4, max_drafts=4), on)[0]  # nothing to cut


def _profile_with_moe():
    from vllm_hybridspec.latency_profile import LatencyProfile

    lengths = list(range(1, 6))
    total = [[100.0 + 25.0 * (n - 1) for n in lengths], [400.0 + 100.0 * (n - 1) for n in lengths]]
    unique = [[1.6 + 0.46 * (n - 1) for n in lengths], [6.0 + 1.84 * (n - 1) for n in lengths]]
    moe = [[50.0 * u for u in row] for row in unique]
    rest = [[t - m for t, m in zip(*rows)] for rows in zip(total, moe)]
    return LatencyProfile("cpu-test", "tiny", "synthetic", [1, 4], lengths, total,
                          per_layer_type={"moe": moe, "rest": rest}, unique_experts=unique)


def test_cut_scheduler_records_only_a_requests_own_consecutive_steps():
    import numpy as np

    from vllm_hybridspec.adaptive.budget import CutScheduler

    profile = _profile_with_moe()
    scheduler = CutScheduler(profile, latency_model(profile, 4, 5), 4, 4, min_drafts=0, max_drafts=4)
    a, b = np.array([[0.9, 0.8, 0.7, 0.6]], np.float32), np.array([[0.5, 0.5, 0.5, 0.5]], np.float32)
    ones = np.ones((1, 4), np.float32)
    scheduler.observe(np.array([0]), ["r1"], ones)   # a new request: vLLM's reset row, nothing to compare
    scheduler.observe(np.array([0]), ["r1"], a)      # first confidences: the previous row was the reset
    assert scheduler.history.size == 0
    scheduler.observe(np.array([0]), ["r1"], a)      # not updated since (not run last step): no change recorded
    scheduler.observe(np.array([0]), ["r1"], b)      # a real step-to-step change
    assert scheduler.history.size == 1
    scheduler.observe(np.array([0]), ["r2"], a)      # the slot went to another request: no change recorded
    assert scheduler.history.size == 1
    want = torch.logit(torch.cumprod(torch.from_numpy(b).double(), -1)) - torch.logit(
        torch.cumprod(torch.from_numpy(a).double(), -1))
    assert torch.allclose(scheduler.history.shifts[0], want[0])
    # with a history, the count is at least the host's budget and at most the capacity
    stale, caps = torch.from_numpy(np.repeat(a, 3, 0)), torch.tensor([4, 2, 3])
    for budget in (0, 3, 9):
        got, rate = scheduler.budget(stale, caps, budget)
        assert budget <= got <= 9 and rate > 0
