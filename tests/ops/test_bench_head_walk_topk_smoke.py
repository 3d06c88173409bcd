"""CI smoke test of eval/bench_head_walk_topk.py: --quick walks both variants at tiny sizes under the Triton interpreter
(timings meaningless, greedy only: vLLM's sampler is not here) and writes a results file with the real one's schema;
and the summary / table of sampled rows, from made-up rows."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "eval"))


def test_bench_quick(tmp_path):
    env = dict(os.environ, PYTHONSAFEPATH="1", TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(REPO / "eval" / "bench_head_walk_topk.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "head_walk_topk.json").read_text())
    assert {"bench", "device", "commit", "date", "command", "rows", "summary"} <= set(doc)
    assert doc["rows"] and all(min(r["agree"]) == 1.0 and r["ours_topk_us"] for r in doc["rows"])
    assert doc["summary"]["min_draft_agreement"] == 1.0
    assert (tmp_path / "head_walk_topk.md").exists()


def test_summary_and_table_of_sampled_rows():
    import bench_head_walk_topk as bench

    rows = [dict(vocab=32000, steps=15, batch=1, mode=mode, topk=64, agree=[1.0], graph_topk_us=300.0,
                 ours_topk_us=50.0, speedup_graph_topk=6.0) for mode in ("greedy", "sampled")]
    rows[1].update(cache_pattern_equal=[True], cache_entries_differing=[1e-4], cache_max_rel_gap=[0.01])
    summary = bench.summarize(rows)
    assert summary["speedup_graph_topk_v32k_blk15_b1"] == summary["speedup_graph_topk_v32k_blk15_b1_sampled"] == 6.0
    assert summary["cache_candidate_columns_equal"] and summary["cache_entries_differing_max"] == 1e-4
    table = bench.markdown(dict(device="d", commit="0123456789", date="t", command="c", rows=rows))
    assert table.count("| 32000 | 15 | 1 |") == 2
