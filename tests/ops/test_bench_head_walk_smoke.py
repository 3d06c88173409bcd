"""CI smoke test of eval/bench_head_walk.py: --quick runs every path of the bench at tiny sizes under the Triton
interpreter (timings meaningless) and writes a results file with the schema of the real one."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_quick(tmp_path):
    env = dict(os.environ, PYTHONSAFEPATH="1", TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(REPO / "eval" / "bench_head_walk.py"), "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "head_walk.json").read_text())
    assert {"bench", "device", "commit", "date", "command", "rows", "summary"} <= set(doc)
    assert {"speedup_graph_loop_v32k_blk15_b1", "speedup_fused_step_v32k_blk15_b1",
            "speedup_graph_loop_v152k_blk15_b1", "speedup_graph_loop_v32k_blk15_b32"} <= set(doc["summary"])
    assert doc["rows"] and all(r["ours_eq_naive"] and r["ours_eq_step"] for r in doc["rows"])
    assert (tmp_path / "head_walk.md").exists()
