"""Runs offline vLLM engines one after another in this process and writes their results as JSON.

    python tests/e2e_job.py JOB.json OUT.json

JOB: {"engines": [{"name", "model", "speculative_config", "additional_config", "llm_kwargs"}],
      "prompts": [...], "max_tokens": N}
Started by tests/conftest.py (`run_engines`) in a subprocess, so that each test module controls the
environment vLLM sees at import (VLLM_PLUGINS, the MRV2 shim) and shares one process for its engines.

The component jobs (tests/gdn/gdn_job.py, tests/adaptive/adaptive_job.py (also used by tests/routing),
tests/head_walk/head_walk_job.py) run their engines through `run` here: `before_engine(engine)` resets their
counters, `collect(llm, engine)` adds what they report per engine, `sampling_params(job, engine)` replaces the
greedy sampling; `main(run_job)` is their entry point.
"""
import gc
import json
import sys
import time

ENGINE_DEFAULTS = dict(
    enforce_eager=True,
    enable_prefix_caching=False,
    kv_cache_memory_bytes=256 * 2**20,
    max_model_len=512,
    max_num_seqs=8,
    disable_log_stats=False,
    seed=0,
)


def engine_kwargs(engine, **defaults):
    """LLM(...) arguments of one job engine: ENGINE_DEFAULTS (overridden by `defaults`), then the engine's own."""
    kwargs = dict(model=engine["model"], **{**ENGINE_DEFAULTS, **defaults})
    for key in ("speculative_config", "additional_config"):
        if engine.get(key) is not None:
            kwargs[key] = engine[key]
    kwargs.update(engine.get("llm_kwargs", {}))
    return kwargs


def greedy_params(job, engine):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)


def run(job, *, before_engine=None, collect=None, sampling_params=greedy_params, **defaults):
    from vllm import LLM

    from vllm_hybridspec import status
    from vllm_hybridspec.metrics import spec_decode_metrics

    results = {}
    for engine in job["engines"]:
        status.reset()
        if before_engine is not None:
            before_engine(engine)
        started = time.time()
        llm = LLM(**engine_kwargs(engine, **defaults))
        init_seconds = time.time() - started
        params = sampling_params(job, engine)
        started = time.time()
        outputs = llm.generate(job["prompts"], params, use_tqdm=False)
        result = results[engine["name"]] = {
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "texts": [o.outputs[0].text for o in outputs],
            "metrics": spec_decode_metrics(llm),
            "status": status.snapshot(),
        }
        if collect is not None:
            result.update(collect(llm, engine))
        result.update(init_seconds=round(init_seconds, 1), generate_seconds=round(time.time() - started, 1))
        del llm
        gc.collect()
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    return results


def main(run_job=run):
    with open(sys.argv[1]) as f:
        job = json.load(f)
    results = run_job(job)
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
