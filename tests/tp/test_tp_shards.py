"""Block-parallel GDN verification's CUDA path per tensor-parallel rank (tp_size 2 and 4), on CPU under the Triton
interpreter, in a subprocess so that TRITON_INTERPRET=1 precedes every triton import (tests/tp/shard_job.py)."""
import subprocess
import sys
from pathlib import Path

from conftest import base_env


def test_each_rank_verifies_and_commits_its_heads_through_the_kernels(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("shard_job.py"))],
        env=base_env(TRITON_INTERPRET="1"), cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr
