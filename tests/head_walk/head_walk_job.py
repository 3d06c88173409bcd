"""Runs offline vLLM engines (Model Runner V2 through the test-only shim) with a DSpark drafter and walks every
draft step twice: vLLM's own `_sample_sequential` on a copy of the step's state, then hybridspec's (which the
engine keeps). Prints the engines' outputs and the comparison as JSON.

    python tests/head_walk/head_walk_job.py JOB.json OUT.json

JOB: {"engines": [{"name", "model", "speculative_config", "additional_config", "llm_kwargs", "sampling"}],
      "prompts": [...], "max_tokens": N, "dense_target": {"out", "drafter", "tokenizer"} (optional),
      "topk_drafter": {"out", "drafter", "topk"} (optional: a copy of the drafter with `dspark_draft_topk`)}.
"sampling": {"temperature": T, "seed": S, "greedy_every": k} draws request i with seed S + i, except every k-th
request, which stays greedy (absent: all greedy). Started by test_walk_e2e.py under `mrv2_env()`; the engines run
through tests/e2e_job.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for e2e_job (PYTHONSAFEPATH keeps it off)
import e2e_job  # noqa: E402


def _valid_rows(spec, num_reqs):
    reqs = spec.sample_idx_mapping[: num_reqs * spec.num_speculative_steps].view(num_reqs, -1)[:, 0]
    return reqs >= 0, reqs


def _state(spec):
    return [t.clone() for t in (spec.draft_tokens, spec.draft_logits, spec.draft_token_confidence_probs)
            if t is not None]


def _restore(spec, saved):
    live = [t for t in (spec.draft_tokens, spec.draft_logits, spec.draft_token_confidence_probs) if t is not None]
    for tensor, copy in zip(live, saved):
        tensor.copy_(copy)


def _outputs(spec, num_reqs):
    valid, reqs = _valid_rows(spec, num_reqs)
    out = {"tokens": spec.draft_tokens[:num_reqs][valid].clone()}
    if spec.draft_logits is not None:
        out["cache"] = spec.draft_logits[reqs[valid]].clone()
    return out


def install_shadow_walk(stats):
    from vllm_hybridspec.plugin import register

    register()  # arms the patch before the speculator module is imported (vLLM's own call is then a no-op)
    import hybridspec_kernels.head_walk as kernels
    import hybridspec_kernels.head_walk_topk as topk_kernels
    import vllm.v1.worker.gpu.spec_decode.dspark.speculator as module

    from vllm_hybridspec.head_walk.patches import UseHybridSpecHeadWalk

    assert UseHybridSpecHeadWalk.is_applied(), "the head_walk patch was not applied on import"
    ours, vllms = module.DSparkSpeculator._sample_sequential, UseHybridSpecHeadWalk.original()

    def counting(launch, key):
        def counting_launch(*args, **kwargs):
            stats[key] += 1
            return launch(*args, **kwargs)
        return counting_launch

    kernels.head_walk = counting(kernels.head_walk, "kernel_launches")
    topk_kernels.head_walk_topk = counting(topk_kernels.head_walk_topk, "topk_kernel_launches")

    def shadow(self, num_reqs, head_hidden):
        before = _state(self)
        vllms(self, num_reqs, head_hidden)
        want = _outputs(self, num_reqs)
        _restore(self, before)
        launches = stats["kernel_launches"] + stats["topk_kernel_launches"]
        ours(self, num_reqs, head_hidden)
        got = _outputs(self, num_reqs)
        stats["walks"] += 1
        stats["walks_through_kernel"] += stats["kernel_launches"] + stats["topk_kernel_launches"] > launches
        rows = want["tokens"].shape[0]
        if rows == 0:
            return
        stats["compared_steps"] += 1
        stats["compared_drafts"] += want["tokens"].numel()
        stats["differing_drafts"] += int((want["tokens"] != got["tokens"]).sum())
        if "cache" in want:
            diff = (want["cache"].double() - got["cache"].double()).abs().nan_to_num(0.0)
            stats["cache_max_abs_diff"] = max(stats["cache_max_abs_diff"], float(diff.max()))
            stats["cache_entries"] += want["cache"].numel()
            stats["cache_equal_entries"] += int((want["cache"] == got["cache"]).sum())
        if len(stats["sample_drafts"]) < 4:
            stats["sample_drafts"].append({"vllm": want["tokens"].tolist(), "ours": got["tokens"].tolist()})

    module.DSparkSpeculator._sample_sequential = shadow


def new_stats():
    return dict(walks=0, walks_through_kernel=0, kernel_launches=0, topk_kernel_launches=0, compared_steps=0,
                compared_drafts=0,
                differing_drafts=0, cache_entries=0, cache_equal_entries=0, cache_max_abs_diff=0.0, sample_drafts=[])


def build_dense_target(out, drafter, tokenizer):
    """A random fp32 Qwen3 target for the tiny DSpark drafter: vLLM's CPU GDN kernels run only in bf16, which the
    Triton interpreter computes wrongly, so the megakernel can run in an engine only beside a dense fp32 target."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    draft = AutoConfig.from_pretrained(drafter)
    tok = AutoTokenizer.from_pretrained(tokenizer)
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=draft.vocab_size, hidden_size=draft.target_hidden_size, intermediate_size=256,
        num_hidden_layers=max(draft.dflash_config["target_layer_ids"]) + 2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    Qwen3ForCausalLM(config).to(torch.float32).save_pretrained(out)
    tok.save_pretrained(out)


def build_topk_drafter(out, drafter, topk):
    """The drafter with `dspark_draft_topk` in its config (vLLM's top-k walk); the weights are linked, not copied."""
    import json
    import os

    os.makedirs(out, exist_ok=True)
    for name in os.listdir(drafter):
        if name != "config.json" and not os.path.exists(os.path.join(out, name)):
            os.symlink(os.path.join(drafter, name), os.path.join(out, name))
    with open(os.path.join(drafter, "config.json")) as f:
        config = json.load(f)
    config["dspark_draft_topk"] = topk
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def sampling_params(job, engine):
    from vllm import SamplingParams

    sampling = engine.get("sampling")
    if not sampling:
        return e2e_job.greedy_params(job, engine)
    every = sampling.get("greedy_every", 0)
    return [SamplingParams(temperature=0.0 if every and i % every == 0 else sampling["temperature"],
                           seed=sampling["seed"] + i, max_tokens=job["max_tokens"], ignore_eos=True)
            for i in range(len(job["prompts"]))]


def run(job):
    if job.get("dense_target"):
        build_dense_target(**job["dense_target"])
    if job.get("topk_drafter"):
        build_topk_drafter(**job["topk_drafter"])
    stats = new_stats()
    install_shadow_walk(stats)
    return e2e_job.run(job, before_engine=lambda engine: stats.update(new_stats()),
                       collect=lambda llm, engine: {"walk": dict(stats)}, sampling_params=sampling_params)


if __name__ == "__main__":
    e2e_job.main(run)
