"""What prefix caching costs the block-parallel GDN commit: `gdn_reconstruct` with and without block-boundary
checkpoints (eval/notes/prefix_caching.md), CUDA-graph timed over a stack of GDN layers.

With prefix caching on (vLLM's default), every commit passes checkpoint slots for all rows; a row writes one only
when its accepted tokens reach a KV-block boundary (about once every block_size / accepted steps), so the
typical step has no checkpoint row or one. Variants per (L, batch):
    plain     no checkpoint arguments (prefix caching off): one launch
    idle      checkpoint arguments, no row reaches a boundary: the checkpoint launch's programs exit at once
    one_row   one row writes a checkpoint (the common step with a boundary)
    all_rows  every row writes one (the worst case)
Writes eval/results/gdn_checkpoint.json (+ .md) with summary keys idle_overhead_L16_b{1,32,64} and
one_row_overhead_L16_b32 (time / plain - 1).

    python eval/bench_gdn_checkpoint.py [--layers 30] [--lens 4,16] [--batches 1,8,32,64] [--out eval/results]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cuda_graph import call_ms  # noqa: E402
from _results import write_results  # noqa: E402

from hybridspec_kernels.gdn_verify import GDNStateTable, GDNVerifyWorkspace, gdn_reconstruct  # noqa: E402

BENCH = "gdn_checkpoint"
ON_GPU = torch.cuda.is_available()
QWEN3_NEXT_GDN = dict(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, width=4)
TINY_GDN = dict(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, width=4)
VARIANTS = ("plain", "idle", "one_row", "all_rows")


def make_problem(gdn, seqlen, batch, num_layers, device, seed=0):
    """States for 2 * batch + 1 slots per layer (slot 0 = vLLM's null block; request i runs in slot i + 1, its
    checkpoint slot is batch + i + 1) and one step's workspace with random contents."""
    torch.manual_seed(seed)
    H, HV, K, V, W = (gdn[k] for k in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "width"))
    D = 2 * H * K + HV * V
    act = torch.bfloat16 if ON_GPU else torch.float32
    ssm = torch.randn(num_layers, 2 * batch + 1, HV, V, K, device=device) * 0.1
    conv = torch.randn(num_layers, 2 * batch + 1, W - 1, D, device=device).to(act)
    ws = GDNVerifyWorkspace.allocate(num_layers, batch, seqlen, H, HV, K, V, act, device)
    for tensor in (ws.u, ws.k, ws.x):
        tensor.copy_(torch.randn_like(tensor, dtype=torch.float32) * 0.1)
    ws.g.copy_(-torch.rand_like(ws.g).cumsum(dim=2))  # cumulative log decay: non-increasing over a request's tokens
    rows = torch.arange(batch, dtype=torch.int32, device=device)
    return dict(
        table=GDNStateTable(list(ssm), list(conv), W), ws=ws, ssm=ssm,
        slots=rows + 1,
        cu=torch.arange(0, seqlen * batch + 1, seqlen, dtype=torch.int32, device=device),
        accepted=torch.full((batch,), seqlen, dtype=torch.int32, device=device),
        ckpt_slots={
            "idle": torch.zeros(batch, dtype=torch.int32, device=device),
            "one_row": torch.where(rows == batch // 2, rows + batch + 1, 0).to(torch.int32),
            "all_rows": rows + batch + 1,
        },
        ckpt_lens=torch.full((batch,), max(1, seqlen // 2), dtype=torch.int32, device=device),
    )


def step(problem, variant):
    args = (problem["table"], problem["ws"], problem["slots"], problem["accepted"], problem["cu"])
    if variant == "plain":
        return lambda: gdn_reconstruct(*args)
    return lambda: gdn_reconstruct(*args, checkpoint_indices=problem["ckpt_slots"][variant],
                                   checkpoint_lens=problem["ckpt_lens"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=30 if ON_GPU else 2)
    parser.add_argument("--lens", default="4,16" if ON_GPU else "4")
    parser.add_argument("--batches", default="1,8,32,64" if ON_GPU else "1,3")
    parser.add_argument("--rep-ms", type=int, default=100)
    parser.add_argument("--out", default="eval/results")
    args = parser.parse_args(argv)
    device = "cuda" if ON_GPU else "cpu"
    gdn = QWEN3_NEXT_GDN if ON_GPU else TINY_GDN
    rows = []
    for seqlen in (int(x) for x in args.lens.split(",")):
        for batch in (int(x) for x in args.batches.split(",")):
            problem = make_problem(gdn, seqlen, batch, args.layers, device)
            times = {v: call_ms(step(problem, v), args.rep_ms) * 1e3 / args.layers for v in VARIANTS}
            row = dict(L=seqlen, batch=batch, **{f"{v}_us": round(t, 3) for v, t in times.items()})
            row.update({f"{v}_overhead": round(times[v] / times["plain"] - 1, 4) for v in VARIANTS[1:]})
            rows.append(row)
            print(row, flush=True)
            del problem
            if ON_GPU:
                torch.cuda.empty_cache()
    by_cell = {(r["L"], r["batch"]): r for r in rows}
    summary = {}
    for batch in (1, 32, 64):
        if (16, batch) in by_cell:
            summary[f"idle_overhead_L16_b{batch}"] = by_cell[(16, batch)]["idle_overhead"]
    if (16, 32) in by_cell:
        summary["one_row_overhead_L16_b32"] = by_cell[(16, 32)]["one_row_overhead"]
    device_name = torch.cuda.get_device_name() if ON_GPU else "cpu (TRITON_INTERPRET smoke, timings meaningless)"
    command = "python eval/bench_gdn_checkpoint.py " + " ".join(argv if argv is not None else sys.argv[1:])
    note = (f"\nus per layer (gdn_reconstruct over {args.layers} layers, one call, CUDA-graph replay median), GDN "
            f"{gdn}, fp32 ssm states, all drafts accepted; overhead = time / plain - 1. idle = checkpoint arguments "
            "with no row at a block boundary (the usual prefix-caching step).\n")
    path = write_results(BENCH, rows, summary, command.strip(), device_name, args.out, extra={"layers": args.layers})
    with open(Path(args.out) / f"{BENCH}.md", "a") as md:
        md.write(note)
    print(summary)
    return path


if __name__ == "__main__":
    main()
