"""Builds the tiny local models (tokenizer, hybrid target with MTP head, drafters) and caches them.

    python -m vllm_hybridspec.tiny DIR        # build into DIR (skipped when DIR already holds this build)
    models = ensure_tiny_models(".tiny")       # cached under .tiny/<builder hash>/

Everything is deterministic for a given seed and environment; the cache key is a hash of this package's
source, so editing the builder rebuilds.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

SEED = 1234
MANIFEST = "manifest.json"
DEFAULT_CACHE_ENV = "HYBRIDSPEC_TINY_CACHE"


@dataclass(frozen=True)
class TinyModels:
    """Paths of one build. `target` carries the MTP head (`num_nextn_predict_layers=1`)."""

    root: Path
    target: Path        # Qwen3NextForCausalLM, trained on the toy corpus, + trained MTP head
    target_exact: Path  # the same with final norms set to -1: all logits 0, every draft accepted
    dense: Path         # Qwen3ForCausalLM (no GDN layers), random weights
    dflash: Path        # DFlashDraftModel for `target`
    dspark: Path        # Qwen3DSparkModel for `target`
    stats: dict

    @property
    def prompts(self) -> list[str]:
        from vllm_hybridspec.tiny.corpus import PROMPTS

        return list(PROMPTS)


def builder_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _load(root: Path) -> TinyModels | None:
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("builder_hash") != builder_hash():
        return None
    return TinyModels(root=root, stats=manifest["stats"], **{k: root / v for k, v in manifest["models"].items()})


def ensure_tiny_models(cache_root: str | os.PathLike | None = None, log=print) -> TinyModels:
    """The cached build under cache_root/<builder hash>/, built first if missing."""
    if cache_root is None:
        cache_root = os.environ.get(DEFAULT_CACHE_ENV) or Path.home() / ".cache" / "vllm-hybridspec" / "tiny"
    return build(Path(cache_root) / builder_hash(), log=log)


def build(out_dir: str | os.PathLike, log=print) -> TinyModels:
    out_dir = Path(out_dir).resolve()
    cached = _load(out_dir)
    if cached is not None:
        return cached
    staging = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.time()

    def timed_log(message: str) -> None:
        log(f"[{time.time() - started:6.1f} s] {message}")

    stats = _build_into(staging, timed_log)
    stats["build_seconds"] = round(time.time() - started, 1)
    models = {"target": "target", "target_exact": "target-exact", "dense": "dense", "dflash": "dflash", "dspark": "dspark"}
    manifest = {"builder_hash": builder_hash(), "seed": SEED, "models": models, "stats": stats}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if out_dir.exists():  # a stale build (other hash) or a concurrent builder that finished first
        shutil.rmtree(out_dir, ignore_errors=True)
    try:
        staging.rename(out_dir)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"tiny models ready in {out_dir} ({stats['build_seconds']} s)")
    loaded = _load(out_dir)
    assert loaded is not None
    return loaded


def _build_into(root: Path, log) -> dict:
    from vllm_hybridspec.tiny import drafters, target
    from vllm_hybridspec.tiny.corpus import documents
    from vllm_hybridspec.tiny.tokenizer import train_tokenizer

    target.block_fla()
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3NextForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(SEED)
    stats: dict = {}

    texts = documents(SEED, 1500)
    tokenizer = train_tokenizer(texts, vocab_size=1000, out_dir=root / "tokenizer")
    stream = torch.tensor(tokenizer("".join(texts))["input_ids"], dtype=torch.long)
    stats["tokenizer_vocab"] = len(tokenizer)
    stats["corpus_tokens"] = int(stream.numel())
    log(f"tokenizer: {len(tokenizer)} tokens; corpus: {stream.numel()} tokens")

    config = target.target_config(tokenizer)
    model = Qwen3NextForCausalLM(config)
    target.init_linear_and_experts(model)
    stats["target_params"] = sum(p.numel() for p in model.parameters())
    stats["target_final_loss"] = round(
        target.train_target(model, stream, steps=120, batch_size=16, seq_len=64, lr=3e-3, seed=SEED, log=log), 4
    )

    mtp = target.make_mtp(config)
    stats["mtp_agreement"] = round(
        target.train_mtp(model, mtp, stream, steps=60, batch_size=16, seq_len=64, lr=3e-3, seed=SEED + 1, log=log), 3
    )

    target_dir = root / "target"
    model.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    weights_file = target_dir / "model.safetensors"
    weights = load_file(weights_file)
    weights.update(target.mtp_checkpoint_tensors(mtp))
    save_file(weights, weights_file, metadata={"format": "pt"})

    # Degenerate exact-acceptance variant: Qwen3-Next norms scale by (1 + w), so w = -1 zeroes the final
    # hidden state -> all logits 0 -> target and MTP both pick token 0 and every draft is accepted.
    exact_dir = root / "target-exact"
    shutil.copytree(target_dir, exact_dir)
    weights["model.norm.weight"] = torch.full_like(weights["model.norm.weight"], -1.0)
    weights["mtp.norm.weight"] = torch.full_like(weights["mtp.norm.weight"], -1.0)
    save_file(weights, exact_dir / "model.safetensors", metadata={"format": "pt"})

    dense_config = Qwen3Config(
        vocab_size=target.VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    dense = Qwen3ForCausalLM(dense_config)
    target.init_linear_and_experts(dense)
    dense.save_pretrained(root / "dense")
    tokenizer.save_pretrained(root / "dense")

    stats.update(drafters.build_drafters(model, tokenizer, stream, root, seed=SEED + 2, log=log))
    shutil.rmtree(root / "tokenizer")
    return stats
