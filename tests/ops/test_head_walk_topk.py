"""head_walk_topk (DSpark's top-k Markov walk: the bias-table and loop forms) against naive_head_walk_topk, against vLLM's
own top-k walk written as torch ops (baddbmm_ + scatter_ + argmax / vLLM's Gumbel noise), and its cache bookkeeping.

Without CUDA the kernel runs under the Triton interpreter (fp32 / fp16); GPU tests (marker gpu) run bf16 at real
shapes.
"""
import os
import types

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED or not ON_GPU else "cuda"

import pytest  # noqa: E402
import triton.language as tl  # noqa: E402

from hybridspec_kernels.head_walk.naive import DRAFT_NOISE_SALT, gumbel_noise, spec_step_seed  # noqa: E402
from hybridspec_kernels.head_walk_topk import (  # noqa: E402
    TABLE_MAX_TOPK,
    dense_step_logits,
    head_walk_topk,
    naive_head_walk_topk,
    naive_topk_candidates,
    topk_candidates,
    walk_candidates,
)

needs_kernels = pytest.mark.skipif(
    DEVICE == "cpu" and type(tl.standard.sigmoid).__name__ != "InterpretedFunction",
    reason="triton was imported before TRITON_INTERPRET=1 could be set: run with TRITON_INTERPRET=1",
)
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not ON_GPU or INTERPRETED, reason="needs CUDA")


def make_problem(rows, steps, vocab, topk, rank=32, dtype=torch.float32, seed=0, device=DEVICE, d2t=False,
                 scale=0.3, extra_target=40):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen) * s).to(device)

    p = types.SimpleNamespace(rows=rows, steps=steps, vocab=vocab, topk=topk)
    base = rnd(rows, steps, vocab, s=2.0).to(dtype)
    p.values, p.cand = base.topk(topk, dim=-1)
    target_vocab = vocab + extra_target if d2t else vocab
    p.w1 = rnd(target_vocab, rank, s=scale).to(dtype)
    p.w2 = rnd(vocab, rank, s=scale).to(dtype)  # vLLM's [V, r] rows
    p.x0 = torch.randint(0, target_vocab, (rows,), generator=gen).to(device)
    p.d2t = None
    if d2t:  # increasing target ids with gaps, as vLLM's d2t of a sorted draft vocabulary
        targets = torch.sort(torch.randperm(target_vocab, generator=gen)[:vocab]).values
        p.d2t = (targets - torch.arange(vocab)).to(device)
    p.target_vocab = target_vocab
    num_reqs = rows + 2
    p.temperature = (torch.rand(num_reqs, generator=gen) * 1.5 + 0.3).to(device)
    p.temperature[1] = 0.0  # a greedy request inside a sampled batch
    p.seeds = torch.randint(0, 2**62, (num_reqs,), generator=gen).to(device)
    p.positions = torch.randint(0, 100_000, (rows, steps), generator=gen).to(device)
    p.req = torch.randperm(num_reqs, generator=gen)[:rows].to(device)
    return p


def sampling(p, sampled):
    return dict(temperature=p.temperature, seeds=p.seeds, positions=p.positions) if sampled else {}


def vllm_topk_walk(p, sampled, logit_scale=1.0):
    """vLLM 0.33's _sample_sequential_topk + apply_bias_gathered + _sample_logits, as torch ops (the greedy argmax
    over the dense -inf row; the sampled draw as vLLM's Gumbel-max over target ids)."""
    rows, steps, vocab = p.rows, p.steps, p.vocab
    width = p.target_vocab
    dense = torch.full((rows, steps, vocab), float("-inf"), dtype=p.values.dtype, device=p.values.device)
    prev = p.x0.long()
    tokens = torch.empty(rows, steps, dtype=torch.long, device=p.values.device)
    cols_all = torch.arange(vocab, device=p.values.device)
    target_cols = cols_all if p.d2t is None else cols_all + p.d2t
    cache = torch.full((rows, steps, width), float("-inf"), device=p.values.device)
    for i in range(steps):
        embed = p.w1[prev]
        weight = p.w2[p.cand[:, i]]
        corrected = p.values[:, i].unsqueeze(-1).clone()
        corrected.baddbmm_(weight, embed.unsqueeze(-1), beta=1.0, alpha=logit_scale)
        logits = dense[:, i].scatter_(1, p.cand[:, i], corrected.squeeze(-1))
        if not sampled:
            x = logits.float().argmax(-1)
            x = target_cols[x]
        else:
            row_logits = torch.full((rows, width), float("-inf"), device=p.values.device)
            row_logits[:, target_cols] = logits.float()
            cache[:, i] = row_logits
            temp = p.temperature[p.req].float()
            hot = temp != 0
            noise = gumbel_noise(spec_step_seed(p.seeds[p.req], i)[:, None],
                                 p.positions[:, i, None] + DRAFT_NOISE_SALT, torch.arange(width, device=temp.device))
            scored = torch.where(hot[:, None], row_logits / torch.where(hot, temp, 1.0)[:, None] + noise, row_logits)
            x = scored.argmax(-1)
        tokens[:, i] = x
        prev = x
    return tokens, cache


FORMS = ["loop", "table", "table_ahead"]
CASES = [  # rows, steps, vocab, topk, rank
    (1, 7, 97, 8, 32),
    (3, 15, 300, 64, 64),
    (5, 4, 131, 33, 16),
    (2, 16, 1000, 100, 32),  # two chunks
    (4, 1, 50, 1, 32),
]


@needs_kernels
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("round_dot", [False, True], ids=["", "round_dot"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("d2t", [False, True], ids=["", "d2t"])
@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}n{c[1]}v{c[2]}k{c[3]}r{c[4]}" for c in CASES])
def test_matches_naive(case, d2t, sampled, round_dot, form):
    rows, steps, vocab, topk, rank = case
    dtype = torch.float16 if round_dot else torch.float32  # fp16: the rounding of the product matters
    p = make_problem(rows, steps, vocab, topk, rank, d2t=d2t, seed=rows * 31 + topk, dtype=dtype)
    corrected = torch.empty(rows, steps, topk, device=DEVICE)
    tokens = head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, req_indices=p.req, draft_to_target=p.d2t,
                            corrected_out=corrected, round_dot=round_dot, form=form, **sampling(p, sampled))
    want_tokens, want_corrected = naive_head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, req_indices=p.req,
                                                       draft_to_target=p.d2t, force_tokens=tokens,
                                                       round_dot=round_dot, **sampling(p, sampled))
    ref_tokens, _ = naive_head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, req_indices=p.req,
                                         draft_to_target=p.d2t, round_dot=round_dot, **sampling(p, sampled))
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(corrected, want_corrected, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_matches_vllms_topk_walk(dtype, sampled, form):
    """Drafts and cached rows equal to vLLM's own ops (fp32 / fp16: the interpreter's bf16 is wrong)."""
    p = make_problem(4, 15, 257, 16, 64, dtype=dtype, d2t=True, seed=7)
    p.req = torch.arange(p.rows, device=DEVICE)  # vllm_topk_walk's cache is by row
    cache = torch.full((p.rows, p.steps, p.target_vocab), 5.0, device=DEVICE)
    cache.fill_(float("-inf"))
    columns = torch.full((p.rows, p.steps, p.topk), -1, dtype=torch.int64, device=DEVICE)
    tokens = head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, req_indices=p.req, draft_to_target=p.d2t,
                            draft_logits=cache if sampled else None, cached_columns=columns if sampled else None,
                            form=form, **sampling(p, sampled))
    want_tokens, want_cache = vllm_topk_walk(p, sampled)
    assert torch.equal(tokens, want_tokens)
    if sampled:
        written = torch.isfinite(want_cache)
        assert torch.equal(torch.isfinite(cache), written)
        if dtype == torch.float16:  # rounded once to fp16 on both sides
            assert torch.equal(cache, want_cache)
        else:  # fp32: only the order of the r products differs
            torch.testing.assert_close(cache[written], want_cache[written], rtol=0, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("topk", [5, 8])
def test_a_step_whose_candidates_all_score_minus_inf(topk, form):
    """The lanes past K (K 5: not a power of two; K 8: below the table form's 16-wide tile) never win: a step whose
    candidates all score -inf picks the smallest draft id among them, as the reference does."""
    p = make_problem(3, 4, 60, topk, 16, seed=topk)
    p.values[:, 1] = float("-inf")
    tokens = head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, form=form)
    want, _ = naive_head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0)
    assert torch.equal(tokens, want)
    assert torch.equal(tokens[:, 1], p.cand[:, 1].min(dim=1).values)


@needs_kernels
@pytest.mark.parametrize("form", FORMS)
def test_logit_scale(form):
    p = make_problem(2, 5, 120, 12, 32, seed=3)
    tokens = head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, logit_scale=0.7, form=form)
    want, _ = naive_head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, logit_scale=0.7)
    vllm, _ = vllm_topk_walk(p, False, logit_scale=0.7)
    assert torch.equal(tokens, want) and torch.equal(tokens, vllm)


@needs_kernels
@pytest.mark.parametrize("form", FORMS)
def test_cache_rows_stay_dense_topk_rows_across_walks(form):
    """Walks that reuse request slots leave each slot's rows exactly vLLM's dense top-k rows: -inf everywhere but the
    last walk's candidates (the columns a previous walk wrote are put back to -inf)."""
    slots, steps, vocab, topk = 6, 4, 90, 10
    cache = torch.full((slots, steps + 1, vocab), float("-inf"), device=DEVICE)
    columns = torch.full((slots, steps + 1, topk), -1, dtype=torch.int64, device=DEVICE)
    for walk in range(4):
        p = make_problem(3, steps, vocab, topk, 32, seed=100 + walk)
        req = torch.tensor([walk % slots, (walk + 2) % slots, -1], device=DEVICE)  # a padding row
        corrected = torch.empty(3, steps, topk, device=DEVICE)
        head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, req_indices=req, temperature=p.temperature,
                       seeds=p.seeds, positions=p.positions, draft_logits=cache, cached_columns=columns,
                       corrected_out=corrected, form=form)
        dense = dense_step_logits(corrected, p.cand, vocab)
        for b in range(2):
            assert torch.equal(cache[req[b], :steps], dense[b]), (walk, b)
        assert torch.isneginf(cache[:, steps]).all()  # the step past N is never written
    written = {0, 2, 1, 3, 4, 5}
    assert all(torch.isfinite(cache[s, 0]).sum() == topk for s in written)


@needs_kernels
@pytest.mark.parametrize("form", FORMS)
def test_padding_rows_write_nothing_and_walk(form):
    p = make_problem(3, 3, 64, 5, 16, seed=9)
    req = torch.tensor([-1, 0, -1], device=DEVICE)
    x0 = torch.tensor([10**6, 3, -5], device=DEVICE)  # garbage anchors on padding rows stay inside W1
    cache = torch.full((2, 3, 64), float("-inf"), device=DEVICE)
    columns = torch.full((2, 3, 5), -1, dtype=torch.int64, device=DEVICE)
    tokens = head_walk_topk(p.values, p.cand, p.w1, p.w2, x0, req_indices=req, temperature=p.temperature,
                            seeds=p.seeds, positions=p.positions, draft_logits=cache, cached_columns=columns,
                            form=form)
    assert torch.isfinite(cache[0]).sum() == 3 * 5 and torch.isneginf(cache[1]).all()
    assert (columns[1] == -1).all()
    want, _ = naive_head_walk_topk(p.values, p.cand, p.w1, p.w2, x0.clamp(0, p.w1.shape[0] - 1), req_indices=req,
                                   temperature=p.temperature, seeds=p.seeds, positions=p.positions)
    assert torch.equal(tokens, want)


@needs_kernels
def test_sampled_draw_distribution():
    """The first step's draws over many seeds follow softmax(corrected / T) over the candidates."""
    rows, topk, draws = 1, 6, 3000
    p = make_problem(rows, 1, 40, topk, 16, seed=5, scale=0.5)
    temp = torch.tensor([0.9], device=DEVICE)
    counts = torch.zeros(p.w1.shape[0])
    corrected = torch.empty(rows, 1, topk, device=DEVICE)
    values = p.values.expand(draws, 1, topk).contiguous()
    cand = p.cand.expand(draws, 1, topk).contiguous()
    seeds = torch.arange(draws, device=DEVICE) * 7919 + 11
    tokens = head_walk_topk(values, cand, p.w1, p.w2, p.x0.expand(draws).contiguous(),
                            temperature=temp.expand(draws).contiguous(), seeds=seeds,
                            positions=torch.full((draws, 1), 17, device=DEVICE))
    head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, corrected_out=corrected)
    counts.index_add_(0, tokens[:, 0].cpu(), torch.ones(draws))
    probs = torch.softmax(corrected[0, 0].cpu() / 0.9, dim=0)
    observed = counts[p.cand[0, 0].cpu()] / draws
    assert counts.sum() == observed.sum() * draws  # every draw is a candidate
    assert (observed - probs).abs().max() < 4 * (probs * (1 - probs) / draws).sqrt().max() + 1e-3


@pytest.mark.parametrize("bad, message", [
    (dict(candidates=torch.zeros(2, 3, 4, dtype=torch.int64)), "must be the same"),
    (dict(base_values=torch.zeros(2, 3, 5000), candidates=torch.zeros(2, 3, 5000, dtype=torch.int64)), "top-k"),
    (dict(base_values=torch.zeros(2, 3, 5, dtype=torch.float64)), "base_values in"),
    (dict(w2_rows=torch.zeros(16, 32, dtype=torch.float16)), "one float dtype"),
    (dict(w2_rows=torch.zeros(32, 16).t()), "contiguous"),
    (dict(first_tokens=torch.zeros(3, dtype=torch.int64)), "first_tokens"),
    (dict(temperature=torch.ones(2)), "together"),
    (dict(draft_logits=torch.zeros(2, 3, 16)), "cached_columns"),
    (dict(draft_logits=torch.zeros(2, 3, 16), cached_columns=torch.zeros(2, 3, 5, dtype=torch.int32)), "int64"),
    (dict(draft_logits=torch.zeros(2, 3, 12), cached_columns=torch.zeros(2, 3, 5, dtype=torch.int64)),
     "12 columns for 16 draft ids"),
    (dict(draft_to_target=torch.zeros(9, dtype=torch.int64)), "draft_to_target"),
    (dict(w1=torch.zeros(8, 32)), "w1 has 8 rows"),
    (dict(temperature=torch.ones(2), seeds=torch.zeros(2, dtype=torch.int64), positions=torch.zeros(2, 3)),
     "positions"),
    (dict(form="tables"), "form 'tables'"),
    (dict(base_values=torch.zeros(2, 3, 200), candidates=torch.zeros(2, 3, 200, dtype=torch.int64),
          w1=torch.zeros(256, 32), w2_rows=torch.zeros(256, 32), form="table"), "at most 128"),
    (dict(temperature=torch.ones(1), seeds=torch.zeros(2, dtype=torch.int64),
          positions=torch.zeros(2, 3, dtype=torch.int64)), "temperature"),
])
def test_bad_input(bad, message):
    args = dict(base_values=torch.zeros(2, 3, 5), candidates=torch.zeros(2, 3, 5, dtype=torch.int64),
                w1=torch.zeros(16, 32), w2_rows=torch.zeros(16, 32), first_tokens=torch.zeros(2, dtype=torch.int64))
    args.update(bad)
    positional = [args.pop(name) for name in ("base_values", "candidates", "w1", "w2_rows", "first_tokens")]
    with pytest.raises(ValueError, match=message):
        head_walk_topk(*positional, **args)


def tied_logits(rows, vocab, dtype, device, seed):
    """Random 16-bit logits with many exact ties (coarse values), a tied plateau at the top, -0.0 / +0.0 and NaN."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randint(-40, 40, (rows, vocab), generator=gen).float() / 8).to(dtype)
    x[:, 3:40] = 5.0  # a plateau that straddles every small k's boundary
    x[0, 7] = float("nan")
    x[-1, :20] = -0.0
    x[-1, 20:40] = 0.0
    return x.to(device)


SELECT_CASES = [  # rows, vocab, k, split (small splits: a row over several programs)
    (3, 1000, 8, 256),
    (2, 5000, 64, 1024),
    (4, 300, 300, 128),
    (1, 77, 1, 8192),
    (2, 3000, 200, 256),  # k above a split: every split stages all it has
    (5, 2049, 40, 512),
]


@needs_kernels
@pytest.mark.parametrize("digit_bits, bound_pieces", [(4, None), (8, 0), (4, 2), (8, 16)])
@pytest.mark.parametrize("case", SELECT_CASES, ids=[f"r{c[0]}v{c[1]}k{c[2]}s{c[3]}" for c in SELECT_CASES])
def test_topk_candidates_match_naive(case, digit_bits, bound_pieces):
    """Tied logits: the plateau overflows its split's bound (the select path), the other splits stage without one."""
    rows, vocab, k, split = case
    x = tied_logits(rows, vocab, torch.float16, DEVICE, seed=vocab + k)
    values, index = topk_candidates(x, k, split=split, num_warps=4, digit_bits=digit_bits, bound_pieces=bound_pieces)
    want_values, want_index = naive_topk_candidates(x, k)
    order, want_order = index.argsort(-1), want_index.argsort(-1)  # the same set; the order is not torch's
    assert torch.equal(index.gather(-1, order), want_index.gather(-1, want_order))
    assert torch.equal(values.gather(-1, order).view(torch.int16),
                       want_values.gather(-1, want_order).view(torch.int16))  # NaN and -0.0 bit for bit


@needs_kernels
@pytest.mark.parametrize("digit_bits", [4, 8])
def test_topk_candidates_bound_fallback_rows(digit_bits):
    """Two-read path, rows of every kind in one call: a constant row and a row rising along the vocabulary overfill
    their lists (the one-read fallback), random rows do not; a tied top exceeding k orders its ties by index."""
    vocab, k = 3000, 24
    gen = torch.Generator().manual_seed(digit_bits)
    x = torch.randn(5, vocab, generator=gen).half()
    x[1] = 1.5
    x[2] = torch.linspace(-4, 4, vocab).half()
    x[3, 100:160] = 9.0  # 60 tied at the top: the first 24 by index
    x[4, ::97] = 9.0
    for bound_pieces in (4, 16, 64):  # 64: pieces of 8, the constant row chooses more than the most pieces
        values, index = topk_candidates(x.to(DEVICE), k, split=512, num_warps=4, digit_bits=digit_bits,
                                        bound_pieces=bound_pieces)
        want_values, want_index = naive_topk_candidates(x, k)
        assert torch.equal(index.cpu().sort(-1).values, want_index.sort(-1).values)
        assert torch.equal(values.cpu().float().sort(-1).values, want_values.float().sort(-1).values)


@needs_kernels
@pytest.mark.parametrize("k", [12, 40, 70])
def test_topk_candidates_bound_signed_zeros(k):
    """Two-read path: rows whose k-th key is -0.0 or +0.0 (the maxima pass's float maximum cannot tell them apart),
    with pieces holding only -0.0 beside pieces holding +0.0, and a NaN."""
    vocab = 2000
    gen = torch.Generator().manual_seed(k)
    x = torch.full((3, vocab), -1.0)
    x[:, torch.randperm(vocab, generator=gen)[:8]] = 1.0
    x[0, 300:340] = 0.0
    x[0, 900:960] = -0.0
    x[1, 0:400:7] = -0.0
    x[1, 1000:1003] = 0.0
    x[2, 500:1500:3] = -0.0
    x[2, 77] = float("nan")
    x = x.half()
    values, index = topk_candidates(x.to(DEVICE), k, split=512, num_warps=4, bound_pieces=16)
    want_values, want_index = naive_topk_candidates(x, k)
    assert torch.equal(index.cpu().sort(-1).values, want_index.sort(-1).values)
    assert torch.equal(values.cpu().view(torch.int16).sort(-1).values, want_values.view(torch.int16).sort(-1).values)


def test_topk_candidates_bad_input():
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        topk_candidates(torch.zeros(2, 10), 3)
    with pytest.raises(ValueError, match="outside 1..10"):
        topk_candidates(torch.zeros(2, 10, dtype=torch.float16), 11)
    with pytest.raises(ValueError, match="staged candidates"):
        topk_candidates(torch.zeros(2, 10_000, dtype=torch.float16), 5000, split=128)
    with pytest.raises(ValueError, match="bound_pieces 3"):
        topk_candidates(torch.zeros(2, 10, dtype=torch.float16), 3, split=64, bound_pieces=3)
    with pytest.raises(ValueError, match="a bound for k 600"):
        topk_candidates(torch.zeros(2, 10_000, dtype=torch.float16), 600, bound_pieces=4)
    with pytest.raises(ValueError, match="bound_pieces 128"):
        topk_candidates(torch.zeros(2, 10, dtype=torch.float16), 3, split=64, bound_pieces=128)


# ---------------------------------------------------------------------------------------------------------- GPU
GPU_CASES = [  # rows, steps, vocab, topk, d2t target vocab
    (1, 15, 32_000, 64, None),
    (8, 15, 151_936, 64, None),
    (32, 7, 32_000, 256, None),
    (64, 15, 248_320, 64, None),
    (3, 15, 32_000, 100, 151_936),
]


@gpu
@needs_cuda
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"b{c[0]}n{c[1]}v{c[2]}k{c[3]}" + ("d2t" if c[4] else "")
                                                  for c in GPU_CASES])
def test_gpu_matches_vllms_topk_walk_bf16(case, sampled, form):
    if form != "loop" and case[3] > TABLE_MAX_TOPK:
        pytest.skip(f"the table forms take K <= {TABLE_MAX_TOPK}")
    rows, steps, vocab, topk, target_vocab = case
    p = make_problem(rows, steps, vocab, topk, 256, dtype=torch.bfloat16, device="cuda", seed=rows + topk,
                     d2t=target_vocab is not None, extra_target=(target_vocab or vocab) - vocab, scale=0.05)
    p.req = torch.arange(rows, device="cuda")
    cache = torch.full((rows, steps, p.target_vocab), float("-inf"), device="cuda")
    columns = torch.full((rows, steps, topk), -1, dtype=torch.int64, device="cuda")
    tokens = head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, req_indices=p.req, draft_to_target=p.d2t,
                            draft_logits=cache if sampled else None, cached_columns=columns if sampled else None,
                            form=form, **sampling(p, sampled))
    want_tokens, want_cache = vllm_topk_walk(p, sampled)
    # cuBLAS may sum the r products in another order: a rare bf16 tie flip is tolerated only where the two differ
    # by one step's rounding (checked by teacher forcing along our path).
    differ = (tokens != want_tokens).any(dim=1)
    assert differ.float().mean() <= 0.05, (tokens, want_tokens)
    _, corrected = naive_head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, req_indices=p.req, draft_to_target=p.d2t,
                                        force_tokens=tokens, **sampling(p, sampled))
    got = torch.empty(rows, steps, topk, device="cuda")
    head_walk_topk(p.values, p.cand, p.w1, p.w2, p.x0, req_indices=p.req, draft_to_target=p.d2t, corrected_out=got,
                   form=form, **sampling(p, sampled))
    ulp = corrected.abs() * 2.0**-7 + 1e-30
    assert ((got - corrected).abs() <= ulp).all()
    if sampled:  # rows that walked the same path: their cached rows, up to the same rare one-ulp product roundings
        same = ~differ
        got_rows, want_rows = cache[same], want_cache[same]
        assert torch.equal(torch.isfinite(got_rows), torch.isfinite(want_rows))
        finite = torch.isfinite(want_rows)
        gap = (got_rows[finite] - want_rows[finite]).abs()
        assert (gap <= want_rows[finite].abs() * 2.0**-6 + 2.0**-10).all()  # an ulp of the product, after the sum
        assert (gap > 0).float().mean() <= 1e-2, (gap > 0).float().mean()  # measured 0-0.2 %


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [1.0, 0.75])
@pytest.mark.parametrize("batch, topk, rank", [(1, 8, 64), (64, 64, 256), (256, 1024, 1024), (7, 100, 256)])
def test_gpu_corrected_logits_equal_vllms_baddbmm(batch, topk, rank, scale, dtype):
    """The rounding point, bit for bit: dyadic weights make every dot product exact whatever the summation order, so
    the kernel's corrected logits (default_round_dot: K 100 rounds once, the others the product first) must equal
    torch's `values.clone().baddbmm_(W2[ids], e, alpha=scale)` exactly."""
    gen = torch.Generator().manual_seed(batch + topk)
    dyadic = lambda *shape: (torch.randint(-8, 9, shape, generator=gen).float() / 16).to("cuda", dtype)  # noqa: E731
    vocab = max(2048, topk)
    w1, w2 = dyadic(vocab, rank), dyadic(vocab, rank)
    values = (torch.randn(batch, 1, topk, generator=gen) * 4).to("cuda", dtype)
    cand = torch.stack([torch.randperm(vocab, generator=gen)[:topk] for _ in range(batch)])[:, None].cuda()
    first = torch.randint(0, vocab, (batch,), generator=gen).cuda()
    got = torch.empty(batch, 1, topk, device="cuda")
    head_walk_topk(values, cand, w1, w2, first, logit_scale=scale, corrected_out=got)  # default_round_dot
    want = values[:, 0].unsqueeze(-1).clone().baddbmm_(w2[cand[:, 0]], w1[first].unsqueeze(-1), beta=1.0, alpha=scale)
    assert torch.equal(got[:, 0], want.squeeze(-1).float())


@gpu
@needs_cuda
@pytest.mark.parametrize("rows, vocab, k", [(15, 32_000, 64), (120, 151_936, 64), (15, 248_320, 256), (960, 32_000, 64),
                                            (7, 1000, 1000), (1, 151_936, 64), (3, 248_320, 64), (7, 151_936, 16),
                                            (15, 32_000, 1), (15, 32_000, 8), (15, 32_000, 16),
                                            (960, 248_320, 64), (64, 151_936, 256)])
def test_gpu_topk_candidates_are_torch_topk_set(rows, vocab, k):
    """The set (and the boundary ties) torch.topk's CUDA kernel picks, on random and on heavily tied bf16 logits, and
    on random rows among constant and rising ones (those two fall back from the two-read path)."""
    mixed = torch.randn(rows, vocab, device="cuda")
    mixed[::3] = 0.5
    mixed[1::3] = torch.linspace(-3, 3, vocab, device="cuda")
    for x in (torch.randn(rows, vocab, device="cuda").bfloat16(),
              tied_logits(rows, vocab, torch.bfloat16, "cuda", seed=rows), mixed.bfloat16()):
        values, index = topk_candidates(x, k)
        want_values, want_index = x.topk(k, dim=-1)
        assert torch.equal(index.sort(-1).values, want_index.sort(-1).values)
        assert torch.equal(values.float().sort(-1).values.nan_to_num(9.0),
                           want_values.float().sort(-1).values.nan_to_num(9.0))


@gpu
@needs_cuda
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("rows, steps, vocab", [(1, 15, 32_000), (8, 15, 151_936), (64, 7, 248_320)])
def test_gpu_pdl_changes_nothing(rows, steps, vocab, sampled):
    """Programmatic dependent launch of the select's, the table's and the chain's launches: each follows a kernel
    that lets it start at once and writes what it reads only later (the logits, by `late_writer.late_copy`, before
    the select's first launch), and must wait for it. The candidates, drafts and cache are those without PDL for
    every input, eagerly and over CUDA-graph replays. 8 x 15 x 151,936 and 64 x 7 x 248,320 take the two-read select
    (their constant rows its fallback launches); 1 x 15 x 32k the one-read one."""
    from late_writer import late_copy

    topk = 64
    p = make_problem(rows, steps, 64, topk, 256, dtype=torch.bfloat16, device="cuda", seed=rows, scale=0.05)
    p.w1 = (torch.randn(vocab, 256, device="cuda") * 0.05).bfloat16()
    p.w2 = (torch.randn(vocab, 256, device="cuda") * 0.05).bfloat16()
    p.x0 = torch.randint(0, vocab, (rows,), device="cuda")
    p.req = torch.arange(rows, device="cuda")
    sources = []
    for seed in range(3):
        x = torch.randn(rows, steps, vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        x[0, ::2] = 0.25 * (seed + 1)  # constant rows
        sources.append(x.bfloat16())
    logits = torch.empty_like(sources[0])
    cache = torch.empty((rows, steps, vocab), device="cuda")
    columns = torch.empty((rows, steps, topk), dtype=torch.int64, device="cuda")
    tokens = torch.empty(rows, steps, dtype=torch.int64, device="cuda")
    results = {}
    for pdl in (False, True):
        def walk(src):
            cache.fill_(float("-inf"))
            columns.fill_(-1)
            late_copy(logits, src)  # the launch right before the select's first
            values, cand = walk_candidates(logits, topk, pdl=pdl)
            head_walk_topk(values, cand, p.w1, p.w2, p.x0, out=tokens, req_indices=p.req, pdl=pdl,
                           draft_logits=cache if sampled else None, cached_columns=columns if sampled else None,
                           **sampling(p, sampled))
            return cand

        got = []
        for src in sources:
            cand = walk(src)
            got.append((cand.sort(-1).values.clone(), tokens.clone(), cache.clone()))
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        holder = torch.empty_like(logits)
        with torch.cuda.stream(stream):
            walk(holder)  # warm-up on the capture stream
            with torch.cuda.graph(graph, stream=stream):
                graph_cand = walk(holder)
        torch.cuda.current_stream().wait_stream(stream)
        for src, (want_cand, want_tokens, want_cache) in zip(sources, got):
            holder.copy_(src)
            tokens.fill_(-1)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(graph_cand.sort(-1).values, want_cand), pdl
            assert torch.equal(tokens, want_tokens) and torch.equal(cache, want_cache), pdl
        results[pdl] = got
    for (a_cand, a_tokens, a_cache), (b_cand, b_tokens, b_cache) in zip(results[False], results[True]):
        assert torch.equal(a_cand, b_cand) and torch.equal(a_tokens, b_tokens) and torch.equal(a_cache, b_cache)
