import pytest
import torch

from vllm_hybridspec.routing import (
    ExpertCost,
    ProbeCostModel,
    expert_cost_from_profile,
    naive_routing_keep,
    naive_probe_worth,
    neutralize_routing,
    new_experts_per_token,
    probe_worth,
    routing_keep_mask,
    verified_drafts_after_correction,
)
from vllm_hybridspec.routing.correction import fit_moe_time
from policy_fixtures import MOE_LAYERS, TOP_K, one_thread, profile  # noqa: F401  (pytest fixtures)

COST = ExpertCost(probe_token_us=0.0, keep_token_us=10.0, per_expert_layer_us=2.0, num_moe_layers=4,
                  mean_new_experts=1.0)


def _ids(rows):
    return torch.tensor(rows, dtype=torch.long)


def test_hand_made_decisions():
    # Request 0: tokens 0-1 + probe 2; request 1: token 3 + probe 4. Experts 0..9, top-2.
    ids = _ids([[0, 1], [1, 2], [0, 2],  # probe of request 0 adds nothing new
                [3, 4], [8, 9]])         # probe of request 1 adds two new experts
    probe = torch.tensor([False, False, True, False, True])
    survival = torch.tensor([0.0, 0.0, 0.5, 0.0, 0.5])
    # Probe 0 costs 10 us (token only); probe 1 costs 10 + 2 * (2 + 3 * 2) = 26 us (r = 1: 2 new experts
    # in all 4 layers). Value of a probe = 0.5 / rate: rate 0.02 tok/us -> 25 us: keep probe 0, drop probe 1.
    d = routing_keep_mask(ids, probe, survival, 0.02, COST, 10)
    assert d.keep.tolist() == [True, True, True, True, False]
    assert d.new_experts[[2, 4]].tolist() == [0, 2]
    # Cheaper tokens (rate 0.01 -> value 50 us) keep both; threshold 2 doubles the cost side: 20 < 50 keeps
    # probe 0, 52 > 50 drops probe 1.
    assert routing_keep_mask(ids, probe, survival, 0.01, COST, 10).keep.all()
    assert routing_keep_mask(ids, probe, survival, 0.01, COST, 10, threshold=2.0).keep.tolist() == [
        True, True, True, True, False]
    # A probe of a request that is not eligible (sampled, not greedy) is always dropped.
    eligible = torch.tensor([True, True, False, True, True])
    assert routing_keep_mask(ids, probe, survival, 0.01, COST, 10, eligible=eligible).keep.tolist() == [
        True, True, False, True, True]
    # Padding tokens do not count in the base set: with token 1 invalid, expert 2 becomes new for probe 0.
    valid = torch.tensor([True, False, True, True, True])
    assert routing_keep_mask(ids, probe, survival, 0.02, COST, 10, token_valid=valid).new_experts[2].item() == 1


def test_cross_layer_correlation_uses_mean_for_other_layers():
    cost = ExpertCost(probe_token_us=0.0, keep_token_us=0.0, per_expert_layer_us=1.0, num_moe_layers=5,
                      mean_new_experts=0.5,
                      cross_layer_correlation=0.0)
    assert cost.probe_cost_us(torch.tensor([0, 4])).tolist() == [2.0, 6.0]


@pytest.mark.parametrize("seed", range(5))
def test_matches_naive_reference(seed):
    g = torch.Generator().manual_seed(seed)
    tokens, k, experts = 37, 8, 64
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    ids[3, 2] = -1  # an expert-parallel "not on this rank" id counts as nothing
    probe = torch.rand(tokens, generator=g) < 0.3
    survival = torch.rand(tokens, generator=g)
    eligible = torch.rand(tokens, generator=g) < 0.8
    valid = torch.rand(tokens, generator=g) < 0.9
    cost = ExpertCost(probe_token_us=3.0, keep_token_us=5.0, per_expert_layer_us=0.7, num_moe_layers=40,
                      mean_new_experts=1.3,
                      cross_layer_correlation=0.6)
    d = routing_keep_mask(ids, probe, survival, 0.004, cost, experts, threshold=1.3, eligible=eligible,
                          token_valid=valid)
    keep, new = naive_routing_keep(ids.tolist(), probe.tolist(), survival.tolist(), 0.004, cost, experts, 1.3,
                                   eligible.tolist(), valid.tolist())
    assert d.keep.tolist() == keep
    assert d.new_experts.tolist() == new


@pytest.mark.parametrize("r", [0.0, 0.5, 1.0])
def test_probe_worth_matches_naive_reference(r):
    g = torch.Generator().manual_seed(4)
    cost = ExpertCost(probe_token_us=40.0, keep_token_us=0.0, per_expert_layer_us=1.5, num_moe_layers=40,
                      mean_new_experts=3.0, cross_layer_correlation=r)
    survival = torch.rand(50, generator=g)
    got = probe_worth(survival, 0.002, cost, 8, threshold=1.2, overhead_us=2.0).tolist()
    assert got == naive_probe_worth(survival.tolist(), 0.002, cost, 8, 1.2, 2.0)
    assert any(got) and not all(got)


def test_probe_worth_hand_made():
    # Every probe adds exactly 0 or 8 experts in layer 0 (p = 0 or 1): the benefit is deterministic.
    free = ExpertCost(probe_token_us=10.0, keep_token_us=0.0, per_expert_layer_us=1.0, num_moe_layers=1,
                      mean_new_experts=0.0)
    assert probe_worth(torch.tensor([0.5]), 0.01, free, 8).tolist() == [True]    # value 50 > 10
    assert probe_worth(torch.tensor([0.05]), 0.01, free, 8).tolist() == [False]  # value 5 < 10
    dear = ExpertCost(probe_token_us=10.0, keep_token_us=0.0, per_expert_layer_us=10.0, num_moe_layers=1,
                      mean_new_experts=8.0)
    # Keeping always costs 80 us: a probe worth 50 us is never kept, so never worth probing.
    assert probe_worth(torch.tensor([0.5]), 0.01, dear, 8).tolist() == [False]
    assert probe_worth(torch.tensor([1.0]), 0.01, dear, 8).tolist() == [True]   # 100 - 80 = 20 > 10


def _toy_moe(x, ids, weights, experts):
    """Naive MoE: out[t] = sum_j w[t, j] * expert[ids[t, j]](x[t]); ids < 0 are skipped. Returns the output
    and the set of experts that ran."""
    out = torch.zeros_like(x)
    ran = set()
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            ran.add(e)
            out[t] += weights[t, j] * torch.tanh(x[t] @ experts[e])
    return out, ran


def test_neutralised_routing_leaves_kept_tokens_unchanged_and_runs_no_expert_for_dropped():
    g = torch.Generator().manual_seed(3)
    tokens, hidden, experts, k = 9, 16, 12, 3
    x = torch.randn(tokens, hidden, generator=g)
    w_experts = torch.randn(experts, hidden, hidden, generator=g) / 4
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=g)
    keep = torch.ones(tokens, dtype=torch.bool)
    keep[[4, 8]] = False
    new_ids, new_weights = neutralize_routing(ids, weights, keep)
    full, _ = _toy_moe(x, ids, weights, w_experts)
    out, ran = _toy_moe(x, new_ids, new_weights, w_experts)
    assert torch.equal(out[keep], full[keep])
    assert torch.equal(out[~keep], torch.zeros_like(out[~keep]))
    assert ran == {int(e) for e in ids[keep].flatten()}
    assert torch.equal(new_ids[keep], ids[keep]) and torch.equal(new_weights[keep], weights[keep])
    assert (new_ids[~keep] == -1).all() and (new_weights[~keep] == 0).all()


def test_dropped_probe_is_never_accepted():
    """Greedy verification with the corrected lengths: a dropped probe is not verified, so even a probe
    that matches the target's argmax adds nothing, while a kept one can be accepted."""
    num_drafts = torch.tensor([2, 3, 1])
    probe_index = torch.tensor([2, 6, -1])  # request 2 had no draft left to probe
    keep = torch.ones(8, dtype=torch.bool)
    keep[2] = False
    verified = verified_drafts_after_correction(num_drafts, probe_index, keep)
    assert verified.tolist() == [2, 4, 1]
    drafts = torch.tensor([[5, 6, 7, 8, 9], [1, 2, 3, 4, 5], [4, 4, 4, 4, 4]])
    target = drafts.clone()  # every draft, probes included, equals the target's choice
    match = (drafts == target) & (torch.arange(5) < verified[:, None])
    accepted = torch.cumprod(match.long(), -1).sum(-1)
    assert accepted.tolist() == [2, 4, 1]


def test_new_experts_per_token():
    ids = _ids([[0, 1], [2, 3], [1, 4], [5, 6]])
    base = torch.tensor([True, True, False, False])
    assert new_experts_per_token(ids, base, 8).tolist() == [0, 0, 1, 2]


def test_expert_cost_from_profile_recovers_the_synthetic_slope(profile):
    # The synthetic MoE time is 40 * (30 + 1.6 * U): 1.6 us per unique expert per layer.
    cost = expert_cost_from_profile(profile, 1, 8.0, num_moe_layers=MOE_LAYERS, top_k=TOP_K)
    assert cost.per_expert_layer_us == pytest.approx(1.6, rel=1e-6)
    assert 0 < cost.mean_new_experts < TOP_K
    assert cost.probe_token_us > 0 and cost.keep_token_us == pytest.approx(0.0, abs=1e-6)
    skipped = expert_cost_from_profile(profile, 1, 8.0, num_moe_layers=MOE_LAYERS, top_k=TOP_K,
                                       dropped_token_runs=False)
    assert skipped.probe_token_us == 0 and skipped.keep_token_us == pytest.approx(cost.probe_token_us)
    with pytest.raises(ValueError, match="unique_experts"):
        from vllm_hybridspec.latency_profile import LatencyProfile
        bare = LatencyProfile("d", "m", "v", [1], [1, 2], [[1.0, 2.0]])
        expert_cost_from_profile(bare, 1, 1.0, num_moe_layers=40, top_k=8)


def test_expert_cost_separates_expert_loads_from_token_compute(profile):
    # MoE time = 40 * (30 + 1.6 U) + 2.5 us per routed token: the fit must find both terms.
    import copy

    p = copy.deepcopy(profile)
    p.per_layer_type["moe"] = [[m + 2.5 * b * length for length, m in zip(p.lengths, row)]
                               for b, row in zip(p.batch_sizes, p.per_layer_type["moe"])]
    p.t_us = [[t + 2.5 * b * length for length, t in zip(p.lengths, row)] for b, row in zip(p.batch_sizes, p.t_us)]
    assert fit_moe_time(p) == pytest.approx((1.6 * MOE_LAYERS, 2.5), rel=1e-6)
    cost = expert_cost_from_profile(p, 8, 4.0, num_moe_layers=MOE_LAYERS, top_k=TOP_K)
    assert cost.per_expert_layer_us == pytest.approx(1.6, rel=1e-6)
    # a dropped probe still runs its MoE rows (weight 0 on experts the step runs anyway): the token compute is
    # paid by every probe, with the non-MoE time; a kept one adds nothing else besides its experts
    skipped = expert_cost_from_profile(p, 8, 4.0, num_moe_layers=MOE_LAYERS, top_k=TOP_K, dropped_token_runs=False)
    assert cost.keep_token_us == pytest.approx(0.0, abs=1e-6)
    assert skipped.keep_token_us == pytest.approx(cost.probe_token_us, rel=1e-6)
    plain = expert_cost_from_profile(profile, 8, 4.0, num_moe_layers=MOE_LAYERS, top_k=TOP_K)
    assert cost.probe_token_us - plain.probe_token_us == pytest.approx(2.5, rel=1e-6)


def test_probe_cost_model_prices_each_step_shape(profile):
    model = ProbeCostModel(profile, num_moe_layers=MOE_LAYERS, top_k=TOP_K, cross_layer_correlation=0.5)
    for batch, length in ((1, 3.0), (1, 11.0), (8, 6.25), (20, 9.5), (64, 2.0)):
        want = expert_cost_from_profile(profile, batch, length, num_moe_layers=MOE_LAYERS, top_k=TOP_K,
                                        cross_layer_correlation=0.5, anchor_to_t=True)
        got = model.at(batch, length)
        for field in ("probe_token_us", "keep_token_us", "per_expert_layer_us", "mean_new_experts"):
            assert getattr(got, field) == pytest.approx(getattr(want, field), rel=1e-9, abs=1e-9), field
        assert model.at(batch, length) is got  # cached by step shape
    with pytest.raises(ValueError, match="batch >= 1"):
        model.at(0, 2.0)
    with pytest.raises(ValueError, match="length >= 1"):
        model.at(4, 0.5)
    from vllm_hybridspec.latency_profile import LatencyProfile
    with pytest.raises(ValueError, match="unique_experts"):
        ProbeCostModel(LatencyProfile("d", "m", "v", [1], [1, 2], [[1.0, 2.0]]), num_moe_layers=40, top_k=8)


def test_a_probe_is_priced_where_the_policy_stopped(profile):
    """The length policy stops in front of a dear token; the probe (the first draft it did not admit) is that
    token. Priced at the step's own length, the keep rule drops it; priced at a typical length, it kept it
    (why the correction lost at concurrency 1 on the measured profile)."""
    import copy

    from vllm_hybridspec.policy import VerifyLatencyModel, choose_verify_lengths

    p = copy.deepcopy(profile)
    jump = 6  # T(7) - T(6) at batch 1 carries a step of 1 ms, all of it in the non-MoE layers
    p.t_us[0] = [t + (1000.0 if length > jump else 0.0) for length, t in zip(p.lengths, p.t_us[0])]
    p.per_layer_type["rest"][0] = [r + (1000.0 if length > jump else 0.0)
                                   for length, r in zip(p.lengths, p.per_layer_type["rest"][0])]
    conf = torch.full((1, 15), 0.85)
    latency = VerifyLatencyModel(p, 1, 16)
    decision = choose_verify_lengths(conf, torch.tensor([15]), latency, lookahead=True)
    stop = int(decision.num_drafts[0])
    assert stop == jump - 1  # verified length 6: the next token is the dear one
    model = ProbeCostModel(p, num_moe_layers=MOE_LAYERS, top_k=TOP_K)
    value_us = float(decision.next_survival[0] / decision.marginal_rate)
    typical = model.at(1, 9.0)
    here = model.at(1, 1.0 + stop)
    fewest = torch.tensor(0.0)  # even a probe that adds no expert
    assert value_us > float(typical.probe_cost_us(fewest))
    assert value_us < here.probe_token_us + float(here.probe_cost_us(fewest))
    assert probe_worth(decision.next_survival, decision.marginal_rate, typical, TOP_K).all()
    assert not probe_worth(decision.next_survival, decision.marginal_rate, here, TOP_K).any()


def test_expert_cost_anchored_to_t_prices_the_average_probe_as_one_token_of_t(profile):
    """anchor_to_t: a probe with the average new-expert count costs what T charges for one more token (the
    MoE fit keeps only the per-expert slope), so a kept probe is never priced below the drafts around it."""
    for batch, length in ((1, 3.0), (8, 6.0), (20, 9.5)):
        cost = expert_cost_from_profile(profile, batch, length, num_moe_layers=MOE_LAYERS, top_k=TOP_K,
                                        anchor_to_t=True)
        t_token = (profile.interpolate(batch, length + 1) - profile.interpolate(batch, length)) / batch
        mean_cost = cost.probe_token_us + float(cost.probe_cost_us(torch.tensor(cost.mean_new_experts)))
        assert mean_cost == pytest.approx(max(t_token, mean_cost - cost.keep_token_us), rel=1e-6)
        plain = expert_cost_from_profile(profile, batch, length, num_moe_layers=MOE_LAYERS, top_k=TOP_K)
        assert cost.per_expert_layer_us == plain.per_expert_layer_us
        assert cost.mean_new_experts == plain.mean_new_experts


def test_token_dependent_keep_is_lossy_under_sampling():
    """Why only greedy requests may keep a probe: dropping a draft because of ITS OWN routing (a function
    of the token) biases speculative sampling. Exact emitted distribution at the probe's position."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    residual = (p - q).clamp(min=0) / (p - q).clamp(min=0).sum()

    def emitted(drop_prob):  # drop_prob[x]: chance the probe is dropped when the draft is x
        dropped = (q * drop_prob).sum() * p  # dropped: the bonus token comes from p
        accept = (1 - drop_prob) * torch.minimum(p, q)
        rejected_mass = ((1 - drop_prob) * (q - p).clamp(min=0)).sum()
        return dropped + accept + rejected_mass * residual

    assert torch.allclose(emitted(torch.zeros(3)), p)
    assert torch.allclose(emitted(torch.full((3,), 0.4)), p)  # token-independent: lossless
    biased = emitted(torch.tensor([0.0, 0.0, 1.0]))  # routing of token 2 looks expensive
    assert (biased - p).abs().sum() > 0.1


def test_bad_inputs_raise():
    ids = _ids([[0, 1], [2, 3]])
    probe = torch.tensor([False, True])
    with pytest.raises(ValueError, match="topk_ids"):
        routing_keep_mask(ids[0], probe, torch.zeros(2), 0.1, COST, 4)
    with pytest.raises(ValueError, match="probe_mask"):
        routing_keep_mask(ids, torch.tensor([0, 1]), torch.zeros(2), 0.1, COST, 4)
    with pytest.raises(ValueError, match="probe_survival"):
        routing_keep_mask(ids, probe, torch.zeros(3), 0.1, COST, 4)
    with pytest.raises(ValueError, match="threshold"):
        routing_keep_mask(ids, probe, torch.zeros(2), 0.1, COST, 4, threshold=0.0)
    with pytest.raises(ValueError, match="keep"):
        neutralize_routing(ids, torch.ones(2, 2), torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="cross_layer_correlation"):
        ExpertCost(0.0, 1.0, 1.0, 4, 1.0, cross_layer_correlation=1.5)
    with pytest.raises(ValueError, match="num_moe_layers"):
        ExpertCost(0.0, 1.0, 1.0, 0, 1.0)
    with pytest.raises(ValueError, match=">= 0"):
        ExpertCost(-1.0, 1.0, 1.0, 4, 1.0)
    with pytest.raises(ValueError, match="top_k"):
        probe_worth(torch.ones(2), 0.1, COST, 0)
    with pytest.raises(ValueError, match="probe_index"):
        verified_drafts_after_correction(torch.tensor([1, 2]), torch.tensor([0]), torch.ones(2, dtype=torch.bool))
