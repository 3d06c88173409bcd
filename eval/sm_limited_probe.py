"""Diagnostic: the head walk where this process gets fewer SMs than the device has (a CUDA green context, or an MPS
client under CUDA_MPS_ACTIVE_THREAD_PERCENTAGE). Prints one JSON line per step: how many SMs a wide launch really
reaches, what the walk planned, whether the driver refused its cooperative launch, whether its drafts are the
walk's (tests/ops/test_head_walk.py's tolerance against the naive walk), what a CUDA graph captured there does, and
per-walk times. Run on the GPU (each step in its own process, so that a broken capture cannot spoil the next):

    python3 eval/sm_limited_probe.py green --sms 64 --step walk       # a green context of 64 SMs
    python3 eval/sm_limited_probe.py green --sms 64 --step capture    # the first walk there inside a graph capture
    python3 eval/sm_limited_probe.py plain --step walk                # as the process is (e.g. an MPS client)
    python3 eval/sm_limited_probe.py plain --step forms --programs 132,114,78,66   # plans for fewer SMs, emulated by
                                                                       # head_walk(programs=P) on the whole device
Times are CUDA-graph replays of one walk (median of 7 samples of 10 replays).
"""
import argparse
import contextlib
import json
import pathlib
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "ops"))
import test_head_walk as cases  # noqa: E402  (make_problem, sampling_kwargs, assert_walk_tolerated)

import hybridspec_kernels.head_walk.walk as walk_module  # noqa: E402
from hybridspec_kernels.head_walk import head_walk  # noqa: E402


@triton.jit
def _smid_kernel(out):
    smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(out + tl.program_id(0), smid)


def reached_sms(device_sms: int) -> int:
    out = torch.full((8 * device_sms,), -1, dtype=torch.int32, device="cuda")
    _smid_kernel[(out.numel(),)](out, num_warps=4)
    torch.cuda.synchronize()
    return int(torch.unique(out).numel())


def report(**fields) -> None:
    print(json.dumps(fields), flush=True)


def problem(rows: int, sampled: bool):
    p = cases.make_problem(rows, 15, 32000, rank=256, dtype=torch.bfloat16, seed=rows + 90, scale=0.1, device="cuda")
    p.w2 = p.w2.t().contiguous().t()  # vLLM's layout: markov_w2.weight [V, r] passed as .t()
    kw = dict(cases.sampling_kwargs(p)) if sampled else {}
    return p, kw


def one_walk(p, kw, rows, sampled, **walk_kw):
    cache = torch.zeros(rows, 16, 32000, dtype=torch.bfloat16, device="cuda") if sampled else None
    tokens, _, _ = head_walk(p.U, p.w1, p.w2, p.x0, draft_logits=cache, **kw, **walk_kw)
    return tokens, cache


def checked(p, tokens, sampled, cache) -> str:
    try:
        cases.assert_walk_tolerated(p, tokens, {}, sampled, cache=cache)
        return "ok"
    except AssertionError as exc:
        return f"WRONG: {exc}"


_CAPTURE_STREAM = None


def timed_us(fn, samples: int = 7, replays: int = 10) -> float:
    """us of one fn() replayed from a CUDA graph captured on _CAPTURE_STREAM (the green context's, where set)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=_CAPTURE_STREAM):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / replays)
    return sorted(times)[len(times) // 2]


def step_walk(label: str, device_sms: int, sms: int | None) -> None:
    for rows, sampled in ((1, False), (4, False), (8, True)):
        p, kw = problem(rows, sampled)
        walk_module._cooperative_refused.clear()
        t0 = time.time()
        try:
            tokens, cache = one_walk(p, kw, rows, sampled)
            torch.cuda.synchronize()
            verdict = checked(p, tokens, sampled, cache)
        except Exception as exc:  # noqa: BLE001 (a diagnostic: say what broke)
            report(where=label, rows=rows, sampled=sampled, walk="default", error=repr(exc)[:400])
            continue
        refused = sorted(walk_module._cooperative_refused)
        us = timed_us(lambda: one_walk(p, kw, rows, sampled))
        report(where=label, rows=rows, sampled=sampled, walk="default", refused=refused, drafts=verdict,
               us_per_walk=round(us, 1), first_walk_s=round(time.time() - t0, 2))
        if sms is not None and sms < device_sms:
            walk_module._cooperative_refused.clear()
            try:
                tokens, cache = one_walk(p, kw, rows, sampled, programs=sms)
                torch.cuda.synchronize()
                verdict = checked(p, tokens, sampled, cache)
                us = timed_us(lambda: one_walk(p, kw, rows, sampled, programs=sms))
                report(where=label, rows=rows, sampled=sampled, walk=f"persistent, {sms} programs",
                       refused=sorted(walk_module._cooperative_refused), drafts=verdict, us_per_walk=round(us, 1))
            except Exception as exc:  # noqa: BLE001
                report(where=label, rows=rows, sampled=sampled, walk=f"persistent, {sms} programs",
                       error=repr(exc)[:400])


FORMS = {"default": {}, "no_tma_ring": {"stream_tma": 0}, "gluon": {"gluon": True}}
# Candidate forms for shards of 320..512 rows (fewer SMs): (rows the form is for, head_walk options).
RING = dict(stream_tma=2, tile_rows=128, resident_tiles=2, stream_rows=128)
FORMS2 = {
    "default": (None, {}),
    "gluon_rs2_ring2": ((1,), dict(gluon="rs2_sf_lean_pp", **RING)),
    "gluon_rs2_ring2_128": ((1,), dict(gluon="rs2_sf_lean_pp", stream_tma=2, tile_rows=128, resident_tiles=1,
                                          stream_rows=128)),
    "gluon_rs_ring4": ((1,), dict(gluon="rs_sf_lean", stream_tma=4, tile_rows=128, resident_tiles=1,
                                  stream_rows=64)),
    "triton_256reg_ring3": (None, dict(gluon=False, tile_rows=256, resident_tiles=1, stream_tma=3, stream_rows=64)),
    "triton_2x128_ring3": (None, dict(gluon=False, tile_rows=128, resident_tiles=2, stream_tma=3, stream_rows=64)),
    "triton_256reg_ring2_128": (None, dict(gluon=False, tile_rows=256, resident_tiles=1, stream_tma=2,
                                           stream_rows=128)),
    "rows": ((8,), dict(gluon="rows")),
}


def step_forms(label: str, device_sms: int, programs: list[int]) -> None:
    """Each plan for P SMs (head_walk(programs=P): the shard sizes a P-SM device plans) in its default form and the
    alternatives FORMS names, where they differ from the default plan."""
    for rows, sampled in ((1, False), (1, True), (8, False), (8, True), (32, False)):
        p, kw = problem(rows, sampled)
        for sms in programs:
            base = {} if sms >= device_sms else {"programs": sms}
            cfg = walk_module.plan_walk(32000, 256, rows, 2, torch.device("cuda"), **base)
            for form, extra in FORMS.items():
                if form == "no_tma_ring" and not cfg.stream_tma:
                    continue
                if form == "gluon" and rows > 1:
                    continue
                walk_kw = {**base, **extra}
                walk_module._cooperative_refused.clear()
                try:
                    tokens, cache = one_walk(p, kw, rows, sampled, **walk_kw)
                    torch.cuda.synchronize()
                    verdict = checked(p, tokens, sampled, cache)
                    us = timed_us(lambda: one_walk(p, kw, rows, sampled, **walk_kw))
                    report(where=label, sms=sms, rows=rows, sampled=sampled, form=form, programs=cfg.programs,
                           chunk_rows=cfg.chunk_rows, stream_tma=cfg.stream_tma, drafts=verdict,
                           us_per_walk=round(us, 1))
                except Exception as exc:  # noqa: BLE001
                    report(where=label, sms=sms, rows=rows, sampled=sampled, form=form, error=repr(exc)[:300])


def step_forms2(label: str, device_sms: int, programs: list[int], cases_: list[tuple[int, bool]]) -> None:
    """FORMS2 at each P of `programs` (head_walk(programs=P)): us a walk, drafts, the plan it walked."""
    for rows, sampled in cases_:
        p, kw = problem(rows, sampled)
        for sms in programs:
            base = {} if sms >= device_sms else {"programs": sms}
            for form, (for_rows, extra) in FORMS2.items():
                if for_rows is not None and rows not in for_rows:
                    continue
                walk_kw = {**base, **extra}
                walk_module._cooperative_refused.clear()
                try:
                    tokens, cache = one_walk(p, kw, rows, sampled, **walk_kw)
                    torch.cuda.synchronize()
                    verdict = checked(p, tokens, sampled, cache)
                    us = timed_us(lambda: one_walk(p, kw, rows, sampled, **walk_kw))
                    report(where=label, sms=sms, rows=rows, sampled=sampled, form=form, drafts=verdict,
                           us_per_walk=round(us, 1))
                except Exception as exc:  # noqa: BLE001
                    report(where=label, sms=sms, rows=rows, sampled=sampled, form=form, error=repr(exc)[:300])


def step_capture(label: str) -> None:
    rows, sampled = 1, False
    p, kw = problem(rows, sampled)
    # compile outside the capture (Triton cannot compile inside one) on the full device's plan? No: on this context,
    # with the refusal forgotten afterwards, so that the capture meets the refusal first as a graph captured before
    # any eager walk would.
    one_walk(p, kw, rows, sampled)
    torch.cuda.synchronize()
    eager_refused = sorted(walk_module._cooperative_refused)
    walk_module._cooperative_refused.clear()
    graph = torch.cuda.CUDAGraph()
    out = {}
    try:
        with torch.cuda.graph(graph, stream=_CAPTURE_STREAM):
            out["tokens"], _ = one_walk(p, kw, rows, sampled)
        captured = "captured"
    except Exception as exc:  # noqa: BLE001
        report(where=label, step="capture", eager_refused=eager_refused, capture_error=repr(exc)[:600],
               refused_after=sorted(walk_module._cooperative_refused))
        return
    try:
        graph.replay()
        torch.cuda.synchronize()
        report(where=label, step="capture", eager_refused=eager_refused, result=captured,
               refused_after=sorted(walk_module._cooperative_refused),
               drafts=checked(p, out["tokens"], sampled, None))
    except Exception as exc:  # noqa: BLE001
        report(where=label, step="capture", eager_refused=eager_refused, result=captured,
               replay_error=repr(exc)[:600])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("where", choices=["green", "plain"])
    parser.add_argument("--sms", type=int, default=64)
    parser.add_argument("--step", choices=["walk", "capture", "forms", "forms2"], default="walk")
    parser.add_argument("--programs", default="132,114,78,66")
    args = parser.parse_args()
    torch.cuda.init()
    device_sms = torch.cuda.get_device_properties(0).multi_processor_count
    report(where=args.where, device_sms=device_sms, torch=torch.__version__, reached_sms=reached_sms(device_sms))
    scope = contextlib.nullcontext()
    sms = None
    if args.where == "green":
        from torch.cuda.green_contexts import GreenContext

        ctx = GreenContext.create(num_sms=args.sms, device_id=0)
        global _CAPTURE_STREAM
        if hasattr(ctx, "Stream"):
            _CAPTURE_STREAM = ctx.Stream()
            scope = torch.cuda.stream(_CAPTURE_STREAM)
        else:
            ctx.set_context()
            current = torch.cuda.current_stream()
            _CAPTURE_STREAM = None if current == torch.cuda.default_stream() else current
        report(where="green", context_stream=hasattr(ctx, "Stream"))
        sms = args.sms
    with scope:
        report(where=args.where, props_sms=torch.cuda.get_device_properties(0).multi_processor_count,
               reached_sms_here=reached_sms(device_sms), planned_programs=walk_module.plan_walk(
                   32000, 256, 1, 2, torch.device("cuda")).programs)
        if args.step == "walk":
            step_walk(args.where, device_sms, sms)
        elif args.step == "forms2":
            step_forms2(args.where, device_sms, [int(n) for n in args.programs.split(",")],
                        [(1, False), (1, True), (8, False), (32, False)])
        elif args.step == "forms":
            step_forms(args.where, device_sms, [int(n) for n in args.programs.split(",")])
        else:
            step_capture(args.where)


if __name__ == "__main__":
    main()
