"""DSpark serial head walk: our persistent resident-W2 kernel against vLLM 0.33's walks (issue 4).

Variants, all timed as CUDA-graph replays of one whole walk (B rows x N steps, r = 256, bf16), warm caches:
    graph_loop   vLLM's DSparkSpeculator._sample_sequential, op for op in torch (W1 gather, full-vocab bias GEMV
                 F.linear, add, argmax or vLLM's own Triton gumbel_sample with the draft logits cache, copy)
    graph_topk   vLLM's _sample_sequential_topk (dspark_draft_topk = TOPK): top-k once, -inf fill, per step a
                 W2 row gather + baddbmm + scatter, then the same sampling
    fused_step   vLLM's one-launch-per-step fused Markov kernel (models/deepseek_v41/amd/ops/fused_markov.py,
                 run unchanged on the H200; built for <= 8 rows; it always samples, so greedy runs it at T = 0)
    ours_step    our kernel one launch per step (lockstep: the launch boundary is the barrier)
    ours         our kernel, one persistent launch per walk, exchange='auto' (what the vLLM wiring runs)
    ours_sync    ours on a vocabulary of 64 rows per program: the step chain without the vocabulary work
    ladder       our kernel with one launch option changed (exchange, key reduction, streamed tile rows, ...)
Floors: hbm_stream_us = N x W2 bytes / HBM (re-reading W2 every step, what any non-resident walk pays);
hbm_once_us = (W2 once + U + draft logits) / HBM (the least our walk must move); mma_us = 2 B V r N / peak.

GPU (one call):
    python eval/bench_head_walk.py --prepare           # here: extract vLLM's Triton sources (git-ignored)
    python eval/bench_head_walk.py --out $OUT          # there
    python eval/bench_head_walk.py --finalize DIR      # here: copy results into eval/results, draw the plot
CPU smoke (tiny sizes, Triton interpreter, wall clock):
    python eval/bench_head_walk.py --quick --out /tmp/hw
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

EVAL = Path(__file__).resolve().parent
REPO = EVAL.parent
sys.path.insert(0, str(EVAL))

from _cuda_graph import capture_graph  # noqa: E402

BENCH = "head_walk"
EXTRACT_DIR = REPO / ".vendor" / "extracted_head_walk"
TOPK = 64
RANK = 256
GUMBEL_MODULE = "vllm/v1/worker/gpu/sample/gumbel.py"
FUSED_MARKOV_MODULE = "vllm.models.deepseek_v41.amd.ops.fused_markov"
HBM_FALLBACK_GBPS = 4300.0  # anchors.md, measured copy on this H200
MMA_PEAK_TFLOPS = 790.0  # anchors.md, measured bf16 dense


def prepare(dest: Path = EXTRACT_DIR) -> None:
    """Copy vLLM's gumbel.py (shared extraction helper) and fused_markov.py (its two extra vLLM imports, a logger
    and the AMD on/off switch, are replaced here) into a git-ignored folder that the GPU call carries."""
    from _vllm_sources import PACKAGE, _read_source, _rewrite, extract

    names = extract([GUMBEL_MODULE], dest)
    source = _read_source(FUSED_MARKOV_MODULE)
    source = source.replace("from vllm.logger import init_logger",
                            "import logging\n\n\ndef init_logger(name):\n    return logging.getLogger(name)")
    source = source.replace("from vllm.models.deepseek_v41.amd.ops import enabled",
                            "def enabled():\n    return True")
    text, unresolved = _rewrite(source, FUSED_MARKOV_MODULE, set(names))
    if unresolved:
        raise ImportError("fused_markov.py imports more of vLLM than expected:\n  " + "\n  ".join(unresolved))
    path = dest / PACKAGE / "fused_markov.py"
    path.write_text(text)
    print(f"extracted {sorted(names)} and {FUSED_MARKOV_MODULE} into {dest}")


def load_vllm_kernels(dest: Path = EXTRACT_DIR):
    """(gumbel module, fused_markov module) from the extracted copies, or (None, None) when absent."""
    import importlib

    if not (dest / "vllm_extracted").exists():
        return None, None
    sys.path.insert(0, str(dest))
    gumbel = importlib.import_module("vllm_extracted.v1.worker.gpu.sample.gumbel")
    fused = importlib.import_module("vllm_extracted.fused_markov")
    return gumbel, fused


# ----------------------------------------------------------------------------------------------- problem


class Problem:
    """Static buffers of one walk, laid out as vLLM's DSpark speculator holds them."""

    def __init__(self, torch, rows, steps, vocab, rank, sampled, device, dtype, seed=0, target_vocab=None,
                 d2t_layout="random"):
        gen = torch.Generator(device=device).manual_seed(seed)
        rnd = lambda *s, scale=1.0: (torch.randn(*s, generator=gen, device=device) * scale).to(dtype)  # noqa: E731
        self.rows, self.steps, self.vocab, self.rank, self.sampled = rows, steps, vocab, rank, sampled
        # Bias std ~ sqrt(r) * 0.25^2 = 1, the same scale as the base logits: the Markov term decides tokens.
        self.base = rnd(rows, steps, vocab)
        self.w1 = rnd(vocab, rank, scale=0.25)
        self.w2 = rnd(vocab, rank, scale=0.25)  # vLLM's markov_w2.weight layout [V, r]
        self.input_ids = torch.randint(0, vocab, (rows * steps,), generator=gen, device=device)
        self.anchor_idx = torch.arange(rows, device=device) * steps
        self.first = self.input_ids[self.anchor_idx].clone()
        self.temperature = torch.rand(rows, generator=gen, device=device) * 0.8 + 0.6
        self.seeds = torch.randint(0, 2**62, (rows,), generator=gen, device=device)
        self.sample_pos = (torch.randint(1, 50_000, (rows, 1), generator=gen, device=device)
                           + torch.arange(steps, device=device))
        self.positions = (self.sample_pos - 1).contiguous()
        self.idx_map = torch.arange(rows).repeat_interleave(steps).view(rows, steps).to(device)
        self.step_cols = torch.arange(steps, dtype=torch.int32).to(device)
        self.draft_tokens = torch.zeros(rows, steps, dtype=torch.long, device=device)
        self.draft_logits = torch.zeros(rows, steps, vocab, dtype=dtype, device=device) if sampled else None
        self.work = torch.empty_like(self.base)
        # A reduced draft vocabulary (DSpark's 32k drafts of a 151,936-token target), laid out as vLLM 0.33 holds
        # it: d2t maps each draft id to an increasing target id (a sorted subset), W1 has the target's rows and is
        # indexed by the previous (target) token, the anchors are target ids, and a sampled walk scatters each
        # step's draft logits into a -inf target-width buffer and samples / caches over the target vocabulary.
        self.d2t = self.targets = self.scatter_buf = None
        if target_vocab:
            pick = torch.Generator(device="cpu").manual_seed(seed + 11)
            # "random": a sorted random subset (every 32-byte sector of a cache row holds some draft columns);
            # "dense": the first `vocab` ids (the draft columns fill whole sectors; a diagnosis layout)
            chosen = torch.randperm(target_vocab, generator=pick)[:vocab] if d2t_layout == "random" else (
                torch.arange(vocab))
            self.targets = chosen.sort().values.to(device)
            self.d2t = self.targets - torch.arange(vocab, device=device)
            self.w1 = rnd(target_vocab, rank, scale=0.25)
            self.input_ids = self.targets[self.input_ids]
            self.first = self.input_ids[self.anchor_idx].clone()
            if sampled:
                self.draft_logits = torch.zeros(rows, steps, target_vocab, dtype=dtype, device=device)
                self.scatter_buf = torch.full((rows, target_vocab), float("-inf"), dtype=dtype, device=device)


def _draft_step(gumbel, p: Problem, i: int, logits_i):
    """vLLM's `_sample_logits` for step i (Gumbel sample into the draft-logits cache, or argmax; with a reduced
    draft vocabulary the scatter into target columns first, or the argmax's map to a target id) + the store."""
    if p.sampled:
        if p.scatter_buf is not None:
            p.scatter_buf.index_copy_(1, p.targets, logits_i.to(p.scatter_buf.dtype))
            logits_i = p.scatter_buf
        draft = gumbel.gumbel_sample(logits_i, p.idx_map[:, i], p.temperature, p.seeds, p.sample_pos[:, i] - 1,
                                     apply_temperature=True, is_drafting=True, logits_cache=p.draft_logits,
                                     logits_cache_col=p.step_cols[i], use_fp64=False)
    else:
        draft = logits_i.argmax(dim=-1)
        if p.d2t is not None:
            draft = draft + p.d2t[draft]
    p.draft_tokens[:, i] = draft
    return draft


def graph_loop(torch, F, gumbel, p: Problem) -> None:
    """vLLM 0.33 DSparkSpeculator._sample_sequential from the base logits on (full draft vocabulary, or a reduced
    one with its d2t: Problem(target_vocab=))."""
    prev = p.input_ids[p.anchor_idx]
    for i in range(p.steps):
        markov_embed = F.embedding(prev, p.w1)
        bias = F.linear(markov_embed, p.w2)
        logits_i = p.base[:, i] + bias
        prev = _draft_step(gumbel, p, i, logits_i)


def graph_topk(torch, F, gumbel, p: Problem) -> None:
    """vLLM 0.33 DSparkSpeculator._sample_sequential_topk (p.work stands for the backbone's logits tensor that
    vLLM overwrites in place)."""
    base_values, draft_indices = p.base.topk(TOPK, dim=-1)
    p.work.fill_(float("-inf"))
    prev = p.input_ids[p.anchor_idx]
    for i in range(p.steps):
        markov_embed = F.embedding(prev, p.w1)
        weight = p.w2[draft_indices[:, i]]
        corrected = base_values[:, i].unsqueeze(-1).clone()
        corrected.baddbmm_(weight, markov_embed.unsqueeze(-1), beta=1.0, alpha=1.0)
        logits_i = p.work[:, i].scatter_(1, draft_indices[:, i], corrected.squeeze(-1))
        prev = _draft_step(gumbel, p, i, logits_i)


class FusedStep:
    """vLLM's fused_markov.sample_sequential launch sequence, with our Problem's buffers in the speculator's
    place (greedy runs it at temperature 0: it always fills the draft logits cache)."""

    def __init__(self, torch, triton, fused, p: Problem):
        self.fused, self.p, self.triton = fused, p, triton
        self.cache = p.draft_logits if p.draft_logits is not None else torch.zeros_like(p.base)
        self.temperature = p.temperature if p.sampled else torch.zeros_like(p.temperature)
        self.sample_pos = p.sample_pos.contiguous()
        nb = triton.cdiv(p.vocab, fused.BLOCK)
        self.nb, self.nb2 = nb, triton.next_power_of_2(nb)
        self.bufs = [(torch.empty(p.rows, nb, dtype=torch.float32, device=p.base.device),
                      torch.empty(p.rows, nb, dtype=torch.int64, device=p.base.device)) for _ in range(2)]

    def __call__(self) -> None:
        f, p = self.fused, self.p
        for step in range(p.steps):
            prev_max, prev_arg = self.bufs[(step + 1) % 2]
            out_max, out_arg = self.bufs[step % 2]
            f._markov_step_kernel[(self.nb,)](
                prev_max, prev_arg, p.input_ids, p.anchor_idx, p.draft_tokens, p.draft_tokens.stride(0), p.w1, p.w2,
                p.base[:, step], p.base.stride(0), self.cache, self.cache.stride(0), self.cache.stride(1),
                p.idx_map, p.idx_map.stride(0), self.sample_pos, self.sample_pos.stride(0), self.temperature,
                p.seeds, out_max, out_arg, p.vocab, self.nb, STEP=step, ROWS=p.rows, RANK=p.rank, BLOCK=f.BLOCK,
                K_CHUNK=f.K_CHUNK, BLOCKS_POW2=self.nb2, USE_FP64=False, num_warps=f.NUM_WARPS)
        last_max, last_arg = self.bufs[(p.steps - 1) % 2]
        f._markov_last_kernel[(p.rows,)](last_max, last_arg, p.draft_tokens, p.draft_tokens.stride(0), self.nb,
                                         STEP=p.steps - 1, BLOCKS_POW2=self.nb2)


def ours_fn(head_walk, p: Problem, **kw):
    if p.d2t is not None:
        # What the vLLM wiring passes for vLLM's sorted d2t (checked there once, outside graph capture).
        kw = dict(dict(draft_to_target=p.d2t, draft_to_target_increasing=True), **kw)

    def run():
        sample = dict(temperature=p.temperature, seeds=p.seeds, positions=p.positions) if p.sampled else {}
        head_walk(p.base, p.w1, p.w2.t(), p.first, draft_logits=p.draft_logits, out=p.draft_tokens, **sample, **kw)
    return run


# ------------------------------------------------------------------------------------------------ timing


def time_graph(torch, fn, trials=5, replays=10, flush_bytes=0):
    """Median us per call of fn captured in one CUDA graph (fn already ran once, so it is compiled). flush_bytes:
    a write of that many bytes before each trial (past the L2: the trial's replays start cold)."""
    graph = capture_graph(fn)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda") if flush_bytes else None
    times = []
    for _ in range(trials):
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / replays)
    return statistics.median(times), (max(times) - min(times)) / statistics.median(times)


def hbm_gbps(torch):
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    gbps = 2 * 10 * src.numel() / (start.elapsed_time(end) / 1000.0) / 1e9
    del src, dst
    return gbps


def tolerated(naive_head_walk, gumbel_noise_fn, p: Problem, tokens, atol_ulps=2.0):
    """Fraction of steps where our token is the best of its own path within atol_ulps bf16 ulps (teacher-forced
    fp32 reference; bf16 logits tie often and sum in another order than cuBLAS)."""
    import torch

    from hybridspec_kernels.head_walk.naive import DRAFT_NOISE_SALT, spec_step_seed

    kw = dict(temperature=p.temperature, seeds=p.seeds, positions=p.positions) if p.sampled else {}
    if p.d2t is not None:
        kw["draft_to_target"] = p.d2t
    _, logits, _ = naive_head_walk(p.base, p.w1, p.w2.t(), p.first, force_tokens=tokens, **kw)
    scored = logits
    ids = torch.arange(p.vocab, device=logits.device)[None, :] if p.d2t is None else p.targets[None, :]
    if p.d2t is not None:
        # Target ids back to draft columns (the targets increase with the draft id).
        tokens = torch.searchsorted(p.targets, tokens)
    if p.sampled:
        for k in range(p.steps):
            noise = gumbel_noise_fn(spec_step_seed(p.seeds, k)[:, None], p.positions[:, k, None] + DRAFT_NOISE_SALT, ids)
            scored[:, k] = logits[:, k] / p.temperature[:, None] + noise
    best = scored.max(-1).values
    chosen = scored.gather(-1, tokens[..., None]).squeeze(-1)
    ok = chosen >= best - atol_ulps * best.abs().clamp(min=1.0) * 2.0 ** -7
    return float(ok.float().mean())


# --------------------------------------------------------------------------------------------------- run


def run_gpu(args) -> dict:
    import torch
    import torch.nn.functional as F
    import triton

    from hybridspec_kernels.head_walk import barrier_errors, gumbel_noise, head_walk, naive_head_walk

    gumbel, fused = load_vllm_kernels(Path(args.vllm_sources))
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    bw = hbm_gbps(torch)
    print(f"device {props.name}, {props.multi_processor_count} SMs, L2 {props.L2_cache_size / 2**20:.0f} MiB, copy "
          f"{bw:.0f} GB/s, vLLM kernels {'found' if gumbel else 'MISSING'}", flush=True)
    if args.compile_workers > 0:
        precompile(args, props.multi_processor_count)
    rows_out, checks = [], []
    ladder = LADDERS[args.ladder]
    # The step chain alone: 64 vocabulary rows per program, greedy.
    import hybridspec_kernels.head_walk.walk as walk

    _allow_local_exchange(walk)
    for floor in ladder["floors"]:
        exchange, rows, floor_kw = _floor_kw(floor)
        sms = props.multi_processor_count
        name = f"ours_sync_floor_{exchange}" + (f"_b{rows}" if rows > 1 else "")
        try:
            p = Problem(torch, rows, 15, 64 * sms, RANK, False, device, torch.bfloat16)
            fn = ours_fn(head_walk, p, **floor_kw)
            errors_before = barrier_errors(device)
            gluon_ran = _walks_gluon(walk, fn)
            torch.cuda.synchronize()
            if barrier_errors(device) != errors_before:
                raise RuntimeError("grid barrier gave up")
            us, _ = time_graph(torch, fn)
            checks.append(dict(check=name, steps=15, programs=sms, batch=rows, us=round(us, 1),
                               us_per_step=round(us / 15, 2)))
            if floor_kw.get("gluon"):
                checks[-1]["gluon_ran"] = gluon_ran
        except Exception as exc:
            checks.append(dict(check=name, error=f"{type(exc).__name__}: {str(exc)[:300]}"))
        print(json.dumps(checks[-1]), flush=True)
    t_ladder = time.time()
    for name, vocab, rows, kw in ([] if args.no_ladder else ladder["cases"]):
        if time.time() - t_ladder > args.ladder_budget_s:
            print(f"ladder budget reached, skipping {name}", flush=True)
            continue
        shipped_spin = walk.GUESS_ROUNDS, walk.SPIN_STAGGER, walk.SPIN_READS
        shipped_hoist = walk.D2T_HOIST
        shipped_rows_exchange = walk.ROWS_EXCHANGE, walk.ROWS_SPIN_STAGGER, walk.ROWS_WARPS
        shipped_cooperative = walk.COOPERATIVE_LAUNCH
        shipped_table_streamed = walk.NOISE_TABLE_STREAMED
        try:
            kw = dict(kw)
            if kw.pop("fp8", False):
                kw["w2_dtype"] = torch.float8_e4m3fn
            # The Gluon walk's candidate guesses a step (a module constant, baked into the build when captured).
            walk.GUESS_ROUNDS = kw.pop("guess_rounds", shipped_spin[0])
            # ... and the "..._pp" forms' stagger between a slot's reads in flight (clock cycles), and their number.
            walk.SPIN_STAGGER = kw.pop("spin_stagger", shipped_spin[1])
            walk.SPIN_READS = kw.pop("spin_reads", shipped_spin[2])
            walk.D2T_HOIST = kw.pop("d2t_hoist", shipped_hoist)  # d2t offsets of resident tiles read once a walk
            walk.ROWS_EXCHANGE = kw.pop("rows_exchange", shipped_rows_exchange[0])  # gluon="rows": its exchange
            walk.ROWS_SPIN_STAGGER = kw.pop("rows_spin_stagger", shipped_rows_exchange[1])  # ... and its spins
            walk.ROWS_WARPS = kw.pop("rows_warps", shipped_rows_exchange[2])  # ... and its warps
            walk.COOPERATIVE_LAUNCH = kw.pop("cooperative", shipped_cooperative)  # launch_cooperative_grid
            # partly streamed shards' noise from the table too
            walk.NOISE_TABLE_STREAMED = kw.pop("noise_table_streamed", shipped_table_streamed)
            steps = kw.pop("steps", 15)
            # Timed even where its tokens differ from the one-launch-per-step walk's (a diagnostic form).
            time_always = kw.pop("time_always", False)
            # A reduced draft vocabulary (vLLM's d2t) into d2t_target_vocab target ids (Problem(target_vocab=)),
            # laid out as d2t_layout; no_cache: a sampled walk without the draft-logits cache.
            p = Problem(torch, rows, steps, vocab, RANK, kw.pop("sampled", False), device, torch.bfloat16,
                        target_vocab=kw.pop("d2t_target_vocab", None), d2t_layout=kw.pop("d2t_layout", "random"))
            if kw.pop("no_cache", False):
                p.draft_logits = None
            cache_width = kw.pop("cache_width", None)
            if cache_width and p.draft_logits is not None:  # the same draft columns in wider cache rows
                p.draft_logits = torch.zeros(rows, steps, cache_width, dtype=p.draft_logits.dtype, device=device)
            ours_fn(head_walk, p, lockstep=True)()
            step_tokens = p.draft_tokens.clone()
            errors_before = barrier_errors(device)
            fn = ours_fn(head_walk, p, **kw)
            p.draft_tokens.fill_(-1)
            gluon_ran = _walks_gluon(walk, fn)
            torch.cuda.synchronize()
            row = dict(check=f"tune_{name}", vocab=vocab, batch=rows, steps=steps,
                       equal_step=bool(torch.equal(step_tokens, p.draft_tokens)),
                       barrier_errors=barrier_errors(device) - errors_before)
            if kw.get("gluon", "auto") is not False:  # the default ("auto") may walk either kernel
                row["gluon_ran"] = gluon_ran
            if row["barrier_errors"] == 0 and (row["equal_step"] or time_always):
                us, spread = time_graph(torch, fn)
                row.update(us=round(us, 1), spread=round(spread, 3), us_per_step=round(us / steps, 2))
        except Exception as exc:  # a tuning variant that cannot run is reported, not fatal
            row = dict(check=f"tune_{name}", error=f"{type(exc).__name__}: {str(exc)[:300]}")
        finally:
            walk.GUESS_ROUNDS, walk.SPIN_STAGGER, walk.SPIN_READS = shipped_spin
            walk.D2T_HOIST = shipped_hoist
            walk.ROWS_EXCHANGE, walk.ROWS_SPIN_STAGGER, walk.ROWS_WARPS = shipped_rows_exchange
            walk.COOPERATIVE_LAUNCH = shipped_cooperative
            walk.NOISE_TABLE_STREAMED = shipped_table_streamed
        checks.append(row)
        print(json.dumps(row), flush=True)
    rule = launch_rule(checks, ladder["rule"])
    checks.append(dict(check="ours_exchange_rule", value={str(k): v for k, v in rule.items()}))
    print(json.dumps(checks[-1]), flush=True)
    scoring_rule = launch_rule(checks, ladder.get("scoring", {}), tag="v152k")
    if scoring_rule:
        checks.append(dict(check="ours_scoring_rule_v152k", value={str(k): v for k, v in scoring_rule.items()}))
        print(json.dumps(checks[-1]), flush=True)
    if ladder.get("sweep_gluon_auto"):
        walk.GLUON_AUTO_FORM, walk.GLUON_AUTO_GEOMETRY = ladder["sweep_gluon_auto"]
        checks.append(dict(check="sweep_gluon_auto", form=walk.GLUON_AUTO_FORM, geometry=walk.GLUON_AUTO_GEOMETRY))
        print(json.dumps(checks[-1]), flush=True)
    if ladder.get("sweep_gluon_auto_resident"):
        # The sweep row as it would be with this resident form adopted as auto's.
        walk.GLUON_AUTO_RESIDENT_FORM = ladder["sweep_gluon_auto_resident"]
        checks.append(dict(check="sweep_gluon_auto_resident", form=walk.GLUON_AUTO_RESIDENT_FORM))
        print(json.dumps(checks[-1]), flush=True)
    if ladder.get("sweep_resident_chunk_rows"):
        # The sweep row as it would be with the resident candidate adopted (auto takes it on these shard sizes).
        walk.GLUON_AUTO_RESIDENT_CHUNK_ROWS = ladder["sweep_resident_chunk_rows"]
        checks.append(dict(check="sweep_resident_auto", form=walk.GLUON_AUTO_RESIDENT_FORM,
                           chunk_rows=list(walk.GLUON_AUTO_RESIDENT_CHUNK_ROWS)))
        print(json.dumps(checks[-1]), flush=True)
    t_start = time.time()
    # Block lengths in the order given (the headline block 15 first), both vocabularies before the next block.
    for steps in args.steps:
        for vocab in args.vocabs:
            for rows in args.batches:
                for mode in args.modes:
                    if time.time() - t_start > args.budget_s:
                        print(f"time budget reached, skipping V={vocab} N={steps} B={rows} {mode}", flush=True)
                        continue
                    sampled = mode == "sampled"
                    w2_bytes = vocab * RANK * 2
                    row = dict(vocab=vocab, steps=steps, batch=rows, mode=mode,
                               hbm_stream_us=round(steps * w2_bytes / bw / 1e3, 1),
                               hbm_once_us=round((w2_bytes + rows * steps * vocab * 2 * (2 if sampled else 1))
                                                 / bw / 1e3, 1),
                               mma_us=round(2 * rows * vocab * RANK * steps / MMA_PEAK_TFLOPS / 1e6, 2))
                    row["ours_variant"] = pick_variant(rule, rows)
                    ours_kw = dict(ladder["rule"].get(row["ours_variant"], {}))
                    row["ours_exchange"] = ours_kw.get("exchange", "auto")
                    if scoring_rule and vocab == 151936 and (rows > 1 or 1 in scoring_rule):
                        row["ours_scoring"] = pick_variant(scoring_rule, rows)
                        ours_kw.update(ladder["scoring"][row["ours_scoring"]])
                    # Each variant timed on args.samples fresh allocations (every sample's tensors stay alive
                    # until the row ends, so each lands elsewhere), a fresh graph capture each, ours and the
                    # baselines interleaved sample by sample; the row reports the median (HW11: one allocation's
                    # `ours` moved ~+-1.5 % between runs, as much as the gap to a goal).
                    if args.d2t_target_vocab:
                        row["d2t_target_vocab"] = args.d2t_target_vocab
                    problems, samples, tokens = [], {}, {}
                    for sample in range(args.samples):
                        p = Problem(torch, rows, steps, vocab, RANK, sampled, device, torch.bfloat16,
                                    target_vocab=args.d2t_target_vocab or None)
                        problems.append(p)
                        variants = {"ours": ours_fn(head_walk, p, **ours_kw)}
                        for also, also_kw in ladder.get("sweep_also", {}).items():
                            variants[f"ours_{also}"] = ours_fn(head_walk, p, **also_kw)
                        variants["ours_step"] = ours_fn(head_walk, p, lockstep=True)
                        if not (sampled and gumbel is None):
                            variants["graph_loop"] = lambda p=p: graph_loop(torch, F, gumbel, p)
                            if p.d2t is None:  # (the top-k loop and the fused step here have no d2t form)
                                variants["graph_topk"] = lambda p=p: graph_topk(torch, F, gumbel, p)
                        if (fused is not None and rows in args.fused_batches and vocab in args.fused_vocabs
                                and p.d2t is None):
                            variants["fused_step"] = FusedStep(torch, triton, fused, p)
                        for name, fn in variants.items():
                            if f"{name}_error" in row:
                                continue
                            try:
                                p.draft_tokens.fill_(-1)
                                errors_before = barrier_errors(device)
                                if name == "ours" or name[len("ours_"):] in ladder.get("sweep_also", {}):
                                    # (head_walk's default and the forms beside it may walk either kernel)
                                    ran = _walks_gluon(walk, fn)
                                    row[f"{name}_gluon"] = ran and row.get(f"{name}_gluon", True)
                                else:
                                    fn()
                                torch.cuda.synchronize()
                                if barrier_errors(device) != errors_before:
                                    # A wait that gives up takes ~0.3 s a step: never time such a walk.
                                    raise RuntimeError("a grid barrier / exchange wait gave up")
                                tokens.setdefault(name, []).append(p.draft_tokens.clone())
                                us, spread = time_graph(torch, fn)
                                samples.setdefault(name, []).append((us, spread))
                            except Exception as exc:  # a variant that cannot run is reported, not fatal
                                row[f"{name}_us"] = None
                                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                                print(f"  {name} failed: {row[f'{name}_error']}", flush=True)
                    for name, timed in samples.items():
                        if f"{name}_error" in row:
                            continue
                        us_list = [us for us, _ in timed]
                        median = statistics.median(us_list)
                        row[f"{name}_us"] = round(median, 1)
                        # Within one capture (replay to replay), the largest of the samples'.
                        row[f"{name}_spread"] = round(max(spread for _, spread in timed), 3)
                        if args.samples > 1:
                            row[f"{name}_us_samples"] = [round(us, 1) for us in us_list]
                            row[f"{name}_sample_spread"] = round((max(us_list) - min(us_list)) / median, 3)
                    if args.samples > 1:
                        row["samples"] = args.samples
                    if "ours" in tokens:
                        ours_tokens = tokens["ours"][0]
                        # Every sample's tensors hold the same data (same seed): one set of tokens.
                        row["ours_written"] = all(bool((t >= 0).all()) for t in tokens["ours"])
                        row["ours_eq_step"] = all(torch.equal(t, ours_tokens) for t in tokens["ours"]) and all(
                            torch.equal(t, ours_tokens) for t in tokens.get("ours_step", []))
                        row["ours_tolerated"] = tolerated(naive_head_walk, gumbel_noise, problems[0], ours_tokens)
                        for ref in ("graph_loop", "fused_step"):
                            if ref in tokens:
                                row[f"agree_{ref}"] = round(float((tokens[ref][0] == ours_tokens).float().mean()), 3)
                        for also in ladder.get("sweep_also", {}):
                            name = f"ours_{also}"
                            if name in tokens:
                                row[f"{name}_eq_ours"] = all(torch.equal(t, ours_tokens) for t in tokens[name])
                            if row.get(f"{name}_us_samples") and row.get("ours_us_samples"):
                                # ours' gain over it, sample by sample (the same allocation, timed back to back).
                                row[f"ours_gain_over_{name}_samples"] = [
                                    round(1 - ours / other, 4) for ours, other in zip(row["ours_us_samples"],
                                                                                      row[f"{name}_us_samples"])]
                    for ref in ("graph_loop", "graph_topk", "fused_step", "ours_step"):
                        if row.get(f"{ref}_us") and row.get("ours_us"):
                            row[f"speedup_{ref}"] = round(row[f"{ref}_us"] / row["ours_us"], 2)
                    if row.get("graph_loop_us_samples") and row.get("ours_us_samples"):
                        # Sample by sample (ours and the loop timed back to back): the spread of the ratio.
                        row["speedup_graph_loop_samples"] = [
                            round(loop / ours, 3) for loop, ours in zip(row["graph_loop_us_samples"],
                                                                        row["ours_us_samples"])]
                    if row.get("ours_us"):
                        row["ours_us_per_step"] = round(row["ours_us"] / steps, 2)
                    if row.get("graph_loop_us"):
                        row["graph_loop_us_per_step"] = round(row["graph_loop_us"] / steps, 2)
                    rows_out.append(row)
                    print(json.dumps(row), flush=True)
                    del p, problems, tokens, variants
                    torch.cuda.empty_cache()
    try:
        if args.heads_budget_s > 0:
            checks += check_heads(torch, head_walk, naive_head_walk, gumbel_noise, device, args)
    except Exception as exc:  # reported, the sweep's results are still written
        checks.append(dict(check="heads", error=f"{type(exc).__name__}: {str(exc)[:300]}"))
        print(json.dumps(checks[-1]), flush=True)
    errors = barrier_errors(device)
    checks.append(dict(check="barrier_errors", value=errors))
    return dict(rows=rows_out, checks=checks, hbm_gbps=round(bw), device=props.name, sms=props.multi_processor_count,
                l2_mib=round(props.L2_cache_size / 2**20))


def launch_rule(checks, candidates, tag="v32k") -> dict:
    """{ladder batch size: fastest candidate launch variant} from this run's greedy ladder rows named
    tune_<variant>_<tag>_b<rows> (tokens equal to the one-launch-per-step walk, no wait gave up); the sweep's
    `ours` and the wiring (choose_exchange, choose_streamed_scoring) follow it."""
    best = {}
    for c in checks:
        name = c.get("check", "")
        for variant in candidates:
            prefix = f"tune_{variant}_{tag}_b"
            if name.startswith(prefix) and name[len(prefix):].isdigit() and c.get("us") and c.get("equal_step"):
                rows = int(name[len(prefix):])
                if rows not in best or c["us"] < best[rows][1]:
                    best[rows] = (variant, c["us"])
    return {rows: variant for rows, (variant, _) in sorted(best.items())}


def pick_variant(rule: dict, rows: int) -> str:
    """The rule's variant for the smallest ladder batch >= rows (the largest one above them all); '' (the
    defaults) when the ladder measured nothing."""
    if not rule:
        return ""
    sizes = sorted(rule)
    return rule[next((b for b in sizes if b >= rows), sizes[-1])]


def head_case(torch, device, rows, head, sampled, vocab=32000, steps=15, d_model=512):
    """A bf16 Markov, gated-Markov or RNN walk problem and its head_walk keyword arguments."""
    gen = torch.Generator(device=device).manual_seed(rows * 10 + sampled)
    rnd = lambda *s, scale: (torch.randn(*s, generator=gen, device=device) * scale).to(torch.bfloat16)  # noqa: E731
    p = Problem(torch, rows, steps, vocab, RANK, sampled, device, torch.bfloat16, seed=rows)
    hidden = rnd(rows, steps, d_model, scale=0.5)
    if head == "markov":
        kw = {}
    elif head == "gated_markov":
        kw = dict(gate_weights=(rnd(RANK, d_model + RANK, scale=0.05), rnd(RANK, scale=0.1)))
    else:
        kw = dict(rnn_weights=(rnd(3 * RANK, 2 * RANK + d_model, scale=0.05), rnd(3 * RANK, scale=0.1)))
    kw.update(head=head, hidden=hidden)
    if sampled:
        kw.update(temperature=p.temperature, seeds=p.seeds, positions=p.positions)
    return p, kw


def _with(forms: dict, **options) -> dict:
    """forms (name -> head_walk options) with options added to each (sampled=True, a d2t target vocabulary)."""
    return {name: dict(kw, **options) for name, kw in forms.items()}


def _mirrored_passes(forms: dict, vocab: int, suffix: str, passes: int = 4, rows: int = 1) -> list:
    """Cases of `passes` passes over forms (name -> head_walk options), every other pass in reverse order
    (ABBA: drift cancels), named name{"", "_again", "_third", "_fourth"}_{suffix}."""
    names = list(forms)
    return [(f"{name}{tag}_{suffix}", vocab, rows, forms[name])
            for i, tag in enumerate(("", "_again", "_third", "_fourth")[:passes])
            for name in (names if i % 2 == 0 else names[::-1])]


# Launch configurations tried beside the defaults (greedy, block 15): each changes one option, so the rows tell
# which change bought what. Session 2's ladder (v4):
TUNE_CASES = [
    ("counter_v32k_b1", 32000, 1, dict(exchange="counter")),
    ("flags_v32k_b1", 32000, 1, dict(exchange="flags")),
    ("tagged_v32k_b1", 32000, 1, dict(exchange="tagged")),
    ("warps16_v32k_b1", 32000, 1, dict(num_warps=16)),
    ("counter_v32k_b8", 32000, 8, dict(exchange="counter")),
    ("flags_v32k_b8", 32000, 8, dict(exchange="flags")),
    ("tagged_v32k_b8", 32000, 8, dict(exchange="tagged")),
    ("warps16_v32k_b8", 32000, 8, dict(num_warps=16)),
    ("counter_v32k_b32", 32000, 32, dict(exchange="counter")),
    ("tagged_v32k_b32", 32000, 32, dict(exchange="tagged")),
    ("counter_v32k_b64", 32000, 64, dict(exchange="counter")),
    ("tagged_v32k_b64", 32000, 64, dict(exchange="tagged")),
    ("counter_v152k_b1", 151936, 1, dict(exchange="counter")),
    ("flags_v152k_b1", 151936, 1, dict(exchange="flags")),
    ("tagged_v152k_b1", 151936, 1, dict(exchange="tagged")),
    ("counter_v152k_b32", 151936, 32, dict(exchange="counter")),
    ("tagged_v152k_b32", 151936, 32, dict(exchange="tagged")),
    ("tile_keys_v152k_b1", 151936, 1, dict(keys_once=False)),
    ("no_prefetch_v152k_b1", 151936, 1, dict(prefetch=False)),
    ("stream128_v152k_b1", 151936, 1, dict(stream_rows=128)),
    ("warps16_v152k_b1", 151936, 1, dict(num_warps=16)),
    ("res1_tile128_v152k_b1", 151936, 1, dict(tile_rows=128, resident_tiles=1)),
    ("no_prefetch_v152k_b32", 151936, 32, dict(prefetch=False)),
]
# Session 3 (v5): the batched exchanges (probe, poll) against the counter barrier and the per-thread spin, and the
# L1 prefetch of the next step's U and the candidates' W1 rows during the wait, at V = 32k.
TUNE_CASES_V5 = [
    ("tagged_v32k_b1", 32000, 1, dict(exchange="tagged")),
    ("tagged_l1_v32k_b1", 32000, 1, dict(exchange="tagged", l1_prefetch=True)),
    ("counter_v32k_b1", 32000, 1, dict(exchange="counter")),
    ("counter_v32k_b8", 32000, 8, dict(exchange="counter")),
    ("probe_v32k_b8", 32000, 8, dict(exchange="probe")),
    ("poll_v32k_b8", 32000, 8, dict(exchange="poll")),
    ("poll_l1_v32k_b8", 32000, 8, dict(exchange="poll", l1_prefetch=True)),
    ("warps16_poll_v32k_b8", 32000, 8, dict(exchange="poll", num_warps=16)),
    ("counter_v32k_b32", 32000, 32, dict(exchange="counter")),
    ("probe_v32k_b32", 32000, 32, dict(exchange="probe")),
    ("poll_v32k_b32", 32000, 32, dict(exchange="poll")),
    ("warps16_poll_v32k_b32", 32000, 32, dict(exchange="poll", num_warps=16)),
    ("counter_v32k_b64", 32000, 64, dict(exchange="counter")),
    ("probe_v32k_b64", 32000, 64, dict(exchange="probe")),
    ("poll_v32k_b64", 32000, 64, dict(exchange="poll")),
    ("warps16_poll_v32k_b64", 32000, 64, dict(exchange="poll", num_warps=16)),
    ("tagged_v152k_b1", 151936, 1, dict(exchange="tagged")),
    ("counter_v152k_b32", 151936, 32, dict(exchange="counter")),
    ("probe_v152k_b32", 151936, 32, dict(exchange="probe")),
    ("poll_v152k_b32", 151936, 32, dict(exchange="poll")),
]
# Session 3, second round (v6): the B > 1 scoring cuts side by side. Defaults: a running fp32 value + int32 id max
# per element (split_keys) ending in an fp32 max + int32 id min (pair_reduce), logit scale 1 without its multiply;
# the next step's noise computed during the exchange (noise_ahead) was the default up to 32 padded rows for this
# ladder's run, off since (measured slower). "_key": the split fold ending in one int64 key reduction; "_keys64":
# an int64 key per score (session 3's scoring).
TUNE_CASES_V6 = [
    ("tagged_v32k_b1", 32000, 1, dict(exchange="tagged")),
    ("probe_v32k_b8", 32000, 8, dict(exchange="probe")),
    ("poll_v32k_b8", 32000, 8, dict(exchange="poll")),
    ("poll_key_v32k_b8", 32000, 8, dict(exchange="poll", pair_reduce=False)),
    ("poll_keys64_v32k_b8", 32000, 8, dict(exchange="poll", split_keys=False)),
    ("probe_v32k_b32", 32000, 32, dict(exchange="probe")),
    ("poll_v32k_b32", 32000, 32, dict(exchange="poll")),
    ("probe_key_v32k_b32", 32000, 32, dict(exchange="probe", pair_reduce=False)),
    ("poll_key_v32k_b32", 32000, 32, dict(exchange="poll", pair_reduce=False)),
    ("probe_keys64_v32k_b32", 32000, 32, dict(exchange="probe", split_keys=False)),
    ("poll_v32k_b64", 32000, 64, dict(exchange="poll")),
    ("probe_v32k_b64", 32000, 64, dict(exchange="probe")),
    ("poll_key_v32k_b64", 32000, 64, dict(exchange="poll", pair_reduce=False)),
    ("poll_keys64_v32k_b64", 32000, 64, dict(exchange="poll", split_keys=False)),
    ("sampled_poll_v32k_b8", 32000, 8, dict(exchange="poll", sampled=True)),
    ("sampled_poll_no_ahead_v32k_b8", 32000, 8, dict(exchange="poll", noise_ahead=False, sampled=True)),
    ("sampled_probe_v32k_b32", 32000, 32, dict(exchange="probe", sampled=True)),
    ("sampled_probe_no_ahead_v32k_b32", 32000, 32, dict(exchange="probe", noise_ahead=False, sampled=True)),
    ("sampled_poll_v32k_b64", 32000, 64, dict(exchange="poll", sampled=True)),
    ("sampled_poll_ahead_v32k_b64", 32000, 64, dict(exchange="poll", noise_ahead=True, sampled=True)),
    ("probe_v152k_b32", 151936, 32, dict(exchange="probe")),
    ("probe_keys64_v152k_b32", 151936, 32, dict(exchange="probe", split_keys=False)),
]
# Session 3, second round, call 2 (v7): with a partly streamed shard (V = 152k) the split fold measured +40% at b8 and
# +28% at b64 (sweep, against session 3's int64 keys) and -17% at b32 (ladder v6): the scoring of each batch size
# measured side by side, its winner taken by the sweep's 152k rows (and by plan_walk: MEASURED_STREAMED_SCORING).
# (l2_prefetch=0: what these rows ran before plan_walk prefetched by default.)
STREAMED_SCORINGS = {"split": dict(split_keys=True, split_streamed=True, l2_prefetch=0, stream_tma=0),
                     "split_res": dict(split_keys=True, split_streamed=False, l2_prefetch=0, stream_tma=0),
                     "keys64": dict(split_keys=False, l2_prefetch=0, stream_tma=0)}
TUNE_CASES_V7 = [(f"{name}_v152k_b{rows}", 151936, rows, kw) for rows in (8, 32, 64)
                 for name, kw in STREAMED_SCORINGS.items()]
# Session 4 (v8): the streamed part of a 152k shard (~61 MB a step, every step the same bytes) and the 50-60 MB L2.
# "knee_n<n>": the default walk on a vocabulary whose shards stream n tiles of 64 rows (4.3 MB a tile over 132
# programs): per-step time against streamed bytes, below and above the L2's size. Variants at 152k: "pf<d>" bulk
# L2 prefetch d tiles ahead, "st32" 32-row streamed tiles. (The evict_last keep set, the persisting-L2 set-aside,
# serpentine order and 3 resident tiles of 128 rows were measured slower and removed: eval/notes/head_walk.md.)
KNEE_TILES = (2, 6, 8, 10, 12, 14)
L2_VARIANTS = {
    "tagged": dict(exchange="tagged", stream_tma=0),
    "pf2": dict(l2_prefetch=2, stream_tma=0), "pf4": dict(l2_prefetch=4, stream_tma=0),
    "pf8": dict(l2_prefetch=8, stream_tma=0), "st32": dict(stream_rows=32),
}
TUNE_CASES_V8 = (
    [(f"knee_n{n}_v{132 * (256 + 64 * n)}_b1", 132 * (256 + 64 * n), 1, dict(exchange="tagged", stream_tma=0))
     for n in KNEE_TILES]
    + [(f"knee_pf4_n{n}_v{132 * (256 + 64 * n)}_b1", 132 * (256 + 64 * n), 1, dict(l2_prefetch=4, stream_tma=0))
       for n in (2, 8, 14)]
    + [(f"{name}_v152k_b1", 151936, 1, kw) for name, kw in L2_VARIANTS.items() if name != "tagged"]
    + [(f"{scoring}{suffix}_v152k_b{rows}", 151936, rows, dict(STREAMED_SCORINGS[scoring], **kw))
       for rows, scoring in ((8, "keys64"), (32, "split"), (64, "keys64"))
       for suffix, kw in (("", {}), ("_pf4", dict(l2_prefetch=4)))])
# Session 4, call 2 (v9): per batch size, the streaming variants of the 152k walk (with and without the L2 prefetch
# 4 tiles ahead); the sweep's 152k rows take the one this run's ladder finds fastest (check
# ours_scoring_rule_v152k), and plan_walk's MEASURED_STREAMED_L2_PREFETCH follows it. (The "late" rows, the next
# tile's loads after the dot, measured no faster and were removed: eval/notes/head_walk.md.)
STREAMING_BY_BATCH = {
    1: {"tagged": dict(exchange="tagged", stream_tma=0)},
    8: {"keys64": dict(split_keys=False, l2_prefetch=0, stream_tma=0),
        "keys64_pf4": dict(split_keys=False, l2_prefetch=4, stream_tma=0)},
    32: {"split": dict(split_keys=True, split_streamed=True, l2_prefetch=0, stream_tma=0),
         "split_pf4": dict(split_keys=True, split_streamed=True, l2_prefetch=4, stream_tma=0)},
    64: {"keys64": dict(split_keys=False, l2_prefetch=0, stream_tma=0),
         "keys64_pf4": dict(split_keys=False, l2_prefetch=4, stream_tma=0)},
}
STREAMING = {name: kw for variants in STREAMING_BY_BATCH.values() for name, kw in variants.items()}
TUNE_CASES_V9 = [(f"{name}_v152k_b{rows}", 151936, rows, kw) for rows, variants in STREAMING_BY_BATCH.items()
                 for name, kw in variants.items()]
# Session 4, call 4 (v11): the 152k b8 / b32 sampled sweep rows of v9 (prefetch 4, chosen on greedy rows) came out
# 3-4% slower than session 3's without it: the prefetch distance of sampled walks measured on their own ("s_" rows,
# the rule and the sampled sweep rows), greedy pf2 beside.
STREAMING_SAMPLED_BY_BATCH = {
    8: {f"s_keys64{suffix}": dict(split_keys=False, sampled=True, stream_tma=0, **kw)
        for suffix, kw in (("", dict(l2_prefetch=0)), ("_pf2", dict(l2_prefetch=2)), ("_pf4", dict(l2_prefetch=4)))},
    32: {f"s_split{suffix}": dict(split_keys=True, split_streamed=True, sampled=True, stream_tma=0, **kw)
         for suffix, kw in (("", dict(l2_prefetch=0)), ("_pf2", dict(l2_prefetch=2)),
                            ("_pf4", dict(l2_prefetch=4)))},
}
TUNE_CASES_V11 = ([(f"{name}_v152k_b{rows}", 151936, rows, kw) for rows, variants in STREAMING_SAMPLED_BY_BATCH.items()
                   for name, kw in variants.items()]
                  + [("keys64_pf2_v152k_b8", 151936, 8, dict(split_keys=False, l2_prefetch=2, stream_tma=0)),
                     ("keys64_pf4_v152k_b8", 151936, 8, dict(split_keys=False, l2_prefetch=4, stream_tma=0)),
                     ("split_pf2_v152k_b32", 151936, 32,
                      dict(split_keys=True, split_streamed=True, l2_prefetch=2, stream_tma=0)),
                     ("split_pf4_v152k_b32", 151936, 32,
                      dict(split_keys=True, split_streamed=True, l2_prefetch=4, stream_tma=0))])
# Session 5 (v12): the streamed tiles through a TMA ring (stream_tma = stages; Triton pipelines a tl.range over
# tensor-descriptor loads into shared-memory stages waited on with mbarriers) against the register double buffer.
# The ring needs shared memory beside the resident tiles (227 KiB a program): "st32" 16 KB tiles under the 128 KiB
# resident tile, "res192" 3 resident tiles of 64 rows (96 KiB) + 32 KB tiles, "res128" one of 128 rows + 32 KB tiles;
# "_pf<d>" adds the bulk L2 prefetch d tiles ahead (wrapping into the next step's first tiles, so the copies issued
# after the exchange find them in L2). The sweep's 152k rows take each batch's winner (ours_scoring_rule_v152k).
# Run 2 of session 5 (13fcca2) measured this ladder; plan_walk's MEASURED_STREAMED_TMA follows it. The register-path
# rows of this and the older 152k ladders say stream_tma=0: the plan's default walks the ring since.
TMA_FORMS = {
    "tma2": dict(stream_tma=2),
    "tma4_st32": dict(stream_tma=4, stream_rows=32),
    "tma5_st32": dict(stream_tma=5, stream_rows=32),
    "tma5_st32_pf8": dict(stream_tma=5, stream_rows=32, l2_prefetch=8),
    "tma3_res192": dict(stream_tma=3, tile_rows=64, resident_tiles=3),
    "tma3_res192_pf4": dict(stream_tma=3, tile_rows=64, resident_tiles=3, l2_prefetch=4),
    "tma4_res128": dict(stream_tma=4, tile_rows=128, resident_tiles=1),
}
STREAMING_TMA_BY_BATCH = {
    1: dict({"tagged": dict(exchange="tagged", stream_tma=0)}, **TMA_FORMS),
    8: {"keys64_pf4": dict(split_keys=False, l2_prefetch=4, stream_tma=0),
        **{f"keys64_{name}": dict(kw, split_keys=False, l2_prefetch=kw.get("l2_prefetch", 0))
           for name, kw in TMA_FORMS.items() if name in ("tma5_st32", "tma3_res192", "tma5_st32_pf8")}},
    32: {"split_pf4": dict(split_keys=True, split_streamed=True, l2_prefetch=4, stream_tma=0),
         **{f"split_{name}": dict(kw, split_keys=True, split_streamed=True, l2_prefetch=kw.get("l2_prefetch", 0))
            for name, kw in TMA_FORMS.items() if name in ("tma5_st32", "tma3_res192", "tma5_st32_pf8")}},
}
TUNE_CASES_V12 = ([(f"{name}_v152k_b{rows}", 151936, rows, kw) for rows, variants in STREAMING_TMA_BY_BATCH.items()
                   for name, kw in variants.items()]
                  + [(f"s_{name}_v152k_b1", 151936, 1, dict(kw, sampled=True))
                     for name, kw in (("tagged", dict(exchange="tagged", stream_tma=0)),
                                      ("tma5_st32", TMA_FORMS["tma5_st32"]))])
# Session 5, second round (v13): the ring's cost per iteration and what was left unmeasured. "_uptr": the streamed
# tiles' base logits by pointer loads at the top of each iteration instead of through the ring (u_ring=False: one
# mbarrier wait, one stage refill and its generic-to-async fence less an iteration); "_w4": 4 warps (one warpgroup
# reads each streamed tile from shared memory once). b64 with the ring (two resident tiles of 64 rows, as its
# register path keeps) against its register path; the sampled b8 / b32 defaults (ring) against the register path
# they replaced, side by side ("s_" rows: not in the rule; the sampled sweep rows take the greedy winner).
RES128 = dict(stream_tma=4, tile_rows=128, resident_tiles=1)
STREAMING_V13_BY_BATCH = {
    1: {"tma4_res128": RES128, "tma4_res128_uptr": dict(RES128, u_ring=False),
        "tma4_res128_w4": dict(RES128, num_warps=4), "tma4_res128_uptr_w4": dict(RES128, u_ring=False, num_warps=4),
        "tma5_st32_uptr": dict(stream_tma=5, stream_rows=32, u_ring=False),
        "tma3_res192_uptr": dict(stream_tma=3, tile_rows=64, resident_tiles=3, u_ring=False)},
    64: {"keys64": dict(split_keys=False, l2_prefetch=0, stream_tma=0),
         "keys64_tma3_res128": dict(split_keys=False, l2_prefetch=0, stream_tma=3, tile_rows=64, resident_tiles=2),
         "keys64_tma3_res128_uptr": dict(split_keys=False, l2_prefetch=0, stream_tma=3, tile_rows=64,
                                         resident_tiles=2, u_ring=False)},
}
SAMPLED_V13 = [
    ("s_tma4_res128", 1, RES128), ("s_tma4_res128_uptr", 1, dict(RES128, u_ring=False)),
    ("s_keys64", 8, dict(split_keys=False, l2_prefetch=0, stream_tma=0)),
    ("s_keys64_tma3_res192", 8, dict(split_keys=False, l2_prefetch=0, stream_tma=3, tile_rows=64, resident_tiles=3)),
    ("s_split_pf2", 32, dict(split_keys=True, split_streamed=True, l2_prefetch=2, stream_tma=0)),
    ("s_split_tma3_res192", 32, dict(split_keys=True, split_streamed=True, l2_prefetch=0, stream_tma=3, tile_rows=64,
                                     resident_tiles=3)),
    ("s_keys64", 64, dict(split_keys=False, l2_prefetch=0, stream_tma=0)),
    ("s_keys64_tma3_res128", 64, dict(split_keys=False, l2_prefetch=0, stream_tma=3, tile_rows=64, resident_tiles=2)),
]
TUNE_CASES_V13 = ([(f"{name}_v152k_b{rows}", 151936, rows, kw) for rows, variants in STREAMING_V13_BY_BATCH.items()
                   for name, kw in variants.items()]
                  + [(f"{name}_v152k_b{rows}", 151936, rows, dict(kw, sampled=True)) for name, rows, kw in SAMPLED_V13])
# Session 6 (HX, v15): the amax exchange (atomic max into one [B] winners slot a step, one arrival on a step counter,
# [B] winners read back; "amax": a line a row, as measured then; "amax1": the rows packed) against each batch's
# measured exchange (b1 tagged, b8 poll, b32 probe, b64 poll), greedy and sampled, 32k and 152k (the plan's streamed
# forms otherwise). Sync floors of every exchange beside "local" (no exchange: the step's own cost).
AMAX_VS = {1: "tagged", 8: "poll", 32: "probe", 64: "poll"}
AMAX16 = dict(exchange="amax", winner_stride=16)
TUNE_CASES_V15 = (
    [(f"{ex}_v32k_b{rows}", 32000, rows, AMAX16 if ex == "amax" else dict(exchange=ex)) for rows, base in AMAX_VS.items()
     for ex in (base, "amax")]
    + [("poll_v32k_b32", 32000, 32, dict(exchange="poll"))]
    + [(f"amax1_v32k_b{rows}", 32000, rows, dict(exchange="amax", winner_stride=1)) for rows in (8, 32, 64)]
    + [(f"sampled_{ex}_v32k_b{rows}", 32000, rows, dict(AMAX16 if ex == "amax" else dict(exchange=ex), sampled=True))
       for rows, base in AMAX_VS.items() if rows > 1 for ex in (base, "amax")]
    + [(f"{'sampled_' if sampled else ''}{ex}_v152k_b{rows}", 151936, rows,
        dict(AMAX16 if ex == "amax" else dict(exchange=ex), sampled=sampled))
       for sampled in (False, True) for rows, base in AMAX_VS.items() if rows > 1 for ex in (base, "amax")])
FLOORS_V15 = [(ex, rows, AMAX16) if ex == "amax" else (ex, rows) for rows, base in AMAX_VS.items()
              for ex in ("local", base, "amax")] + [("amax1", 32, dict(exchange="amax", winner_stride=1))]
# Session 6 (HX, v16): after v15 (amax lost at b8 / b32: its floors 6.3 / 6.9 us a step against poll 3.5 / probe
# 5.0), amax (packed rows, the default since v15) beside each batch's measured exchange, side by side; the sweep's
# `ours` takes this run's winner per batch. As measured (0d1d3c4) it also ran the rowmax exchange (program r reduces
# row r's [P] tagged keys and publishes the row's winner, every program waits on the [B] winners): slower at every
# batch, removed (code at 0d1d3c4).
TUNE_CASES_V16 = (
    [("tagged_v32k_b1", 32000, 1, dict(exchange="tagged"))]
    + [(f"{'sampled_' if sampled else ''}{ex}_v{'32k' if vocab == 32000 else '152k'}_b{rows}", vocab, rows,
        dict(exchange=ex, sampled=sampled))
       for vocab in (32000, 151936) for sampled in (False, True) for rows, base in AMAX_VS.items() if rows > 1
       for ex in (base, "amax")])
FLOORS_V16 = [("tagged", 1)] + [(ex, rows) for rows, base in AMAX_VS.items() if rows > 1
                                for ex in ("local", base, "amax")]
# Session 6 (HX, v17): the amax rows' winners spread over the L2 (512 B / 4 KB / 32 KB apart): v15 / v16 say the
# exchange costs ~8.5 ns per L2 request on one slice (125 programs' atomics serialize where their line lands), so
# rows on different slices should cost about what one row costs (b1: +0.3 us over tagged).
AMAX_SPREAD = {f"amax{s}": dict(exchange="amax", winner_stride=s) for s in (64, 512, 4096)}
TUNE_CASES_V17 = [
    ("probe_v32k_b32", 32000, 32, dict(exchange="probe")), ("amax512_v32k_b32", 32000, 32, AMAX_SPREAD["amax512"]),
    ("amax4096_v32k_b32", 32000, 32, AMAX_SPREAD["amax4096"]), ("poll_v32k_b8", 32000, 8, dict(exchange="poll")),
    ("amax512_v32k_b8", 32000, 8, AMAX_SPREAD["amax512"]), ("amax512_v32k_b64", 32000, 64, AMAX_SPREAD["amax512"])]
FLOORS_V17 = [("probe", 32), ("amax", 32)] + [(name, 32, kw) for name, kw in AMAX_SPREAD.items()]
# Session 6's Gluon ladders v18 (PH: the resident 32k b1 walk), v19 (PS: the 152k b1 streamed walk in its forms and
# geometries) and v20 (PB: 2..32 rows) were run once (session 7, call 1; eval/notes/head_walk.md); their cases named
# forms since removed: code at eee43d2.
# Session 7 (v21): head_walk's default at 152k b1 (gluon="auto": the Gluon streamed walk, form rs, 256 resident rows
# of which 64 in registers, 3 ring stages) beside the Triton walk (gluon=False) at blocks 15 and 7 and at 150,001
# (U rows not 16-byte aligned: the default stays on the Triton register path; the Gluon walk in the default's exact
# form beside it), plus the one other ring geometry the plan and the shared memory admit at 256 resident rows (2
# stages; 320 rows: plan_walk keeps at most 256 resident; 4 stages: over the shared memory).
GLUON_AUTO_KW = dict(gluon="rs", stream_tma=3, tile_rows=64, resident_tiles=4)
GLUON_PROBES = {"rs_res256s2": dict(gluon="rs", stream_tma=2, tile_rows=64, resident_tiles=4)}
TUNE_CASES_V21 = [
    ("default_v152k_b1", 151936, 1, {}), ("triton_v152k_b1", 151936, 1, dict(gluon=False)),
    ("default_blk7_v152k_b1", 151936, 1, dict(steps=7)),
    ("triton_blk7_v152k_b1", 151936, 1, dict(gluon=False, steps=7)),
    ("triton_v150001_b1", 150001, 1, dict(gluon=False)),
    ("gluon_rs_res256s3_v150001_b1", 150001, 1, GLUON_AUTO_KW),
    *[(f"gluon_{name}_v152k_b1", 151936, 1, kw) for name, kw in GLUON_PROBES.items()],
    ("default_again_v152k_b1", 151936, 1, {}), ("triton_again_v152k_b1", 151936, 1, dict(gluon=False))]
# HW7b (v22): 128-row tiles at 8 warps (two warpgroups, 128 rows of W2 in registers as the wgmma A operand): rs
# with 256 resident rows (128 in registers + 128 in shared memory) and 2 ring stages of 128 rows (7 streamed
# iterations a step instead of the default's 14), or 128 resident rows (registers only) and 3 stages (8), beside
# the default (auto: rs, 64-row tiles, 256 resident, 3 stages) and the Triton walk, at 152k (blocks 15 and 7) and
# 150,001. The sweep row's `ours` is head_walk's default with the t128 res256 s2 form as the auto geometry
# ("sweep_gluon_auto": the row the default would give if that form were adopted). Run once (59fc260, where
# "default" was rs res256 s3 at 64-row tiles); t128 res256 s2 won and is now the default (walk.GLUON_AUTO_GEOMETRY).
T128 = dict(tile_rows=128, stream_rows=128)
GLUON_T128 = {"rs_res256s2t128": dict(gluon="rs", stream_tma=2, resident_tiles=2, **T128),
              "rs_res128s3t128": dict(gluon="rs", stream_tma=3, resident_tiles=1, **T128)}
TUNE_CASES_V22 = [
    ("default_v152k_b1", 151936, 1, {}), ("triton_v152k_b1", 151936, 1, dict(gluon=False)),
    *[(f"gluon_{name}_v152k_b1", 151936, 1, kw) for name, kw in GLUON_T128.items()],
    ("default_v150001_b1", 150001, 1, {}), ("triton_v150001_b1", 150001, 1, dict(gluon=False)),
    ("gluon_rs_res256s2t128_v150001_b1", 150001, 1, GLUON_T128["rs_res256s2t128"]),
    ("default_blk7_v152k_b1", 151936, 1, dict(steps=7)),
    ("gluon_rs_res256s2t128_blk7_v152k_b1", 151936, 1, dict(GLUON_T128["rs_res256s2t128"], steps=7)),
    ("default_again_v152k_b1", 151936, 1, {}),
    ("gluon_rs_res256s2t128_again_v152k_b1", 151936, 1, GLUON_T128["rs_res256s2t128"])]
# HW8's ladder v23 (rs_ws / rs_sf / rs_ws_sf beside the then default rs) was run once (session 8, lead's call 1 at
# 89ba734): rs_sf won and is auto's form; its cases named the producer-warp forms since removed (code at 89ba734).
# HW9's ladders v24 (rs_sf beside its once-a-step L2 prefetch of the next step's 1..4 tiles, rs_sf_pf1..4; call A at
# bff8a73) and v25 (beside rs_sf_w1, each program's best token's W1 row prefetched into L2 as it publishes; call B at
# b4da3f0) were run once (session 8): no prefetch form gained; their cases named those forms, since removed.
# v26: the shipped default (auto: rs_sf, 128-row tiles, 256 resident, 2 stages) beside the Triton walk at 152k (blocks
# 15 and 7, an again-row) and 150,001; the sweep row walks the shipped default as it is. Not yet run.
TUNE_CASES_V26 = [
    ("default_v152k_b1", 151936, 1, {}), ("triton_v152k_b1", 151936, 1, dict(gluon=False)),
    ("default_v150001_b1", 150001, 1, {}), ("default_blk7_v152k_b1", 151936, 1, dict(steps=7)),
    ("default_again_v152k_b1", 151936, 1, {})]
# HW10's ladders v27 (the shipped default with a persisting-L2 access policy window over W2: set-aside 16 / 24 / 32 /
# 37.5 MiB, window by kernel node / stream attribute / in-capture node / eager, a copy between walks) and v28 (the
# set-aside alone, misses normal, hitRatio 0, a fixed window, sum probes) were run once (session 8, calls at cf16024
# and 23bfae0): every window and the set-aside alone were slower; their rows, L2Persist (ctypes on torch's libcudart)
# and time_graph_l2 removed (code at 23bfae0).
# HW11 (v29, run once at 9218c19 when auto was rs_sf: lean -2.3 / -1.9 / -0.3 %): the then shipped default beside
# "rs_sf_lean" (its lean start and end: the shared-memory resident tile by TMA, step 0's base logits and the anchor's
# W1 row before the register tile, only program 0 waiting in the last step) in pairs at 152k block 15 (three),
# 150,001 and block 7, interleaved; the sweep row (every sweep row from HW11 on: each variant timed on --samples
# fresh allocations, median) walks the shipped default.
LEAN = dict(gluon="rs_sf_lean", stream_tma=2, resident_tiles=2, **T128)
TUNE_CASES_V29 = [
    ("default_v152k_b1", 151936, 1, {}), ("gluon_rs_sf_lean_v152k_b1", 151936, 1, LEAN),
    ("default_again_v152k_b1", 151936, 1, {}), ("gluon_rs_sf_lean_again_v152k_b1", 151936, 1, LEAN),
    ("default_v150001_b1", 150001, 1, {}), ("gluon_rs_sf_lean_v150001_b1", 150001, 1, LEAN),
    ("default_blk7_v152k_b1", 151936, 1, dict(steps=7)),
    ("gluon_rs_sf_lean_blk7_v152k_b1", 151936, 1, dict(LEAN, steps=7)),
    ("default_third_v152k_b1", 151936, 1, {}), ("gluon_rs_sf_lean_third_v152k_b1", 151936, 1, LEAN)]
# HW11 call B (v30): four more 152k block-15 pairs in ABBA order (drift cancels), and the sweep row with rs_sf_lean as
# the auto form beside the shipped rs_sf timed on the same fresh allocations ("sweep_also": ours_rs_sf, the pair per
# sample). Run once at f6f748b: lean under rs_sf in all 7 pairs (median 2.1 %), adopted as auto; since then "default"
# in these ladders IS rs_sf_lean (v30's sweep_also keeps timing rs_sf beside it).
TUNE_CASES_V30 = _mirrored_passes({"default": {}, "gluon_rs_sf_lean": LEAN}, 151936, "v152k_b1")
# HW12's ladder v31 (the 32k b1 walk's lean forms beside the shipped Triton walk, blocks 15 / 7 / 1, and the sweep
# row with every form beside the default) was run once (session 9, call A at ee2fd3a): ss_lean adopted as auto's form
# for fully resident 256-row shards; the Triton walk's lean start, rs_lean and the "..._late" forms measured slower and
# were removed (code at ee2fd3a), so its cases are gone.
# v32 (HW12's call B, run once at 8a7cc6a, when auto walked ss_lean at 32k): "default" (auto) beside the Triton walk
# (gluon=False) and ss_lean_pair (both resident tiles' products in flight, the copies issued before the anchor's loads)
# at block 15 in ABBA order (four rows each), blocks 7 and 1 once each; the sweep row walks the default as ours, the
# Triton walk and ss_lean_pair beside it on the same fresh allocations. Outcome: ss_lean reverted (1.49 % median gain),
# ss_lean_pair under the Triton walk in 7 of 7 pairs (median 6.0 %): the candidate. Since then "default" is the Triton
# walk at 32k.
# v33 (the candidate's adoption call, run once: session 9, lead, at af63436, adopted; run 19): ss_lean_pair beside the Triton walk in v32's ABBA order and blocks,
# and the sweep row with ss_lean_pair as auto's form (walk.GLUON_AUTO_RESIDENT_CHUNK_ROWS = (256,) for the sweep) as
# ours, the Triton walk beside it; with TEST_K="resident_lean" (the GPU tests as auto's form).
RESIDENT_T128 = dict(tile_rows=128, resident_tiles=2, stream_rows=128)
V32_FORMS = {"triton": dict(gluon=False), "default": {}, "ss_lean_pair": dict(gluon="ss_lean_pair", **RESIDENT_T128)}
TUNE_CASES_V32 = (
    _mirrored_passes(V32_FORMS, 32000, "v32k_b1")
    + [(f"{name}_blk{steps}_v32k_b1", 32000, 1, dict(kw, steps=steps)) for steps in (7, 1)
       for name, kw in V32_FORMS.items()])
TUNE_CASES_V33 = [case for case in TUNE_CASES_V32 if not case[0].startswith("default")]
# HW13's ladder v34 (the shipped default rs_sf_lean beside "rs_sf_lean_pair" in four ABBA pairs at 152k block 15 and
# once at block 7; the sweep row with the pair form as auto and rs_sf_lean beside it) was run once (session 9 at
# f8823db): the pair form was slower (median -0.6 % of 7 pairs) and removed with its cases (code at f8823db).
# Ladder v35 (session 10): "rs2_sf_lean" (rs_sf_lean with its second resident tile in registers too: 128 registers a
# thread of W2, 384 resident rows, 6 streamed tiles a step instead of 7) beside the shipped default rs_sf_lean in four
# ABBA pairs at 152k block 15, once at 150,001 and at block 7; the sweep row with rs2_sf_lean as auto's form and
# rs_sf_lean beside it on the same fresh allocations.
RS2 = dict(LEAN, gluon="rs2_sf_lean")
TUNE_CASES_V35 = (
    _mirrored_passes({"default": {}, "gluon_rs2_sf_lean": RS2}, 151936, "v152k_b1")
    + [("default_v150001_b1", 150001, 1, {}), ("gluon_rs2_sf_lean_v150001_b1", 150001, 1, RS2),
       ("default_blk7_v152k_b1", 151936, 1, dict(steps=7)),
       ("gluon_rs2_sf_lean_blk7_v152k_b1", 151936, 1, dict(RS2, steps=7))])
# Ladder v36 (session 10): "rs2_lean_pair" (the fully resident 32k walk with both 128-row tiles in registers, brought
# there by TMA through shared memory: no W2 read from shared memory in the steps) beside the shipped default
# ss_lean_pair in four ABBA pairs at block 15, blocks 7 and 1 once each; the sweep row with rs2_lean_pair as auto's
# resident form and ss_lean_pair beside it on the same fresh allocations.
RS2_RESIDENT = dict(gluon="rs2_lean_pair", **RESIDENT_T128)
V36_FORMS = {"default": {}, "rs2_lean_pair": RS2_RESIDENT}
TUNE_CASES_V36 = (
    _mirrored_passes(V36_FORMS, 32000, "v32k_b1")
    + [(f"{name}_blk{steps}_v32k_b1", 32000, 1, dict(kw, steps=steps)) for steps in (7, 1)
       for name, kw in V36_FORMS.items()])
# Ladder v37 (session 10, run once at 22173a2): the "..._fix" forms (FIX_WINNER: the warps' guessed W1 rows to the
# wgmma as they are, only the winning column's row loaded where its guess missed) beside the shipped defaults: slower
# (32k: 43.6 / 43.5 / 44.0 / 42.8 vs 40.3 / 41.2 / 40.9 / 41.1 us; sweep 44.0 vs 40.8; 152k 216.9 / 217.7 vs 214.6 /
# 217.9): the winning column's guess misses often, and its row then waits behind the agreement; removed with its
# cases (code at 22173a2).
# Ladder v38 (session 10, run once at 3d900f7): the shipped 32k resident form rs2_lean_pair beside "..._dfr" (step 0
# reads the staging buffer, the registers are filled during its exchange: a runtime branch in the step loop, 255
# registers + 32 B of stack) 47.4 / 47.6 / 46.5 vs 41.7 / 42.1 / 43.1 us (block 1 7.27 vs 7.6: the start-up gain is
# real, the loop pays more), "..._sw" (tile 0 scored while tile 1's product is in flight) 44.4 / 42.1 / 42.1 (no
# gain), and 2 / 5 / 8 candidate guesses a step (the case option guess_rounds; 3 shipped) 45.6-46.3 / 43.4-43.6 /
# 49.0-49.3: all slower; the forms were removed (code at 3d900f7), guess_rounds stays a case option.
# Ladder v39 (session 10): "..._pp" (the spin keeps two reads of a slot in flight, walk.SPIN_STAGGER = 600 cycles
# apart, so a key is seen up to half a round trip sooner) beside the shipped defaults: rs2_lean_pair_pp vs auto
# (rs2_lean_pair) at 32k in four ABBA pairs, with staggers 300 and 1000 once each, blocks 7 and 1 once each;
# rs2_sf_lean_pp vs auto at 152k in two ABBA pairs; the sweep row (32k) with rs2_lean_pair_pp as auto's resident form
# and rs2_lean_pair beside it on the same fresh allocations.
PP32 = dict(gluon="rs2_lean_pair_pp", **RESIDENT_T128)
PP152 = dict(LEAN, gluon="rs2_sf_lean_pp")
TUNE_CASES_V39 = (
    _mirrored_passes({"default": {}, "rs2_lean_pair_pp": PP32}, 32000, "v32k_b1")
    + [(f"rs2_lean_pair_pp_stagger{cycles}_v32k_b1", 32000, 1, dict(PP32, spin_stagger=cycles))
       for cycles in (300, 1000)]
    + [(f"{name}_blk{steps}_v32k_b1", 32000, 1, dict(kw, steps=steps)) for steps in (7, 1)
       for name, kw in (("default", {}), ("rs2_lean_pair_pp", PP32))]
    + _mirrored_passes({"default": {}, "rs2_sf_lean_pp": PP152}, 151936, "v152k_b1", passes=2))
# Ladder v40 (session 10): the shipped "..._pp" spin (2 reads in flight, 600 cycles apart) beside other reads /
# staggers (bench case options spin_reads / spin_stagger), at 32k block 15 in three passes (forward, backward,
# forward) and at 152k in two; no sweep (--budget-s 0).
V40_SPINS = {"default": (2, 600), "r2s300": (2, 300), "r2s400": (2, 400), "r3s300": (3, 300), "r3s200": (3, 200),
             "r4s200": (4, 200), "r4s150": (4, 150)}
V40_152K = ("default", "r2s300", "r3s200")


def _v40_kw(name):
    reads, stagger = V40_SPINS[name]
    return {} if name == "default" else dict(spin_reads=reads, spin_stagger=stagger)


TUNE_CASES_V40 = (
    _mirrored_passes({name: _v40_kw(name) for name in V40_SPINS}, 32000, "v32k_b1", passes=3)
    + _mirrored_passes({name: _v40_kw(name) for name in V40_152K}, 151936, "v152k_b1", passes=2))
# Ladder v40 (session 10, run once at 502d865): the pipelined spin's reads / stagger at 32k (three passes): shipped 2
# reads 600 cycles apart 40.2 / 40.3 / 40.2 us; 2 x 300 40.1 / 40.1 / 40.0, 2 x 400 40.2 / 40.1 / 40.1, 3 x 200 40.0 /
# 40.2 / 40.1, 4 x 150 40.1 / 40.0 / 40.2 (all within 0.5 %), 3 x 300 41.3 / 41.2 / 40.8, 4 x 200 41.8 / 41.4 / 42.7;
# 152k: shipped 216.9 / 222.2, 2 x 300 220.9 / 215.0, 3 x 200 213.9 / 222.2: nothing changed (2 reads, 600 cycles).
# Ladder v41 (session 10, run once at c5674c2): "rs2_lean_pair_pp_dfr" (step 0 peeled off the loop, reading the
# register tiles' staging buffer; the registers filled while its key is exchanged; the loop's SASS as the shipped
# form's) beside rs2_lean_pair_pp: block 1 6.9 vs 7.5 us, block 7 22.1 vs 22.1, block 15 41.0 / 40.7 / 40.7 / 40.9 vs
# 40.4 / 40.8 / 40.4 / 40.4, sweep 40.5 vs 40.1 (fused step 120.3: the shipped form 3.00x on that machine): the start
# is 0.6 us shorter but the steps pay it back; removed (code at c5674c2).
# Ladder v42 (session 10, run once at 6b341c4: Gluon 40.2 / 40.6 / 40.3 / 40.4 vs Triton 49.5 / 49.7 / 49.7 / 49.8 us,
# block 7 21.9 vs 26.1, block 1 7.7 vs 8.4): a greedy 32k b1 walk with a reduced draft vocabulary (an increasing d2t into 151,936
# target ids, as vLLM builds it): the Triton walk (what ran with any d2t before) beside auto with
# draft_to_target_increasing (the Gluon resident form, rows keyed by target id) in four ABBA pairs, and auto without
# d2t for reference; blocks 7 and 1 once each. No sweep (--budget-s 0).
D2T = dict(d2t_target_vocab=151936)
V42_FORMS = {"d2t_triton": dict(D2T, gluon=False), "d2t_gluon": dict(D2T, draft_to_target_increasing=True)}
TUNE_CASES_V42 = (
    _mirrored_passes(V42_FORMS, 32000, "v32k_b1")
    + [("default_v32k_b1", 32000, 1, {})]
    + [(f"{name}_blk{steps}_v32k_b1", 32000, 1, dict(kw, steps=steps)) for steps in (7, 1)
       for name, kw in V42_FORMS.items()])
# v43 (session 11, diagnosis): a sampled walk of 32k drafts with d2t into 151,936 target ids took 244.6 / 636.6 us at
# b32 / b64 against 190.9 / 339.7 without d2t (run of 1c16d9f). Which part: the draft-logits cache written at
# scattered target columns (partial 32-byte sectors), or the d2t keying / noise by target id? Each batch: no d2t,
# d2t (random subset), the same without the cache, d2t over the first 32k ids (whole sectors); greedy d2t beside.
V43_FORMS = {"plain": dict(sampled=True), "d2t": dict(D2T, sampled=True),
             "d2t_nocache": dict(D2T, sampled=True, no_cache=True),
             "d2t_dense": dict(D2T, sampled=True, d2t_layout="dense"),
             "greedy_d2t": dict(D2T), "greedy_plain": {}}
TUNE_CASES_V43 = [(f"{name}_v32k_b{rows}", 32000, rows, kw) for rows in (32, 64) for name, kw in V43_FORMS.items()]
# v44 (after v43: the cache store is the cost, and d2t over whole sectors still costs 180 us at b64 where the plain
# walk's cache, the same bytes, costs ~29): is it the width of the cache rows? A walk without d2t writing its 32k
# columns into cache rows 32k / 64k / 96k / 151,936 wide.
TUNE_CASES_V44 = [(f"plain_w{width // 1000}k_v32k_b{rows}", 32000, rows, dict(sampled=True, cache_width=width))
                  for rows in (64, 32) for width in (32000, 64000, 96000, 151936)]
# v45 (session 11): the compact cache (head_walk(compact_cache=True): the walk stores draft columns contiguously by
# batch row, one launch then writes the cache's walked target rows whole) against the direct store at the scattered
# target columns, sampled 32k -> 151,936, ABBA x 2 at b8 / b16 / b32 / b64: where it pays sets COMPACT_CACHE_MIN_ROWS.
V45_FORMS = {"direct": dict(D2T, sampled=True, compact_cache=False), "compact": dict(D2T, sampled=True,
                                                                                    compact_cache=True)}
TUNE_CASES_V45 = [case for rows in (8, 16, 32, 64)
                  for case in _mirrored_passes(V45_FORMS, 32000, f"v32k_b{rows}", passes=2, rows=rows)]
# v47 (session 11): after the hoist of resident tiles' d2t offsets and greedy keys by target id, a sampled d2t walk at
# b32 took 245.7 us (236 in v45, another machine) while b64 gained (491 -> 453): the hoist on / off, ABBA, sampled b32
# / b64 (compact) and without the cache, greedy b32.
V47_FORMS = {"hoist": dict(D2T, sampled=True), "nohoist": dict(D2T, sampled=True, d2t_hoist=False)}
TUNE_CASES_V47 = (_mirrored_passes(V47_FORMS, 32000, "v32k_b32", passes=2, rows=32)
                  + _mirrored_passes(V47_FORMS, 32000, "v32k_b64", passes=2, rows=64)
                  + _mirrored_passes({f"{n}_nocache": dict(kw, no_cache=True) for n, kw in V47_FORMS.items()}, 32000,
                                     "v32k_b32", passes=2, rows=32)
                  + _mirrored_passes({f"greedy_{n}": dict(kw, sampled=False) for n, kw in V47_FORMS.items()}, 32000,
                                     "v32k_b32", passes=2, rows=32))
# v48 (session 12): the Gluon walk of several rows (head_walk(gluon="rows"): each batch row polled by one warp, the
# one-row walk's guessed W1 rows and pipelined spin) beside the Triton walk's default (probe at b32, poll at b8 / b16,
# tagged rows otherwise), greedy 32k block 15: ABBA x 2 at b32 and b8, once at b16 / b2; at b32 also with 1 guess
# round and with the plain spin (stagger 0); blocks 7 / 1 at b32.
# ("triton": the Triton walk named, gluon=False: since v50's adoption head_walk's default walks 2..8 rows in the rows
# walk; it was the default, {}, when v48 / v49 / v50 ran, the same walk then. v48's "rows" was the "all" exchange,
# removed since: run now, v48 times the inbox walk, and its guess1 / plainspin cases that same build.)
V48_FORMS = {"triton": dict(gluon=False), "rows": dict(gluon="rows")}
TUNE_CASES_V48 = (_mirrored_passes(V48_FORMS, 32000, "v32k_b32", passes=2, rows=32)
                  + [("rows_guess1_v32k_b32", 32000, 32, dict(gluon="rows", guess_rounds=1)),
                     ("rows_plainspin_v32k_b32", 32000, 32, dict(gluon="rows", spin_stagger=0))]
                  + _mirrored_passes(V48_FORMS, 32000, "v32k_b8", passes=2, rows=8)
                  + [(f"{name}_v32k_b{rows}", 32000, rows, kw) for rows in (16, 2) for name, kw in V48_FORMS.items()]
                  + [(f"{name}_blk{steps}_v32k_b32", 32000, 32, dict(kw, steps=steps)) for steps in (7, 1)
                     for name, kw in V48_FORMS.items()])
# v49 (session 12, after v48: the "all" exchange's polls of every [P, B] key cost 224 vs 86 us at b32): the inbox
# exchange (program r reduces row r's [P] keys and stores the winner into every program's inbox; rows_exchange
# "inbox", now the default) beside the Triton walk, ABBA x 2 at b32 and b8; once: "all", the inbox with the plain
# spin, and "local" (no exchange at all, wrong tokens, timed anyway: the step's floor) at b32 / b8; b16 / b2; blocks
# 7 / 1 at b32. (Run once at 8cc4916, when "rows" spun with two reads in flight: b32 Triton 85.9 / 86.2, rows 106.3 /
# 106.8, all 226.5, plain spin 90.9, local 64.7; b8 59.3 / 59.4 vs 58.6 / 59.1, local 31.7; b16 62.8 vs 73.0; b2 58.3
# vs 54.3; block 7 42.5 vs 50.8. Since v50 "rows" spins plainly: its "rows" rows are no longer that form. The "all"
# case went with that exchange.)
TUNE_CASES_V49 = (_mirrored_passes(V48_FORMS, 32000, "v32k_b32", passes=2, rows=32)
                  + [("rows_plainspin_v32k_b32", 32000, 32, dict(gluon="rows", rows_spin_stagger=0)),
                     ("rows_local_v32k_b32", 32000, 32, dict(gluon="rows", rows_exchange="local", time_always=True))]
                  + _mirrored_passes(V48_FORMS, 32000, "v32k_b8", passes=2, rows=8)
                  + [("rows_local_v32k_b8", 32000, 8, dict(gluon="rows", rows_exchange="local", time_always=True))]
                  + [(f"{name}_v32k_b{rows}", 32000, rows, kw) for rows in (16, 2) for name, kw in V48_FORMS.items()]
                  + [(f"{name}_blk{steps}_v32k_b32", 32000, 32, dict(kw, steps=steps)) for steps in (7, 1)
                     for name, kw in V48_FORMS.items()])
# v50 (session 12, after v49: the inbox walk with the plain spin 90.9 us at b32 vs the Triton walk's 86, rows with the
# pipelined spin tied at b8 and -7 % at b2): the plain spin now the rows walk's (ROWS_SPIN_STAGGER 0); ABBA x 2 against
# the Triton walk at b2 / b4 / b8 / b16 / b32, the pipelined spin once at b2 / b8, "local" at b2 (the floor).
TUNE_CASES_V50 = ([case for rows in (2, 4, 8, 16, 32)
                   for case in _mirrored_passes(V48_FORMS, 32000, f"v32k_b{rows}", passes=2, rows=rows)]
                  + [(f"rows_pp_v32k_b{rows}", 32000, rows, dict(gluon="rows", rows_spin_stagger=600))
                     for rows in (2, 8)]
                  + [("rows_local_v32k_b2", 32000, 2, dict(gluon="rows", rows_exchange="local", time_always=True))])
# v51 (session 12): head_walk's default for 2..8 greedy rows is the rows walk since v50; with an increasing d2t (32k
# drafts into 151,936 target ids, rows keyed by target id) against the Triton walk with that d2t, ABBA x 2 at b4 / b8.
V51_FORMS = {"d2t_triton": dict(D2T, gluon=False), "d2t_auto": dict(D2T)}
TUNE_CASES_V51 = [case for rows in (4, 8) for case in _mirrored_passes(V51_FORMS, 32000, f"v32k_b{rows}", passes=2,
                                                                       rows=rows)]
# v52 (session 12): the rows walk on 16 warps (one 256-row tile, four warpgroups: half the scores, keys and W1 rows a
# thread; offline 3.6 b32: 115 registers, 940 step-loop instructions a warp, against 249 / 1,568 at 8 warps) beside 8
# warps and the Triton walk, two passes (forward, backward) at b8 / b16 / b32; its local floor at b32.
V52_FORMS = {"triton": dict(gluon=False), "rows8": dict(gluon="rows", rows_warps=8),
             "rows16": dict(gluon="rows", rows_warps=16)}
TUNE_CASES_V52 = ([case for rows in (32, 16, 8)
                   for case in _mirrored_passes(V52_FORMS, 32000, f"v32k_b{rows}", passes=2, rows=rows)]
                  + [("rows16_local_v32k_b32", 32000, 32, dict(gluon="rows", rows_warps=16, rows_exchange="local",
                                                               time_always=True))])
# (v52 ran once at 24776bd, us: b32 Triton 86.0 / 85.9, rows8 93.4 / 92.4, rows16 95.5 / 95.3; b16 63.6 / 63.8, 71.6 /
# 68.0, 72.9 / 73.8; b8 59.3 / 59.8, 58.0 / 58.2, 65.6 / 65.4; rows16 local b32 69.5: 16 warps slower everywhere.)
# v53 (session 12): the rows walk's spin by batch: plain (ROWS_SPIN_STAGGER 0, shipped) against two reads in flight
# 600 cycles apart (measured -3.5 % at b2 in three runs, +4 % at b8), ABBA x 2 at b2 / b3 / b4.
V53_FORMS = {"rows_plain": dict(gluon="rows"), "rows_pp": dict(gluon="rows", rows_spin_stagger=600)}
TUNE_CASES_V53 = [case for rows in (2, 3, 4)
                  for case in _mirrored_passes(V53_FORMS, 32000, f"v32k_b{rows}", passes=2, rows=rows)]
# (v53 ran once at 704f90a, us, plain / pp: b2 56.2 / 57.0 vs 54.8 / 55.1, b3 57.0 / 56.6 vs 55.8 / 56.3, b4 57.4 / 57.1
# vs 58.1 / 57.4: the plain spin stays.)
# (v54, session 12, at a5f6d41: the rows walk's scores reduced as an fp32 max then the smallest id at it (SPLIT; offline
# 3.6 b32 step loop 1,336 instructions, 222 registers, against 1,568 / 248) beside int64 keys and the Triton walk, ABBA
# x 2, us: b32 Triton 86.5 / 86.1, keys 93.1 / 95.0, split 90.7 / 91.1; b16 62.9 / 63.2, 71.5 / 72.1, 72.1 / 72.1; b8
# 59.4 / 59.5, 59.4 / 59.2, 60.5 / 60.6. No gain where it matters (b8 +2 %, b32 still slower than the Triton walk):
# removed with its GPU test cases (70 passed, both forms token-identical), code at a5f6d41.)
# v55 (session 14): the cooperative launch (walk.COOPERATIVE_LAUNCH, launch_cooperative_grid: the grid starts only
# once every program is resident) against the plain launch, ABBA x 2, at each walk head_walk picks by default: 32k
# greedy b1 (the Gluon one-row walk), b8 (the rows walk), b32 (the Triton walk); sampled b8 / b32; 152k greedy b1
# (partial residency).
V55_FORMS = {"coop": dict(cooperative=True), "plain": dict(cooperative=False)}
TUNE_CASES_V55 = ([case for rows in (1, 8, 32)
                   for case in _mirrored_passes(V55_FORMS, 32000, f"v32k_b{rows}", passes=4, rows=rows)]
                  + [case for rows in (8, 32)
                     for case in _mirrored_passes(_with(V55_FORMS, sampled=True),
                                                  32000, f"sampled_v32k_b{rows}", passes=2, rows=rows)]
                  + _mirrored_passes(V55_FORMS, 151936, "v152k_b1", passes=2, rows=1))
# (v56, session 15, at 88695b1: the batch rows in two interleaved halves (head_walk(halves=True), a kernel of its own:
# half 0 publishes its step-k keys, half 1 waits for its step k - 1 keys, scores step k and publishes, then half 0 reads
# its step-k keys), against the rows walked together, ABBA x 2, us: greedy b24 118.2 / 115.9 vs 91.3 / 91.4, b32 122.4 /
# 122.3 vs 85.3 / 85.1, b64 176.5 / 177.4 vs 142.5 / 142.1; sampled b32 211.3 / 211.1 vs 190.0 / 189.1, b64 337.3 /
# 338.0 vs 343.2 / 342.7; d2t greedy b32 124.7 / 123.2 vs 85.1 / 85.0, sampled b32 268.8 / 270.0 vs 236.7 / 236.5, b64
# 450.0 / 449.6 vs 461.1 / 461.3. Tokens equal to the lockstep walk's in every case, 34 GPU tests passed. Each half-step
# cost a whole b16 step (~4.1 us): the exchange's round trips and the W1 gather stay on one instruction stream, so the
# other half's scoring does not hide them. Removed, code at 88695b1.)
# (v57, session 15, at ee6ebfe: the inbox exchange in the Triton walk (exchange="inbox": one reducer program a row, the
# winners pushed into every program's inbox, then each program spins on its own slots) against each batch's measured
# exchange, ABBA x 2, us: greedy b8 80.6 / 80.2 vs poll 63.7 / 63.7, b16 80.5 / 86.3 vs probe 66.6 / 66.5, b32 106.2 /
# 106.5 vs probe 86.3 / 85.8, b64 152.8 / 148.2 vs amax 140.4 / 140.1; sampled b32 203.5 / 210.8 vs 189.5 / 191.2, b64
# 404.9 / 413.5 vs 342.6 / 341.4; d2t sampled b32 266.1 / 265.9 vs 237.3 / 236.9; 152k greedy b32 381.9 / 382.2 vs
# probe 388.8 / 390.9 (-2 %, under the rule). Tokens equal everywhere (10 exchange GPU tests passed). Two dependent
# spins (the reducer's, then the inbox's), each seeing a key up to a round trip late, cost more than the probe's
# batched read of all P x B keys. Removed, code at ee6ebfe.)
# v58 (session 15, diagnosis): what the exchange costs the Triton walk, each batch's measured exchange against the
# same walk with no exchange at all (LOCAL_EXCHANGE: each program walks its own shard's best, wrong tokens, timed
# anyway), ABBA x 2: greedy b8 (poll), b16 / b32 (probe), b64 (amax), sampled b32 (probe).
def _v58_cases(measured: str, rows: int, label: str = "", **kw) -> list:
    forms = {measured: dict(kw, exchange=measured), "local": dict(kw, exchange="local", time_always=True)}
    return _mirrored_passes(forms, 32000, f"{label}v32k_b{rows}", passes=2, rows=rows)


TUNE_CASES_V58 = (_v58_cases("probe", 32) + _v58_cases("probe", 16) + _v58_cases("poll", 8) + _v58_cases("amax", 64)
                  + _v58_cases("probe", 32, label="sampled_", sampled=True))
# v59 (session 15): after v58's profile (b32 probe walk: the two 128-row tiles' wgmma waits ~10 % of the stall samples,
# one wait each, a layout round trip between them), the fully resident 32k shard as one 256-row tile at 32 / 64 rows
# (plan_walk's default caps a tile's [rows, B] accumulator at 4096 entries: two 128-row tiles at b32), ABBA x 2: greedy
# b24 / b32 / b64, sampled b32, the d2t greedy b32 and sampled b32.
V59_FORMS = {"tile256": dict(tile_rows=256), "tile_default": dict()}
TUNE_CASES_V59 = ([case for rows in (32, 64, 24)
                   for case in _mirrored_passes(V59_FORMS, 32000, f"v32k_b{rows}", passes=2, rows=rows)]
                  + _mirrored_passes(_with(V59_FORMS, sampled=True), 32000,
                                     "sampled_v32k_b32", passes=2, rows=32)
                  + [case for sampled in (False, True)
                     for case in _mirrored_passes(_with(V59_FORMS, sampled=sampled, d2t_target_vocab=151936),
                                                  32000, f"d2t_{'sampled' if sampled else 'greedy'}_v32k_b32",
                                                  passes=2, rows=32)])
# v60 (session 15): sampled walks of 33..64 rows (the plan's four 64-row tiles, 384 B of stack, triton 3.6) as two
# 128-row tiles (608 B) or one of 256 (672 B), ABBA x 2, plain and with the 32k -> 151,936 d2t and its cache.
V60_FORMS = {"tile256": dict(tile_rows=256, sampled=True), "tile128": dict(tile_rows=128, sampled=True),
             "tile_default": dict(sampled=True)}
TUNE_CASES_V60 = (_mirrored_passes(V60_FORMS, 32000, "sampled_v32k_b64", passes=2, rows=64)
                  + _mirrored_passes(_with(V60_FORMS, d2t_target_vocab=151936),
                                     32000, "d2t_sampled_v32k_b64", passes=2, rows=64))
# (v60 ran once at a26b8a5, us, tile256 / tile128 / default: sampled b64 412.2 / 421.3, 445.2 / 435.1, 339.8 / 339.9;
# d2t sampled b64 540.2 / 543.1, 568.8 / 558.8, 453.8 / 451.7: the spills win, the four 64-row tiles stay.)
# v61 (session 15): 16 warps for the Triton walk at 17..64 rows (half the scores, keys and reductions a thread; offline
# 3.6: b32 greedy 1,504 instructions, 112 registers, no stack, against 2,184 / 139 at 8 warps; b32 sampled 128 + 128 B of
# stack; b64 greedy 128 + 8 B), ABBA x 2: greedy b32 (also with one 256-row tile), b64, sampled b32.
V61_FORMS = {"warps16": dict(num_warps=16), "warps8": dict()}
TUNE_CASES_V61 = (_mirrored_passes(dict(V61_FORMS, warps16_tile256=dict(num_warps=16, tile_rows=256)), 32000,
                                   "v32k_b32", passes=2, rows=32)
                  + _mirrored_passes(V61_FORMS, 32000, "v32k_b64", passes=2, rows=64)
                  + _mirrored_passes(_with(V61_FORMS, sampled=True), 32000,
                                     "sampled_v32k_b32", passes=2, rows=32))
# (v61 ran once at b2e0fcd, us, 16 / 8 warps: greedy b32 102.5 / 101.5 vs 85.2 / 85.7 (16 warps + one 256-row tile 102.7
# / 102.4), b64 189.3 / 189.3 vs 136.2 / 136.5, sampled b32 186.4 / 186.0 vs 173.4 / 173.7: 8 warps stay.)
# v62 (session 16): sampled walks whose Gumbel noise is made before the walk by noise_table_kernel (every step's, at full
# occupancy) and loaded by the walk beside its base logits, against the walk that computes it while scoring (v58: the
# noise is ~6.7 of the sampled b32 step's 10.7 us without exchange), ABBA x 2: 32k sampled b8 / b16 / b32 / b64 (b64
# also "late": each 64-row tile's noise loaded just before it is scored; removed since, code at c6d9d5f), the d2t
# sampled b32 with its cache. The
# table variant's time includes the table's launch (both are in the captured graph).
V62_FORMS = {"table": dict(noise_table=True, sampled=True), "inline": dict(noise_table=False, sampled=True)}
TUNE_CASES_V62 = ([case for rows in (8, 16, 32, 64)
                   for case in _mirrored_passes(V62_FORMS, 32000, f"sampled_v32k_b{rows}", passes=2, rows=rows)]
                  + _mirrored_passes(_with(V62_FORMS, d2t_target_vocab=151936), 32000, "d2t_sampled_v32k_b32",
                                     passes=2, rows=32))
# (v62 ran once at a65685d, us, table / inline: b8 94.2 / 95.7 vs 102.8 / 103.4; b16 120.3 / 120.7 vs 108.4 / 108.3; b32
# 179.9 / 180.0 vs 173.5 / 173.7; b64 377.1 / 377.9, late 365.5 / 364.8 vs 340.8 / 340.1; d2t b32 241.0 / 240.4 vs
# 222.4 / 222.3; the table's launch alone 14.2 / 49.1 / 94.5 us at b8 / b32 / b64.)
# v63 (session 16): the same at 2 / 4 / 8 rows (the rule's lower end), and b8 with d2t and its cache.
TUNE_CASES_V63 = ([case for rows in (2, 4, 8)
                   for case in _mirrored_passes(V62_FORMS, 32000, f"sampled_v32k_b{rows}", passes=2, rows=rows)]
                  + _mirrored_passes(_with(V62_FORMS, d2t_target_vocab=151936), 32000, "d2t_sampled_v32k_b8",
                                     passes=2, rows=8))
# v64 (session 16, diagnosis): what the sampled walk pays besides its noise: with and without the draft-logits cache
# store (no_cache), noise inline and from the table, at 16 / 32 / 64 rows, beside the greedy walk, ABBA x 2.
V64_FORMS = {"inline": dict(noise_table=False, sampled=True), "inline_nocache": dict(noise_table=False, sampled=True,
                                                                                     no_cache=True),
             "table": dict(noise_table=True, sampled=True), "table_nocache": dict(noise_table=True, sampled=True,
                                                                                  no_cache=True),
             "greedy": dict()}
TUNE_CASES_V64 = [case for rows in (32, 16, 64)
                  for case in _mirrored_passes(V64_FORMS, 32000, f"v32k_b{rows}", passes=2, rows=rows)]
# (v64 ran once at e276a4c, us (ABBA x 2): b32 inline 173.6 / 174.2, inline without the cache 161.8 / 160.6, table 180.8 /
# 180.6, table without the cache 172.8 / 172.9, greedy 85.9 / 85.1; b16 109.5 / 108.9, 106.5 / 106.4, 121.5 / 121.8,
# 120.6 / 120.3, 66.8 / 66.4; b64 340.4 / 342.3, 321.9 / 321.9, 377.8 / 377.7, 331.0 / 331.3, 136.5 / 136.8.)
# (v65, session 16: the table's next-step lines prefetched into L2 at each step's top (noise_prefetch), ABBA x 2, us,
# table + prefetch / table / inline: b32 176.8 / 177.9, 177.8 / 177.6, 173.5 / 173.4; b16 120.5 / 119.9, 117.8 / 118.4,
# 108.5 / 108.2; b64 383.7 / 383.6, 377.1 / 375.7, 339.1 / 340.0; b8 100.9 / 100.6, 96.2 / 95.2, 102.9 / 102.7: no
# gain, slower at b8 / b64. Removed, code at 0640c6d.)
# v66 (session 16): the noise table for one row (the one-row scoring loads its [rows] noise), ABBA x 2: 32k sampled b1,
# plain and with the d2t and its cache.
TUNE_CASES_V66 = (_mirrored_passes(V62_FORMS, 32000, "sampled_v32k_b1", passes=2, rows=1)
                  + _mirrored_passes(_with(V62_FORMS, d2t_target_vocab=151936), 32000, "d2t_sampled_v32k_b1",
                                     passes=2, rows=1))
# (v66 ran once at e2a58ef, us, table / inline: b1 52.8 / 52.3 vs 54.9 / 55.3; d2t b1 57.7 / 58.8 vs 52.4 / 52.6: one row
# keeps the inline noise by default.)
# v67 (session 17): one sampled row drawn by gluon_b1's walk (the noise table made before it, the draft-logits cache
# stored by the walk) against the Triton walk's sampled default, ABBA x 2: 32k (the resident form), 32k with the d2t
# into 151,936 target ids and its cache, 152k (the streamed form), blocks 15.
V67_RESIDENT = {"gluon": dict(sampled=True, gluon="rs2_lean_pair_pp", tile_rows=128, resident_tiles=2,
                              stream_rows=128),
                "triton": dict(sampled=True)}
V67_STREAMED = {"gluon": dict(sampled=True, gluon="rs2_sf_lean_pp", stream_tma=2, tile_rows=128, resident_tiles=2,
                              stream_rows=128),
                "triton": dict(sampled=True)}
TUNE_CASES_V67 = (_mirrored_passes(V67_RESIDENT, 32000, "sampled_v32k_b1", passes=2)
                  + _mirrored_passes(_with(V67_RESIDENT, d2t_target_vocab=151936), 32000, "d2t_sampled_v32k_b1",
                                     passes=2)
                  + _mirrored_passes(V67_STREAMED, 151936, "sampled_v152k_b1", passes=2))
# (v67 ran once at dc4d431, us, Gluon / Triton: 32k 44.7 / 44.7 vs 54.7 / 54.7; d2t 45.3 / 46.1 vs 52.4 / 53.0; 152k
# 246.2 / 242.8 vs 336.7 / 340.7: adopted, walk.MEASURED_GLUON_DRAW_CHUNK_ROWS.)
# v68 (session 17): sampled rows drawn by gluon_rows' walk (the noise table made before it, the cache stored by the
# walk) against the Triton walk's sampled default (its noise table too at 2..8 rows), ABBA x 2: 32k at 2 / 4 / 8 rows,
# and 8 rows with the d2t into 151,936 target ids and its cache.
V68_FORMS = {"rows": dict(sampled=True, gluon="rows"), "triton": dict(sampled=True, gluon=False)}
TUNE_CASES_V68 = ([case for rows in (2, 4, 8)
                   for case in _mirrored_passes(V68_FORMS, 32000, f"sampled_v32k_b{rows}", passes=2, rows=rows)]
                  + _mirrored_passes(_with(V68_FORMS, d2t_target_vocab=151936), 32000, "d2t_sampled_v32k_b8",
                                     passes=2, rows=8))
# v69 (session 17, diagnosis): where the rows walk's d2t draw loses (v68: d2t b8 120.1 / 120.3 vs the Triton walk's
# 107.5 / 107.9, while plain b8 won 83.4 / 83.9 vs 93.4 / 93.6): with and without the cache, its store from the
# accumulator's layout or a blocked one, beside the Triton walk, ABBA x 2: d2t b8, d2t b4, plain b8.
V69_FORMS = {"rows": dict(sampled=True, gluon="rows"),
             "rows_nocache": dict(sampled=True, gluon="rows", no_cache=True),
             "triton": dict(sampled=True, gluon=False), "triton_nocache": dict(sampled=True, gluon=False, no_cache=True)}
TUNE_CASES_V69 = (_mirrored_passes(_with(V69_FORMS, d2t_target_vocab=151936), 32000, "d2t_sampled_v32k_b8", passes=2,
                                   rows=8)
                  + _mirrored_passes(_with({k: V69_FORMS[k] for k in ("rows", "triton")},
                                           d2t_target_vocab=151936), 32000, "d2t_sampled_v32k_b4", passes=2, rows=4)
                  + _mirrored_passes({k: V69_FORMS[k] for k in ("rows", "triton")}, 32000, "sampled_v32k_b8",
                                     passes=2, rows=8))
# (v69 ran once at a47b7dd, us, d2t b8: rows 117.2 / 120.0, rows with the store from a blocked layout (32 rows of one
# column a warp store; `rows_store_blocked`, removed, code at a47b7dd) 108.7 / 110.1, rows without the cache 78.2 /
# 78.2, Triton 107.7 / 107.7, Triton without the cache 87.1 / 87.0; d2t b4 rows 73.5 / 74.4, blocked 77.1 / 78.1,
# Triton 85.7 / 87.6; b8 rows 83.3 / 83.6, blocked 86.7 / 87.7, Triton 91.3 / 90.5.)
# v70 (session 17): the rows draw with the d2t at 2 rows (v68 / v69 measured 4 and 8), ABBA x 2.
TUNE_CASES_V70 = _mirrored_passes(_with(V68_FORMS, d2t_target_vocab=151936), 32000, "d2t_sampled_v32k_b2", passes=2,
                                  rows=2)
# (v70 ran once at baa4ebd, us, rows / Triton: d2t b2 65.1 / 64.5 vs 78.8 / 79.1.)
# v71 (session 18): the rows draw at 16 and 32 rows, and with the d2t at 16 (v68 stopped at 8, where the greedy rows walk's auto rule stops;
# the sampled Triton walk computes its noise inline there, ~2x its greedy walk at b32), ABBA x 2.
TUNE_CASES_V71 = ([case for rows in (16, 32)
                   for case in _mirrored_passes(V68_FORMS, 32000, f"sampled_v32k_b{rows}", passes=2, rows=rows)]
                  + _mirrored_passes(_with(V68_FORMS, d2t_target_vocab=151936), 32000, "d2t_sampled_v32k_b16",
                                     passes=2, rows=16))
# (v71 ran once at 37078ba, us, rows / Triton: b16 118.7 / 119.5 vs 106.8 / 106.8; b32 226.5 / 226.7 vs 173.1 / 172.9;
# d2t b16 189.4 / 188.9 vs 119.4 / 119.7: the rows draw stays at <= 8 rows.)
# v72 (session 19): Qwen3.5 / 3.6's 248,320-token vocabulary (130 programs of 1,920 rows, 12 streamed tiles a step in
# the Gluon geometry against 6 at 152k): gluon_b1's streamed walk (auto's form at 152k) against the Triton walk, one
# row, greedy and sampled (with its cache), ABBA x 2.
V72_FORMS = {"gluon": dict(gluon="rs2_sf_lean_pp", stream_tma=2, tile_rows=128, resident_tiles=2, stream_rows=128),
             "triton": dict(gluon=False)}
TUNE_CASES_V72 = (_mirrored_passes(V72_FORMS, 248320, "v248k_b1", passes=2)
                  + _mirrored_passes(_with(V72_FORMS, sampled=True), 248320, "sampled_v248k_b1", passes=2))
# (v72 ran once at c50356b, us, Gluon / Triton: greedy 452.7 / 452.1 vs 467.2 / 471.2, sampled 490.0 / 488.6 vs 511.2 /
# 508.1: adopted, walk.GLUON_AUTO_CHUNK_ROWS; since session 20 walk.GLUON_AUTO_STREAMED_CHUNK_RANGE.)
# v73 (session 19): sampled walks of 2..8 rows over partly streamed shards (152k, 248k) with every step's noise made
# before the walk and loaded beside each tile (the resident tiles' and, new, the streamed ones'), against the noise
# computed while scoring, ABBA x 2.
V73_FORMS = {"table": dict(sampled=True, noise_table=True, noise_table_streamed=True),
             "inline": dict(sampled=True, noise_table=False)}
TUNE_CASES_V73 = ([case for rows in (2, 4, 8)
                   for case in _mirrored_passes(V73_FORMS, 151936, f"sampled_v152k_b{rows}", passes=2, rows=rows)]
                  + _mirrored_passes(V73_FORMS, 248320, "sampled_v248k_b8", passes=2, rows=8))
# (v46, session 11: the compact cache's whole-row launch in forms that read their t2d block once for 5 / 15 steps, blocks
# of 2048 / 8192: none faster than v45's; removed with its `expand` option, code at 3c2e8af.)
# The bench's diagnostic exchange: none at all (kernel EXCHANGE 7; each program walks its own shard's best, tokens
# are wrong): only the sync floors take it, as the step's cost without any exchange.
LOCAL_EXCHANGE = ("local", 7)


def _allow_local_exchange(walk) -> None:
    name, code = LOCAL_EXCHANGE
    if name not in walk.EXCHANGES:
        walk.EXCHANGES = walk.EXCHANGES + (name,)
        walk.EXCHANGE_CODES[name] = code


def neighbour_check(spin_limit: int, hold_ms: float, holders: int = 16,
                    cases=((1, False), (8, True), (32, True))) -> list[dict]:
    """Walks launched while `holders` programs of eval/_sm_holder.py hold whole SMs for `hold_ms` on another stream,
    with SPIN_LIMIT at `spin_limit` polls, plainly and cooperatively launched: whether a wait gave up, whether the
    tokens (and a sampled walk's draft-logits cache) equal the walk alone's, and when the walk ended (ms after its
    launch, CUDA events on its stream)."""
    import torch

    import hybridspec_kernels.head_walk.walk as walk
    from _sm_holder import hold_sms
    from hybridspec_kernels.head_walk import barrier_errors, head_walk

    device = torch.device("cuda")
    shipped = walk.SPIN_LIMIT, walk.COOPERATIVE_LAUNCH
    out = []
    other = torch.cuda.Stream()
    try:
        walk.SPIN_LIMIT = spin_limit
        for rows, sampled in cases:
            for cooperative in (False, True):
                walk.COOPERATIVE_LAUNCH = cooperative
                p = Problem(torch, rows, 15, 32000, RANK, sampled, device, torch.bfloat16)
                fn = ours_fn(head_walk, p)
                fn()
                torch.cuda.synchronize()
                alone_tokens = p.draft_tokens.clone()
                alone_cache = p.draft_logits.clone() if p.draft_logits is not None else None
                errors = barrier_errors(device)
                p.draft_tokens.fill_(-1)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(other):
                    hold_sms(holders, hold_ms, device)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                row = dict(check="neighbour", batch=rows, sampled=sampled, cooperative=cooperative,
                           spin_limit=spin_limit, hold_ms=hold_ms, holders=holders,
                           gave_up=barrier_errors(device) - errors,
                           tokens_equal=bool(torch.equal(p.draft_tokens, alone_tokens)),
                           walk_end_ms=round(start.elapsed_time(end), 3))
                if alone_cache is not None:
                    row["cache_equal"] = bool(torch.equal(p.draft_logits, alone_cache))
                out.append(row)
                print(json.dumps(row), flush=True)
    finally:
        walk.SPIN_LIMIT, walk.COOPERATIVE_LAUNCH = shipped
    return out


def _walks_gluon(walk, fn) -> bool:
    """Runs fn once; True unless the walk fell back to the Triton kernel (head_walk(gluon=...) then launches it)."""
    fell_back = []
    triton_launch = walk._launch
    walk._launch = lambda *args, **kwargs: (fell_back.append(1), triton_launch(*args, **kwargs))[1]
    try:
        fn()
    finally:
        walk._launch = triton_launch
    return not fell_back


def _floor_kw(floor) -> tuple[str, int, dict]:
    """A ladder's sync floor: (exchange, rows) or (label, rows, head_walk options)."""
    label, rows = floor[:2]
    return label, rows, dict(tile_rows=64, **(floor[2] if len(floor) > 2 else dict(exchange=label)))


# Per ladder: the launch variants its rule chooses among (name -> head_walk options), the sync floors (exchange,
# batch rows) and the tuning cases.
LADDERS = {
    "v4": dict(rule={e: dict(exchange=e) for e in ("counter", "flags", "tagged")}, cases=TUNE_CASES,
               floors=[("counter", 1), ("flags", 1), ("tagged", 1)]),
    "v5": dict(rule={"counter": dict(exchange="counter"), "tagged": dict(exchange="tagged"),
                     "probe": dict(exchange="probe"), "poll": dict(exchange="poll"),
                     "warps16_poll": dict(exchange="poll", num_warps=16)},
               cases=TUNE_CASES_V5,
               floors=[("counter", 1), ("tagged", 1), ("counter", 8), ("probe", 8), ("poll", 8), ("counter", 32),
                       ("probe", 32), ("poll", 32)]),
    "v6": dict(rule={"tagged": dict(exchange="tagged"), "probe": dict(exchange="probe"), "poll": dict(exchange="poll"),
                     "probe_key": dict(exchange="probe", pair_reduce=False),
                     "poll_key": dict(exchange="poll", pair_reduce=False)},
               cases=TUNE_CASES_V6, floors=[("tagged", 1), ("poll", 8), ("probe", 32)]),
    # 152k only: no exchange rule (the sweep's exchange is choose_exchange's, measured by v6), a scoring rule.
    "v7": dict(rule={}, scoring=STREAMED_SCORINGS, cases=TUNE_CASES_V7, floors=[]),
    "v8": dict(rule={}, cases=TUNE_CASES_V8, floors=[]),
    "v9": dict(rule={}, scoring=STREAMING, scoring_by_batch=STREAMING_BY_BATCH, cases=TUNE_CASES_V9, floors=[]),
    "v11": dict(rule={}, scoring={name: {k: x for k, x in kw.items() if k != "sampled"}
                                  for variants in STREAMING_SAMPLED_BY_BATCH.values() for name, kw in variants.items()},
                scoring_by_batch={rows: {name: {k: x for k, x in kw.items() if k != "sampled"}
                                         for name, kw in variants.items()}
                                  for rows, variants in STREAMING_SAMPLED_BY_BATCH.items()},
                cases=TUNE_CASES_V11, floors=[]),
    "v12": dict(rule={}, scoring={name: kw for variants in STREAMING_TMA_BY_BATCH.values() for name, kw in variants.items()},
                scoring_by_batch=STREAMING_TMA_BY_BATCH, cases=TUNE_CASES_V12, floors=[]),
    "v13": dict(rule={}, scoring={name: kw for variants in STREAMING_V13_BY_BATCH.values()
                                  for name, kw in variants.items()},
                scoring_by_batch=STREAMING_V13_BY_BATCH, cases=TUNE_CASES_V13, floors=[]),
    "v15": dict(rule={ex: dict(exchange=ex) for ex in ("tagged", "probe", "poll", "amax")}, cases=TUNE_CASES_V15,
                floors=FLOORS_V15),
    "v16": dict(rule={ex: dict(exchange=ex) for ex in ("tagged", "probe", "poll", "amax")},
                cases=TUNE_CASES_V16, floors=FLOORS_V16),
    "v17": dict(rule={}, cases=TUNE_CASES_V17, floors=FLOORS_V17),
    "v21": dict(rule={}, cases=TUNE_CASES_V21, floors=[]),
    "v22": dict(rule={}, cases=TUNE_CASES_V22, floors=[],
                sweep_gluon_auto=("rs", {k: v for k, v in GLUON_T128["rs_res256s2t128"].items() if k != "gluon"})),
    "v26": dict(rule={}, cases=TUNE_CASES_V26, floors=[]),
    "v29": dict(rule={}, cases=TUNE_CASES_V29, floors=[]),
    "v30": dict(rule={}, cases=TUNE_CASES_V30, floors=[],
                sweep_gluon_auto=("rs_sf_lean", {k: v for k, v in LEAN.items() if k != "gluon"}),
                sweep_also={"rs_sf": dict(LEAN, gluon="rs_sf")}),
    "v32": dict(rule={}, cases=TUNE_CASES_V32, floors=[],
                sweep_also={name: kw for name, kw in V32_FORMS.items() if name != "default"}),
    "v33": dict(rule={}, cases=TUNE_CASES_V33, floors=[], sweep_resident_chunk_rows=(256,),
                sweep_also={"triton": V32_FORMS["triton"]}),
    "v36": dict(rule={}, cases=TUNE_CASES_V36, floors=[], sweep_gluon_auto_resident="rs2_lean_pair",
                sweep_also={"ss_lean_pair": dict(gluon="ss_lean_pair", **RESIDENT_T128)}),
    "v39": dict(rule={}, cases=TUNE_CASES_V39, floors=[], sweep_gluon_auto_resident="rs2_lean_pair_pp",
                sweep_also={"rs2_lean_pair": RS2_RESIDENT}),
    "v40": dict(rule={}, cases=TUNE_CASES_V40, floors=[]),
    "v42": dict(rule={}, cases=TUNE_CASES_V42, floors=[]),
    "v43": dict(rule={}, cases=TUNE_CASES_V43, floors=[]),
    "v44": dict(rule={}, cases=TUNE_CASES_V44, floors=[]),
    "v45": dict(rule={}, cases=TUNE_CASES_V45, floors=[]),
    "v47": dict(rule={}, cases=TUNE_CASES_V47, floors=[]),
    "v48": dict(rule={}, cases=TUNE_CASES_V48, floors=[]),
    "v49": dict(rule={}, cases=TUNE_CASES_V49, floors=[]),
    "v50": dict(rule={}, cases=TUNE_CASES_V50, floors=[]),
    "v51": dict(rule={}, cases=TUNE_CASES_V51, floors=[]),
    "v52": dict(rule={}, cases=TUNE_CASES_V52, floors=[]),
    "v53": dict(rule={}, cases=TUNE_CASES_V53, floors=[]),
    "v55": dict(rule={}, cases=TUNE_CASES_V55, floors=[]),
    "v58": dict(rule={}, cases=TUNE_CASES_V58, floors=[]),
    "v59": dict(rule={}, cases=TUNE_CASES_V59, floors=[]),
    "v60": dict(rule={}, cases=TUNE_CASES_V60, floors=[]),
    "v61": dict(rule={}, cases=TUNE_CASES_V61, floors=[]),
    "v62": dict(rule={}, cases=TUNE_CASES_V62, floors=[]),
    "v63": dict(rule={}, cases=TUNE_CASES_V63, floors=[]),
    "v64": dict(rule={}, cases=TUNE_CASES_V64, floors=[]),
    "v66": dict(rule={}, cases=TUNE_CASES_V66, floors=[]),
    "v67": dict(rule={}, cases=TUNE_CASES_V67, floors=[]),
    "v68": dict(rule={}, cases=TUNE_CASES_V68, floors=[]),
    "v69": dict(rule={}, cases=TUNE_CASES_V69, floors=[]),
    "v70": dict(rule={}, cases=TUNE_CASES_V70, floors=[]),
    "v71": dict(rule={}, cases=TUNE_CASES_V71, floors=[]),
    "v72": dict(rule={}, cases=TUNE_CASES_V72, floors=[]),
    "v73": dict(rule={}, cases=TUNE_CASES_V73, floors=[]),
    "v35": dict(rule={}, cases=TUNE_CASES_V35, floors=[],
                sweep_gluon_auto=("rs2_sf_lean", {k: v for k, v in LEAN.items() if k != "gluon"}),
                sweep_also={"rs_sf_lean": LEAN}),
}
HEAD_CASES = [(rows, head, sampled) for rows in (1, 64, 8) for head in ("rnn", "gated_markov", "markov")
              for sampled in (False, True)]


def _drop_variants(ladder_name: str, parts) -> None:
    """Removes from a ladder (in place, before anything runs) the cases and scoring variants named with any of parts."""
    ladder = LADDERS[ladder_name]
    hit = lambda name: any(part in name for part in parts)  # noqa: E731
    ladder["cases"] = [case for case in ladder["cases"] if not hit(case[0])]
    for key in ("scoring",):
        if key in ladder:
            ladder[key] = {name: kw for name, kw in ladder[key].items() if not hit(name)}
    if "scoring_by_batch" in ladder:
        ladder["scoring_by_batch"] = {rows: {name: kw for name, kw in variants.items() if not hit(name)}
                                      for rows, variants in ladder["scoring_by_batch"].items()}


def check_heads(torch, head_walk, naive_head_walk, gumbel_noise, device, args) -> list:
    """bf16 gated Markov / RNN / fp8 W2 on the persistent kernel: identical to lockstep, tolerated vs naive."""
    from hybridspec_kernels.head_walk import barrier_errors
    from hybridspec_kernels.head_walk.naive import DRAFT_NOISE_SALT, spec_step_seed

    out = []
    t_heads = time.time()
    for rows, head, sampled in HEAD_CASES:
        if time.time() - t_heads > args.heads_budget_s:
            break
        p, kw = head_case(torch, device, rows, head, sampled)
        errors_before = barrier_errors(device)
        tokens, _, _ = head_walk(p.base, p.w1, p.w2.t(), p.first, **kw)
        torch.cuda.synchronize()
        if barrier_errors(device) != errors_before:
            out.append(dict(check=f"{head}_{'sampled' if sampled else 'greedy'}_b{rows}", error="a wait gave up"))
            print(json.dumps(out[-1]), flush=True)
            continue
        step_tokens, _, _ = head_walk(p.base, p.w1, p.w2.t(), p.first, lockstep=True, **kw)
        ref, logits, _ = naive_head_walk(p.base, p.w1, p.w2.t(), p.first, force_tokens=tokens, **kw)
        scored = logits
        if sampled:
            ids = torch.arange(p.vocab, device=device)[None, :]
            for k in range(p.steps):
                scored[:, k] = logits[:, k] / p.temperature[:, None] + gumbel_noise(
                    spec_step_seed(p.seeds, k)[:, None], p.positions[:, k, None] + DRAFT_NOISE_SALT, ids)
        best = scored.max(-1).values
        chosen = scored.gather(-1, tokens[..., None]).squeeze(-1)
        # Gate / RNN arithmetic runs in another order and precision than the fp32 reference: 4 bf16 ulps.
        tol = float((chosen >= best - 4 * best.abs().clamp(min=1.0) * 2.0 ** -7).float().mean())
        us, _ = time_graph(torch, lambda: head_walk(p.base, p.w1, p.w2.t(), p.first, **kw))
        out.append(dict(check=f"{head}_{'sampled' if sampled else 'greedy'}_b{rows}",
                        equal_lockstep=bool(torch.equal(tokens, step_tokens)), tolerated=round(tol, 4),
                        agree_naive=round(float((tokens == ref).float().mean()), 3), ours_us=round(us, 1)))
        print(json.dumps(out[-1]), flush=True)
    if time.time() - t_heads > args.heads_budget_s:
        return out
    p = Problem(torch, 1, 15, 151936, RANK, False, device, torch.bfloat16, seed=9)
    for name, kw in (("fp8_w2", dict(w2_dtype=torch.float8_e4m3fn)), ("residency_off", dict(residency="off"))):
        tokens, _, _ = head_walk(p.base, p.w1, p.w2.t(), p.first, **kw)
        us, _ = time_graph(torch, lambda: head_walk(p.base, p.w1, p.w2.t(), p.first, **kw))
        tol = tolerated(naive_head_walk, gumbel_noise, p, tokens) if name != "fp8_w2" else None
        out.append(dict(check=f"{name}_v151936_blk15_b1", ours_us=round(us, 1), tolerated=tol,
                        tokens_written=bool((tokens >= 0).all())))
        print(json.dumps(out[-1]), flush=True)
    return out


class _CompileOnly:
    """Stands in for a Triton kernel: `kernel[grid](...)` compiles (JITFunction.warmup) without launching."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *a, **kw: self.kernel.warmup(*a, grid=grid, **kw)


def _compile_job(job) -> str:
    """One worker's share of the bench's Triton compiles; the on-disk cache hands them to the timing process."""
    try:
        import torch
        import triton

        import hybridspec_kernels.head_walk.walk as walk

        if not isinstance(walk.head_walk_kernel, _CompileOnly):  # workers run several jobs
            walk.head_walk_kernel = _CompileOnly(walk.head_walk_kernel)
            _allow_local_exchange(walk)
        if walk.gluon_b1.HAVE_GLUON and not isinstance(walk.gluon_b1.head_walk_b1_stream_kernel, _CompileOnly):
            walk.gluon_b1.head_walk_b1_stream_kernel = _CompileOnly(walk.gluon_b1.head_walk_b1_stream_kernel)
        device = torch.device("cuda")
        kind = job["kind"]
        if kind == "heads":
            p, kw = head_case(torch, device, job["rows"], job["head"], job["sampled"])
            walk.head_walk(p.base, p.w1, p.w2.t(), p.first, **kw)
            walk.head_walk(p.base, p.w1, p.w2.t(), p.first, lockstep=True, **kw)
            return f"ok {job}"
        p = Problem(torch, job["rows"], 15, job["vocab"], RANK, job["sampled"], device, torch.bfloat16)
        if kind == "ours":
            for kw in job["variants"]:
                kw = dict(kw)
                if kw.pop("fp8", False):
                    kw["w2_dtype"] = torch.float8_e4m3fn
                ours_fn(walk.head_walk, p, **kw)()
        elif kind == "fused":
            _, fused = load_vllm_kernels(Path(job["vllm_sources"]))
            if not isinstance(fused._markov_step_kernel, _CompileOnly):
                fused._markov_step_kernel = _CompileOnly(fused._markov_step_kernel)
                fused._markov_last_kernel = _CompileOnly(fused._markov_last_kernel)
            FusedStep(torch, triton, fused, p)()
        return f"ok {job}"
    except Exception as exc:  # reported; the timing process compiles what is missing itself
        return f"FAILED {job}: {type(exc).__name__}: {str(exc)[:400]}"


def precompile(args, sms: int) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ladder = LADDERS[args.ladder]
    # Every variant the rule may choose (the sweep runs the one this run's ladder finds fastest), or just the
    # ones named by --rule-variants; one row always walks with the tagged exchange (probe and poll are the same
    # walk there).
    candidates = [kw for name, kw in ladder["rule"].items() if not args.rule_variants or name in args.rule_variants]
    jobs = []
    for vocab in args.vocabs:
        for rows in args.batches:
            for mode in args.modes:
                chosen = [{"exchange": "tagged"}] if rows == 1 else (candidates or [{}])
                if vocab == 151936 and ladder.get("scoring_by_batch"):
                    chosen = list(ladder["scoring_by_batch"][min((b for b in ladder["scoring_by_batch"] if b >= rows),
                                                                 default=max(ladder["scoring_by_batch"]))].values())
                elif rows > 1 and vocab == 151936 and ladder.get("scoring"):
                    chosen = [dict(kw, **scoring) for kw in chosen for scoring in ladder["scoring"].values()]
                jobs.append(dict(kind="ours", vocab=vocab, rows=rows, sampled=mode == "sampled",
                                 variants=chosen + [{"lockstep": True}]))
                if rows in args.fused_batches and vocab in args.fused_vocabs and mode == "greedy":
                    jobs.append(dict(kind="fused", vocab=vocab, rows=rows, sampled=False,
                                     vllm_sources=args.vllm_sources))
    if args.heads_budget_s > 0:
        jobs += [dict(kind="heads", rows=r, head=h, sampled=s) for r, h, s in HEAD_CASES]
        jobs.append(dict(kind="ours", vocab=151936, rows=1, sampled=False,
                         variants=[{"fp8": True}, {"residency": "off"}]))
    jobs += [dict(kind="ours", vocab=64 * sms, rows=_floor_kw(f)[1], sampled=False, variants=[_floor_kw(f)[2]])
             for f in ladder["floors"]]
    if not args.no_ladder:
        jobs += [dict(kind="ours", vocab=v, rows=r, sampled=kw.get("sampled", False),
                      variants=[{k: x for k, x in kw.items() if k != "sampled"},
                                {"lockstep": True}])
                 for _, v, r, kw in ladder["cases"]]
    start = time.time()
    pool = ProcessPoolExecutor(args.compile_workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        for future in as_completed([pool.submit(_compile_job, job) for job in jobs], timeout=args.compile_timeout_s):
            message = future.result()
            if not message.startswith("ok"):
                print(message, flush=True)
    except Exception as exc:  # a stuck or broken pool only costs the compiles it did not do
        print(f"precompile stopped: {type(exc).__name__}: {exc}", flush=True)
    pool.shutdown(wait=False, cancel_futures=True)
    print(f"precompiled {len(jobs)} jobs in {time.time() - start:.0f} s", flush=True)


def merge_runs(paths, commits) -> tuple[dict, str]:
    """Several GPU runs' results as one: a later run's row replaces an earlier run's row of the same
    configuration; every row and check keeps its run number, every ratio stays within one run. A path may be an
    earlier merge (its runs come first, in their order)."""
    runs, by_key, checks = [], {}, []
    for path, commit in zip(paths, commits):
        doc = json.loads(Path(path).read_text())
        if "runs" in doc:
            # An earlier merge (the committed results file): its runs, rows and checks keep their run numbers, moved
            # past the runs before it.
            offset = len(runs)
            runs += [dict(r, run=r["run"] + offset) for r in doc["runs"]]
            for row in doc["rows"]:
                by_key[(row["vocab"], row["steps"], row["batch"], row["mode"])] = dict(row, run=row["run"] + offset)
            checks += [dict(c, run=c["run"] + offset) for c in doc.get("checks", [])]
            continue
        number = len(runs) + 1
        runs.append(dict(run=number, commit=commit or doc["commit"], date=doc["date"], command=doc["command"],
                         device=doc["device"], hbm_gbps=doc.get("hbm_gbps")))
        for row in doc["rows"]:
            by_key[(row["vocab"], row["steps"], row["batch"], row["mode"])] = dict(row, run=number)
        checks += [dict(c, run=number) for c in doc.get("checks", [])]
    rows = sorted(by_key.values(), key=lambda r: (r["vocab"], -r["steps"], r["batch"], r["mode"]))
    result = dict(rows=rows, checks=checks, device=runs[-1]["device"], hbm_gbps=runs[-1]["hbm_gbps"], sms=None,
                  runs=runs)
    command = "python eval/bench_head_walk.py --merge " + " ".join(str(p) for p in paths) + " (runs listed in 'runs')"
    return result, command


def summarize(rows, checks=()) -> dict:
    def pick(vocab, steps, batch, key, mode="greedy"):
        for r in rows:
            if (r["vocab"], r["steps"], r["batch"], r["mode"]) == (vocab, steps, batch, mode):
                return r.get(key)
        return None

    d2t = sorted({r["d2t_target_vocab"] for r in rows if r.get("d2t_target_vocab")})
    if d2t:
        # A reduced-vocabulary run (--d2t-target-vocab): every sweep row's ratio, keyed by draft / target vocabulary.
        out = {}
        for r in rows:
            name = (f"v{round(r['vocab'] / 1000)}k_d2t{round(r['d2t_target_vocab'] / 1000)}k_blk{r['steps']}_"
                    f"b{r['batch']}" + ("_sampled" if r["mode"] == "sampled" else ""))
            out[f"speedup_graph_loop_{name}"] = r.get("speedup_graph_loop")
            out[f"ours_us_{name}"] = r.get("ours_us")
            out[f"graph_loop_us_{name}"] = r.get("graph_loop_us")
        return out
    if not any(r["batch"] in (1, 32) for r in rows) or all(r["vocab"] > 151936 for r in rows):
        # A run of other batch sizes (the rows walk's, --results-name head_walk_rows) or of other vocabularies
        # (Qwen3.5's 248,320: --results-name head_walk_v248k): every sweep row's ratio, and the rows walk against the
        # Triton walk in the run's ladder (mean of its ABBA passes).
        out = {}
        for r in rows:
            name = f"v{round(r['vocab'] / 1000)}k_blk{r['steps']}_b{r['batch']}" + (
                "_sampled" if r["mode"] == "sampled" else "")
            out[f"speedup_graph_loop_{name}"] = r.get("speedup_graph_loop")
            out[f"ours_us_{name}"] = r.get("ours_us")
            out[f"graph_loop_us_{name}"] = r.get("graph_loop_us")
        return {**out, **rows_ladder_summary(checks)}
    return {
        "speedup_graph_loop_v32k_blk15_b1": pick(32000, 15, 1, "speedup_graph_loop"),
        "speedup_fused_step_v32k_blk15_b1": pick(32000, 15, 1, "speedup_fused_step"),
        "speedup_graph_loop_v152k_blk15_b1": pick(151936, 15, 1, "speedup_graph_loop"),
        "speedup_graph_loop_v32k_blk15_b32": pick(32000, 15, 32, "speedup_graph_loop"),
        "speedup_graph_loop_v32k_blk15_b1_sampled": pick(32000, 15, 1, "speedup_graph_loop", "sampled"),
        "speedup_fused_step_v32k_blk15_b1_sampled": pick(32000, 15, 1, "speedup_fused_step", "sampled"),
        "ours_us_v32k_blk15_b1": pick(32000, 15, 1, "ours_us"),
        "graph_loop_us_v32k_blk15_b1": pick(32000, 15, 1, "graph_loop_us"),
        **ladder_summary(rows, checks),
    }


# The exchange ladders' variants (v4 .. v6) that ladder_summary reports; other ladders' rows at 32k b1 (forms, other
# block lengths: HW12's v31) stay in the checks only.
LADDER_SUMMARY_VARIANTS = ("counter", "flags", "tagged", "probe", "poll", "amax")


def ladder_summary(rows, checks) -> dict:
    """Each exchange of the ladder at 32k / block 15 / batch 1 against the graph loop timed in the same run."""
    out = {}
    for c in checks:
        name = c.get("check", "")
        if not (name.startswith("tune_") and name.endswith("_v32k_b1") and c.get("us") and c.get("equal_step")
                and c.get("steps", 15) == 15 and name[len("tune_"):-len("_v32k_b1")] in LADDER_SUMMARY_VARIANTS):
            continue
        loop = [r for r in rows if (r["vocab"], r["steps"], r["batch"], r["mode"]) == (32000, 15, 1, "greedy")
                and r.get("run") == c.get("run") and r.get("graph_loop_us")]
        if loop:
            variant = name[len("tune_"):-len("_v32k_b1")]
            out[f"ours_{variant}_us_v32k_blk15_b1"] = c["us"]
            out[f"speedup_graph_loop_v32k_blk15_b1_{variant}"] = round(loop[0]["graph_loop_us"] / c["us"], 2)
    return out


def rows_ladder_summary(checks) -> dict:
    """Ladders v48-v50's ABBA pairs (tune_triton[_again]_v32k_bB beside tune_rows[_again]_v32k_bB, block 15): the
    Triton walk's mean time over the rows walk's, per batch."""
    times: dict = {}
    for c in checks:
        name = c.get("check", "")
        for form in ("triton", "rows"):
            for tag in ("", "_again"):
                prefix = f"tune_{form}{tag}_v32k_b"
                if name.startswith(prefix) and name[len(prefix):].isdigit() and c.get("us") and c.get("equal_step"):
                    times.setdefault(int(name[len(prefix):]), {}).setdefault(form, []).append(c["us"])
    return {f"rows_walk_speedup_over_triton_v32k_blk15_b{batch}": round(
        statistics.mean(t["triton"]) / statistics.mean(t["rows"]), 3)
        for batch, t in sorted(times.items()) if t.get("triton") and t.get("rows")}


def run_quick(args) -> dict:
    """Tiny sizes under the Triton interpreter: exercises every code path of the bench, times nothing useful."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    import torch.nn.functional as F

    from hybridspec_kernels.head_walk import head_walk, naive_head_walk

    rows_out = []
    for rows in (1, 3):
        for mode in ("greedy", "sampled"):
            p = Problem(torch, rows, 4, 300, 16, mode == "sampled", torch.device("cpu"), torch.float32)
            row = dict(vocab=300, steps=4, batch=rows, mode=mode)
            variants = {"ours": ours_fn(head_walk, p), "ours_step": ours_fn(head_walk, p, lockstep=True, programs=3)}
            if mode == "greedy":
                variants["graph_loop"] = lambda: graph_loop(torch, F, None, p)
                variants["graph_topk"] = lambda: graph_topk(torch, F, None, p)
            tokens = {}
            for name, fn in variants.items():
                start = time.perf_counter()
                fn()
                row[f"{name}_us"] = round((time.perf_counter() - start) * 1e6, 1)
                tokens[name] = p.draft_tokens.clone()
            kw = dict(temperature=p.temperature, seeds=p.seeds, positions=p.positions) if p.sampled else {}
            ref = naive_head_walk(p.base, p.w1, p.w2.t(), p.first, **kw)[0]
            row["ours_eq_naive"] = bool(torch.equal(tokens["ours"], ref))
            row["ours_eq_step"] = bool(torch.equal(tokens["ours"], tokens["ours_step"]))
            if "graph_loop" in tokens:
                row["agree_graph_loop"] = float((tokens["graph_loop"] == tokens["ours"]).float().mean())
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    return dict(rows=rows_out, checks=[], device="cpu (Triton interpreter)", hbm_gbps=None, sms=None)


def parse_log(path: Path) -> dict:
    """The rows and checks a GPU run printed (one JSON object a line), for a run that ended before writing."""
    rows, checks, device, gbps, sms = [], [], "unknown", None, None
    for line in path.read_text().splitlines():
        if line.startswith("device "):
            head = line[len("device "):].split(",")
            device, sms = head[0], int(head[1].split()[0])
            gbps = float(head[2].split()[1])
        elif line.startswith('{"vocab"'):
            rows.append(json.loads(line))
        elif line.startswith('{"check"'):
            checks.append(json.loads(line))
    checks.append(dict(check="note", value=f"rebuilt from {path.name}: the run stopped before writing its results"))
    return dict(rows=rows, checks=checks, device=device, hbm_gbps=gbps, sms=sms)


def write(result, command, out_dir):
    from _results import write_results

    rows = result["rows"]
    summary = summarize(rows, result["checks"])
    md = markdown(rows, summary, result)
    extra = dict(checks=result["checks"], hbm_gbps=result["hbm_gbps"], sms=result["sms"], topk=TOPK, rank=RANK)
    if "runs" in result:
        extra["runs"] = result["runs"]
    return write_results(BENCH, rows, summary, command, result["device"], out_dir=out_dir, extra=extra,
                         markdown=md)


def markdown(rows, summary, result) -> str:
    lines = [f"# {BENCH}", "", f"device: {result['device']}, HBM copy {result['hbm_gbps']} GB/s, r = {RANK}, "
             f"top-k {TOPK}; us per walk (CUDA-graph replay, median).", "", "| summary | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in summary.items()]
    if result.get("runs"):
        lines += ["", "runs (each row's `run`; ratios only within a run):", ""]
        lines += [f"- run {r['run']}: commit {r['commit'][:10]}, {r['date']}, `{r['command']}`" for r in result["runs"]]
    cols = ["run", "vocab"] + (["d2t_target_vocab"] if any(r.get("d2t_target_vocab") for r in rows) else []) + [
            "steps", "batch", "mode", "ours_variant", "ours_us", "ours_us_per_step", "ours_step_us",
            "graph_loop_us", "graph_topk_us", "fused_step_us", "speedup_graph_loop", "speedup_fused_step",
            "hbm_stream_us", "hbm_once_us", "ours_tolerated", "agree_graph_loop"]
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols) + " |" for r in rows]
    if result["checks"]:
        lines += ["", "checks:", ""] + [f"- {json.dumps(c)}" for c in result["checks"]]
    return "\n".join(lines) + "\n"


def plot(json_path: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(json_path.read_text())
    rows = [r for r in doc["rows"] if r["steps"] == 15]
    # The run's vocabularies (the issue's two, or another run's, e.g. Qwen3.5's 248,320), at most two panels.
    vocabs = sorted({r["vocab"] for r in rows})[:2] or [32000, 151936]
    fig, axes = plt.subplots(1, len(vocabs), figsize=(5.5 * len(vocabs), 4), sharey=False, squeeze=False)
    axes = axes[0]
    for ax, vocab in zip(axes, vocabs):
        for mode, style in (("greedy", "-"), ("sampled", "--")):
            sel = sorted((r for r in rows if r["vocab"] == vocab and r["mode"] == mode), key=lambda r: r["batch"])
            for key, color in (("ours_us", "C0"), ("graph_loop_us", "C1"), ("graph_topk_us", "C2"),
                               ("fused_step_us", "C3"), ("ours_step_us", "C4")):
                pts = [(r["batch"], r[key]) for r in sel if r.get(key)]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", color=color, label=f"{key[:-3]} {mode}")
        floor = [(r["batch"], r["hbm_stream_us"]) for r in rows if r["vocab"] == vocab and r["mode"] == "greedy"]
        if floor:
            ax.plot(*zip(*sorted(floor)), ":", color="gray", label="W2 streamed every step (HBM floor)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"V = {vocab}, r = {RANK}, block 15")
        ax.set_xlabel("batch")
        ax.set_ylabel("us per walk")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def profile_walk(vocab: int, rows: int, exchange: str) -> None:
    import torch

    from hybridspec_kernels.head_walk import head_walk

    p = Problem(torch, rows, 15, vocab, RANK, False, torch.device("cuda"), torch.bfloat16)
    # "rows": the Gluon rows walk (head_walk(gluon="rows")); else a Triton walk's exchange.
    kw = dict(gluon="rows") if exchange == "rows" else dict(exchange=exchange)
    for _ in range(3):
        ours_fn(head_walk, p, **kw)()
    torch.cuda.synchronize()
    print(f"profiled V={vocab} B={rows} exchange={exchange}: tokens {p.draft_tokens[0, :4].tolist()}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prepare", action="store_true")
    parser.add_argument("--finalize", type=Path)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--vllm-sources", default=str(EXTRACT_DIR))
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32000, 151936])
    parser.add_argument("--steps", type=int, nargs="+", default=[15, 7])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--modes", nargs="+", default=["greedy", "sampled"])
    parser.add_argument("--fused-batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--fused-vocabs", type=int, nargs="+", default=[32000, 151936])
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--samples", type=int, default=3,
                        help="fresh allocations (tensors, graph capture) each sweep variant is timed on; the median")
    parser.add_argument("--compile-workers", type=int, default=12)
    parser.add_argument("--heads-budget-s", type=float, default=40.0)
    parser.add_argument("--ladder-budget-s", type=float, default=120.0)
    parser.add_argument("--from-log", type=Path, help="rebuild results from the JSON lines of a GPU run's log")
    parser.add_argument("--log-command", default="", help="the command that produced --from-log")
    parser.add_argument("--merge", type=Path, nargs="+", help="results of several GPU runs, oldest first")
    parser.add_argument("--merge-commits", nargs="+", help="the commit each merged run ran (if its file lacks it)")
    parser.add_argument("--compile-timeout-s", type=float, default=150.0)
    parser.add_argument("--precompile-only", action="store_true", help="compile everything the run needs, then exit")
    parser.add_argument("--no-ladder", action="store_true", help="skip the tuning ladder")
    parser.add_argument("--ladder", choices=sorted(LADDERS), default="v6", help="which tuning ladder and floors")
    parser.add_argument("--rule-variants", nargs="+", help="precompile only these launch variants for the sweep")
    parser.add_argument("--skip", nargs="+", default=[],
                        help="drop ladder rows and scoring variants whose name contains any of these (a form that "
                             "faulted in a check before the bench: a CUDA fault ends the process)")
    parser.add_argument("--d2t-target-vocab", type=int, default=0,
                        help="sweep rows with a reduced draft vocabulary (the --vocabs) mapped by an increasing d2t "
                             "into this many target ids, vLLM's loop with its d2t beside ours; results as "
                             "head_walk_d2t (with --finalize too)")
    parser.add_argument("--resummarize", action="store_true",
                        help="with --finalize: summary and table made again from the run's rows and checks")
    parser.add_argument("--results-name",
                        help="the results' file name (default head_walk; a d2t sweep appends _d2t), --finalize too")
    parser.add_argument("--profile-walk", nargs=3, metavar=("VOCAB", "ROWS", "EXCHANGE"),
                        help="run three greedy walks of one configuration and exit (for ncu: the third is profiled)")
    parser.add_argument("--neighbour-check", nargs="+", type=float, metavar="SPIN_LIMIT HOLD_MS [HOLDERS]",
                        help="walks beside programs holding SMs on another stream (eval/_sm_holder.py), SPIN_LIMIT "
                             "polls a wait, plain and cooperative launches (JSON lines), then exit")
    args = parser.parse_args()
    global BENCH
    BENCH = args.results_name or BENCH
    if args.d2t_target_vocab:
        BENCH = f"{BENCH}_d2t"
    if args.skip:
        _drop_variants(args.ladder, args.skip)
    if args.prepare:
        prepare()
        return
    if args.finalize:
        src = args.finalize / f"{BENCH}.json"
        dest = EVAL / "results"
        if args.resummarize:
            # The summary (and table) made again from the run's own rows and checks, with its provenance.
            doc = json.loads(src.read_text())
            os.environ["HYBRIDSPEC_COMMIT"] = str(doc["commit"])
            write(dict(rows=doc["rows"], checks=doc["checks"], device=doc["device"], hbm_gbps=doc["hbm_gbps"],
                       sms=doc["sms"]), doc["command"], args.finalize)
        for suffix in (".json", ".md"):
            shutil.copy(args.finalize / f"{BENCH}{suffix}", dest / f"{BENCH}{suffix}")
        plot(src, dest / f"{BENCH}.png")
        print(f"results in {dest}")
        return
    if args.neighbour_check:
        spin_limit, hold_ms = args.neighbour_check[:2]
        neighbour_check(int(spin_limit), hold_ms, *[int(x) for x in args.neighbour_check[2:]])
        return
    if args.profile_walk:
        profile_walk(int(args.profile_walk[0]), int(args.profile_walk[1]), args.profile_walk[2])
        return
    if args.precompile_only:
        import torch

        precompile(args, torch.cuda.get_device_properties(0).multi_processor_count)
        return
    if args.out is None:
        parser.error("--out is required (eval/results is written by --finalize from a GPU run)")
    command = "python eval/bench_head_walk.py " + " ".join(sys.argv[1:])
    if args.from_log:
        result, command = parse_log(args.from_log), args.log_command
    elif args.merge:
        result, command = merge_runs(args.merge, args.merge_commits or [None] * len(args.merge))
    else:
        result = run_quick(args) if args.quick else run_gpu(args)
    path = write(result, command, args.out)
    print(f"wrote {path}")
    for r in result["rows"]:
        print(f"V={r['vocab']:>6} N={r['steps']:>2} B={r['batch']:>2} {r['mode']:>7}: ours {r.get('ours_us')} us, "
              f"loop {r.get('graph_loop_us')}, topk {r.get('graph_topk_us')}, fused {r.get('fused_step_us')}, "
              f"step {r.get('ours_step_us')} -> x{r.get('speedup_graph_loop')} loop, x{r.get('speedup_fused_step')} "
              f"fused, tol {r.get('ours_tolerated')}")
    for c in result["checks"]:
        if "us" in c or "ours_us" in c or "error" in c:
            print(json.dumps(c))


if __name__ == "__main__":
    main()
