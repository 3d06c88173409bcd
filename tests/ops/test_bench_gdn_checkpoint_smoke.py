"""eval/bench_gdn_checkpoint.py end to end in its CPU mode (interpreter, tiny GDN shape): every variant runs,
the results file has the bench's keys, and a checkpoint launch leaves each request's own state as the plain
launch does (the checkpoint only adds a second slot)."""
import json
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Triton picks interpreter or compiler when a kernel is defined: set the flag before the first import
    os.environ.setdefault("TRITON_INTERPRET", "1")

EVAL = Path(__file__).resolve().parents[2] / "eval"
sys.path.insert(0, str(EVAL))

import bench_gdn_checkpoint as bench  # noqa: E402


def test_bench_writes_results(tmp_path):
    bench.main(["--layers", "2", "--lens", "3", "--batches", "2", "--rep-ms", "1", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "gdn_checkpoint.json").read_text())
    assert {"bench", "device", "commit", "date", "command", "rows", "summary"} <= set(doc)
    (row,) = doc["rows"]
    assert row["L"] == 3 and row["batch"] == 2
    assert all(row[f"{v}_us"] > 0 for v in bench.VARIANTS)


def test_variants_commit_the_same_running_state():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    finals = {}
    for variant in bench.VARIANTS:
        problem = bench.make_problem(bench.TINY_GDN, 5, 3, 2, device, seed=3)
        bench.step(problem, variant)()
        finals[variant] = problem["ssm"][:, 1:4].clone()  # the requests' own slots 1..3
    for variant in bench.VARIANTS[1:]:
        torch.testing.assert_close(finals[variant], finals["plain"], rtol=0, atol=0)
