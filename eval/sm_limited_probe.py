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
    python3 eval/sm_limited_probe.py plain --step results --out-jsonl X.jsonl   # head_walk's default vs the Triton
                                                                       # walk (the default before session 20) per P
    python3 eval/sm_limited_probe.py --finalize X.jsonl [Y.jsonl ...] --results-name head_walk_fewer_sms   (here)
Times are CUDA-graph replays of one walk (median of 7 samples of 10 replays).
"""
import argparse
import contextlib
import json
import os
import pathlib
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "ops"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import test_head_walk as cases  # noqa: E402  (make_problem, sampling_kwargs, assert_walk_tolerated)
from _cuda_graph import capture_graph  # noqa: E402

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


def problem(rows: int, sampled: bool, vocab: int = 32000):
    p = cases.make_problem(rows, 15, vocab, rank=256, dtype=torch.bfloat16, seed=rows + 90, scale=0.1, device="cuda")
    p.w2 = p.w2.t().contiguous().t()  # vLLM's layout: markov_w2.weight [V, r] passed as .t()
    kw = dict(cases.sampling_kwargs(p)) if sampled else {}
    return p, kw


def one_walk(p, kw, rows, sampled, vocab=32000, **walk_kw):
    cache = torch.zeros(rows, 16, vocab, dtype=torch.bfloat16, device="cuda") if sampled else None
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
    fn()  # on the current stream (the green context's, where set), not capture_graph's side stream
    torch.cuda.synchronize()
    graph = capture_graph(fn, warmup_calls=0, stream=_CAPTURE_STREAM)
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
# head_walk options of the forms the steps below compare (literals: what each call measured).
STREAM_AUTO = dict(gluon="rs2_sf_lean_pp", stream_tma=2, tile_rows=128, resident_tiles=2, stream_rows=128)
TRITON_2X128 = dict(gluon=False, tile_rows=128, resident_tiles=2, stream_tma=3, stream_rows=64)
TRITON_256 = dict(gluon=False, tile_rows=256, resident_tiles=1, stream_tma=3, stream_rows=64)
# Candidate forms for shards of 320..512 rows (fewer SMs): (rows the form is for, head_walk options).
FORMS2 = {
    "default": (None, {}),
    "gluon_rs2_ring2": ((1,), STREAM_AUTO),
    "gluon_rs2_ring2_128": ((1,), dict(gluon="rs2_sf_lean_pp", stream_tma=2, tile_rows=128, resident_tiles=1,
                                          stream_rows=128)),
    "gluon_rs_ring4": ((1,), dict(gluon="rs_sf_lean", stream_tma=4, tile_rows=128, resident_tiles=1,
                                  stream_rows=64)),
    "triton_256reg_ring3": (None, TRITON_256),
    "triton_2x128_ring3": (None, TRITON_2X128),
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
                time_form(p, kw, rows, sampled, {**base, **extra}, where=label, sms=sms, rows=rows, sampled=sampled,
                          form=form, programs=cfg.programs, chunk_rows=cfg.chunk_rows, stream_tma=cfg.stream_tma)


def time_form(p, kw, rows: int, sampled: bool, walk_kw: dict, **fields) -> None:
    """One walk with walk_kw (its drafts checked), then its CUDA-graph time: a report line with `fields`."""
    walk_module._cooperative_refused.clear()
    try:
        tokens, cache = one_walk(p, kw, rows, sampled, **walk_kw)
        torch.cuda.synchronize()
        verdict = checked(p, tokens, sampled, cache)
        us = timed_us(lambda: one_walk(p, kw, rows, sampled, **walk_kw))
        report(**fields, drafts=verdict, us_per_walk=round(us, 1))
    except Exception as exc:  # noqa: BLE001 (a diagnostic: say what broke)
        report(**fields, error=repr(exc)[:300])


def step_forms2(label: str, device_sms: int, programs: list[int], cases_: list[tuple[int, bool]]) -> None:
    """FORMS2 at each P of `programs` (head_walk(programs=P)): us a walk, drafts, the plan it walked."""
    for rows, sampled in cases_:
        p, kw = problem(rows, sampled)
        for sms in programs:
            base = {} if sms >= device_sms else {"programs": sms}
            for form, (for_rows, extra) in FORMS2.items():
                if for_rows is not None and rows not in for_rows:
                    continue
                time_form(p, kw, rows, sampled, {**base, **extra}, where=label, sms=sms, rows=rows, sampled=sampled,
                          form=form)


# (vocab, rows, sampled, the walk before session 20 at these shards: head_walk options). Before: one row walked the
# Triton walk there (gluon=False; its plan unchanged), several rows of 320..512-row shards choose_streamed_tma's ring.
_BEFORE_RING8 = dict(gluon=False, stream_tma=3, tile_rows=64, resident_tiles=3, num_warps=8)
RESULT_CASES = [(32000, 1, False, {"gluon": False}), (32000, 1, True, {"gluon": False}),
                (32000, 8, False, _BEFORE_RING8), (32000, 8, True, _BEFORE_RING8),
                (151936, 1, False, {"gluon": False}), (151936, 1, True, {"gluon": False}),
                (248320, 1, False, {"gluon": False}),
                (50000, 1, False, {"gluon": False}), (64000, 1, False, {"gluon": False})]


def step_results(label: str, device_sms: int, programs: list[int], out_jsonl: str) -> None:
    """Per P SMs (the plan's SM count set to P: head_walk plans as a P-SM device does) and case: head_walk's default
    and the Triton walk (gluon=False: the default before session 20 at these shard sizes), interleaved A B A B, in
    CUDA-graph replays; rows appended to out_jsonl."""
    real_num_sms = walk_module._num_sms
    with open(out_jsonl, "a") as out:
        for vocab, rows, sampled, before in RESULT_CASES:
            p, kw = problem(rows, sampled, vocab)
            for sms in programs:
                if vocab in (50000, 64000) and sms != device_sms or vocab > 64000 and sms >= 132:
                    continue
                walk_module._num_sms = (lambda device, n=sms: n) if sms < device_sms else real_num_sms
                try:
                    cfg = walk_module.plan_walk(vocab, 256, rows, 2, torch.device("cuda"), sampled=sampled)
                    times = {"ours": [], "triton": []}
                    verdicts = {}
                    for name, opts in (("ours", {}), ("triton", before), ("ours", {}), ("triton", before)):
                        tokens, cache = one_walk(p, kw, rows, sampled, vocab, **opts)
                        torch.cuda.synchronize()
                        verdicts[name] = checked(p, tokens, sampled, cache)
                        times[name].append(timed_us(lambda: one_walk(p, kw, rows, sampled, vocab, **opts)))
                    row = dict(where=label, sms=sms, vocab=vocab, rows=rows, sampled=sampled, programs=cfg.programs,
                               chunk_rows=cfg.chunk_rows,
                               form=rule_form(cfg, rows, sampled, torch.cuda.get_device_capability()),
                               ours_us=round(min(times["ours"]), 1), triton_us=round(min(times["triton"]), 1),
                               ours_us_all=[round(t, 1) for t in times["ours"]],
                               triton_us_all=[round(t, 1) for t in times["triton"]], drafts=verdicts)
                    row["speedup_over_triton"] = round(row["triton_us"] / row["ours_us"], 3)
                except Exception as exc:  # noqa: BLE001
                    row = dict(where=label, sms=sms, vocab=vocab, rows=rows, sampled=sampled, error=repr(exc)[:300])
                finally:
                    walk_module._num_sms = real_num_sms
                report(**row)
                out.write(json.dumps(row) + "\n")


def rule_form(cfg, rows: int, sampled: bool, capability, triton_version: str = triton.__version__) -> str:
    """The walk head_walk's rules pick for the Triton plan cfg of a Markov walk of vLLM's W2 layout (by the rules, not
    observed: a Gluon build that fails would fall back)."""
    reason = walk_module.why_not_gluon_auto(
        cfg, overrides=[], num_rows=rows, head="markov", sampled=sampled, cache=sampled, extras=False,
        dtypes=(torch.bfloat16,) * 3, rank=256, capability=capability, triton_version=triton_version, w2_tma=True)
    if reason is None:
        return walk_module.gluon_auto_form(cfg)[0]
    if cfg.stream_tma:
        return f"triton (ring {cfg.stream_tma} x {cfg.stream_rows}, {cfg.resident_tiles} x {cfg.tile_rows} resident)"
    return "triton"


def form_at_head(row: dict) -> str:
    """rule_form for a results row's case with this checkout's rules (on CPU: the plan as a row["sms"]-SM sm_90
    device with triton 3.6, what the rows ran on, makes it)."""
    saved = walk_module._num_sms, walk_module._interpreting
    walk_module._num_sms, walk_module._interpreting = (lambda device: row["sms"]), (lambda: False)
    try:
        cfg = walk_module.plan_walk(row["vocab"], 256, row["rows"], 2, torch.device("cuda"), sampled=row["sampled"])
        return rule_form(cfg, row["rows"], row["sampled"], (9, 0), "3.6.0")
    finally:
        walk_module._num_sms, walk_module._interpreting = saved


def finalize(paths: list[str], results_name: str) -> None:
    """eval/results/<results_name>.json / .md from step_results' rows (run here, on CPU)."""
    import datetime
    import os

    rows = [json.loads(line) for path in paths for line in open(path) if line.strip()]
    header = [r for r in rows if "device" in r]
    rows = [r for r in rows if "device" not in r]
    assert rows and not [r for r in rows if "error" in r], [r for r in rows if "error" in r]
    assert all(r["drafts"] == {"ours": "ok", "triton": "ok"} for r in rows), "a wrong draft"
    # Several rows on the whole H200 walk resident shards, which session 20 left as they were: no "before" to show.
    rows = [r for r in rows if not (r["rows"] > 1 and r["sms"] >= 132)]
    for r in rows:
        if r["sms"] >= 132 and r["vocab"] == 32000:
            # one 32k row on 132 SMs walked the Gluon resident form before session 20 too: "triton" is not "before"
            r["triton_us"] = r["speedup_over_triton"] = None
            r["note"] = "before session 20 as now (the Gluon resident form): no before / ours ratio"
        current = form_at_head(r)
        if current != r["form"]:
            r["note"] = f"since this run head_walk's rules pick {current} here (not what 'ours' timed)"

    def cell(where, sms, vocab=32000, sampled=False):
        return next((r for r in rows if r["where"] == where and r["sms"] == sms and r["vocab"] == vocab
                     and r["sampled"] == sampled and r["rows"] == 1), None)

    summary = {}
    for where, sms in (("plain", 114), ("plain", 90), ("plain", 78), ("plain", 66), ("mps50", 66)):
        for sampled in (False, True):
            r = cell(where, sms, sampled=sampled)
            if r is not None:
                tag = f"{'mps50_' if where == 'mps50' else ''}p{sms}_b1{'_sampled' if sampled else ''}"
                summary[f"speedup_over_triton_v32k_{tag}"] = r["speedup_over_triton"]
                summary[f"ours_us_v32k_{tag}"] = r["ours_us"]
    for vocab in (50000, 64000):
        r = cell("plain", 132, vocab=vocab)
        if r is not None:
            summary[f"speedup_over_triton_v{vocab // 1000}k_p132_b1"] = r["speedup_over_triton"]
    for where, sms in (("plain", 114), ("plain", 78), ("plain", 66), ("mps50", 66)):
        for vocab, batch, sampled in ((151936, 1, False), (151936, 1, True), (248320, 1, False), (32000, 8, False),
                                      (32000, 8, True)):
            r = next((r for r in rows if r["where"] == where and r["sms"] == sms and r["vocab"] == vocab
                      and r["rows"] == batch and r["sampled"] == sampled), None)
            if r is not None:
                tag = f"{'mps50_' if where == 'mps50' else ''}p{sms}_b{batch}{'_sampled' if sampled else ''}"
                summary[f"speedup_over_before_v{round(vocab / 1000)}k_{tag}"] = r["speedup_over_triton"]
    full = cell("plain", 132)
    if full is not None:
        summary["ours_us_v32k_p132_b1"] = full["ours_us"]
    summary["measures"] = (
        "us a 15-step Markov walk (block 15, rank 256, bf16, vLLM's W2 layout), CUDA-graph replays, best of 2 "
        "interleaved samples (A B A B) each the median of 7 x 10 replays; ours: head_walk's default; before "
        "(triton_us): the walk head_walk took there before session 20 (one row: the Triton walk, gluon=False; 8 rows: "
        "its ring of 3 x 64-row stages with 3 resident 64-row tiles); pP: the plan's SM count set to P on the H200 (a "
        "P-SM device's shards); mps50: a real MPS client at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 (66 SMs reported); "
        "programs / rows a program: the Triton plan's (a Gluon form re-plans in 128-row tiles)")
    result = dict(bench="head_walk_fewer_sms", device=header[0]["device"] if header else "unknown",
                  commit=os.environ.get("HYBRIDSPEC_COMMIT", header[0].get("commit", "") if header else ""),
                  date=datetime.date.today().isoformat(),
                  command=" ; ".join(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 (under nvidia-cuda-mps-control -d) "
                                      if h["where"] == "mps50" else "") + h.get("command", "") for h in header),
                  rows=rows, summary=summary)
    out = pathlib.Path(__file__).resolve().parent / "results"
    (out / f"{results_name}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# {results_name}", "", f"{result['device']}, commit `{result['commit']}`, {result['date']}: "
             f"`{result['command']}`", "", summary["measures"], "",
             "| where | SMs (P) | vocab | batch | sampled | programs | rows a program | form (by the rules) | ours us | "
             "before us | speedup | note |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['where']} | {r['sms']} | {r['vocab']} | {r['rows']} | {r['sampled']} | {r['programs']} | "
                     f"{r['chunk_rows']} | {r['form']} | {r['ours_us']} | {r['triton_us']} | "
                     f"{r['speedup_over_triton']} | {r.get('note', '')} |")
    (out / f"{results_name}.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(summary, indent=1))


# (vocab, rows, sampled, P list, {variant: head_walk options}): session 20's call 5.
FORMS3 = ([(vocab, 1, sampled, (114, 78, 66), {"default": {}, "gluon_stream_auto": STREAM_AUTO})
           for vocab in (151936, 248320) for sampled in (False, True)]
          + [(32000, rows, sampled, (114, 78, 66), {"default": {}, "triton_2x128_ring3": TRITON_2X128,
                                                    "triton_256_ring3": TRITON_256})
             for rows, sampled in ((2, False), (4, False), (8, False), (8, True), (16, False), (32, False))])


# Session 20's call 7: a sampled 152k row over shards between the measured 1,344 and 1,984 rows (P = 100: 1,536 rows;
# P = 90: 1,728).
FORMS4 = [(151936, 1, True, (100, 90), {"default": {}, "gluon_stream_auto": STREAM_AUTO})]


def step_forms3(label: str, forms=None) -> None:
    """FORMS3: each case's variants timed twice, interleaved (A B C A B C), as a P-SM device plans (programs=P)."""
    for vocab, rows, sampled, programs, variants in (FORMS3 if forms is None else forms):
        p, kw = problem(rows, sampled, vocab)
        for sms in programs:
            times = {name: [] for name in variants}
            verdicts = {}
            for _ in range(2):
                for name, extra in variants.items():
                    opts = {"programs": sms, **extra}
                    try:
                        if name not in verdicts:
                            tokens, cache = one_walk(p, kw, rows, sampled, vocab, **opts)
                            torch.cuda.synchronize()
                            verdicts[name] = checked(p, tokens, sampled, cache)
                        times[name].append(round(timed_us(lambda: one_walk(p, kw, rows, sampled, vocab, **opts)), 1))
                    except Exception as exc:  # noqa: BLE001
                        verdicts[name] = repr(exc)[:200]
            report(where=label, sms=sms, vocab=vocab, rows=rows, sampled=sampled, us=times, drafts=verdicts)


def step_capture(label: str) -> None:
    rows, sampled = 1, False
    p, kw = problem(rows, sampled)
    # Compiled by an eager walk in this context (Triton cannot compile inside a capture), its refusal then forgotten,
    # so that the capture meets the refusal first, as a graph captured before any eager walk would.
    one_walk(p, kw, rows, sampled)
    torch.cuda.synchronize()
    eager_refused = sorted(walk_module._cooperative_refused)
    walk_module._cooperative_refused.clear()
    out = {}

    def walk_into_out():
        out["tokens"], _ = one_walk(p, kw, rows, sampled)

    try:
        graph = capture_graph(walk_into_out, warmup_calls=0, stream=_CAPTURE_STREAM)
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
    parser.add_argument("where", choices=["green", "plain", "mps50"], nargs="?")
    parser.add_argument("--out-jsonl")
    parser.add_argument("--finalize", nargs="+")
    parser.add_argument("--results-name", default="head_walk_fewer_sms")
    parser.add_argument("--sms", type=int, default=64)
    parser.add_argument("--step", choices=["walk", "capture", "forms", "forms2", "forms3", "forms4", "results"], default="walk")
    parser.add_argument("--programs", default="132,114,78,66")
    args = parser.parse_args()
    if args.finalize:
        finalize(args.finalize, args.results_name)
        return
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
        elif args.step == "results":
            with open(args.out_jsonl, "a") as out:
                out.write(json.dumps(dict(where=args.where, device=torch.cuda.get_device_name(0),
                                          commit=os.environ.get("HYBRIDSPEC_COMMIT", ""),
                                          command=" ".join(["python3"] + sys.argv))) + "\n")
            step_results(args.where, device_sms, [int(n) for n in args.programs.split(",")], args.out_jsonl)
        elif args.step == "forms3":
            step_forms3(args.where)
        elif args.step == "forms4":
            step_forms3(args.where, FORMS4)
        elif args.step == "forms2":
            step_forms2(args.where, device_sms, [int(n) for n in args.programs.split(",")],
                        [(1, False), (1, True), (8, False), (32, False)])
        elif args.step == "forms":
            step_forms(args.where, device_sms, [int(n) for n in args.programs.split(",")])
        else:
            step_capture(args.where)


if __name__ == "__main__":
    main()
