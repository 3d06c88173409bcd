"""Offline sm_90 compile of the kernels' DEFAULT builds, to prove a refactor changed no instruction (no GPU needed).

Each build the library would launch on an H200 (gdn_verify: every config the shipped tuned file picks, at L 4 and
16 (GDN_LENS), fp32 and bf16 states (verify_bf16s_*), incl. the reconstruction's checkpoint launch; head_walk: the
plan's default at 32k / 152k, batch 1 / 8 / 32 / 64, greedy and sampled) is captured from the public entry point,
compiled for sm_90, and its SASS instruction stream (addresses stripped), a register-masked copy and the PTX without
line info are written to OUT/<build>.*.
Judge SASS with the GPU's Triton (3.6 on the lent H200), never this machine's: put it first on PYTHONPATH.

    PYTHONPATH=<triton 3.6 site>:<hybridspec_kernels folder> python eval/offline_sass.py compile OUT WHAT [BUILD...]
    python eval/offline_sass.py compare BASE_OUT NEW_OUT     # per build: sass / masked / ptx SAME or DIFF

WHAT: gdn, hw, topk (head_walk_topk's builds), hwd (head_walk's Triton builds with d2t at 32k: greedy, sampled, the compact cache), hwrows (the Gluon
walk of 2..32 rows, gluon_rows, beside the Triton walk's build of each batch) or hwg (head_walk's Gluon streamed b1 walk, 152k / 150001, in its forms and ring geometries beside
the Triton b1 build, with step-loop instruction counts; and its fully resident lean forms at 32k / 30011, HW12). (head_walk's removed Gluon prototypes' targets: the
resident b1 forms in hwg, hwr (gluon_rows): at eee43d2.)
(gdn_verify's Gluon prototypes' targets gdng / gdnb: at eee43d2, removed with the prototypes.)

SASS_IR=1 also writes each build's TTIR / TTGIR (OUT/<build>.ttir, .ttgir).

Builds that spill (the b64 walks) can differ run to run in ptxas's register and spill-slot choice: compare
their masked SASS and PTX.
"""
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path


def compare(base, new):
    """Prints one line per build present in both folders; returns the number of builds whose PTX differs."""
    differ = 0
    for sass in sorted(Path(base).glob("*.sass")):
        name = sass.stem
        if not (Path(new) / f"{name}.sass").exists():
            continue
        same = {ext: (Path(base) / f"{name}.{ext}").read_bytes() == (Path(new) / f"{name}.{ext}").read_bytes()
                for ext in ("sass", "sassn", "ptxn")}
        differ += not same["ptxn"]
        print(f"{name} sass:{'SAME' if same['sass'] else 'DIFF'} masked:{'SAME' if same['sassn'] else 'DIFF'} "
              f"ptx:{'SAME' if same['ptxn'] else 'DIFF'}")
    return differ


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "compare":
    sys.exit(1 if compare(sys.argv[2], sys.argv[3]) else 0)
WHATS = ("gdn", "hw", "hwg", "hwd", "hwrows", "topk")
if __name__ != "__main__" or len(sys.argv) < 4 or sys.argv[1] != "compile" or sys.argv[3] not in WHATS:
    sys.exit(__doc__)

os.environ.pop("TRITON_INTERPRET", None)
import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import hybridspec_kernels._pdl  # noqa: E402

hybridspec_kernels._pdl.OFFLINE_SM90 = True  # CPU tensors stand for the GPU's: PDL builds as launched there

OUT, WHAT, ONLY = sys.argv[2], sys.argv[3], set(sys.argv[4:])
os.makedirs(OUT, exist_ok=True)
captured = []


class Capture:
    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            captured.append((self.fn, args, kwargs))
        return launch


def tstr(t):
    return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16", torch.int64: "i64",
            torch.int32: "i32", torch.float8_e4m3fn: "fp8e4nv", torch.bool: "i1"}[t.dtype]


def compile_captured(name, fn, args, kwargs):
    kw = dict(kwargs)
    num_warps = kw.pop("num_warps", 4)
    num_stages = kw.pop("num_stages", 3)
    options = dict(num_warps=num_warps, num_stages=num_stages)
    for launch_option in ("maxnreg", "launch_pdl"):  # compile options passed at launch (stacked / two-pass)
        if launch_option in kw:
            options[launch_option] = kw.pop(launch_option)
    for a, v in zip(fn.arg_names, args):
        kw[a] = v
    sig, consts, attrs = {}, {}, {}
    for i, a in enumerate(fn.arg_names):
        p = fn.params[i]
        v = kw[a] if a in kw else p.default
        if p.is_constexpr:
            sig[a] = "constexpr"; consts[a] = v
        elif v is None:
            sig[a] = "constexpr"; consts[a] = None
        elif isinstance(v, torch.Tensor):
            sig[a] = "*" + tstr(v); attrs[(i,)] = [["tt.divisibility", 16]]
        elif type(v).__name__ == "TensorDescriptor":  # host descriptor: "tensordesc<bf16[64, 256]>"
            from triton.runtime.jit import mangle_type
            sig[a] = mangle_type(v)
        elif isinstance(v, bool):
            sig[a] = "i1"
        elif isinstance(v, int):
            if v == 1 and not p.do_not_specialize:
                sig[a] = "constexpr"; consts[a] = 1
            else:
                sig[a] = "i32" if -2**31 <= v < 2**31 else "i64"
                if v % 16 == 0 and v != 0 and not p.do_not_specialize:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[a] = "fp32"
        else:
            raise TypeError((a, v))
    source = ASTSource
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    k = triton.compile(source(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=options)
    path = f"{OUT}/{name}.cubin"
    open(path, "wb").write(k.asm["cubin"])
    bindir = os.path.dirname(triton.__file__) + "/backends/nvidia/bin"
    sass = subprocess.run([f"{bindir}/cuobjdump", "-sass", path], capture_output=True, text=True).stdout
    ins = [m.group(1).strip() for m in re.finditer(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", sass, re.M)]
    # branch targets are addresses: keep them (they move only if the stream moves)
    open(f"{OUT}/{name}.sass", "w").write("\n".join(ins) + "\n")
    res = subprocess.run([f"{bindir}/cuobjdump", "-res-usage", path], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", res, re.S)
    h = hashlib.sha256("\n".join(ins).encode()).hexdigest()[:16]
    # ptxas assigns spill slots / registers differently run to run in builds that spill (the b64 walks): also a
    # hash with register numbers and stack offsets masked, and one of the PTX without line info
    norm = [re.sub(r"\[R1\+0x[0-9a-f]+\]", "[R1+off]", re.sub(r"\b(U?R|U?P)\d+\b", r"\1#", t)) for t in ins]
    open(f"{OUT}/{name}.sassn", "w").write("\n".join(norm) + "\n")
    ptx = k.asm["ptx"].split(".section\t.debug")[0]
    ptx = [l for l in ptx.splitlines() if not l.strip().startswith((".loc", ".file", "@@DWARF"))
           and not re.match(r"^\$L__tmp\d+:$", l.strip())]
    open(f"{OUT}/{name}.ptxn", "w").write("\n".join(ptx) + "\n")
    if os.environ.get("SASS_IR"):
        # SASS_IR=1: the TTIR / TTGIR too (where the pipeliner put a loop's copies, waits and shared-memory stores)
        for stage in ("ttir", "ttgir"):
            if stage in k.asm:  # a Gluon build starts at TTGIR
                open(f"{OUT}/{name}.{stage}", "w").write(k.asm[stage])
    h += " norm " + hashlib.sha256("\n".join(norm).encode()).hexdigest()[:12]
    h += " ptx " + hashlib.sha256("\n".join(ptx).encode()).hexdigest()[:12]
    print(f"{name:40} {h} instr {len(ins):5} regs {m.group(1)} stack {m.group(2)} smem {k.metadata.shared}",
          flush=True)
    return sass


STEP_LOOP_OPS = ("HGMMA", "BAR", "MEMBAR", "LDG", "STG", "LDS", "STS", "SHFL", "WARPSYNC", "FENCE", "CCTL", "ATOM",
                 "RED", "WARPGROUP")


def _sass_loops(sass):
    """(SASS lines as (address, instruction), every backward branch's (target, branch) address pair)."""
    lines = [(int(m.group(1), 16), m.group(2).strip()) for m in
             re.finditer(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", sass, re.M)]
    loops = []
    for addr, ins in lines:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", ins)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    return lines, loops


def _loop_body(lines, lo, hi):
    return [i for a, i in lines if lo <= a <= hi]


def _op_counts(body):
    """Instructions of a loop body by opcode family (STEP_LOOP_OPS), predicates stripped."""
    ops = [re.sub(r"^@!?U?P[T0-9]+\s+", "", i).split()[0] for i in body]
    return {"instr": len(ops), **{fam: sum(op.split(".")[0] == fam for op in ops) for fam in STEP_LOOP_OPS}}


def step_loop_counts(sass, narrowest=False):
    """Instructions of the step loop (the widest backward branch whose body holds an HGMMA), by opcode family:
    what one step of a walk issues per warp, spins counted once. narrowest: the innermost such loop (a partly
    streamed walk's streamed-tile iteration)."""
    lines, loops = _sass_loops(sass)
    best = None
    for lo, hi in loops:
        body = _loop_body(lines, lo, hi)
        if any("HGMMA" in i for i in body) and (best is None or (len(body) < len(best) if narrowest
                                                                  else len(body) > len(best))):
            best = body
    return {} if best is None else _op_counts(best)


def streamed_loops(sass):
    """Every innermost loop whose body holds an HGMMA (no such loop inside it), in address order, counted as
    step_loop_counts counts: a form that splits the streamed tiles of a step over two loops (gluon 'rs_sf': the
    ring's waiting tiles before the resident ones) has two, whose narrowest alone is its 'streamed loop'."""
    lines, loops = _sass_loops(sass)
    # (an mbarrier wait's out-of-line retry block, ending in a try-wait, branches back after it: not a walk loop)
    mma = [(lo, hi) for lo, hi in loops if any("HGMMA" in i for i in _loop_body(lines, lo, hi))
           and not any("SYNCS.PHASECHK" in i for i in _loop_body(lines, lo, hi)[-4:])]
    inner = [(lo, hi) for lo, hi in mma if not any(lo <= a and b <= hi and (a, b) != (lo, hi) for a, b in mma)]
    return [_op_counts(_loop_body(lines, lo, hi)) for lo, hi in sorted(inner)]


# GDN_LENS=4,16,17: the verify lengths whose tuned picks the gdn target compiles (the tuned file's length keys)
GDN_LENS = [int(n) for n in os.environ.get("GDN_LENS", "4,16").split(",")]


def gdn():
    from hybridspec_kernels.gdn_verify import verify as vf, two_pass as tp, reconstruct as rc
    from hybridspec_kernels.gdn_verify import reconstruct_short as rs, stacked as sk
    from hybridspec_kernels.gdn_verify.workspace import GDNVerifyWorkspace, GDNStateTable
    vf._gdn_verify_kernel = Capture(vf._gdn_verify_kernel)
    tp._gdn_verify_prep_kernel = Capture(tp._gdn_verify_prep_kernel)
    tp._gdn_verify_state_kernel = Capture(tp._gdn_verify_state_kernel)
    sk._stacked_prep_kernel = Capture(sk._stacked_prep_kernel)
    sk._stacked_state_kernel = Capture(sk._stacked_state_kernel)
    rc._gdn_reconstruct_kernel = Capture(rc._gdn_reconstruct_kernel)
    rs._gdn_reconstruct_short_kernel = Capture(rs._gdn_reconstruct_short_kernel)
    rc.reconstruct_short = lambda *a, **k: False  # the hook reads the tuned file only on a GPU
    tuned = json.loads((Path(vf.__file__).parent / "tuned_verify_configs.json").read_text())
    H, HV, K, V, W = 16, 32, 128, 128, 4
    D = 2 * H * K + HV * V
    bf = torch.bfloat16
    jobs = []
    for L in GDN_LENS:
        for batch, cfg in tuned["verify_by_len"][str(L)].items():
            jobs.append(("verify", L, int(batch), cfg))
        for batch, cfg in tuned.get("verify_by_len_bf16", {}).get(str(L), {}).items():  # bf16 states' picks
            jobs.append(("verify_bf16s", L, int(batch), cfg))
        for batch, cfg in tuned["reconstruct_by_len"][str(L)].items():
            jobs.append(("recon", L, int(batch), cfg))
        for batch, cfg in tuned.get("reconstruct_short_by_len", {}).get(str(L), {}).items():
            if cfg.get("short"):
                jobs.append(("rshort", L, int(batch), cfg))
    # GDN_EXTRA='[["verify", 17, 32, {...VerifyConfig fields...}], ...]': builds beside the tuned picks (a candidate's)
    jobs += [tuple(job) for job in json.loads(os.environ.get("GDN_EXTRA", "[]"))]
    seen = {}
    for part, L, B, cfg in jobs:
        T = B * L
        x = torch.empty(T, D, dtype=bf)
        a = torch.empty(T, HV, dtype=bf); b = torch.empty(T, HV, dtype=bf)
        conv_w = torch.empty(D, W, dtype=bf)
        A_log = torch.empty(HV); dt_bias = torch.empty(HV)
        conv_state = torch.empty(B + 1, W - 1, D, dtype=bf)
        ssm_state = torch.empty(B + 1, HV, V, K, dtype=bf if part == "verify_bf16s" else torch.float32)
        idx = torch.arange(1, B + 1, dtype=torch.int32)
        cu = torch.arange(0, T + 1, L, dtype=torch.int32)
        ws = GDNVerifyWorkspace.allocate(1, B, L, H, HV, K, V, bf, device="cpu")
        del captured[:]
        if part.startswith("verify"):
            fields = {f for f in vf.VerifyConfig.__dataclass_fields__}
            c = {k: v for k, v in cfg.items() if k in fields}
            dropped = {k: v for k, v in cfg.items() if k not in fields}
            assert not any(dropped.values()), dropped
            vf.gdn_verify(x, a, b, conv_w, None, A_log, dt_bias, conv_state, ssm_state, idx, cu, ws.layer(0),
                          max_seqlen=L, config=vf.VerifyConfig(**c))
        elif part == "recon":
            st = GDNStateTable([ssm_state], [conv_state], W)
            rc.gdn_reconstruct(st, ws, idx, torch.full((B,), L, dtype=torch.int32), cu, block_v=cfg["block_v"],
                               num_warps=cfg["num_warps"], checkpoint_indices=idx, checkpoint_lens=idx)
        else:
            st = GDNStateTable([ssm_state], [conv_state], W)
            rs.gdn_reconstruct_short(st, ws, idx, torch.full((B,), L, dtype=torch.int32), cu,
                                     block_v=cfg["block_v"], num_warps=cfg["num_warps"], early=cfg.get("early"))
        for j, (fn, args, kwargs) in enumerate(captured):
            key = (fn.__name__, repr(sorted((k, v) for k, v in kwargs.items() if not isinstance(v, torch.Tensor))),
                   L if part != "recon" else 0, tuple(str(t.dtype) for t in args if isinstance(t, torch.Tensor)))
            name = f"{part}_L{L}_b{B}_{j}_{fn.__name__.strip('_')}"
            if ONLY and name not in ONLY:
                continue
            if key in seen:
                print(f"{name:40} same build as {seen[key]}", flush=True)
                continue
            seen[key] = name
            compile_captured(name, fn, args, kwargs)


# HW_OPTS='{"stream_tma": 3, "tile_rows": 64, "resident_tiles": 3}': plan_walk options for every hw build (a
# launch variant's SASS; the default builds without it).
HW_OPTS = json.loads(os.environ.get("HW_OPTS", "{}"))


def _walk_operands(rows, steps, vocab, rank):
    """Empty bf16 walk operands of a shape (only their dtypes and strides reach the compile): U [B, N, V], W1
    [V, r], W2 rows [V, r], anchors [B], tokens [B, N]."""
    return (torch.empty(rows, steps, vocab, dtype=torch.bfloat16), torch.empty(vocab, rank, dtype=torch.bfloat16),
            torch.empty(vocab, rank, dtype=torch.bfloat16), torch.zeros(rows, dtype=torch.long),
            torch.empty(rows, steps, dtype=torch.long))


def _sampled_draw(steps, vocab, rows=1):
    """Sampled rows' operands as the engine passes them: their requests, temperatures, seeds, positions and an fp32
    draft-logits cache (only dtypes and strides reach the compile)."""
    return dict(req_indices=torch.zeros(rows, dtype=torch.int32), temperature=torch.ones(rows),
                seeds=torch.zeros(rows, dtype=torch.long), positions=torch.zeros(rows, steps, dtype=torch.long),
                draft_logits=torch.empty(rows, steps, vocab))


def hw():
    import hybridspec_kernels.head_walk.walk as walk
    walk._num_sms = lambda d: 132
    walk._interpreting = lambda: False
    walk.head_walk_kernel = Capture(walk.head_walk_kernel)
    walk.noise_table_kernel = Capture(walk.noise_table_kernel)
    steps, rank = 15, 256
    for vocab in (32000, 151936):
        for rows in (1, 8, 32, 64):
            for sampled in (False, True):
                name = f"hw_v{vocab}_b{rows}_{'sampled' if sampled else 'greedy'}"
                if ONLY and name not in ONLY:
                    continue
                u, w1, w2, first, tokens = _walk_operands(rows, steps, vocab, rank)
                cfg = walk.plan_walk(vocab, rank, rows, 2, torch.device("cuda"), sampled=sampled, **HW_OPTS)
                temp = seeds = pos = dl = None
                if sampled:
                    temp = torch.ones(rows); seeds = torch.zeros(rows, dtype=torch.long)
                    pos = torch.zeros(rows, steps, dtype=torch.long)
                    dl = torch.empty(rows, steps, vocab, dtype=torch.bfloat16)
                del captured[:]
                walk._launch(cfg, u, w1, w2, None, first, tokens, None, temp, seeds, pos, None, dl, None, None,
                             None, None, None, None, None, None, 0, 1.0)
                *table, (fn, args, kwargs) = captured  # a noise table (HW_OPTS noise_table) launches first
                print(name, cfg, flush=True)
                compile_captured(name, fn, args, kwargs)
                if table:
                    compile_captured(name + "_noise_table", *table[0])


def hwd():
    """The Triton walk's builds with a reduced draft vocabulary (d2t, W1 over 151,936 target ids, increasing as vLLM
    builds it) at V = 32k: greedy b1 / b32 / b64, sampled b1 (cache at target columns) and b32 / b64 (the compact
    cache, STORE_LOGITS 2)."""
    import hybridspec_kernels.head_walk.walk as walk
    walk._num_sms = lambda d: 132
    walk._interpreting = lambda: False
    walk.head_walk_kernel = Capture(walk.head_walk_kernel)
    steps, rank, vocab, target = 15, 256, 32000, 151936
    for rows in (1, 32, 64):
        for sampled in (False, True):
            name = f"hwd_v{vocab}_b{rows}_{'sampled' if sampled else 'greedy'}"
            if ONLY and name not in ONLY:
                continue
            u, _, w2, first, tokens = _walk_operands(rows, steps, vocab, rank)
            w1 = torch.empty(target, rank, dtype=torch.bfloat16)
            d2t = torch.zeros(vocab, dtype=torch.long)
            cfg = walk.plan_walk(vocab, rank, rows, 2, torch.device("cuda"), sampled=sampled, **HW_OPTS)
            temp = seeds = pos = dl = None
            compact = sampled and rows >= walk.COMPACT_CACHE_MIN_ROWS
            if sampled:
                temp = torch.ones(rows); seeds = torch.zeros(rows, dtype=torch.long)
                pos = torch.zeros(rows, steps, dtype=torch.long)
                dl = torch.empty(rows, steps, vocab if compact else target, dtype=torch.bfloat16)
            del captured[:]
            walk._launch(cfg, u, w1, w2, None, first, tokens, None, temp, seeds, pos, d2t, dl, None, None,
                         None, None, None, None, None, None, 0, 1.0, compact_logits=compact, d2t_increasing=True)
            (fn, args, kwargs), = captured
            print(name, cfg, flush=True)
            compile_captured(name, fn, args, kwargs)


def _topk_walk_operands(rows, steps, topk, vocab, rank, sampled):
    """head_walk_topk's positional operands (values, candidates, w1, w2, anchors) and keywords (out, req_indices,
    and a sampled walk's with its cache), bf16, for a capture."""
    first = torch.zeros(rows, dtype=torch.long)
    operands = (torch.empty(rows, steps, topk, dtype=torch.bfloat16), torch.zeros(rows, steps, topk, dtype=torch.long),
                torch.empty(vocab, rank, dtype=torch.bfloat16), torch.empty(vocab, rank, dtype=torch.bfloat16), first)
    extra = dict(out=torch.zeros(rows, steps, dtype=torch.long), req_indices=first)
    if sampled:
        extra.update(temperature=torch.ones(rows), seeds=torch.zeros(rows, dtype=torch.long),
                     positions=torch.zeros(rows, steps, dtype=torch.long),
                     draft_logits=torch.empty(rows, steps, vocab, dtype=torch.bfloat16),
                     cached_columns=torch.zeros(rows, steps, topk, dtype=torch.long))
    return operands, extra


def topk():
    """head_walk_topk (the top-k walk, one program a row): bf16, r 256, 15 steps, greedy / sampled with the cache, K 64
    and K 256 (four chunks), 8 / 16 / 32 warps."""
    import hybridspec_kernels.head_walk_topk.walk as walk
    walk.head_walk_topk_kernel = Capture(walk.head_walk_topk_kernel)
    rows, steps, rank, vocab = 8, 15, 256, 151936
    for topk in (64, 256):
        for sampled in (False, True):
            for warps in (8, 16, 32):
                name = f"topk_k{topk}_{'sampled' if sampled else 'greedy'}_w{warps}"
                if ONLY and name not in ONLY:
                    continue
                operands, extra = _topk_walk_operands(rows, steps, topk, vocab, rank, sampled)
                del captured[:]
                walk.head_walk_topk(*operands, num_warps=warps, round_dot=True, form="loop", **extra)
                (fn, args, kwargs), = captured
                compile_captured(name, fn, args, kwargs)
    # the bias-table forms (session 23): the table launch and the chain, K 64, with and without the tile ahead
    import hybridspec_kernels.head_walk_topk.table as table
    for kernel in ("topk_bias_table_kernel", "topk_table_chain_kernel"):
        setattr(table, kernel, Capture(getattr(table, kernel)))
    for sampled in (False, True):
        for form, warps in (("table", 1), ("table", 4), ("table_ahead", 1), ("table_ahead", 2), ("table_ahead", 4)):
            name = f"topk_{form}_k64_{'sampled' if sampled else 'greedy'}_w{warps}"
            if ONLY and name not in ONLY:
                continue
            operands, extra = _topk_walk_operands(rows, steps, 64, vocab, rank, sampled)
            del captured[:]
            walk.head_walk_topk(*operands, num_warps=warps, round_dot=True, form=form, **extra)
            for i, (fn, args, kwargs) in enumerate(captured):
                compile_captured(f"{name}_{i}", fn, args, kwargs)
    import hybridspec_kernels.head_walk_topk.select as select
    for name in ("topk_split_kernel", "topk_merge_kernel", "topk_bound_maxima_kernel", "topk_bounded_row_kernel",
                 "topk_fallback_split_kernel", "topk_fallback_merge_kernel"):
        setattr(select, name, Capture(getattr(select, name)))
    for bits, pieces in ((8, 0), (4, 0), (2, 0), (4, None)):
        del captured[:]
        select.topk_candidates(torch.empty(120, vocab, dtype=torch.bfloat16), 64, digit_bits=bits, bound_pieces=pieces)
        for i, (fn, args, kwargs) in enumerate(captured):
            compile_captured(f"topk_select_bits{bits}_p{pieces}_{i}", fn, args, kwargs)


def _compile_counted(name, cfg):
    """Compiles the one captured launch and prints its step loop's counts; the SASS text, or None where this Triton
    rejects the build (printed: what a Triton version rejects is the finding, not a crash)."""
    (fn, args, kwargs), = captured
    print(name, cfg, flush=True)
    try:
        sass = compile_captured(name, fn, args, kwargs)
    except Exception as exc:
        print(f"{name:40} FAILED {type(exc).__name__}: {str(exc)[-3000:]}", flush=True)
        return None
    print(f"{name:40} step loop {json.dumps(step_loop_counts(sass))}", flush=True)
    return sass


def hwg():
    """head_walk(gluon=...) at one greedy row of partly streamed shards (151936; 150001: U rows not 16-byte aligned,
    the Triton walk's register path) beside the Triton walk's default b1 build: registers, stack, shared memory, the
    step loop's and one streamed iteration's instructions (step_loop_counts) of each form and ring geometry."""
    import hybridspec_kernels.head_walk.gluon_b1 as gb
    import hybridspec_kernels.head_walk.walk as walk
    walk._num_sms = lambda d: 132
    walk._interpreting = lambda: False
    walk.head_walk_kernel = Capture(walk.head_walk_kernel)
    gb.head_walk_b1_stream_kernel = Capture(gb.head_walk_b1_stream_kernel)
    walk.noise_table_kernel = Capture(walk.noise_table_kernel)
    steps, rank = 15, 256
    # Ring geometries beyond the plan's (name suffix -> plan options): resident rows / ring stages (_t128: 128-row
    # tiles at 8 warps, 128 rows in registers). res256_s2_t128 is gluon="auto"'s (walk.GLUON_AUTO_GEOMETRY; before
    # HW7b res256_s3).
    geometry = {"res192_s3": dict(stream_tma=3, tile_rows=64, resident_tiles=3),
                "res192_s4": dict(stream_tma=4, tile_rows=64, resident_tiles=3),
                "res256_s3": dict(stream_tma=3, tile_rows=64, resident_tiles=4),
                "res256_s2": dict(stream_tma=2, tile_rows=64, resident_tiles=4),
                "res256_s2_t128": walk.GLUON_AUTO_GEOMETRY,
                "res128_s3_t128": dict(stream_tma=3, tile_rows=128, resident_tiles=1, stream_rows=128),
                # HW12: fully resident 32k shards (256 rows = two 128-row tiles, no ring)
                "res256_t128": dict(tile_rows=128, resident_tiles=2, stream_rows=128)}
    forms = {151936: ("triton", "ss", "rs", "ss_res192_s3", "rs_res192_s4", "rs_res256_s3", "rs_res256_s2",
                      "rs_res256_s2_t128", "rs_res128_s3_t128", "rs_sf_res256_s2_t128",
                      "rs_sf_lean_res256_s2_t128", "rs2_sf_lean_res256_s2_t128",
                      "rs2_sf_lean_pp_res256_s2_t128", "triton_sampled", "rs2_sf_lean_pp_sampled_res256_s2_t128"),
             150001: ("triton", "ss", "rs_res256_s3", "rs_res256_s2_t128", "rs_sf_res256_s2_t128",
                      "rs_sf_lean_res256_s2_t128", "rs2_sf_lean_res256_s2_t128"),
             # HW12: the fully resident walk (the Triton walk, the Gluon lean form ss_lean_pair)
             32000: ("triton", "ss_lean_pair_res256_t128", "rs2_lean_pair_res256_t128",
                     "rs2_lean_pair_pp_res256_t128", "rs2_lean_pair_pp_d2t_res256_t128", "triton_sampled",
                     "rs2_lean_pair_pp_sampled_res256_t128", "rs2_lean_pair_pp_d2t_sampled_res256_t128"),
             30011: ("triton", "ss_lean_pair_res256_t128", "rs2_lean_pair_res256_t128")}
    for vocab, names in forms.items():
        for form_name in names:
            form, _, geo = form_name.partition("_res")
            # "..._sampled": one sampled row (a request's temperature, seed and positions) with its draft-logits
            # cache; "..._d2t": rows keyed by target id (an increasing d2t; the launch's d2t argument)
            sampled_form = form.endswith("_sampled")
            form = form.removesuffix("_sampled")
            d2t_form = form.endswith("_d2t")
            form = form.removesuffix("_d2t")
            name = f"hwg_v{vocab}_b1_{form_name}"
            if ONLY and name not in ONLY:
                continue
            u, w1, w2, first, tokens = _walk_operands(1, steps, vocab, rank)
            del captured[:]
            if form == "triton":
                # As head_walk: no Triton ring where U's rows are not 16-byte aligned.
                cfg = walk.plan_walk(vocab, rank, 1, 2, torch.device("cuda"),
                                     stream_tma=None if vocab % 8 == 0 else 0)
                draw = _sampled_draw(steps, vocab) if sampled_form else {}
                walk._launch(cfg, u, w1, w2, None, first, tokens, draw.get("req_indices"), draw.get("temperature"),
                             draw.get("seeds"), draw.get("positions"), None, draw.get("draft_logits"), None, None,
                             None, None, None, None, None, None, 0, 1.0)
            else:
                # The Gluon walk's ring reads only W2: its plan keeps the ring whatever U's alignment.
                cfg = walk.plan_walk(vocab, rank, 1, 2, torch.device("cuda"), **(geometry["res" + geo] if geo else {}))
                flags = walk.gluon_form_flags(form)
                why = walk.why_not_gluon_b1(cfg, num_rows=1, head="markov", sampled=False, extras=False,
                                            dtypes=(w1.dtype, w2.dtype, u.dtype), rank=rank, capability=(9, 0),
                                            rs=flags["rs"], lean=flags["lean_ends"])
                assert why is None, why
                walk._launch_gluon_b1(cfg, u, w1, w2, first, tokens, 1.0, **flags,
                                      d2t=torch.zeros(vocab, dtype=torch.long, device=u.device) if d2t_form else None,
                                      draw=_sampled_draw(steps, vocab) if sampled_form else None)
            del captured[:-1]  # a sampled row's noise table launches first (compiled by hw())
            sass = _compile_counted(name, cfg)
            if sass:  # one streamed tile's iteration (the step loop counts it once)
                print(f"{name:40} streamed loop {json.dumps(step_loop_counts(sass, narrowest=True))}", flush=True)
                loops = streamed_loops(sass)
                if len(loops) > 1:  # rs_sf: the lead loop, then the rest of the step's streamed tiles
                    brief = [{k: c[k] for k in ("instr", "BAR")} for c in loops]
                    print(f"{name:40} streamed loops {json.dumps(brief)}", flush=True)


def hwrows():
    """head_walk(gluon="rows") at 32k / 30011 (fully resident 256-row shards) and 2 / 5 / 8 / 16 / 32 greedy rows, beside
    the Triton walk's default build of each: registers, stack, shared memory and the step loop's counts."""
    import hybridspec_kernels.head_walk.gluon_rows as gr
    import hybridspec_kernels.head_walk.walk as walk
    walk._num_sms = lambda d: 132
    walk._interpreting = lambda: False
    walk.head_walk_kernel = Capture(walk.head_walk_kernel)
    gr.head_walk_rows_kernel = Capture(gr.head_walk_rows_kernel)
    walk.noise_table_kernel = Capture(walk.noise_table_kernel)
    steps, rank = 15, 256
    # "..._sampled": sampled rows with their requests and draft-logits cache (session 17)
    cases = ([(vocab, rows, form, steps) for vocab in (32000, 30011) for rows in (2, 5, 8, 16, 32)
              for form in ("triton", "rows")] + [(32000, 32, "rows", 1), (32000, 8, "rows", 1)]
             + [(32000, rows, form, steps) for rows in (2, 8, 32) for form in ("triton_sampled", "rows_sampled")])
    for vocab, rows, form, steps in cases:
        name = f"hwrows_v{vocab}_b{rows}_{form}" + ("" if steps == 15 else f"_blk{steps}")
        if ONLY and name not in ONLY:
            continue
        u, w1, w2, first, tokens = _walk_operands(rows, steps, vocab, rank)
        sampled = form.endswith("_sampled")
        draw = _sampled_draw(steps, vocab, rows) if sampled else {}
        cfg = walk.plan_walk(vocab, rank, rows, 2, torch.device("cuda"), sampled=sampled)
        del captured[:]
        if form.startswith("triton"):
            walk._launch(cfg, u, w1, w2, None, first, tokens, draw.get("req_indices"), draw.get("temperature"),
                         draw.get("seeds"), draw.get("positions"), None, draw.get("draft_logits"), None, None, None,
                         None, None, None, None, None, 0, 1.0)
        else:
            why = walk.why_not_gluon_rows(cfg, num_rows=rows, head="markov", sampled=sampled, extras=False,
                                          dtypes=(w1.dtype, w2.dtype, u.dtype), rank=rank, capability=(9, 0))
            assert why is None, why
            walk._launch_gluon_rows(cfg, u, w1, w2, first, tokens, 1.0, draw=draw or None)
        del captured[:-1]  # a sampled walk's noise table launches first
        _compile_counted(name, cfg)


{"gdn": gdn, "hwg": hwg, "hw": hw, "hwd": hwd, "hwrows": hwrows, "topk": topk}[WHAT]()
