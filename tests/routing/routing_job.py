"""Runs offline vLLM engines in this process; reports tokens, status, the adaptive counters and the routing
correction's counters. Started by tests/routing in a subprocess (MRV2 shim, in-process engine).

    python tests/routing/routing_job.py JOB.json OUT.json
"""
import gc
import json
import sys


def run(job):
    from vllm import LLM, SamplingParams

    from vllm_hybridspec import status
    from vllm_hybridspec.adaptive import COUNTERS
    from vllm_hybridspec.metrics import spec_decode_metrics
    from vllm_hybridspec.routing_wiring import step as wiring

    results = {}
    for engine in job["engines"]:
        status.reset()
        COUNTERS.reset()
        wiring.install(None)
        kwargs = dict(
            model=engine["model"], enforce_eager=True, enable_prefix_caching=False, kv_cache_memory_bytes=256 * 2**20,
            max_model_len=512, max_num_seqs=4, disable_log_stats=False, seed=0,
        )
        for key in ("speculative_config", "additional_config"):
            if engine.get(key) is not None:
                kwargs[key] = engine[key]
        llm = LLM(**kwargs)
        params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)
        outputs = llm.generate(job["prompts"], params, use_tqdm=False)
        results[engine["name"]] = {
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "texts": [o.outputs[0].text for o in outputs],
            "metrics": spec_decode_metrics(llm),
            "status": status.snapshot(),
            "adaptive": COUNTERS.snapshot(),
            "routing": wiring.snapshot(),
        }
        del llm
        gc.collect()
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    return results


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        job = json.load(f)
    results = run(job)
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)
