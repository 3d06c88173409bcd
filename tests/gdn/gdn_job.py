"""Runs offline vLLM engines in this process and reports, besides their tokens, what the GDN layers did.

    python tests/gdn/gdn_job.py JOB.json OUT.json

JOB: {"engines": [{"name", "model", "speculative_config", "additional_config", "llm_kwargs"}], "prompts", "max_tokens"}
Per engine: token_ids, spec-decode metrics, hybridspec status, the block-parallel counters, and the GDN state
layout as allocated (MambaSpec of the GDN KV-cache groups, state tensor shapes, block-table width, backend).
Started by the tests in a subprocess (in-process engine: VLLM_ENABLE_V1_MULTIPROCESSING=0); the engines run
through tests/e2e_job.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for e2e_job (PYTHONSAFEPATH keeps it off)
import e2e_job  # noqa: E402


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
    from vllm_hybridspec.gdn import COUNTERS

    def collect(llm, engine):
        return {"counters": dict(vars(COUNTERS)), "layout": gdn_layout(llm) if engine.get("layout", True) else None}

    return e2e_job.run(job, before_engine=lambda engine: COUNTERS.reset(), collect=collect)


if __name__ == "__main__":
    e2e_job.main(run)
