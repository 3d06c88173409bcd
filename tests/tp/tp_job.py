"""Runs offline vLLM engines, some with tensor parallelism, and reports what every rank did.

    python tests/tp/tp_job.py JOB.json OUT.json

JOB: as tests/e2e_job.py; an engine's `llm_kwargs` carries `tensor_parallel_size`. With TP > 1 vLLM runs each
rank in a worker process of its own (multiprocessing executor; gloo and shared-memory communicators on CPU), so
hybridspec's status and counters live there: `collective_rpc` brings them back. Per engine, besides e2e_job's
keys: `ranks`, in rank order, each {rank, tp_size, status, gdn, adaptive, routing, manager, walk, layout}.
An engine's `max_tokens` overrides the job's; its `"shadow_walk": true` compares DSpark's walk with vLLM's in every rank (tp_shadow_walk.py; `walk`);
the job's `dense_target` builds tests/head_walk's dense fp32 target first (head_walk_job.build_dense_target).
Started by tests/tp in a subprocess (in-process engine core: VLLM_ENABLE_V1_MULTIPROCESSING=0).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for e2e_job (PYTHONSAFEPATH keeps it off)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/tp, for the workers' `tp_shadow_walk`
import e2e_job  # noqa: E402

SHADOW_WALK = "tp_shadow_walk.ShadowWalkReport"  # an engine's `shadow_walk: true` sets it as worker_extension_cls


def rank_report(worker) -> dict:
    """Runs in each worker (collective_rpc): this rank's status, counters and GDN state layout."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
    from vllm.v1.kv_cache_interface import MambaSpec

    from vllm_hybridspec import status
    from vllm_hybridspec.adaptive import COUNTERS as ADAPTIVE
    from vllm_hybridspec.gdn import COUNTERS as GDN
    from vllm_hybridspec.routing_wiring import step as wiring

    runner = worker.model_runner
    context = runner.vllm_config.compilation_config.static_forward_context
    groups = [g for g in runner.kv_cache_config.kv_cache_groups if isinstance(g.kv_cache_spec, MambaSpec)]
    layout = None
    if groups:  # a hybrid target
        layer = context[groups[0].layer_names[0]]
        layout = {
            "layer_class": type(layer).__name__,
            "layer_tp_size": layer.tp_size,
            "num_speculative_blocks": groups[0].kv_cache_spec.num_speculative_blocks,
            "conv_state_shape": list(layer.kv_cache[0].shape),
            "ssm_state_shape": list(layer.kv_cache[1].shape),
        }
    return {
        "rank": get_tensor_model_parallel_rank(),
        "tp_size": get_tensor_model_parallel_world_size(),
        "status": status.snapshot(),
        "gdn": dict(vars(GDN)),
        "adaptive": ADAPTIVE.snapshot(),
        "routing": wiring.snapshot(),
        "manager": type(getattr(runner, "adaptive_verification", None)).__name__,
        "walk": worker.shadow_walk_stats() if hasattr(worker, "shadow_walk_stats") else None,
        "layout": layout,
    }


def before_engine(engine) -> None:
    """Zeroes this process's counters before an engine: a TP = 1 engine runs its worker in this process, after
    earlier engines; TP > 1 workers start from this process's state (forked) or from scratch (spawned)."""
    from vllm_hybridspec.adaptive import COUNTERS as ADAPTIVE
    from vllm_hybridspec.gdn import COUNTERS as GDN
    from vllm_hybridspec.routing_wiring import step as wiring

    GDN.reset()
    ADAPTIVE.reset()
    wiring.install(None)
    if "tp_shadow_walk" in sys.modules:  # imported here by a TP = 1 engine; forked workers inherit its counts
        sys.modules["tp_shadow_walk"].reset()
    if engine.get("shadow_walk"):
        engine.setdefault("llm_kwargs", {})["worker_extension_cls"] = SHADOW_WALK


def greedy_params(job, engine):
    """Greedy, `job["max_tokens"]` or the engine's own `max_tokens`."""
    return e2e_job.greedy_params({**job, "max_tokens": engine.get("max_tokens", job["max_tokens"])}, engine)


def run(job):
    if job.get("dense_target"):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "head_walk"))
        from head_walk_job import build_dense_target

        build_dense_target(**job["dense_target"])

    def collect(llm, engine):
        from vllm_hybridspec import status

        return {"ranks": sorted(llm.collective_rpc(rank_report), key=lambda report: report["rank"]),
                "per_rank_status": status.per_rank(llm)}

    return e2e_job.run(job, before_engine=before_engine, collect=collect, sampling_params=greedy_params)


if __name__ == "__main__":
    e2e_job.main(run)
