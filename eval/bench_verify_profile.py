"""Verification latency profile T(batch, L) of a hybrid GDN + MoE target at real shapes (issue 5).

A Qwen3.6-35B-A3B-shaped target with random bf16 weights (eval/verify_model/) runs decode-time verify passes:
B requests x L tokens, each request with --ctx tokens already in the attention KV cache. Every (variant, B, L)
whole pass is captured in one CUDA graph and timed by replay (median); each layer type (GDN mixers, attention
mixers, MoE blocks, the rest: embedding, norms, LM head) is also captured and timed on its own for the
breakdown. MoE: vLLM 0.33's fused-MoE Triton kernel with its own launcher, tuned-config lookup and default rule (expert
alignment by moe_align.py, one Triton launch for vLLM's CUDA op) or OpenAI's triton_kernels; a probe (child
process) checks every option against the torch reference and takes the fastest correct one.
MoE routing is imposed from a synthetic model (eval/verify_model/routing.py) whose one correlation
parameter rho is calibrated on the GPU, by bisection, so that the baseline's T(16)/T(4) - 1 at batch 1 equals
the published 0.71; every figure is also reported at rho = 0 (independent) and rho = 0.95 (strongly shared).

Variants:
    baseline     vLLM 0.33's GDN verify path (per-token state writes into L slots)
    ours         hybridspec_kernels.gdn_verify + one gdn_reconstruct launch for all layers (all tokens accepted)
    ours_probe   ours + the routing-correction probe: embedding + layer 0 (GDN) + router on L + 1 tokens

GPU (one call does everything):
    python eval/bench_verify_profile.py --prepare          # here: extract vLLM / OpenAI Triton sources
    python eval/bench_verify_profile.py --out $OUT         # there
    python eval/bench_verify_profile.py --finalize DIR     # here: copy results into eval/results + plots
CPU smoke (tiny shapes, torch paths, wall-clock timing):
    python eval/bench_verify_profile.py --tiny --out /tmp/vp
CPU end to end on the Triton kernels (tiny shapes, fp32, interpreter; after --prepare):
    TRITON_INTERPRET=1 python eval/bench_verify_profile.py --tiny --interpret --out /tmp/vp
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

EVAL = Path(__file__).resolve().parent
sys.path.insert(0, str(EVAL))

from _cuda_graph import capture_graph  # noqa: E402

BENCH = "verify_profile"
PUBLISHED_GROWTH_4_TO_16 = 0.71   # Qwen3.6-35B-A3B + DFlash, verify time L=4 -> L=16 (anchors.md)
STRONG_RHO = 0.95
PROFILE_FILE = "latency_profile_{model}_{device}.json"
# MoE configurations tried (in a child process: a bad one can fault the GPU context) before the sweep; the
# fastest one (geometric mean of CUDA-graph times over MOE_TIME_TOKENS) that matches the torch reference on
# every routing pattern is used. vllm_*: vLLM's fused_moe_kernel; "lookup" = vLLM's own config lookup on this
# device (its configs/ file for the device name, else get_default_config), "tuned" = the wheel's H200 file for
# the shape, else its H100 (Hopper) one, through VLLM_TUNED_CONFIG_FOLDER. oai_*: OpenAI's matmul_ogs, "default"
# = its own heuristics, the other pins split_k / persistence; ids imposed as a -inf router bias ("mask").
MOE_OPTIONS = [
    {"name": "vllm_fused_lookup", "impl": "vllm", "config": "lookup"},
    {"name": "vllm_fused_tuned", "impl": "vllm", "config": "tuned"},
    {"name": "oai_split1_nonpersistent_mask", "impl": "oai", "constraints": {"split_k": 1, "is_persistent": False},
     "routing": "mask"},
    {"name": "oai_default_mask", "impl": "oai", "constraints": {}, "routing": "mask"},
]
# imposing the ids through routing(expt_indx=...) gave wrong outputs and an illegal address in calls 1-2:
# only with --moe-options all
MOE_OPTIONS_WRONG_BEFORE = [
    {"name": "oai_split1_nonpersistent_provided", "impl": "oai", "constraints": {"split_k": 1, "is_persistent": False},
     "routing": "provided"},
    {"name": "oai_default_provided", "impl": "oai", "constraints": {}, "routing": "provided"},
]
MOE_TOL = 2e-2
LENGTH_PRIORITY = [1, 4, 16, 8, 2, 12, 17, 3, 6, 10, 14, 5, 7, 9, 11, 13, 15]


def load_latency_profile_module():
    """vllm_hybridspec/latency_profile.py by path: stdlib only, and the repo root must not go on sys.path."""
    path = EVAL.parent / "vllm_hybridspec" / "latency_profile.py"
    spec = importlib.util.spec_from_file_location("hybridspec_latency_profile", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def parse_list(text, kind=int):
    out = []
    for part in text.split(","):
        if "-" in part and kind is int:
            a, b = part.split("-")
            out += list(range(int(a), int(b) + 1))
        elif part:
            out.append(kind(part))
    return out


# ------------------------------------------------------------------------------------------------- timing
class GraphTimer:
    """Capture a callable in a CUDA graph; time replays with events (median)."""

    def __init__(self, torch, target_s=0.08, min_reps=5, max_reps=25):
        self.torch, self.target_s, self.min_reps, self.max_reps = torch, target_s, min_reps, max_reps

    def build(self, fn):
        return capture_graph(fn)

    def time_us(self, graph) -> float:
        torch = self.torch
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        first = start.elapsed_time(end) / 1e3
        reps = int(min(self.max_reps, max(self.min_reps, self.target_s / max(first, 1e-6))))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for s, e in events:
            s.record()
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)


class EagerTimer:
    """CPU smoke: wall clock of eager calls (meaningless as latency, exercises the pipeline)."""

    def __init__(self, reps=2):
        self.reps = reps

    def build(self, fn):
        fn()
        return fn

    def time_us(self, fn) -> float:
        ts = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(ts)


# ------------------------------------------------------------------------------------------------- measurement
def routing_ids(model, batch, length, rho, args):
    from verify_model.routing import synthetic_routing
    s = model.s
    # common random numbers: the same seed per (batch, length) for every rho, as in the calibration
    return synthetic_routing(batch, length, len(model.moes), s.num_experts, s.top_k, rho, args.zipf,
                             seed=1000 * batch + length)


def calibrate_rho(model, timer, args, log):
    """Bisection over rho so that baseline T(1, 16) / T(1, 4) - 1 = target (whole-pass graphs, batch 1)."""
    target = args.calibrate_target
    lengths = (4, 16)
    bufs = {L: model.prepare(1, L, seed=L) for L in lengths}
    for L in lengths:
        model.set_routing(bufs[L], routing_ids(model, 1, L, 0.0, args))
    graphs = {L: timer.build(lambda L=L: model.forward(bufs[L], "baseline")) for L in lengths}
    trace = []

    def growth(rho):
        t = {}
        for L in lengths:
            model.set_routing(bufs[L], routing_ids(model, 1, L, rho, args))
            t[L] = timer.time_us(graphs[L])
        g = t[16] / t[4] - 1
        trace.append({"rho": rho, "t4_us": t[4], "t16_us": t[16], "growth": g})
        log(f"  calibrate rho={rho:.4f}: T(4)={t[4]:.0f} us T(16)={t[16]:.0f} us growth={g:.3f}")
        return g

    g_lo, g_hi = growth(0.0), growth(1.0)
    if g_lo <= target:
        rho, status = 0.0, "unreachable: independent routing already grows less than the target"
    elif g_hi >= target:
        rho, status = 1.0, "unreachable: fully shared routing still grows more than the target"
    else:
        lo, hi = 0.0, 1.0
        for _ in range(args.calibrate_iters):
            mid = (lo + hi) / 2
            if growth(mid) > target:
                lo = mid
            else:
                hi = mid
        # the endpoint whose measured growth is nearest the target
        near = min((p for p in trace if lo <= p["rho"] <= hi), key=lambda p: abs(p["growth"] - target))
        rho, status = near["rho"], "bisection"
    del graphs
    return {"rho": rho, "status": status, "target_growth": target, "iterations": trace,
            "method": f"bisection on rho in [0, 1], {args.calibrate_iters} steps, whole-pass baseline CUDA graphs at "
                      f"batch 1, L = 4 and 16, same routing seeds as the sweep"}


def measure_config(model, timer, batch, length, rhos, variants, args, log):
    """All graphs of one (batch, L); returns rows (one per variant x rho)."""
    from verify_model.routing import unique_experts
    buf = model.prepare(batch, length, seed=batch * 100 + length)
    ids = {rho: routing_ids(model, batch, length, rho, args) for rho in rhos}
    model.set_routing(buf, ids[rhos[0]])
    fns = {
        "whole_baseline": lambda: model.forward(buf, "baseline"),
        "gdn_baseline": lambda: model.forward(buf, "baseline", parts=("gdn",)),
        "attention": lambda: model.forward(buf, "baseline", parts=("attention",)),
        "moe": lambda: model.forward(buf, "baseline", parts=("moe",)),
        "rest": lambda: model.forward(buf, "baseline", parts=("rest",)),
    }
    if "ours" in variants:
        fns["whole_ours"] = lambda: model.forward(buf, "ours")
        fns["gdn_ours"] = lambda: model.forward(buf, "ours", parts=("gdn",))
    if "ours_probe" in variants:
        pbuf = model.prepare(batch, length + 1, seed=batch * 100 + length + 50)
        fns["probe"] = lambda: model.probe(pbuf)
    rho_dependent = ("whole_baseline", "whole_ours", "moe")
    graphs, errors = {}, {}
    for name, fn in fns.items():
        try:
            graphs[name] = timer.build(fn)
        except Exception as e:  # keep the rest of the sweep alive; the row records what failed
            errors[name] = f"{type(e).__name__}: {e}"[:300]
            log(f"  ! {name} B={batch} L={length}: {errors[name]}")
    t_fixed = {n: timer.time_us(g) for n, g in graphs.items() if n not in rho_dependent}
    rows = []
    for rho in rhos:
        model.set_routing(buf, ids[rho])
        t = dict(t_fixed)
        t.update({n: timer.time_us(g) for n, g in graphs.items() if n in rho_dependent})
        ue = unique_experts(ids[rho], batch)
        for variant in variants:
            gdn_key = "gdn_baseline" if variant == "baseline" else "gdn_ours"
            whole_key = "whole_baseline" if variant == "baseline" else "whole_ours"
            if whole_key not in t or (variant == "ours_probe" and "probe" not in t):
                continue
            probe = t.get("probe", 0.0) if variant == "ours_probe" else 0.0
            parts = {"gdn": t.get(gdn_key, float("nan")), "attention": t.get("attention", float("nan")),
                     "moe": t.get("moe", float("nan")), "rest": t.get("rest", float("nan")) + probe}
            row = {"variant": variant, "rho": round(rho, 4), "batch": batch, "L": length,
                   "t_us": round(t[whole_key] + probe, 2),
                   **{f"{k}_us": round(v, 2) for k, v in parts.items()},
                   "parts_sum_us": round(sum(parts.values()), 2),
                   "probe_us": round(probe, 2) if variant == "ours_probe" else None,
                   "unique_experts_batch": ue["per_batch"], "unique_experts_request": round(ue["per_request"], 3)}
            rows.append(row)
    del graphs
    if errors:
        for r in rows:
            r["errors"] = errors
    return rows


def scale_rows(rows, measured_layers, full_layers):
    """--layers < full: per-layer parts scale by full/measured; embedding, norms and LM head are not scaled."""
    f = full_layers / measured_layers
    for r in rows:
        layer_part = r["gdn_us"] + r["attention_us"] + r["moe_us"]
        r["t_us_measured"] = r["t_us"]
        r["t_us"] = round(r["t_us"] + (f - 1) * layer_part, 2)
        for k in ("gdn_us", "attention_us", "moe_us"):
            r[k] = round(r[k] * f, 2)
    return rows


def configure_moe(kernels, option):
    """Point `kernels` at one MoE option (vLLM's fused kernel with a config mode, or OAI with constraints)."""
    from verify_model import kernels_loader as kl
    if option["impl"] == "vllm":
        kernels.moe_impl = "vllm"
        kernels.vllm_moe = kl.load_vllm_moe(option["config"])
    else:
        kernels.moe_impl = "oai"
        if kernels.oai_moe is None:
            kernels.oai_moe = kl.load_oai_moe()
        kernels.oai_moe.reset_opt_flags_constraints()
        kernels.oai_moe.update_opt_flags_constraints(option["constraints"])
        kernels.moe_routing = option["routing"]
    return kernels


def moe_probe_child(args):
    """--moe-probe: test MoE options on one real-shaped layer (GPU, bf16) or a tiny one (CPU interpreter, fp32);
    one JSON line per option on stdout."""
    import torch
    from verify_model import checks as chk
    from verify_model.model import Kernels, MoELayer
    from verify_model.shapes import SHAPES
    gpu = torch.cuda.is_available()
    shape = SHAPES[args.shape if gpu else "tiny"]
    device, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    gen = torch.Generator(device=device).manual_seed(5)
    layers = {}
    for opt in json.loads(args.moe_probe):
        print(f"MOE_START {opt['name']}", flush=True)
        try:
            kernels = configure_moe(Kernels(fused="triton"), opt)
            layout = "vllm" if opt["impl"] == "vllm" else "oai"
            if layout not in layers:
                layers.clear()  # one real-shaped layer at a time (1.5 GiB each)
                layers[layout] = MoELayer(shape, device, dtype, gen, layout=layout)
            res = chk.check_moe_option(layers[layout], shape, kernels, gen,
                                       time_tokens=chk.MOE_TIME_TOKENS if gpu else ())
            if opt["impl"] == "vllm":
                from verify_model.vllm_moe import describe_configs
                res["configs"] = describe_configs(kernels.vllm_moe, shape.num_experts, 2 * shape.expert_inter,
                                                  shape.hidden, shape.top_k, dtype, chk.MOE_TIME_TOKENS)
        except Exception as e:
            res = {"error": f"{type(e).__name__}: {e}"[:300], "max_err": float("inf")}
        res["name"] = opt["name"]
        print("MOE_OPTION " + json.dumps(_json_safe(res)), flush=True)


def _geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("inf")


def select_moe_option(args, log, options):
    import subprocess
    remaining, results = list(options), []
    for _ in range(3):
        if not remaining:
            break
        cmd = [sys.executable, str(Path(__file__).resolve()), "--moe-probe", json.dumps(remaining), "--shape", args.shape]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.probe_timeout_s)
            out, rc, err = proc.stdout, proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc, err = -1, "timeout"
        started = [l.split(" ", 1)[1] for l in out.splitlines() if l.startswith("MOE_START ")]
        for line in out.splitlines():
            if line.startswith("MOE_OPTION "):
                r = json.loads(line.split(" ", 1)[1])
                r["max_err"] = float(r["max_err"])
                results.append(r)
                log(f"  moe option {r['name']}: max_err={r['max_err']:.2e} graph_us="
                    f"{ {k: round(v, 1) for k, v in r.get('graph_us', {}).items()} } {r.get('error', '')}")
        done = {r["name"] for r in results}
        if rc != 0:
            crashed = next((n for n in started if n not in done), None)
            log(f"  moe probe exited {rc} during {crashed}: {err[-300:]}")
            if crashed:
                results.append({"name": crashed, "max_err": float("inf"), "error": f"process died (rc={rc})"})
                done.add(crashed)
        remaining = [o for o in remaining if o["name"] not in done]
        if rc == 0:
            break
    good = [r for r in results if r["max_err"] < MOE_TOL]
    if not good:
        return None, results
    timed = [r for r in good if r.get("graph_us")]
    # no timings (CPU interpreter): the first correct option in list order
    best = min(timed, key=lambda r: _geomean(r["graph_us"].values())) if timed else good[0]
    for r in results:
        r["graph_us_geomean"] = round(_geomean(r.get("graph_us", {}).values()), 2) if r.get("graph_us") else None
    return next(o for o in options if o["name"] == best["name"]), results


# ------------------------------------------------------------------------------------------------- results
def build_profiles(lp, rows, device, model_name, rho, variants, meta):
    sel = [r for r in rows if r["rho"] == round(rho, 4)]
    profiles = []
    for variant in variants:
        vr = [r for r in sel if r["variant"] == variant]
        measured = {b: {r["L"] for r in vr if r["batch"] == b} for b in {r["batch"] for r in vr}}
        if not measured:
            continue
        # a batch the time budget cut short would shrink every batch's length grid to its few lengths: leave it out
        most = max(len(ls) for ls in measured.values())
        batches = sorted(b for b, ls in measured.items() if len(ls) == most)
        lengths = sorted(set.intersection(*(measured[b] for b in batches)))
        if not lengths:
            continue
        at = {(r["batch"], r["L"]): r for r in vr}
        table = lambda key: [[at[(b, L)][key] for L in lengths] for b in batches]
        profiles.append(lp.LatencyProfile(
            device=device, model=model_name, variant=variant, batch_sizes=batches, lengths=lengths,
            t_us=table("t_us"),
            per_layer_type={k: table(f"{k}_us") for k in ("gdn", "attention", "moe", "rest")},
            unique_experts=table("unique_experts_batch"),
            meta={**meta, "rho": rho, "partial_batches_left_out": sorted(set(measured) - set(batches))}))
    return profiles


def summarize(rows, rho, variants):
    def t(variant, b, L):
        for r in rows:
            if r["variant"] == variant and r["batch"] == b and r["L"] == L and r["rho"] == round(rho, 4):
                return r["t_us"]
        return None

    out = {}
    base4, base16 = t("baseline", 1, 4), t("baseline", 1, 16)
    if base4 and base16:
        out["baseline_growth_4_to_16"] = round(base16 / base4 - 1, 4)
    best = "ours_probe" if "ours_probe" in variants and t("ours_probe", 1, 16) else "ours"
    for name, variant in (("", best), ("_no_correction", "ours")):
        o4, o16 = t(variant, 1, 4), t(variant, 1, 16)
        if o4 and o16 and base16:
            out[f"ours{name}_growth_4_to_16"] = round(o16 / o4 - 1, 4)
            out[f"verify_speedup_L16_b1{name}"] = round(base16 / o16, 4)
    out["ours_variant"] = best
    return out


def markdown_report(doc):
    s = doc["summary"]
    lines = [f"# {doc['bench']}", "", f"device: {doc['device']}, commit {doc['commit'][:12]}, {doc['date']}", "",
             f"command: `{doc['command']}`", "", "| summary | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in s.items() if not isinstance(v, dict)]
    cal = doc.get("calibration", {})
    lines += ["", f"calibrated rho = {cal.get('rho')} ({cal.get('status')}); {cal.get('method', '')}", ""]
    if cal.get("iterations"):
        lines += ["calibration steps (rho -> baseline growth 4 -> 16 at batch 1): " +
                  ", ".join(f"{p['rho']:.4f} -> {p['growth']:.3f}" for p in cal["iterations"]), ""]
    moe = doc.get("meta", {}).get("moe", {})
    if moe.get("option"):
        lines += [f"MoE: {moe['option'].get('name')} ({moe.get('configs', {}).get('source', '')}); probe: " +
                  ", ".join(f"{r['name']} err {float(r['max_err']):.1e} geomean {r.get('graph_us_geomean')} us"
                            for r in moe.get("probe") or []), ""]
    by_rho = s.get("by_rho", {})
    keys = list(dict.fromkeys(k for v in by_rho.values() for k in v if k != "ours_variant"))
    if keys:
        lines += ["| summary by rho | " + " | ".join(by_rho) + " |", "|---|" + "---|" * len(by_rho)]
        lines += [f"| {k} | " + " | ".join(str(by_rho[r].get(k, "")) for r in by_rho) + " |" for k in keys]
        lines.append("")
    blocks = [("", doc["rows"])]
    x = doc.get("extra_shape") or {}
    if x.get("rows"):
        blocks.append((f"{x['shape']} ({x['meta']['layers_measured']} of {x['meta']['layers_full']} layers measured, "
                       f"scaled), ", x["rows"]))
    for title, rows in blocks:
        lines += _rows_tables(title, rows, doc["rhos"])
    return "\n".join(lines) + "\n"


def _rows_tables(title, all_rows, rhos):
    lines = []
    for rho in rhos:
        lines += [f"## {title}rho = {rho}", "", "| B | L | baseline us | ours us | ours+probe us | gdn base/ours us | attn us | "
                  "moe us | rest us | unique experts |", "|---|---|---|---|---|---|---|---|---|---|"]
        by = {}
        for r in all_rows:
            if r["rho"] == rho:
                by.setdefault((r["batch"], r["L"]), {})[r["variant"]] = r
        for (b, L), v in sorted(by.items()):
            base, ours, probe = v.get("baseline", {}), v.get("ours", {}), v.get("ours_probe", {})
            lines.append(f"| {b} | {L} | {base.get('t_us', '')} | {ours.get('t_us', '')} | {probe.get('t_us', '')} | "
                         f"{base.get('gdn_us', '')} / {ours.get('gdn_us', '')} | {base.get('attention_us', '')} | "
                         f"{base.get('moe_us', '')} | {base.get('rest_us', '')} | {base.get('unique_experts_batch', '')} |")
        lines.append("")
    return lines


def _json_safe(obj):
    """Non-finite floats (failed checks) as strings: the files stay strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def device_tag(device: str) -> str:
    return "h200" if "H200" in device else "cpu" if device.startswith("cpu") else device.split()[-1].lower()


def profile_meta(meta: dict) -> dict:
    """The profile files carry the MoE choice in brief (the probe details stay in the result file)."""
    moe = meta.get("moe") or {}
    if "probe" not in moe:
        return meta
    option = moe.get("option")
    return {**meta, "moe": {"option": option.get("name") if isinstance(option, dict) else option,
                            "impl": moe.get("impl"), "configs": (moe.get("configs") or {}).get("source")}}


def extra_prefix(shape_name: str) -> str:
    return "qwen3_next_" if shape_name.startswith("qwen3_next") else f"{shape_name}_"


def write_all(out_dir, args, device, rows, calibration, rhos, variants, checks, meta, lp, model_name, extra=None):
    from _results import write_results
    rho_cal = calibration["rho"]
    summary = summarize(rows, rho_cal, variants)
    summary["calibrated_rho"] = rho_cal
    summary["moe_option"] = checks.get("moe_option")
    summary["by_rho"] = {str(r): summarize(rows, r, variants) for r in rhos}
    full_meta, meta = meta, profile_meta(meta)
    extra_profiles = []
    dev_tag = device_tag(device)
    if extra and extra.get("rows"):
        prefix = extra_prefix(extra["shape"])
        for r in rhos:
            for k, v in extra["summary_by_rho"][str(r)].items():
                if k != "ours_variant":
                    summary["by_rho"][str(r)][prefix + k] = v
        summary.update({prefix + k: v for k, v in extra["summary_by_rho"][str(rho_cal)].items()
                        if k != "ours_variant"})
        extra_profiles = build_profiles(lp, extra["rows"], device, extra["shape"], rho_cal, variants,
                                        {**extra["meta"], "moe": meta["moe"]})
    profiles = build_profiles(lp, rows, device, model_name, rho_cal, variants, meta)
    default = summary.get("ours_variant", "baseline")
    if default not in {p.variant for p in profiles}:
        default = profiles[0].variant if profiles else None
    payload = {
        "calibration": calibration, "rhos": [round(r, 4) for r in rhos], "checks": checks, "meta": full_meta,
        "default_variant": default,
        "profiles": [p.to_dict() for p in profiles],
        "profiles_by_rho": {str(round(r, 4)): [p.to_dict() for p in build_profiles(lp, rows, device, model_name, r,
                                                                                    variants, meta)] for r in rhos},
    }
    if extra:
        payload["extra_shape"] = extra
    payload = _json_safe(payload)
    command = " ".join(["python", "eval/bench_verify_profile.py"] + sys.argv[1:])
    path = write_results(BENCH, rows, summary, command, device, out_dir, extra=payload)
    doc = json.loads(path.read_text())
    (Path(out_dir) / f"{BENCH}.md").write_text(markdown_report(doc))
    if profiles:
        lp.save_profiles(Path(out_dir) / PROFILE_FILE.format(model=model_name, device=dev_tag), profiles, default)
    if extra_profiles:
        x_default = default if default in {p.variant for p in extra_profiles} else extra_profiles[0].variant
        x_model = extra["shape"] if extra["shape"] != model_name else extra["shape"] + "_extra"  # (smoke test)
        lp.save_profiles(Path(out_dir) / PROFILE_FILE.format(model=x_model, device=dev_tag), extra_profiles,
                         x_default)
    return summary


# ------------------------------------------------------------------------------------------------- main
def run(args):
    import torch
    from verify_model import checks as chk
    from verify_model import kernels_loader as kl
    from verify_model.model import Kernels, VerifyModel
    from verify_model.shapes import SHAPES
    lp = load_latency_profile_module()
    t_start = time.time()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = open(out_dir / "verify_profile_log.txt", "a")

    def log(msg):
        line = f"[{time.time() - t_start:7.1f}s] {msg}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    gpu = not args.tiny
    if args.interpret and (not args.tiny or os.environ.get("TRITON_INTERPRET") != "1"):
        raise ValueError("--interpret needs --tiny and TRITON_INTERPRET=1 in the environment")
    triton_paths = gpu or args.interpret
    shape = SHAPES["tiny" if args.tiny else args.shape]
    full_layers = shape.num_layers
    if args.layers:
        shape = shape.with_layers(args.layers)
    variants = [v for v in parse_list(args.variants, str)]
    if triton_paths:
        if gpu:
            device, dtype, device_name = "cuda", torch.bfloat16, torch.cuda.get_device_name()
        else:
            device, dtype, device_name = "cpu", torch.float32, "cpu (Triton interpreter, eager wall clock)"
            sys.path.insert(0, str(EVAL))
            from _vllm_sources import fix_interpreter_masks
            fix_interpreter_masks()
        kernels = Kernels(fused="triton", vllm_gdn=kl.load_vllm_gdn(), attention="flash_gqa" if gpu else "math")
        try:
            kernels.ours_gdn = kl.load_ours()
        except Exception as e:
            log(f"ours unavailable ({e}); baseline only")
            variants = ["baseline"]
        timer = GraphTimer(torch) if gpu else EagerTimer(reps=1)
    else:
        device, dtype, device_name = "cpu", torch.float32, "cpu (smoke, eager wall clock)"
        kernels = Kernels(fused="torch", attention="math")
        timer = EagerTimer()
    gen = torch.Generator(device=device).manual_seed(0)
    checks = {}
    moe_probe, moe_meta = None, {"impl": kernels.moe_impl}
    if triton_paths:
        if args.moe_options == "default":
            options = MOE_OPTIONS
        elif args.moe_options == "all":
            options = MOE_OPTIONS + MOE_OPTIONS_WRONG_BEFORE
        else:
            names = set(args.moe_options.split(","))
            options = [o for o in MOE_OPTIONS + MOE_OPTIONS_WRONG_BEFORE if o["name"] in names]
        option, moe_probe = select_moe_option(args, log, options)
        if option is None:
            log("!! no MoE configuration matches the reference; stopping")
            (out_dir / "verify_profile_moe_probe.json").write_text(json.dumps(_json_safe(moe_probe), indent=1))
            raise SystemExit(2)
        configure_moe(kernels, option)
        checks["moe_option"] = option["name"]
        moe_meta = {"option": option, "impl": kernels.moe_impl, "probe": moe_probe,
                    "selection": "fastest correct option by the geometric mean of CUDA-graph times over "
                                 f"{list(chk.MOE_TIME_TOKENS)} tokens (CPU: first correct)"}
        log(f"moe: {option}")
        checks.update(chk.check_fused_ops(device, dtype, gen))
        if gpu:
            for mode in ("flash_gqa", "efficient_folded"):
                try:
                    err = chk.check_attention(mode, device, dtype, gen)
                except Exception as e:
                    log(f"attention mode {mode} failed: {type(e).__name__}: {e}"[:300])
                    continue
                checks[f"attention_{mode}"] = err
                if err < 2e-2:
                    kernels.attention = mode
                    break
            else:
                kernels.attention = "math"
        log(f"attention: {kernels.attention}")
    batches = parse_list(args.batches)
    lengths = parse_list(args.lengths)
    t0 = time.time()
    model = VerifyModel(shape, device=device, dtype=dtype, max_batch=max(batches), max_len=max(lengths),
                        ctx_len=args.ctx, kernels=kernels, seed=0)
    if gpu:
        torch.cuda.synchronize()
        log(f"model built in {time.time() - t0:.1f}s, {torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated")
    run_model_checks(model, kernels, shape, batches, lengths, variants, checks, gen, gpu, log)
    variants = checks.pop("_variants", variants)
    if kernels.moe_impl == "vllm" and kernels.vllm_moe is not None:
        from verify_model.vllm_moe import describe_configs
        tokens = sorted({b * L for b in batches for L in lengths})
        moe_meta["configs"] = describe_configs(kernels.vllm_moe, shape.num_experts, 2 * shape.expert_inter,
                                               shape.hidden, shape.top_k, dtype, tokens)
        log(f"moe configs: {moe_meta['configs']['source']}")
    model.reset_states()
    log("checks: " + ", ".join(f"{k}={v:.2e}" for k, v in checks.items() if isinstance(v, float)))
    bad = {k: v for k, v in checks.items() if isinstance(v, float) and not k.endswith("states_changed")
           and not (v < 2e-2)}
    if bad:
        log(f"!! checks above tolerance: {bad}")
    meta = {"shape": shape.name, "layers_measured": shape.num_layers, "layers_full": full_layers,
            "ctx_len": args.ctx, "zipf_s": args.zipf, "dtype": str(dtype), "attention": kernels.attention,
            "timing": "CUDA graph per whole pass and per layer type, median of replays" if gpu else "eager wall clock",
            "gdn_ssm_state": "fp32", "ours_accepted": "all L tokens reconstructed (worst case)",
            "ours_projection": "one fused qkvz GEMM, gdn_verify reads the column slices (as the baseline)",
            "moe": moe_meta}

    # calibration
    if args.rho is not None or not {4, 16} <= set(lengths):
        rho = args.rho if args.rho is not None else 0.5
        calibration = {"rho": rho, "status": "not calibrated (given, or L = 4 / 16 not measured)", "iterations": []}
    else:
        log("calibrating rho")
        calibration = calibrate_rho(model, timer, args, log)
    rho_cal = calibration["rho"]
    log(f"rho = {rho_cal:.4f} ({calibration['status']})")
    rhos = [rho_cal] + [r for r in (0.0, STRONG_RHO) if abs(r - rho_cal) > 1e-9]
    model.reset_states()

    extra_on = bool(args.extra_shape) and args.extra_layers >= 0
    main_budget = args.budget_s - (args.extra_reserve_s if extra_on else 0) if args.budget_s else 0
    model_name = shape.name if shape.num_layers == full_layers else f"{shape.name}_scaled_from_{shape.num_layers}"
    rows = sweep(model, timer, batches, lengths, rhos, variants, args, log, t_start, main_budget,
                 shape.num_layers, full_layers, rho_cal,
                 on_batch=lambda rows: write_all(out_dir, args, device_name, rows, calibration, rhos, variants,
                                                 checks, meta, lp, model_name))
    summary = write_all(out_dir, args, device_name, rows, calibration, rhos, variants, checks, meta, lp, model_name)
    extra = None
    if extra_on:
        elapsed = time.time() - t_start
        if args.budget_s and elapsed > args.budget_s - 20:
            log(f"skip {args.extra_shape}: budget ({elapsed:.0f}s used)")
        else:
            del model
            import gc
            gc.collect()
            if gpu:
                torch.cuda.empty_cache()
            try:
                extra = run_extra_shape(args, kernels, device, dtype, timer, rhos, variants, rho_cal, checks, log,
                                        t_start, gen, gpu)
            except Exception as e:  # the main profile is written already
                log(f"!! {args.extra_shape} failed: {type(e).__name__}: {e}"[:400])
                extra = {"error": f"{type(e).__name__}: {e}"[:300]}
            summary = write_all(out_dir, args, device_name, rows, calibration, rhos, variants, checks, meta, lp,
                                model_name, extra=extra)
    log("summary: " + json.dumps({k: v for k, v in summary.items() if k != "by_rho"}))
    # short table last (the device reply carries the end of stdout)
    print(f"\nMoE: {checks.get('moe_option')} ({moe_meta.get('configs', {}).get('source', '')})")
    for r in moe_probe or []:
        print(f"  {r['name']}: max_err={r['max_err']:.2e} geomean_us={r.get('graph_us_geomean')} "
              f"{r.get('graph_us', '')} {r.get('error', '')}")
    print(f"calibration: rho={rho_cal} ({calibration['status']}): " +
          " ".join(f"{p['rho']:.3f}->{p['growth']:.3f}" for p in calibration.get("iterations", [])))
    for b in batches:
        print(f"\nB={b}, rho={rho_cal:.3f}  T(L) us")
        print("L   " + " ".join(f"{v:>11s}" for v in variants) + "   moe(base)")
        for L in sorted(lengths):
            vals = [next((r["t_us"] for r in rows if r["batch"] == b and r["L"] == L and r["variant"] == v
                          and r["rho"] == round(rho_cal, 4)), float("nan")) for v in variants]
            moe = next((r["moe_us"] for r in rows if r["batch"] == b and r["L"] == L and r["variant"] == "baseline"
                        and r["rho"] == round(rho_cal, 4)), float("nan"))
            print(f"{L:<3d} " + " ".join(f"{x:11.1f}" for x in vals) + f" {moe:11.1f}")
    for r in rhos:
        print(f"rho={r:.3f}: " + json.dumps(summary["by_rho"][str(r)]))
    if extra and "summary_by_rho" in extra:
        print(f"{args.extra_shape}: " + json.dumps(extra["summary_by_rho"]))
    return summary


def run_model_checks(model, kernels, shape, batches, lengths, variants, checks, gen, gpu, log):
    """GDN (both paths vs the naive recurrence, reconstruction vs the baseline's stored state), the chosen MoE
    option on the model's own layer 0, vLLM's expert alignment vs its reference. Updates `checks`."""
    from verify_model import checks as chk
    naive = kernels.ours_gdn
    if naive is None:
        from importlib import import_module
        try:
            naive = import_module("hybridspec_kernels.gdn_verify")
        except ImportError:
            naive = None
    if naive is not None:
        for tag, (b, L) in (("", (min(2, max(batches)), min(5, max(lengths)))),
                            ("_big", (min(3, max(batches)), min(17, max(lengths))))):
            try:
                checks.update({k + tag: v for k, v in chk.check_gdn(model, b, L, gen, naive).items()})
            except Exception as e:
                log(f"gdn check failed: {type(e).__name__}: {e}"[:400])
                checks[f"gdn_check_error{tag}"] = f"{type(e).__name__}: {e}"[:300]
                if gpu and kernels.ours_gdn is not None:  # find out whether ours itself fails
                    try:
                        model.forward(model.prepare(1, 4), "ours", parts=("gdn",))
                    except Exception as e2:
                        log(f"ours fails ({type(e2).__name__}: {e2}); baseline only"[:400])
                        kernels.ours_gdn = None
                        checks["_variants"] = ["baseline"]
                break
    if gpu and kernels.ours_gdn is not None and checks.get("gdn_ours_vs_naive", 0.0) > 2e-2:
        try:
            checks.update(chk.check_ours_standalone(kernels.ours_gdn, model.device, gen))
        except Exception as e:
            checks["ours_standalone_error"] = f"{type(e).__name__}: {e}"[:300]
    if kernels.vllm_moe is not None or kernels.oai_moe is not None:
        patterns = chk.MOE_PATTERNS if gpu else ((1, 0.0), (4, 1.0), (7, 0.3))
        res = chk.check_moe_option(model.moes[0], shape, kernels, gen, patterns=patterns, time_tokens=())
        checks.update({f"moe_{k}": v for k, v in res["errs"].items()})
    if kernels.moe_impl == "vllm" and kernels.vllm_moe is not None:
        checks.update(chk.check_moe_align(model.device, shape, gen))


def sweep(model, timer, batches, lengths, rhos, variants, args, log, t_start, budget_s, measured_layers,
          full_layers, rho_cal, on_batch=None):
    """Every (batch, L) in priority order until the time budget; returns the rows."""
    rows, per_batch_cost = [], {}
    order = [L for L in LENGTH_PRIORITY if L in lengths] + [L for L in lengths if L not in LENGTH_PRIORITY]
    for b in batches:
        for L in order:
            elapsed = time.time() - t_start
            est = per_batch_cost.get(b, 0.0)
            if budget_s and elapsed + 1.3 * est > budget_s:
                log(f"  skip B={b} L={L}: budget ({elapsed:.0f}s used, ~{est:.1f}s needed)")
                continue
            t_cfg = time.time()
            new = measure_config(model, timer, b, L, rhos, variants, args, log)
            per_batch_cost[b] = time.time() - t_cfg
            if measured_layers != full_layers:
                scale_rows(new, measured_layers, full_layers)
            rows += new
            tb = {r["variant"]: r["t_us"] for r in new if r["rho"] == round(rho_cal, 4)}
            moe = next((r["moe_us"] for r in new if r["rho"] == round(rho_cal, 4)), float("nan"))
            log(f"B={b:2d} L={L:2d} " + " ".join(f"{k}={v:.0f}us" for k, v in tb.items()) +
                f" moe={moe:.0f}us ({per_batch_cost[b]:.1f}s)")
        rows.sort(key=lambda r: (r["rho"], r["variant"], r["batch"], r["L"]))
        if on_batch is not None:
            on_batch(rows)
    return rows


def run_extra_shape(args, kernels, device, dtype, timer, rhos, variants, rho_cal, checks, log, t_start, gen, gpu):
    """A second target (Qwen3-Next-80B-A3B: 512 experts, top-10, 48 layers) at batch 1 and a few lengths, on
    fewer layers when memory requires (per-layer parts scaled to the full depth); the same rhos and kernels."""
    import torch
    from verify_model import checks as chk
    from verify_model.model import VerifyModel
    from verify_model.shapes import SHAPES
    xshape = SHAPES[args.extra_shape]
    full = xshape.num_layers
    if args.extra_layers:
        xshape = xshape.with_layers(args.extra_layers)
    xlengths = parse_list(args.extra_lengths)
    t0 = time.time()
    if gpu:
        log(f"{xshape.name}: {torch.cuda.memory_allocated() / 2**30:.1f} GiB still allocated before the build")
    model = None
    while model is None:
        try:
            model = VerifyModel(xshape, device=device, dtype=dtype, max_batch=1, max_len=max(xlengths),
                                ctx_len=args.ctx, kernels=kernels, seed=3)
        except torch.cuda.OutOfMemoryError:
            half = xshape.num_layers // 2 // xshape.full_attention_interval * xshape.full_attention_interval
            if half < xshape.full_attention_interval:
                raise
            log(f"{xshape.name}: out of memory at {xshape.num_layers} layers, trying {half}")
            xshape = xshape.with_layers(half)
        if model is None:  # outside the except block: the half-built model is unreferenced now
            import gc
            gc.collect()
            torch.cuda.empty_cache()
    if gpu:
        torch.cuda.synchronize()
        log(f"{xshape.name}: {xshape.num_layers} of {full} layers built in {time.time() - t0:.1f}s, "
            f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated")
    patterns = ((1, 0.0), (4, 0.0), (16, 0.0), (16, 1.0)) if gpu else ((1, 0.0), (4, 1.0))
    res = chk.check_moe_option(model.moes[0], xshape, kernels, gen, patterns=patterns, time_tokens=())
    xchecks = {f"moe_{k}": v for k, v in res["errs"].items()}
    log(f"{xshape.name} checks: " + ", ".join(f"{k}={v:.2e}" for k, v in xchecks.items()))
    meta = {"shape": xshape.name, "layers_measured": xshape.num_layers, "layers_full": full, "batch": 1,
            "scaling": "per-layer parts (gdn, attention, moe) x full/measured; embedding, norms, LM head as measured"}
    if kernels.moe_impl == "vllm":
        from verify_model.vllm_moe import describe_configs
        meta["moe_configs"] = describe_configs(kernels.vllm_moe, xshape.num_experts, 2 * xshape.expert_inter,
                                               xshape.hidden, xshape.top_k, dtype, xlengths)
    model.reset_states()
    rows = sweep(model, timer, [1], xlengths, rhos, variants, args, log, t_start, args.budget_s,
                 xshape.num_layers, full, rho_cal)
    del model
    return {"shape": xshape.name, "rows": rows, "checks": xchecks, "meta": meta,
            "summary_by_rho": {str(r): summarize(rows, r, variants) for r in rhos}}


def plot(json_path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    doc = json.loads(json_path.read_text())
    rows, rho = doc["rows"], round(doc["calibration"]["rho"], 4)   # rows carry rho rounded to 4 places
    batches = sorted({r["batch"] for r in rows})
    variants = [v for v in ("baseline", "ours", "ours_probe") if any(r["variant"] == v for r in rows)]
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
    for ax, b in zip(axes[0], batches):
        for rr, style in zip(doc["rhos"], ("-", ":", "--")):
            for v in variants:
                pts = sorted((r["L"], r["t_us"] / 1e3) for r in rows if r["batch"] == b and r["variant"] == v
                             and r["rho"] == rr)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o" if rr == rho else None, ms=3,
                            label=f"{v} rho={rr}", color={"baseline": "C3", "ours": "C0", "ours_probe": "C2"}[v])
        ax.set_title(f"batch {b}")
        ax.set_xlabel("verified tokens per request L")
        ax.set_ylabel("verify pass T(L), ms")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"{doc['meta']['shape']} verify latency on {doc['device']} (rho calibrated = {rho})")
    fig.tight_layout()
    fig.savefig(json_path.with_name(f"{BENCH}_T_of_L.png"), dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(len(batches), 2, figsize=(11, 3.6 * len(batches)), squeeze=False)
    colors = {"gdn": "C0", "attention": "C1", "moe": "C2", "rest": "C7"}
    for i, b in enumerate(batches):
        for j, v in enumerate(("baseline", "ours_probe" if "ours_probe" in variants else "ours")):
            vr = sorted((r for r in rows if r["batch"] == b and r["variant"] == v and r["rho"] == rho),
                        key=lambda r: r["L"])
            ax = axes[i][j]
            if not vr:
                ax.set_visible(False)
                continue
            Ls = [r["L"] for r in vr]
            bottom = [0.0] * len(vr)
            for k in ("gdn", "attention", "moe", "rest"):
                vals = [r[f"{k}_us"] / 1e3 for r in vr]
                ax.bar(Ls, vals, bottom=bottom, color=colors[k], label=k)
                bottom = [x + y for x, y in zip(bottom, vals)]
            ax.plot(Ls, [r["t_us"] / 1e3 for r in vr], "k.-", label="whole pass (graph)")
            ax.set_title(f"{v}, batch {b}, rho={rho}")
            ax.set_xlabel("L")
            ax.set_ylabel("ms")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(json_path.with_name(f"{BENCH}_breakdown.png"), dpi=110)
    plt.close(fig)


def finalize(src: Path):
    """Copy a run's files from `src` (the fetched $OUT) into eval/results and draw the plots there."""
    dst = EVAL / "results"
    dst.mkdir(exist_ok=True)
    for f in src.iterdir():
        if f.name.startswith(("verify_profile", "latency_profile_")) and f.suffix in (".json", ".md", ".txt"):
            shutil.copyfile(f, dst / f.name)
    rebuild_profiles(dst / f"{BENCH}.json")
    plot(dst / f"{BENCH}.json")


def rebuild_profiles(json_path: Path):
    """Rebuild the LatencyProfile tables (JSON + profile file) from the run's rows with this file's
    build_profiles (a run made before a fix of it stays usable); the measured rows are not touched."""
    lp = load_latency_profile_module()
    doc = json.loads(json_path.read_text())
    if not doc.get("profiles"):
        return
    model_name, device = doc["profiles"][0]["model"], doc["device"]
    variants = list(dict.fromkeys(r["variant"] for r in doc["rows"]))
    rho_cal = doc["calibration"]["rho"]
    profiles = build_profiles(lp, doc["rows"], device, model_name, rho_cal, variants, profile_meta(doc["meta"]))
    doc["profiles"] = [p.to_dict() for p in profiles]
    doc["profiles_by_rho"] = {str(round(r, 4)): [p.to_dict() for p in build_profiles(lp, doc["rows"], device,
                                                                                      model_name, r, variants,
                                                                                      profile_meta(doc["meta"]))]
                              for r in doc["rhos"]}
    json_path.write_text(json.dumps(_json_safe(doc), indent=1) + "\n")
    dev_tag = device_tag(device)
    lp.save_profiles(json_path.with_name(PROFILE_FILE.format(model=model_name, device=dev_tag)), profiles,
                     doc["default_variant"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen36_35b_a3b", choices=["qwen36_35b_a3b", "qwen3_next_80b_a3b"])
    p.add_argument("--layers", type=int, default=0, help="build fewer layers and scale per layer (0: all)")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--lengths", default="1-17")
    p.add_argument("--ctx", type=int, default=2048, help="prefix tokens per request in the KV cache")
    p.add_argument("--variants", default="baseline,ours,ours_probe")
    p.add_argument("--zipf", type=float, default=0.6, help="expert popularity exponent (fixed, not calibrated)")
    p.add_argument("--rho", type=float, default=None, help="skip calibration and use this rho")
    p.add_argument("--calibrate-target", type=float, default=PUBLISHED_GROWTH_4_TO_16)
    p.add_argument("--calibrate-iters", type=int, default=7)
    p.add_argument("--budget-s", type=float, default=0, help="stop starting new configs after this many seconds")
    p.add_argument("--out", default=str(EVAL / "results"))
    p.add_argument("--tiny", action="store_true", help="CPU smoke: tiny shapes, torch paths")
    p.add_argument("--interpret", action="store_true",
                   help="with --tiny and TRITON_INTERPRET=1: the Triton kernels (vLLM GDN + MoE, ours) on the CPU")
    p.add_argument("--moe-options", default="default",
                   help="'default', 'all' (+ the OAI imposed-ids options that were wrong before) or names, comma-separated")
    p.add_argument("--probe-timeout-s", type=float, default=200)
    p.add_argument("--extra-shape", default="", help="a second target after the main sweep (qwen3_next_80b_a3b)")
    p.add_argument("--extra-layers", type=int, default=24, help="layers built for the extra shape (0: all), scaled")
    p.add_argument("--extra-lengths", default="1,4,8,16")
    p.add_argument("--extra-reserve-s", type=float, default=70, help="budget kept for the extra shape")
    p.add_argument("--prepare", action="store_true", help="extract the Triton sources the GPU run needs")
    p.add_argument("--finalize", default=None, help="copy a fetched run into eval/results and plot")
    p.add_argument("--plot", default=None, help="plot an existing verify_profile.json")
    p.add_argument("--moe-probe", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.prepare:
        from verify_model import kernels_loader
        kernels_loader.prepare_sources()
        print(f"extracted into {kernels_loader.EXTRACTED_DIR} and {kernels_loader.OAI_DIR}")
        return None
    if args.finalize:
        return finalize(Path(args.finalize))
    if args.plot:
        return plot(Path(args.plot))
    if args.moe_probe:
        return moe_probe_child(args)
    return run(args)


if __name__ == "__main__":
    main()
