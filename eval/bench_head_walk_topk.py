"""DSpark's top-k Markov walk (vLLM's `dspark_draft_topk` mode): our one-launch walk against vLLM 0.33's own
`_sample_sequential_topk` loop, both captured in a CUDA graph, in one run.

Variants (B rows x N steps, r = 256, bf16, K = bench_head_walk.TOPK candidates a step):
    graph_topk   vLLM's walk, op for op (bench_head_walk.graph_topk): torch.topk once, a -inf fill of the logits,
                 then per step a W1 gather, a W2 row gather, baddbmm_, scatter_ and vLLM's sampler (argmax, or its
                 Triton gumbel_sample writing the dense draft-logits cache row)
    ours_topk    what the wiring runs: the anchors' gather, walk_candidates (torch.topk's set by a radix select for
                 bf16 logits), then head_walk_topk (its default form: every step's [K, K] bias table in one launch,
                 then one program a row walks all N steps; a sampled walk writes the cache's K columns and puts -inf
                 back at the last walk's)
Every row checks ours against vLLM's drafts (and, sampled, the cache rows) on the same inputs: `agree` is the share
of equal drafts (a bf16 rounding of a different summation order may flip a near tie, which changes that row's later
steps), and for rows whose drafts agree the share of their cached entries that differ (a product rounded one ulp
apart: the kernel and cuBLAS sum the r products in different orders) and the largest relative gap.

GPU (one call; vLLM's gumbel.py from `python eval/bench_head_walk.py --prepare`, carried in .vendor):
    python3 eval/bench_head_walk_topk.py --out $OUT/topk
CPU smoke (Triton interpreter, tiny sizes, wall clock, greedy only: no vLLM sampler here):
    python eval/bench_head_walk_topk.py --quick --out /tmp/topk
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

EVAL = Path(__file__).resolve().parent
sys.path.insert(0, str(EVAL))

import bench_head_walk  # noqa: E402
from _results import write_results  # noqa: E402
from bench_head_walk import RANK, TOPK, Problem, graph_topk, hbm_gbps, load_vllm_kernels, time_graph  # noqa: E402

BENCH = "head_walk_topk"


class OursTopk:
    """The wiring's top-k walk on a Problem's buffers (the cache filled with -inf once, as make_plan does)."""

    def __init__(self, torch, walk, p: Problem, topk: int, select=None, **launch):
        from hybridspec_kernels.head_walk_topk import walk_candidates

        self.torch, self.walk, self.p, self.topk, self.launch = torch, walk, p, topk, launch
        self.select = select or walk_candidates
        self.select_options = {"pdl": launch["pdl"]} if "pdl" in launch else {}  # the select's launches too
        self.req = p.idx_map[:, 0].contiguous()
        self.columns = None
        if p.sampled:
            p.draft_logits.fill_(float("-inf"))
            self.columns = torch.full((p.rows, p.steps, topk), -1, dtype=torch.int64, device=p.base.device)

    def __call__(self) -> None:
        p = self.p
        first = p.input_ids[p.anchor_idx]
        values, candidates = self.select(p.base, self.topk, **self.select_options)
        sampling = dict(temperature=p.temperature, seeds=p.seeds, positions=p.positions) if p.sampled else {}
        self.walk(values, candidates, p.w1, p.w2, first, out=p.draft_tokens, req_indices=self.req,
                  draft_logits=p.draft_logits, cached_columns=self.columns, **sampling, **self.launch)


def run(args) -> dict:
    import torch
    import torch.nn.functional as F

    from hybridspec_kernels.head_walk_topk import head_walk_topk

    bench_head_walk.TOPK = args.topk  # graph_topk's K
    gumbel, _ = load_vllm_kernels()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    on_gpu = device.type == "cuda"
    props = torch.cuda.get_device_properties(device) if on_gpu else None
    bw = hbm_gbps(torch) if on_gpu else None
    dtype = torch.bfloat16 if on_gpu else torch.float32
    rows_out = []
    t_start = time.time()
    for steps in args.steps:
        for vocab in args.vocabs:
            for batch in args.batches:
                for mode in args.modes:
                    if time.time() - t_start > args.budget_s:
                        print(f"time budget reached, skipping V={vocab} N={steps} B={batch} {mode}", flush=True)
                        continue
                    sampled = mode == "sampled"
                    if sampled and gumbel is None:
                        print(f"no vLLM gumbel.py: skipping sampled V={vocab} B={batch}", flush=True)
                        continue
                    row = dict(vocab=vocab, steps=steps, batch=batch, mode=mode, topk=args.topk)
                    samples: dict[str, list[float]] = {}
                    try:
                        for sample in range(args.samples):
                            p = Problem(torch, batch, steps, vocab, RANK, sampled, device, dtype, seed=sample)
                            theirs = lambda p=p: graph_topk(torch, F, gumbel, p)  # noqa: E731
                            ours = OursTopk(torch, head_walk_topk, p, args.topk)
                            # Correctness on this sample's inputs: vLLM's walk, then ours, on the same buffers.
                            theirs()
                            want_tokens = p.draft_tokens.clone()
                            want_cache = p.draft_logits.clone() if sampled else None
                            p.draft_tokens.fill_(-1)
                            ours()
                            ours()  # a second walk over the same slots: the bookkeeping's steady state
                            agree = (p.draft_tokens == want_tokens)
                            row.setdefault("agree", []).append(round(float(agree.float().mean()), 4))
                            if sampled:  # rows that walked the same path: their cached entries that differ
                                same_rows = agree.all(dim=1)
                                got, want = p.draft_logits[same_rows].float(), want_cache[same_rows].float()
                                finite = torch.isfinite(want)
                                gap = (got[finite] - want[finite]).abs()
                                row.setdefault("cache_pattern_equal", []).append(
                                    bool(torch.equal(torch.isfinite(got), finite)))
                                row.setdefault("cache_entries_differing", []).append(
                                    round(float((gap > 0).float().mean()), 6))
                                row.setdefault("cache_max_rel_gap", []).append(
                                    round(float((gap / want[finite].abs().clamp(min=1e-6)).max()), 5))
                            for name, fn in (("graph_topk", theirs), ("ours_topk", ours)):
                                if on_gpu:
                                    us, _ = time_graph(torch, fn)
                                else:
                                    t0 = time.perf_counter()
                                    fn()
                                    us = (time.perf_counter() - t0) * 1e6
                                samples.setdefault(name, []).append(us)
                            del p
                    except Exception as exc:  # a row that cannot run is reported, not fatal
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                        print(f"  failed: {row['error']}", flush=True)
                    for name, us_list in samples.items():
                        row[f"{name}_us"] = round(statistics.median(us_list), 1)
                        row[f"{name}_us_samples"] = [round(us, 1) for us in us_list]
                    if row.get("ours_topk_us") and row.get("graph_topk_us"):
                        row["speedup_graph_topk"] = round(row["graph_topk_us"] / row["ours_topk_us"], 2)
                        row["speedup_samples"] = [round(a / b, 3) for a, b in zip(row["graph_topk_us_samples"],
                                                                                   row["ours_topk_us_samples"])]
                        row["ours_us_per_step"] = round(row["ours_topk_us"] / steps, 2)
                    if bw:  # the least any top-k walk reads: the B x N x K rows of W2 it gathers
                        row["w2_rows_floor_us"] = round(batch * steps * args.topk * RANK * 2 / bw / 1e3, 2)
                    rows_out.append(row)
                    print(json.dumps(row), flush=True)
                    if on_gpu:
                        torch.cuda.empty_cache()
    return dict(rows=rows_out, device=props.name if on_gpu else "cpu (Triton interpreter)",
                hbm_gbps=round(bw) if bw else None, sms=props.multi_processor_count if on_gpu else None)


LADDER = {  # launch options of head_walk_topk timed side by side (--ladder; calls 1-2 also timed 4 warps and a
    # prefetch of the next step's candidates, since removed: eval/notes/head_walk.md, session 21; session 22 call 16
    # L2 prefetches of the next W1 / W2 rows, slower warm and cold, removed)
    "w16": dict(form="loop", num_warps=16),
    "w8": dict(form="loop", num_warps=8),
    # session 23: the bias-table forms (every step's [K, K] bias, then a chain of K-wide picks)
    "table_w1": dict(form="table", num_warps=1),
    "table_w2": dict(form="table", num_warps=2),
    "ahead_w4": dict(form="table_ahead", num_warps=4),
    # every launch of the select, the table and the chain by programmatic dependent launch (the default since call 5)
    "table_w1_nopdl": dict(form="table", num_warps=1, pdl=False),
    "table_w1_pdl": dict(form="table", num_warps=1, pdl=True),
    "table_w2_pdl": dict(form="table", num_warps=2, pdl=True),
}
LADDER_POINTS = [(32000, 1, "greedy"), (32000, 1, "sampled"), (151936, 1, "greedy"), (151936, 8, "greedy"),
                 (151936, 32, "sampled"), (248320, 64, "greedy"), (248320, 64, "sampled")]


def ladder(args) -> list[dict]:
    """Each launch option on the same inputs, interleaved sample by sample (us per 15-step walk, K = args.topk);
    drafts checked equal to the default launch's."""
    import torch

    from hybridspec_kernels.head_walk_topk import head_walk_topk

    gumbel, _ = load_vllm_kernels()
    out = []
    for vocab, batch, mode in LADDER_POINTS:
        sampled = mode == "sampled"
        if sampled and gumbel is None:
            continue
        row = dict(check="ladder", vocab=vocab, steps=15, batch=batch, mode=mode, topk=args.topk)
        for sample in range(args.samples):
            p = Problem(torch, batch, 15, vocab, RANK, sampled, torch.device("cuda"), torch.bfloat16, seed=sample)
            want = None
            for name, launch in LADDER.items():
                fn = OursTopk(torch, head_walk_topk, p, args.topk, **launch)
                try:
                    fn()
                    if want is None:
                        want = p.draft_tokens.clone()
                    row.setdefault(f"{name}_equal", True)
                    row[f"{name}_equal"] &= bool(torch.equal(p.draft_tokens, want))
                    # cold: one replay a trial, each after an L2 flush (serving finds a walk's rows cold; the warm
                    # timing replays the same rows from L2)
                    us = (time_graph(torch, fn, trials=21, replays=1, flush_bytes=256 << 20) if args.cold
                          else time_graph(torch, fn))[0]
                    row.setdefault(f"{name}_us_samples", []).append(round(us, 2))
                except Exception as exc:
                    row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            del p
        for name in LADDER:
            if row.get(f"{name}_us_samples"):
                row[f"{name}_us"] = round(statistics.median(row[f"{name}_us_samples"]), 2)
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def diagnose(args) -> list[dict]:
    """(1) How vLLM's `values.clone().baddbmm_(W2[ids], e)` rounds on this GPU: its bf16 results against candidate
    formulas, share of equal entries. (2) Where the time goes: torch.topk alone, the walk kernel alone (default launch
    and the ladder's), each in its own CUDA graph."""
    import torch

    from hybridspec_kernels.head_walk_topk import head_walk_topk, topk_candidates

    out = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    dev = torch.device("cuda")
    for batch, k, scale in ((64, 64, 1.0), (8, 256, 1.0), (64, 64, 0.75)):
        v = (torch.randn(batch, k, generator=gen, device=dev) * 2).bfloat16()
        w = (torch.randn(batch, k, RANK, generator=gen, device=dev) * 0.25).bfloat16()
        e = (torch.randn(batch, RANK, generator=gen, device=dev) * 0.25).bfloat16()
        ref = v.unsqueeze(-1).clone().baddbmm_(w, e.unsqueeze(-1), beta=1.0, alpha=scale).squeeze(-1)
        dot32 = torch.einsum("bkr,br->bk", w.double(), e.double()).float()
        bmm = torch.bmm(w, e.unsqueeze(-1)).squeeze(-1)  # bf16 out, as cuBLAS rounds a plain bmm
        forms = {
            "single_round": (v.float() + scale * dot32).bfloat16(),
            "scaled_dot_rounded_then_add": (v.float() + (scale * dot32).bfloat16().float()).bfloat16(),
            "dot_rounded_then_add": (v.float() + scale * dot32.bfloat16().float()).bfloat16(),
            "bmm_bf16_then_add": (v.float() + scale * bmm.float()).bfloat16(),
            "bmm_scaled_rounded_then_add": (v.float() + (scale * bmm.float()).bfloat16().float()).bfloat16(),
        }
        row = dict(check="baddbmm_rounding", batch=batch, topk=k, scale=scale,
                   reduced_precision_reduction=torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
                   max_abs_diff_single=float((ref.float() - forms["single_round"].float()).abs().max()))
        for name, form in forms.items():
            row[f"equal_{name}"] = round(float((form == ref).float().mean()), 5)
        out.append(row)
        print(json.dumps(row), flush=True)
    for vocab in (32000, 151936, 248320):
        for batch in (1, 8, 32, 64):
            for mode in ("greedy", "sampled"):
                sampled = mode == "sampled"
                p = Problem(torch, batch, 15, vocab, RANK, sampled, dev, torch.bfloat16)
                values, cand = p.base.topk(args.topk, dim=-1)
                row = dict(check="time_split", vocab=vocab, batch=batch, mode=mode, topk=args.topk)
                row["topk_us"] = round(time_graph(torch, lambda: p.base.topk(args.topk, dim=-1))[0], 1)
                row["select_us"] = round(time_graph(torch, lambda: topk_candidates(p.base, args.topk))[0], 1)
                for split in (4096, 16384):
                    row[f"select_split{split}_us"] = round(time_graph(
                        torch, lambda split=split: topk_candidates(p.base, args.topk, split=split))[0], 1)
                sel_values, sel_index = topk_candidates(p.base, args.topk)
                row["select_equal_topk_set"] = bool(torch.equal(sel_index.sort(-1).values, cand.sort(-1).values))
                req = p.idx_map[:, 0].contiguous()
                columns = torch.full((batch, 15, args.topk), -1, dtype=torch.int64, device=dev) if sampled else None
                if sampled:
                    p.draft_logits.fill_(float("-inf"))
                sampling = dict(temperature=p.temperature, seeds=p.seeds, positions=p.positions) if sampled else {}
                for name, launch in LADDER.items():
                    fn = lambda launch=launch: head_walk_topk(  # noqa: E731
                        values, cand, p.w1, p.w2, p.first, out=p.draft_tokens, req_indices=req,
                        draft_logits=p.draft_logits, cached_columns=columns, **sampling, **launch)
                    fn()
                    row[f"walk_{name}_us"] = round(time_graph(torch, fn)[0], 1)
                out.append(row)
                print(json.dumps(row), flush=True)
                del p, values, cand
    return out


def diagnose_topk(args) -> list[dict]:
    """torch.topk over the [B * N, V] logits as one slice a row and as S shorter slices a row ([B * N * S, V / S]: the
    first stage a two-stage select could use), and torch.topk over the staged S * K of a row (its second stage)."""
    import torch

    out = []
    dev = torch.device("cuda")
    for vocab in (32000, 151936, 248320):
        for batch in (1, 8, 32, 64):
            base = torch.randn(batch * 15, vocab, device=dev).bfloat16()
            row = dict(check="topk_reshape", vocab=vocab, batch=batch, topk=args.topk)
            row["rows_us"] = round(time_graph(torch, lambda: base.topk(args.topk, dim=-1))[0], 1)
            for parts in (4, 8, 16, 32, 64):
                if vocab % parts or vocab // parts < args.topk:
                    continue
                short = base.view(batch * 15 * parts, vocab // parts)
                row[f"split{parts}_us"] = round(time_graph(torch, lambda: short.topk(args.topk, dim=-1))[0], 1)
                row[f"split{parts}_unsorted_us"] = round(time_graph(
                    torch, lambda: short.topk(args.topk, dim=-1, sorted=False))[0], 1)
                staged = torch.randn(batch * 15, parts * args.topk, device=dev).bfloat16()
                row[f"merge{parts}_us"] = round(time_graph(torch, lambda: staged.topk(args.topk, dim=-1))[0], 1)
            out.append(row)
            print(json.dumps(row), flush=True)
            del base
    return out


def select_inputs(rows: int, vocab: int, dist: str, torch, dev):
    """bf16 logits: `randn`; `skewed` adds a bias falling along the vocabulary, as frequent (low) token ids get, which
    packs the top of every row into its first splits."""
    x = torch.randn(rows, vocab, device=dev)
    if dist == "skewed":
        x += torch.linspace(4.0, 0.0, vocab, device=dev)
    return x.bfloat16()


def diagnose_select(args) -> list[dict]:
    """topk_candidates' launch options (digit bits, split, warps, bound pieces) against torch.topk, same inputs; the
    sets compared."""
    import torch

    from hybridspec_kernels.head_walk_topk import topk_candidates

    out = []
    dev = torch.device("cuda")
    cells = ((32000, 1), (32000, 8), (151936, 1), (151936, 8), (151936, 32), (151936, 64), (248320, 8), (248320, 32),
             (248320, 64))
    for (vocab, batch), dist in itertools.product(cells, args.select_dists):
        base = select_inputs(batch * 15, vocab, dist, torch, dev)
        want = base.topk(args.topk, dim=-1)[1].sort(-1).values
        row = dict(check="select_options", vocab=vocab, batch=batch, topk=args.topk, dist=dist)
        row["torch_topk_us"] = round(time_graph(torch, lambda: base.topk(args.topk, dim=-1))[0], 1)
        for bits, split, warps, pieces in itertools.product(args.select_bits, args.select_splits, args.select_warps,
                                                            args.select_pieces):
            pieces = None if pieces < 0 else pieces
            name = f"bits{bits}_split{split}_w{warps}_p{'auto' if pieces is None else pieces}"
            fn = lambda: topk_candidates(base, args.topk, split=split, num_warps=warps,  # noqa: E731
                                         digit_bits=bits, bound_pieces=pieces)
            try:
                row[f"{name}_equal"] = bool(torch.equal(fn()[1].sort(-1).values, want))
                row[f"{name}_us"] = round(time_graph(torch, fn)[0], 1)
            except Exception as exc:
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        out.append(row)
        print(json.dumps(row), flush=True)
        del base
    return out


def diagnose_select_parts(args) -> list[dict]:
    """topk_candidates (each split, warps, gather chunk and bound pieces given) timed through each of its launches in
    turn (a prefix of them), against torch.topk, with the rows that fell back to the one-read path."""
    import torch

    from hybridspec_kernels.head_walk_topk import select
    from hybridspec_kernels.head_walk_topk.select import DIGIT_BITS, default_bound_pieces, select_launches

    out = []
    dev = torch.device("cuda")
    cells = ((32000, 1), (32000, 8), (32000, 32), (32000, 64), (151936, 1), (151936, 8), (151936, 64), (248320, 8),
             (248320, 64))
    if args.select_cells:
        cells = tuple(cell for cell in cells if f"{cell[0]}x{cell[1]}" in args.select_cells)
    for (vocab, batch), dist in itertools.product(cells, args.select_dists):
        base = select_inputs(batch * 15, vocab, dist, torch, dev)
        want = base.topk(args.topk, dim=-1)[1].sort(-1).values
        torch_us = round(time_graph(torch, lambda: base.topk(args.topk, dim=-1))[0], 1)
        for split, warps, gather, pieces, rows_warps, rows_bits, rows_cap in itertools.product(
                args.select_splits, args.select_warps, args.select_gathers, args.select_pieces, args.select_rows_warps,
                args.select_rows_bits, args.select_rows_maxnreg):
            select.GATHER_CHUNK, select.ROWS_NUM_WARPS, select.ROWS_DIGIT_BITS = gather, rows_warps, rows_bits or None
            select.ROWS_MAXNREG = None if rows_cap < 0 else rows_cap
            pieces = default_bound_pieces(batch * 15, vocab, args.topk, split) if pieces < 0 else pieces
            plan = select_launches(base, args.topk, split=split, num_warps=warps, digit_bits=DIGIT_BITS,
                                   bound_pieces=pieces)
            launches = plan.launches
            run_all = lambda: [launch() for _, launch in launches]  # noqa: E731
            run_all()
            row = dict(check="select_parts", vocab=vocab, batch=batch, topk=args.topk, dist=dist, split=split,
                       warps=warps, gather_chunk=gather, bound_pieces=pieces, rows_warps=rows_warps,
                       rows_bits=rows_bits, rows_maxnreg=rows_cap,
                       equal=bool(torch.equal(plan.indices.sort(-1).values, want)), torch_topk_us=torch_us,
                       all_us=round(time_graph(torch, run_all)[0], 1),
                       read_floor_us=round(base.numel() * base.element_size() / args.hbm_gbps / 1e3, 1))
            if plan.fallback is not None:
                row["fallback_rows"] = int(plan.fallback[0].item())
            for n, (name, _) in enumerate(launches):  # prefixes: a launch alone may not be replayable
                prefix = launches[:n + 1]
                row[f"through_{name}_us"] = round(time_graph(torch, lambda: [f() for _, f in prefix])[0], 1)
            out.append(row)
            print(json.dumps(row), flush=True)
        del base
    return out


def diagnose_walk_parts(args) -> list[dict]:
    """Where a top-k walk's time goes (greedy / sampled, K = args.topk, 15 steps): the select alone, the table form's
    table launch alone and with its chain, the loop form alone, and the whole walk the wiring runs (select + walk)."""
    import torch

    from hybridspec_kernels.head_walk_topk import head_walk_topk, walk_candidates
    from hybridspec_kernels.head_walk_topk.table import table_launches

    gumbel, _ = load_vllm_kernels()
    out = []
    points = ((32000, 1, "greedy"), (32000, 1, "sampled"), (32000, 32, "greedy"), (32000, 64, "greedy"),
              (151936, 1, "greedy"), (151936, 8, "greedy"), (151936, 64, "greedy"), (248320, 64, "greedy"))
    for vocab, batch, mode in points:
        sampled = mode == "sampled"
        if sampled and gumbel is None:
            continue
        p = Problem(torch, batch, 15, vocab, RANK, sampled, torch.device("cuda"), torch.bfloat16, seed=0)
        whole = OursTopk(torch, head_walk_topk, p, args.topk)
        values, cand = walk_candidates(p.base, args.topk)
        first = p.input_ids[p.anchor_idx]
        sampling = dict(temperature=p.temperature, seeds=p.seeds, positions=p.positions) if sampled else {}
        cache = dict(draft_logits=p.draft_logits, cached_columns=whole.columns) if sampled else {}
        loop = lambda: head_walk_topk(values, cand, p.w1, p.w2, first, out=p.draft_tokens,  # noqa: E731
                                      req_indices=whole.req, form="loop", **sampling, **cache)
        launches = table_launches(values, cand, p.w1, p.w2, first, p.draft_tokens, sampling.get("temperature"),
                                  sampling.get("seeds"), sampling.get("positions"), whole.req, None, 1.0,
                                  cache.get("draft_logits"), cache.get("cached_columns"), None, True)
        row = dict(check="walk_parts", vocab=vocab, batch=batch, mode=mode, topk=args.topk, steps=15)
        loop()
        want = p.draft_tokens.clone()
        for _, launch in launches:
            launch()
        row["table_equal_loop"] = bool(torch.equal(p.draft_tokens, want))
        row["select_us"] = round(time_graph(torch, lambda: walk_candidates(p.base, args.topk))[0], 1)
        row["loop_walk_us"] = round(time_graph(torch, loop)[0], 1)
        row["through_table_us"] = round(time_graph(torch, launches[0][1])[0], 1)
        row["through_chain_us"] = round(time_graph(torch, lambda: [f() for _, f in launches])[0], 1)
        row["whole_us"] = round(time_graph(torch, whole)[0], 1)
        out.append(row)
        print(json.dumps(row), flush=True)
        del p, whole
    return out


def summarize(rows: list[dict]) -> dict:
    summary = {}
    for row in rows:
        if row.get("steps") == 15 and row.get("speedup_graph_topk"):
            key = f"speedup_graph_topk_v{round(row['vocab'] / 1000)}k_blk15_b{row['batch']}"
            summary[key + ("_sampled" if row["mode"] == "sampled" else "")] = row["speedup_graph_topk"]
    agree = [a for row in rows for a in row.get("agree", [])]
    if agree:
        summary["min_draft_agreement"] = min(agree)
    patterns = [c for row in rows for c in row.get("cache_pattern_equal", [])]
    if patterns:
        summary["cache_candidate_columns_equal"] = all(patterns)
        summary["cache_entries_differing_max"] = max(c for row in rows for c in row.get("cache_entries_differing", []))
        summary["cache_max_rel_gap"] = max(c for row in rows for c in row.get("cache_max_rel_gap", []))
    summary["measures"] = ("vLLM's _sample_sequential_topk graph-loop time / ours (walk_candidates + head_walk_topk), "
                           "CUDA-graph replays, median of the samples")
    return summary


def markdown(doc: dict) -> str:
    lines = [f"# {BENCH}", "", f"{doc['device']}, commit {doc['commit'][:7]}, {doc['date']}", "",
             f"`{doc['command']}`", "",
             "DSpark's top-k Markov walk (vLLM's `dspark_draft_topk`, K candidates a step): vLLM's own loop "
             "(`_sample_sequential_topk`, CUDA graph) vs ours (`hybridspec_kernels.head_walk_topk`, one launch), "
             "us per walk.", "",
             "| V | block | batch | mode | K | vLLM top-k loop | ours | speedup | drafts equal | cache entries differing |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['vocab']} | {r['steps']} | {r['batch']} | {r['mode']} | {r['topk']} | "
                     f"{r.get('graph_topk_us', r.get('error', ''))} | {r.get('ours_topk_us', '')} | "
                     f"{r.get('speedup_graph_topk', '')} | {min(r.get('agree', [0]))} | "
                     f"{max(r['cache_entries_differing']) if 'cache_entries_differing' in r else ''} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="CPU smoke: tiny sizes under the interpreter")
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32000, 151936, 248320])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--steps", type=int, nargs="+", default=[15])
    parser.add_argument("--modes", nargs="+", default=["greedy", "sampled"])
    parser.add_argument("--topk", type=int, default=TOPK)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=300)
    parser.add_argument("--results-name", default=BENCH)
    parser.add_argument("--ladder", action="store_true", help="time head_walk_topk's launch options (LADDER) only")
    parser.add_argument("--cold", action="store_true", help="--ladder: each replay after an L2 flush")
    parser.add_argument("--diagnose", action="store_true", help="vLLM's baddbmm_ rounding; topk / walk time split")
    parser.add_argument("--diagnose-topk", action="store_true", help="torch.topk over shorter slices (two stages)")
    parser.add_argument("--diagnose-select", action="store_true", help="topk_candidates' options against torch.topk")
    parser.add_argument("--diagnose-select-parts", action="store_true", help="topk_candidates' launches timed alone")
    parser.add_argument("--diagnose-walk-parts", action="store_true", help="select, table, chain and loop timed alone")
    parser.add_argument("--hbm-gbps", type=float, default=4000.0, help="the read floor's bandwidth (GB/s)")
    parser.add_argument("--select-bits", type=int, nargs="+", default=[8, 4, 2])
    parser.add_argument("--select-splits", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--select-warps", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--select-gathers", type=int, nargs="+", default=[2048],
                        help="elements per round of the two-read path's second read (select.GATHER_CHUNK)")
    parser.add_argument("--select-rows-warps", type=int, nargs="+", default=[8], help="select.ROWS_NUM_WARPS values")
    parser.add_argument("--select-rows-bits", type=int, nargs="+", default=[0],
                        help="select.ROWS_DIGIT_BITS values (0: the select's digit bits)")
    parser.add_argument("--select-cells", nargs="+", default=None,
                        help="--diagnose-select-parts: only these VOCABxBATCH cells (e.g. 248320x64)")
    parser.add_argument("--select-rows-maxnreg", type=int, nargs="+", default=[-1],
                        help="select.ROWS_MAXNREG values (0: no register cap, -1: the default rule)")
    parser.add_argument("--select-pieces", type=int, nargs="+", default=[0, -1],
                        help="bound pieces per split (0 none, -1 topk_candidates' default)")
    parser.add_argument("--select-dists", nargs="+", default=["randn", "skewed"])
    args = parser.parse_args()
    steps = {"diagnose_walk_parts": diagnose_walk_parts, "diagnose_select_parts": diagnose_select_parts,
             "diagnose_select": diagnose_select,
             "diagnose_topk": diagnose_topk, "diagnose": diagnose, "ladder": ladder}
    for name, step in steps.items():  # a diagnosis step alone writes <out>/<its name>.json
        if getattr(args, name):
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"{name}.json").write_text(json.dumps(step(args), indent=1) + "\n")
            return
    if args.quick:
        args.vocabs, args.batches, args.steps, args.modes, args.samples = [300], [1, 3], [4], ["greedy"], 1
        args.topk = min(args.topk, 16)
    result = run(args)
    command = "python3 eval/bench_head_walk_topk.py " + " ".join(sys.argv[1:])
    summary = summarize(result["rows"])
    path = write_results(args.results_name, result["rows"], summary, command, result["device"], out_dir=args.out,
                         extra=dict(hbm_gbps=result["hbm_gbps"], sms=result["sms"], topk=args.topk, rank=RANK))
    doc = json.loads(path.read_text())
    path.with_suffix(".md").write_text(markdown(doc))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
