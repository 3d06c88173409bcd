"""How far can the GDN path move issue 5's whole-pass figures? Upper bounds derived from a measured profile.

Reads eval/results/verify_profile.json (the H200 run of bench_verify_profile.py) and, at batch 1 for every routing
correlation rho and both target shapes, recomputes the issue's keys from the per-layer-type breakdown under two
idealisations that favour us:
- `gdn_free`: every GDN layer of "ours" costs nothing (its projections, norms and gates included, not only the
  recurrence that gdn_verify replaces);
- `gdn_free_moe_minus_one`: that, and the MoE blocks priced at L - 1 tokens (routing correction drops at most one
  token of the L + 1 it probes).
Everything else (attention, MoE, the rest) is the measured time at that L. If a bound misses a goal, no GDN kernel
and no routing decision of this product can meet it at that calibration: only fewer or cheaper expert bytes can.

    PYTHONSAFEPATH=1 .venv/bin/python eval/verify_profile_bounds.py
writes eval/results/verify_profile_bounds.{json,md}.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import _markdown, write_results  # noqa: E402

GOALS = {"ours_growth_4_to_16": ("<=", 0.35), "verify_speedup_L16_b1": (">=", 1.5)}


def _by_len(rows, variant, rho):
    return {r["L"]: r for r in rows if r["variant"] == variant and r["batch"] == 1 and abs(r["rho"] - rho) < 1e-3}


def bounds_for(rows, rho, shape):
    base, ours = _by_len(rows, "baseline", rho), _by_len(rows, "ours", rho)
    if not all(n in base and n in ours for n in (4, 16)):
        return None

    def ideal(n, moe_len):
        r = ours[n]
        return r["t_us"] - r["gdn_us"] - r["moe_us"] + ours[moe_len]["moe_us"]

    out = {"shape": shape, "rho": rho,
           "baseline_growth_4_to_16": base[16]["t_us"] / base[4]["t_us"] - 1,
           "measured_ours_growth_4_to_16": ours[16]["t_us"] / ours[4]["t_us"] - 1,
           "measured_verify_speedup_L16_b1": base[16]["t_us"] / ours[16]["t_us"],
           "gdn_share_of_baseline_L16": base[16]["gdn_us"] / base[16]["t_us"],
           "moe_share_of_baseline_L16": base[16]["moe_us"] / base[16]["t_us"]}
    for name, moe_len_16, moe_len_4 in (("gdn_free", 16, 4), ("gdn_free_moe_minus_one", 15, 3)):
        if moe_len_4 not in ours or moe_len_16 not in ours:
            continue
        t16, t4 = ideal(16, moe_len_16), ideal(4, moe_len_4)
        out[f"{name}_ours_growth_4_to_16"] = t16 / t4 - 1
        out[f"{name}_verify_speedup_L16_b1"] = base[16]["t_us"] / t16
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="eval/results/verify_profile.json")
    parser.add_argument("--out", default="eval/results")
    args = parser.parse_args()
    doc = json.loads(Path(args.profile).read_text())
    rhos = sorted({r["rho"] for r in doc["rows"]})
    rows = [b for rho in rhos if (b := bounds_for(doc["rows"], rho, "qwen3.6_35b_a3b"))]
    extra = doc.get("extra_shape") or {}
    rows += [b for rho in sorted({r["rho"] for r in extra.get("rows", [])})
             if (b := bounds_for(extra["rows"], rho, extra["shape"]))]
    calibrated = doc["summary"]["calibrated_rho"]
    main_row = next(r for r in rows if r["shape"] == "qwen3.6_35b_a3b" and abs(r["rho"] - calibrated) < 1e-3)
    summary = {
        "source": f"eval/results/{Path(args.profile).name} (commit {doc['commit'][:12]}, {doc['date']})",
        "calibrated_rho": calibrated,
        "best_case_ours_growth_4_to_16": min(v for k, v in main_row.items()
                                             if k.startswith("gdn_free") and k.endswith("_ours_growth_4_to_16")),
        "best_case_verify_speedup_L16_b1": max(v for k, v in main_row.items()
                                               if k.startswith("gdn_free") and k.endswith("_verify_speedup_L16_b1")),
        "goals": {k: f"{op} {v}" for k, (op, v) in GOALS.items()},
    }
    summary["reachable_by_gdn_or_routing_correction"] = {
        "ours_growth_4_to_16": summary["best_case_ours_growth_4_to_16"] <= GOALS["ours_growth_4_to_16"][1],
        "verify_speedup_L16_b1": summary["best_case_verify_speedup_L16_b1"] >= GOALS["verify_speedup_L16_b1"][1]}
    title, tables = _markdown("verify_profile_bounds", rows, summary).split("\n\n", 1)
    markdown = "\n\n".join([
        title,
        f"Derived (no new measurement) from {summary['source']}, device {doc['device']}: issue 5's batch-1 keys "
        "recomputed with every GDN layer of ours free (projections included) and, on top, the MoE blocks priced at "
        "L - 1 tokens (the most routing correction can drop). Command: `python eval/verify_profile_bounds.py`.",
        tables])
    write_results("verify_profile_bounds", rows, summary, "python eval/verify_profile_bounds.py", doc["device"],
                  out_dir=args.out, markdown=markdown)
    print(markdown)


if __name__ == "__main__":
    main()
