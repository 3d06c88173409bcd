"""Runs offline vLLM engines in this process and reports, besides their tokens, what the GDN layers did.

    python tests/gdn/gdn_job.py JOB.json OUT.json

JOB: {"engines": [{"name", "model", "speculative_config", "additional_config", "llm_kwargs"}], "prompts", "max_tokens"}
Per engine: token_ids, spec-decode metrics, hybridspec status, the block-parallel counters, and the GDN state
layout as allocated (MambaSpec of the GDN KV-cache groups, state tensor shapes, block-table width, backend).
Started by the tests in a subprocess (in-process engine: VLLM_ENABLE_V1_MULTIPROCESSING=0).
"""
import gc
import json
import sys


def gdn_layout(llm):
    from vllm.v1.kv_cache_interface import MambaSpec

    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    groups = [g for g in runner.kv_cache_config.kv_cache_groups if isinstance(g.kv_cache_spec, MambaSpec)]
    context = runner.vllm_config.compilation_config.static_forward_context
    layer = context[groups[0].layer_names[0]]
    spec = groups[0].kv_cache_spec
    backend = layer.get_attn_backend()
    return {
        "layer_class": type(layer).__name__,
        "num_gdn_kv_groups": len(groups),
        "num_speculative_blocks": spec.num_speculative_blocks,
        "blocks_per_request": spec.max_num_blocks_per_req(runner.vllm_config, runner.vllm_config.model_config.max_model_len),
        "page_size_bytes": spec.page_size_bytes,
        "conv_state_shape": list(layer.kv_cache[0].shape),
        "ssm_state_shape": list(layer.kv_cache[1].shape),
        "conv_kernel_size": layer.conv_kernel_size,
        "backend": backend.__name__,
        "device_query_lens_ok": backend.supports_device_cpu_query_lens_mismatch(),
    }


def run(job):
    from vllm import LLM, SamplingParams

    from vllm_hybridspec import status
    from vllm_hybridspec.gdn import COUNTERS
    from vllm_hybridspec.metrics import spec_decode_metrics

    results = {}
    for engine in job["engines"]:
        status.reset()
        COUNTERS.reset()
        kwargs = dict(
            model=engine["model"], enforce_eager=True, enable_prefix_caching=False, kv_cache_memory_bytes=256 * 2**20,
            max_model_len=512, max_num_seqs=8, disable_log_stats=False, seed=0,
        )
        for key in ("speculative_config", "additional_config"):
            if engine.get(key) is not None:
                kwargs[key] = engine[key]
        kwargs.update(engine.get("llm_kwargs", {}))
        llm = LLM(**kwargs)
        params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)
        outputs = llm.generate(job["prompts"], params, use_tqdm=False)
        results[engine["name"]] = {
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "texts": [o.outputs[0].text for o in outputs],
            "metrics": spec_decode_metrics(llm),
            "status": status.snapshot(),
            "counters": dict(vars(COUNTERS)),
            "layout": gdn_layout(llm) if engine.get("layout", True) else None,
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
