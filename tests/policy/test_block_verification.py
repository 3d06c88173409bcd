"""vLLM's block verification (`rejection_sample_method="block"`, Sun et al. 2024) stays exact when a request's
verified drafts end at a data-dependent length, as long as that length depends only on earlier drafts.

Adaptive verification (vLLM's and ours) and the routing correction hand MRV2's rejection sampler fewer drafts than
were proposed, or mark the rest invalid (-1); both end the block at the last verified draft, which the block rule
then treats as the block's end (h = p_T there). The block rule is proven exact for a fixed block length; this checks
by exact enumeration (float64, Markov toy target and drafter, every draft sequence and every acceptance length) that
one verification round followed by the target itself gives the target's distribution over the next tokens, for
lengths that are stopping times of the drafts, and that a length peeking at the next draft is caught. The round
follows vLLM 0.33's kernels (`rejection_sampler_utils.py`): the cumulative ratio p_i = min(p_{i-1} p(x_i) / q(x_i),
1); h_i = r_i / (r_i + 1 - p_i) with r_i = sum_x max(p_i p(x | x_<=i) - q(x | x_<=i), 0) while a next draft is
verified, h = p_T at the last one; accepted length tau = the largest i with u_i <= h_i (independent u_i); then a
token from max(p_tau p - q, 0) after a rejected draft, or from p after the last verified draft.
"""
from __future__ import annotations

import itertools

import pytest
import torch

VOCAB, DRAFTS = 3, 3
BOS = VOCAB


def _tables(seed: int, proposal: str = "sampled") -> tuple[torch.Tensor, torch.Tensor]:
    """Target p and drafter q (rows: the previous token, BOS last); "one_hot": a greedy drafter (vLLM without draft
    logits: q is the point mass at its draft)."""
    g = torch.Generator().manual_seed(seed)
    conc = torch.full((VOCAB + 1, VOCAB), 1.2)
    p = torch._sample_dirichlet(conc, generator=g).double()
    q = torch._sample_dirichlet(conc, generator=g).double()
    if proposal == "one_hot":
        q = torch.nn.functional.one_hot(q.argmax(-1), VOCAB).double()
    return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)  # rows sum to 1 in float64


def _seq_prob(table: torch.Tensor, prev: int, tokens) -> float:
    prob = 1.0
    for x in tokens:
        prob *= float(table[prev, x])
        prev = x
    return prob


def _round_then_target(p, q, verified_count, horizon: int) -> dict[tuple[int, ...], float]:
    """P(first `horizon` tokens) when one block-verification round (drafts from q, `verified_count(drafts)` of them
    verified) is followed by the target itself."""
    out: dict[tuple[int, ...], float] = {}

    def emit(prefix: tuple[int, ...], prob: float) -> None:
        # The target continues from the round's tokens up to the horizon.
        prev = prefix[-1] if prefix else BOS
        for rest in itertools.product(range(VOCAB), repeat=horizon - len(prefix)):
            seq = prefix + rest
            out[seq] = out.get(seq, 0.0) + prob * _seq_prob(p, prev, rest)

    for drafts in itertools.product(range(VOCAB), repeat=DRAFTS):
        draft_prob = _seq_prob(q, BOS, drafts)
        if draft_prob == 0.0:  # a one-hot drafter never proposes it
            continue
        t = verified_count(drafts)
        ctx = (BOS,) + drafts  # ctx[i]: the token before draft i + 1
        ratio = [1.0]  # p_0 .. p_t
        for i in range(t):
            ratio.append(min(ratio[-1] * float(p[ctx[i], drafts[i]] / q[ctx[i], drafts[i]]), 1.0))
        h = [0.0] * (t + 1)
        for i in range(1, t + 1):
            if i < t:
                residual = float(torch.clamp(ratio[i] * p[ctx[i]] - q[ctx[i]], min=0).sum())
                denom = residual + 1.0 - ratio[i]
                h[i] = residual / denom if denom > 0 else 1.0
            else:
                h[i] = ratio[i]
        for tau in range(t + 1):
            p_tau = (h[tau] if tau else 1.0) * float(torch.prod(1 - torch.tensor(h[tau + 1:], dtype=torch.float64)))
            if p_tau == 0.0:
                continue
            row = ctx[tau]
            if tau == t:  # every verified draft accepted: the target's token after the last one
                nxt = p[row]
            else:
                nxt = torch.clamp(ratio[tau] * p[row] - q[row], min=0)
                nxt = nxt / nxt.sum()
            for y in range(VOCAB):
                if float(nxt[y]) > 0:
                    emit(tuple(drafts[:tau]) + (y,), draft_prob * p_tau * float(nxt[y]))
    return out


def _max_error(p, q, verified_count) -> float:
    horizon = DRAFTS + 1
    got = _round_then_target(p, q, verified_count, horizon)
    return max(abs(got.get(seq, 0.0) - _seq_prob(p, BOS, seq))
               for seq in itertools.product(range(VOCAB), repeat=horizon))


def _stop_after_token(token: int):
    """Verify up to and including the first draft equal to `token` (whether draft i + 1 is verified depends on
    drafts 1..i only)."""
    def count(drafts):
        for i, x in enumerate(drafts):
            if x == token:
                return i + 1
        return len(drafts)
    return count


def _stop_by_prefix_confidence(p, q, threshold: float):
    """Verify draft i + 1 while the prefix's exact acceptance chance sum_x min(p, q)(x | x_i) stays above the
    threshold (the kind of quantity adaptive lengths and routing ranks are built from)."""
    def count(drafts):
        prev = BOS
        for i, x in enumerate(drafts):
            if i > 0 and float(torch.minimum(p[prev], q[prev]).sum()) < threshold:
                return i
            prev = x
        return len(drafts)
    return count


def _peek_next(token: int):
    """Stops before a draft because of its own value (not a stopping time): must be caught."""
    def count(drafts):
        for i, x in enumerate(drafts):
            if x == token and i > 0:
                return i
        return len(drafts)
    return count


@pytest.mark.parametrize("proposal", ["sampled", "one_hot"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_verification_is_exact_for_lengths_set_by_earlier_drafts(seed, proposal):
    p, q = _tables(seed, proposal)
    for fixed in range(1, DRAFTS + 1):
        assert _max_error(p, q, lambda drafts, n=fixed: n) < 1e-12, fixed
    for token in range(VOCAB):
        assert _max_error(p, q, _stop_after_token(token)) < 1e-12, token
    for threshold in (0.5, 0.7, 0.9):
        assert _max_error(p, q, _stop_by_prefix_confidence(p, q, threshold)) < 1e-12, threshold


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_verification_length_peeking_at_a_draft_is_caught(seed):
    p, q = _tables(seed)
    assert max(_max_error(p, q, _peek_next(token)) for token in range(VOCAB)) > 1e-3
