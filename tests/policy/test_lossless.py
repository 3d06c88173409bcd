"""The length policy keeps speculative sampling lossless: emitted sequences follow the target distribution.

Toy target p and draft q are Markov chains over a small vocabulary; each trial is one request of a batch
of B (independent requests, so the batch-aware ranking mixes them). Every round drafts K tokens from q,
computes c[b, k] = sum_v min(p, q)(v | x_{k-1}) (the exact conditional acceptance probability: a function
of the prefix only), lets the policy choose the lengths, then runs standard rejection sampling (accept x_k
with min(1, p/q), otherwise draw from the normalised residual (p - q)+; a bonus token from p when every
verified draft is accepted). The first M emitted tokens of many seeded trials are compared with the
target's exact distribution by a chi-square test. A rule that peeks at the drafted token itself is run
through the same harness and must be caught (the test has power).
"""
from __future__ import annotations

import itertools

import pytest
import torch

from vllm_hybridspec.latency_profile import LatencyProfile
from vllm_hybridspec.policy import (
    VerifyLatencyModel,
    choose_verify_lengths,
    prefix_scan_budget,
    vllm_adaptive_lengths,
)
from policy_fixtures import one_thread  # noqa: F401  (pytest fixtures)

VOCAB, K, M, BATCH = 4, 4, 3, 4


def _tables(seed):
    g = torch.Generator().manual_seed(seed)
    concentration = torch.full((VOCAB + 1, VOCAB), 1.5)
    p = torch._sample_dirichlet(concentration, generator=g).double()
    q = torch._sample_dirichlet(concentration, generator=g).double()
    # Mix q towards p so that acceptance varies from poor to good across contexts.
    mix = torch.rand(VOCAB + 1, 1, generator=g, dtype=torch.float64)
    q = mix * p + (1 - mix) * q
    return p, q


def _latency():
    lengths = list(range(1, K + 2))
    # Steep in L (a hybrid target), so the policy's choices really vary with the confidences.
    t = [[1000.0 * (1 + 0.35 * (length - 1)) * (1 + 0.2 * (b - 1)) for length in lengths] for b in (1, 8)]
    profile = LatencyProfile("toy", "toy", "toy", [1, 8], lengths, t)
    return VerifyLatencyModel(profile, BATCH, K + 1, overhead_us=200.0)


def _simulate(rule, trials, seed, p, q):
    """Runs `trials` requests (in groups of BATCH) until each emitted M tokens; returns [trials, M] tokens
    and the histogram of verified draft counts."""
    g = torch.Generator().manual_seed(seed)
    groups = trials // BATCH
    out = torch.full((groups, BATCH, M), -1, dtype=torch.long)
    filled = torch.zeros(groups, BATCH, dtype=torch.long)
    last = torch.full((groups, BATCH), VOCAB, dtype=torch.long)  # BOS row
    length_hist = torch.zeros(K + 1, dtype=torch.long)
    accept_ratio = torch.minimum(torch.ones_like(p), p / q)

    def sample(probs):
        flat = probs.reshape(-1, VOCAB)
        return torch.multinomial(flat, 1, generator=g).reshape(probs.shape[:-1])

    def emit(mask, tokens):
        nonlocal filled
        slot = filled.clamp(max=M - 1).unsqueeze(-1)
        write = mask & (filled < M)
        current = out.gather(-1, slot).squeeze(-1)
        out.scatter_(-1, slot, torch.where(write, tokens, current).unsqueeze(-1))
        filled = filled + write.long()

    for _ in range(M):
        drafts, prevs, conf = [], [], []
        prev = last
        for _k in range(K):
            x = sample(q[prev])
            prevs.append(prev)
            drafts.append(x)
            conf.append(torch.minimum(p[prev], q[prev]).sum(-1))
            prev = x
        drafts, prevs = torch.stack(drafts, -1), torch.stack(prevs, -1)
        conf = torch.stack(conf, -1).float()
        n = rule(conf, drafts, prevs).long()
        length_hist += torch.bincount(n.flatten(), minlength=K + 1)

        alive = torch.ones(groups, BATCH, dtype=torch.bool)
        cur = last.clone()
        for k in range(K):
            verifying = alive & (k < n)
            x, pv = drafts[..., k], prevs[..., k]
            u = torch.rand(groups, BATCH, generator=g, dtype=torch.float64)
            accepted = verifying & (u < accept_ratio[pv, x])
            rejected = verifying & ~accepted
            residual = (p[pv] - q[pv]).clamp(min=0)
            residual = residual / residual.sum(-1, keepdim=True).clamp(min=1e-300)
            fix = sample(torch.where(rejected.unsqueeze(-1), residual, p[pv]))
            emit(accepted, x)
            emit(rejected, fix)
            cur = torch.where(accepted, x, torch.where(rejected, fix, cur))
            alive = alive & ~rejected
        bonus = sample(p[cur])
        emit(alive, bonus)
        last = torch.where(alive, bonus, cur)
    assert (filled >= M).all()
    return out.reshape(-1, M), length_hist


def _chi_square_pvalue(tokens, p):
    cells = list(itertools.product(range(VOCAB), repeat=M))
    expected = []
    for seq in cells:
        prob, prev = 1.0, VOCAB
        for t in seq:
            prob *= float(p[prev, t])
            prev = t
        expected.append(prob)
    expected = torch.tensor(expected, dtype=torch.float64) * tokens.shape[0]
    index = sum(tokens[:, i] * VOCAB ** (M - 1 - i) for i in range(M))
    observed = torch.bincount(index, minlength=VOCAB ** M).double()
    stat = ((observed - expected) ** 2 / expected).sum()
    dof = torch.tensor((len(cells) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, stat / 2)), float(0.5 * (observed / observed.sum() - expected / expected.sum()).abs().sum())


TRIALS = 100_000


@pytest.fixture(scope="module")
def toy():
    return _tables(seed=7)


def test_policy_output_follows_target(toy):
    p, q = toy
    latency = _latency()
    rule = lambda conf, drafts, prevs: choose_verify_lengths(conf, torch.full(conf.shape[:-1], K), latency).num_drafts
    tokens, lengths = _simulate(rule, TRIALS, seed=1, p=p, q=q)
    # The policy must actually vary the lengths, or the test would prove nothing about it.
    assert (lengths > 0).sum() >= 3, lengths
    pvalue, tv = _chi_square_pvalue(tokens, p)
    assert pvalue > 1e-3, (pvalue, tv)
    assert tv < 0.02


def test_lookahead_policy_output_follows_target(toy):
    """The lookahead with last round's confidences as forecast and a floor from last round's best prefix (the
    simulator's `hybridspec`, plus the floor): both read the previous round, which the rule carries over."""
    p, q = toy
    latency = _latency()
    last = {}

    def rule(conf, drafts, prevs):
        num = torch.full(conf.shape[:-1], K)
        forecast = last.get("conf", torch.ones_like(conf))
        decision = choose_verify_lengths(conf, num, latency, lookahead=True, forecast_confidences=forecast,
                                         budget_floor=prefix_scan_budget(forecast, num, latency))
        last["conf"] = conf
        return decision.num_drafts

    tokens, lengths = _simulate(rule, TRIALS, seed=4, p=p, q=q)
    assert (lengths > 0).sum() >= 3, lengths
    pvalue, tv = _chi_square_pvalue(tokens, p)
    assert pvalue > 1e-3, (pvalue, tv)
    assert tv < 0.02


def test_vllm_rule_with_stale_budget_follows_target(toy):
    p, q = toy
    latency = _latency()
    stale = torch.full((TRIALS // BATCH, BATCH, K), 0.7)
    rule = lambda conf, drafts, prevs: vllm_adaptive_lengths(
        conf, torch.full(conf.shape[:-1], K), latency, budget_confidences=stale)
    tokens, lengths = _simulate(rule, TRIALS, seed=2, p=p, q=q)
    assert (lengths > 0).sum() >= 2, lengths
    assert _chi_square_pvalue(tokens, p)[0] > 1e-3


def test_peeking_rule_is_caught(toy):
    """Stopping BEFORE a draft the drafter itself found unlikely reads x_k: the harness must flag it."""
    p, q = toy

    def peeking(conf, drafts, prevs):
        q_of_draft = q[prevs, drafts]
        ok = torch.cumprod((q_of_draft > 0.3).long(), dim=-1)
        return ok.sum(-1)

    tokens, _ = _simulate(peeking, TRIALS, seed=3, p=p, q=q)
    assert _chi_square_pvalue(tokens, p)[0] < 1e-6


def test_non_greedy_requests_with_routing_probes_follow_target(toy):
    """Routing correction grants extra drafts for probes; a non-greedy request must verify only the drafts its
    length policy admitted (RoutingStep.invalid_rows). Stopping just before its probe instead (its last admitted
    draft past the policy's budget) verifies draft k depending on draft k itself: that rule is caught."""
    from vllm_hybridspec.adaptive.budget import assign_drafts
    from vllm_hybridspec.routing_wiring.step import mark_probes

    p, q = toy
    caps = torch.full((BATCH,), K, dtype=torch.int32)

    def verified(conf, shipped):
        out = torch.empty(conf.shape[:2], dtype=torch.int32)
        for g in range(conf.shape[0]):
            counts = assign_drafts(conf[g], caps, 4 + 2, min_drafts=0)  # a policy budget of 4, two probes granted
            probe, _, within_policy = mark_probes(conf[g], caps, counts, 4, min_drafts=0)
            out[g] = within_policy if shipped else counts - probe.int()
        return out

    # 30k trials (CI time; was 40k): the biased rule's p-value at seeds 11..18 is 8e-11 at worst (40k: 3e-18); at
    # 20k one of those seeds gave 6e-4, not caught, so 20k would lose power.
    trials = 30_000
    tokens, _ = _simulate(lambda conf, drafts, prevs: verified(conf, True), trials, seed=11, p=p, q=q)
    assert _chi_square_pvalue(tokens, p)[0] > 1e-3
    tokens, _ = _simulate(lambda conf, drafts, prevs: verified(conf, False), trials, seed=11, p=p, q=q)
    assert _chi_square_pvalue(tokens, p)[0] < 1e-6
