"""Runs offline vLLM engines in this process; reports tokens, spec-decode metrics, status and the adaptive
verification counters. Started by tests/adaptive in a subprocess (MRV2 shim, in-process engine); the engines
run through tests/e2e_job.py.

    python tests/adaptive/adaptive_job.py JOB.json OUT.json
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for e2e_job (PYTHONSAFEPATH keeps it off)
import e2e_job  # noqa: E402


def run(job):
    from vllm_hybridspec.adaptive import COUNTERS

    def collect(llm, engine):
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        return {"adaptive": COUNTERS.snapshot(),
                "manager": type(getattr(runner, "adaptive_verification", None)).__name__}

    return e2e_job.run(job, before_engine=lambda engine: COUNTERS.reset(), collect=collect, max_num_seqs=4)


if __name__ == "__main__":
    e2e_job.main(run)
