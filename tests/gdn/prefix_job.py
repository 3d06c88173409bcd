"""Prefix caching on the tiny hybrid target: two rounds of requests, the second re-reading the first's KV blocks.

    python tests/gdn/prefix_job.py JOB.json OUT.json

JOB: {"engines": [...as tests/e2e_job.py...], "text": str, "num_prompts": P, "max_tokens": N, "reused_output": M,
      "tail": T}
Per engine, in one process (in-process engine, VLLM_ENABLE_V1_MULTIPROCESSING=0):
1. round 1: P prompts of 3 * block_size - 8 + i tokens (i = 0..P-1, each cut from its own place of `text`, so
   they share nothing), N greedy tokens each: the decode crosses the block boundary at 3 * block_size, at a
   different point of a spec step for each prompt.
2. round 2: prompt i of round 1 + its first M output tokens + T other tokens. Its first 3 blocks are round 1's,
   the last of them ended during round 1's decode: a prefix-cache hit restores the GDN state that the decode
   wrote at that boundary.
Reports both rounds' tokens, the prefix-cache hits of round 2 (tokens), the block size, the spec-decode metrics,
hybridspec status, the block-parallel counters, the GDN state layout (gdn_job.gdn_layout) and, for an engine with
"compare_states_with": NAME, how far the GDN states it cached after round 1 are from those engine NAME (run
earlier in the job) cached for the same blocks.
"""
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for e2e_job (PYTHONSAFEPATH keeps it off)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_job  # noqa: E402
from gdn_job import gdn_layout  # noqa: E402


def _prefix_cache_hits(llm) -> int:
    return sum(int(m.value) for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits")


def cached_gdn_block_states(llm) -> dict:
    """{block hash (with group id): (tokens up to its boundary, [conv, ssm] state of each layer)} of every GDN block
    in the prefix cache. Block hashes agree between engines of one process that saw the same tokens."""
    from vllm.v1.core.kv_cache_utils import get_group_id
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    context = llm.llm_engine.vllm_config.compilation_config.static_forward_context
    states = {}
    for group_id, manager in enumerate(scheduler.kv_cache_manager.coordinator.single_type_managers):
        if not isinstance(manager, MambaManager):
            continue
        names = scheduler.kv_cache_config.kv_cache_groups[group_id].layer_names
        for block in manager.block_pool.blocks:
            if block.is_null or block.block_hash is None or get_group_id(block.block_hash) != group_id:
                continue
            tensors = [state[block.block_id].clone() for name in names for state in context[name].kv_cache]
            states[bytes(block.block_hash)] = (block.block_hash_num_tokens, tensors)
    return states


def compare_block_states(states: dict, reference: dict | None, prompt_len: int) -> dict | None:
    """Largest relative error between the GDN states both engines cached for the same blocks; `decode_blocks` counts
    common blocks whose boundary lies past every prompt (written by a decode step)."""
    if reference is None:
        return None
    common = [key for key in states if key in reference]
    errors = []
    for key in common:
        for mine, theirs in zip(states[key][1], reference[key][1]):
            rows = min(mine.shape[0], theirs.shape[0])  # conv windows: W-1 rows here, W-1+K with vLLM's spec slots
            errors.append(float((mine[:rows] - theirs[:rows]).norm() / theirs[:rows].norm().clamp_min(1e-30)))
    return {
        "blocks": len(common),
        "decode_blocks": sum(states[key][0] > prompt_len for key in common),
        "max_rel_err": max(errors, default=None),
    }


def run(job):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_hybridspec import status
    from vllm_hybridspec.gdn import COUNTERS
    from vllm_hybridspec.metrics import spec_decode_metrics

    results = {}
    # logprobs of the sampled tokens: the GDN states feed them directly, where a greedy argmax may not move
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)
    block_states = {}
    for engine in job["engines"]:
        status.reset()
        COUNTERS.reset()
        started = time.time()
        llm = LLM(**e2e_job.engine_kwargs(engine))
        init_seconds = time.time() - started
        block_size = llm.llm_engine.vllm_config.cache_config.block_size
        text_ids = llm.get_tokenizer().encode(job["text"], add_special_tokens=False)
        first_len = 3 * block_size - 8
        num_prompts, tail = job["num_prompts"], job["tail"]
        if len(text_ids) < num_prompts * (first_len + num_prompts) + tail:
            raise ValueError(f"text has {len(text_ids)} tokens, too few for {num_prompts} prompts of ~{first_len}")
        starts = [i * (first_len + num_prompts) for i in range(num_prompts)]
        round1 = [text_ids[s : s + first_len + i] for i, s in enumerate(starts)]
        started = time.time()
        outputs1 = llm.generate([TokensPrompt(prompt_token_ids=p) for p in round1], params, use_tqdm=False)
        out1 = [list(o.outputs[0].token_ids) for o in outputs1]
        block_states[engine["name"]] = states = cached_gdn_block_states(llm)
        hits_before = _prefix_cache_hits(llm)
        other = text_ids[-tail:]
        round2 = [p + o[: job["reused_output"]] + other for p, o in zip(round1, out1)]
        outputs2 = llm.generate([TokensPrompt(prompt_token_ids=p) for p in round2], params, use_tqdm=False)
        out2 = [list(o.outputs[0].token_ids) for o in outputs2]
        results[engine["name"]] = {
            "token_ids": out1 + out2,
            "texts": [str(ids) for ids in out1 + out2],
            "block_size": block_size,
            "round1_lens": [len(p) for p in round1],
            "round2_hits": _prefix_cache_hits(llm) - hits_before,
            "round2_cached": [o.num_cached_tokens for o in outputs2],
            "state_check": compare_block_states(states, block_states.get(engine.get("compare_states_with")),
                                                min(len(p) for p in round1)),
            "metrics": spec_decode_metrics(llm),
            "status": status.snapshot(),
            "counters": dict(vars(COUNTERS)),
            "layout": gdn_layout(llm) if engine.get("layout", True) else None,
            "init_seconds": round(init_seconds, 1),
            "generate_seconds": round(time.time() - started, 1),
        }
        del llm
        gc.collect()
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    return results


if __name__ == "__main__":
    e2e_job.main(run)
