"""Runs offline vLLM engines in this process; reports tokens, spec-decode metrics, status, the adaptive
verification counters and the routing step's counters (routing correction, device cut). Started by tests/adaptive
and tests/routing in a subprocess (MRV2 shim, in-process engine); the engines run through tests/e2e_job.py.

    python tests/adaptive/adaptive_job.py JOB.json OUT.json
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for e2e_job (PYTHONSAFEPATH keeps it off)
import e2e_job  # noqa: E402


def run(job):
    from vllm_hybridspec.adaptive import COUNTERS
    from vllm_hybridspec.routing_wiring import step as wiring

    def before_engine(engine):
        COUNTERS.reset()
        wiring.install(None)

    def collect(llm, engine):
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        return {"adaptive": COUNTERS.snapshot(), "routing": wiring.snapshot(),
                "manager": type(getattr(runner, "adaptive_verification", None)).__name__}

    return e2e_job.run(job, before_engine=before_engine, collect=collect, max_num_seqs=4)


if __name__ == "__main__":
    e2e_job.main(run)
