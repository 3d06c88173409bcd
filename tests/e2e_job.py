"""Runs offline vLLM engines one after another in this process and prints their results as JSON.

    python tests/e2e_job.py JOB.json OUT.json

JOB: {"engines": [{"name", "model", "speculative_config", "additional_config", "llm_kwargs"}],
      "prompts": [...], "max_tokens": N}
Started by tests/conftest.py (`run_engines`) in a subprocess, so that each test module controls the
environment vLLM sees at import (VLLM_PLUGINS, the MRV2 shim) and shares one process for its engines.
"""
import gc
import json
import sys
import time


def run(job):
    from vllm import LLM, SamplingParams

    from vllm_hybridspec import status
    from vllm_hybridspec.metrics import spec_decode_metrics

    results = {}
    for engine in job["engines"]:
        status.reset()
        kwargs = dict(
            model=engine["model"],
            enforce_eager=True,
            enable_prefix_caching=False,
            kv_cache_memory_bytes=256 * 2**20,
            max_model_len=512,
            max_num_seqs=8,
            disable_log_stats=False,
            seed=0,
        )
        if engine.get("speculative_config"):
            kwargs["speculative_config"] = engine["speculative_config"]
        if engine.get("additional_config") is not None:
            kwargs["additional_config"] = engine["additional_config"]
        kwargs.update(engine.get("llm_kwargs", {}))
        started = time.time()
        llm = LLM(**kwargs)
        init_seconds = time.time() - started
        params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)
        started = time.time()
        outputs = llm.generate(job["prompts"], params, use_tqdm=False)
        results[engine["name"]] = {
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "texts": [o.outputs[0].text for o in outputs],
            "metrics": spec_decode_metrics(llm),
            "status": status.snapshot(),
            "init_seconds": round(init_seconds, 1),
            "generate_seconds": round(time.time() - started, 1),
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
