"""Tiny DFlash and DSpark drafters for the tiny target, distilled from the target's greedy predictions.

The training forward re-implements what vLLM's `qwen3_dflash.py` / `qwen3_dspark.py` compute at inference:
target hidden states of `target_layer_ids` (outputs of those layers) -> `fc` -> `hidden_norm` -> per draft
layer K/V of the context (k_norm, RoPE at the context positions); the query block attends to the context and,
non-causally, to itself; embeddings and LM head are the target's.

- DFlash (1 + N layout): block = [anchor, mask x N] at positions p..p+N; mask i predicts the token AT p+i.
- DSpark (anchor-as-first, N queries): block = [anchor, mask x (N-1)] at p..p+N-1; query i predicts the token at
  p+i+1 with logits = base + markov_w2 @ markov_w1[previous token] (the anchor, then the previous draft).
"""
from __future__ import annotations

import json
from pathlib import Path

DRAFT_DIMS = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64)
TARGET_LAYER_IDS = [1, 2]  # outputs of target layers 1 and 2
BLOCK = 4                  # drafts per step the drafters are trained for
MARKOV_RANK = 32
ROPE_THETA = 10000.0


def _modules():
    import torch
    from torch import nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):  # vLLM's RMSNorm (weight multiplies, init 1)
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def rope(x, positions):  # neox style over the whole head dim; x [..., L, heads, d], positions [..., L]
        d = x.shape[-1]
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        angles = positions.float().unsqueeze(-1) * inv_freq  # [..., L, d/2]
        cos, sin = angles.cos().unsqueeze(-2), angles.sin().unsqueeze(-2)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class Attention(nn.Module):
        def __init__(self, hidden, heads, kv_heads, head_dim):
            super().__init__()
            self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
            self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
            self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
            self.q_norm = RMSNorm(head_dim)
            self.k_norm = RMSNorm(head_dim)

        def kv(self, x, positions):
            k = self.k_norm(self.k_proj(x).unflatten(-1, (self.kv_heads, self.head_dim)))
            v = self.v_proj(x).unflatten(-1, (self.kv_heads, self.head_dim))
            return rope(k, positions), v

        def forward(self, x, positions, ctx_k, ctx_v, ctx_visible):
            """x [B, A, Q, H]; positions [B, A, Q]; ctx_k/v [B, T, kvh, d]; ctx_visible [B, A, T] bool."""
            q = rope(self.q_norm(self.q_proj(x).unflatten(-1, (self.heads, self.head_dim))), positions)
            k, v = self.kv(x, positions)  # [B, A, Q, kvh, d]
            group = self.heads // self.kv_heads
            ctx_k, ctx_v = ctx_k.repeat_interleave(group, -2), ctx_v.repeat_interleave(group, -2)
            k, v = k.repeat_interleave(group, -2), v.repeat_interleave(group, -2)
            scale = self.head_dim ** -0.5
            s_ctx = torch.einsum("baqhd,bthd->baqht", q, ctx_k) * scale
            s_ctx = s_ctx.masked_fill(~ctx_visible[:, :, None, None, :], float("-inf"))
            s_blk = torch.einsum("baqhd,bakhd->baqhk", q, k) * scale
            p = torch.cat([s_ctx, s_blk], -1).softmax(-1)
            T = ctx_k.shape[1]
            out = torch.einsum("baqht,bthd->baqhd", p[..., :T], ctx_v) + torch.einsum("baqhk,bakhd->baqhd", p[..., T:], v)
            return self.o_proj(out.flatten(-2))

    class MLP(nn.Module):
        def __init__(self, hidden, inter):
            super().__init__()
            self.gate_proj = nn.Linear(hidden, inter, bias=False)
            self.up_proj = nn.Linear(hidden, inter, bias=False)
            self.down_proj = nn.Linear(inter, hidden, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self, d):
            super().__init__()
            hidden = d["hidden_size"]
            self.input_layernorm = RMSNorm(hidden)
            self.self_attn = Attention(hidden, d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"])
            self.post_attention_layernorm = RMSNorm(hidden)
            self.mlp = MLP(hidden, d["intermediate_size"])

    class Drafter(nn.Module):
        def __init__(self, d, fc_in, vocab, markov_rank=None):
            super().__init__()
            hidden = d["hidden_size"]
            self.fc = nn.Linear(fc_in, hidden, bias=False)
            self.hidden_norm = RMSNorm(hidden)
            self.layers = nn.ModuleList([Layer(d) for _ in range(d["num_hidden_layers"])])
            self.norm = RMSNorm(hidden)
            if markov_rank:
                self.markov_head = nn.Module()
                self.markov_head.markov_w1 = nn.Embedding(vocab, markov_rank)
                self.markov_head.markov_w2 = nn.Linear(markov_rank, vocab, bias=False)
                nn.init.normal_(self.markov_head.markov_w1.weight, std=0.02)
                nn.init.zeros_(self.markov_head.markov_w2.weight)

        def forward(self, block_embeds, block_positions, aux, ctx_visible):
            ctx = self.hidden_norm(self.fc(aux))  # [B, T, H]
            ctx_positions = torch.arange(aux.shape[1]).expand(aux.shape[0], -1)
            x = block_embeds
            for layer in self.layers:
                ctx_k, ctx_v = layer.self_attn.kv(ctx, ctx_positions)
                h = layer.self_attn(layer.input_layernorm(x), block_positions, ctx_k, ctx_v, ctx_visible)
                x = x + h
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            return self.norm(x)

    return Drafter


def _target_features(target, tokens):
    """(aux [B, T, len(ids) * H] = outputs of TARGET_LAYER_IDS, teacher [B, T] = greedy next-token ids)."""
    import torch

    captured = {}
    hooks = [
        target.model.layers[i].register_forward_hook(lambda m, a, out, i=i: captured.__setitem__(i, out))
        for i in TARGET_LAYER_IDS
    ]
    try:
        with torch.no_grad():
            logits = target(input_ids=tokens).logits
    finally:
        for hook in hooks:
            hook.remove()
    aux = torch.cat([captured[i][0] if isinstance(captured[i], tuple) else captured[i] for i in TARGET_LAYER_IDS], -1)
    return aux, logits.argmax(-1)


def _train(kind, target, drafter, stream, mask_id, *, steps, seed, log):
    import torch
    import torch.nn.functional as F

    from vllm_hybridspec.tiny.target import batches, cosine_lr

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3, weight_decay=0.0)
    embed, lm_head = target.model.embed_tokens, target.lm_head
    seq_len, anchors_per_seq = 64, 8
    queries = BLOCK + 1 if kind == "dflash" else BLOCK
    agreement = 0.0
    for step, tokens in enumerate(batches(stream, 8, seq_len, steps, generator)):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, steps, 3e-3)
        aux, teacher = _target_features(target, tokens)
        B = tokens.shape[0]
        p = torch.randint(1, seq_len - BLOCK - 1, (B, anchors_per_seq), generator=generator)  # anchor positions
        offsets = torch.arange(queries)
        positions = p[..., None] + offsets  # [B, A, Q]
        block_tokens = torch.full_like(positions, mask_id)
        block_tokens[..., 0] = torch.gather(tokens, 1, p)
        ctx_visible = torch.arange(seq_len)[None, None, :] < p[..., None]
        with torch.no_grad():
            block_embeds = embed(block_tokens)
        hidden = drafter(block_embeds, positions, aux, ctx_visible)
        flat_teacher = lambda idx: torch.gather(teacher, 1, idx.flatten(1)).view_as(idx)  # noqa: E731
        if kind == "dflash":
            logits = lm_head(hidden[:, :, 1:])
            labels = flat_teacher(positions[..., 1:] - 1)  # token at p+i = greedy prediction made at p+i-1
        else:
            labels = flat_teacher(positions)  # query at p+i predicts p+i+1
            previous = torch.cat([block_tokens[..., :1], labels[..., :-1]], -1)
            head = drafter.markov_head
            logits = lm_head(hidden) + head.markov_w2(head.markov_w1(previous))
        loss = F.cross_entropy(logits.flatten(0, -2), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        agreement = (logits.argmax(-1) == labels).float().mean().item()
        if step % 20 == 0 or step == steps - 1:
            log(f"{kind} step {step:4d} loss {loss.item():.3f} agreement {agreement:.2f}")
    return agreement


def _save(kind, drafter, tokenizer, target_config, mask_id, out_dir: Path):
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=target_config.vocab_size,
        rms_norm_eps=1e-6,
        max_position_embeddings=target_config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **DRAFT_DIMS,
    )
    config.architectures = ["DFlashDraftModel" if kind == "dflash" else "Qwen3DSparkModel"]
    config.dflash_config = {"mask_token_id": mask_id, "target_layer_ids": list(TARGET_LAYER_IDS)}
    config.target_hidden_size = target_config.hidden_size
    config.block_size = BLOCK + 1 if kind == "dflash" else BLOCK
    if kind == "dspark":
        config.markov_rank = MARKOV_RANK
        config.sample_from_anchor = True
    config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    tensors = {}
    for name, tensor in drafter.state_dict().items():
        tensors[name] = tensor.detach().contiguous().clone()
    if kind == "dspark":  # vLLM's markov_w2 is an LM head: weight [vocab, rank]
        tensors["markov_head.markov_w2.weight"] = drafter.markov_head.markov_w2.weight.detach().clone()
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})


def build_drafters(target, tokenizer, stream, root: Path, *, seed: int, log) -> dict:
    import torch

    Drafter = _modules()
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    fc_in = target.config.hidden_size * len(TARGET_LAYER_IDS)
    stats = {}
    for offset, kind in enumerate(("dflash", "dspark")):
        torch.manual_seed(seed + offset)
        drafter = Drafter(DRAFT_DIMS, fc_in, target.config.vocab_size, MARKOV_RANK if kind == "dspark" else None)
        from vllm_hybridspec.tiny.target import init_linear_and_experts

        init_linear_and_experts(drafter.layers)
        init_linear_and_experts(drafter.fc)
        stats[f"{kind}_agreement"] = round(
            _train(kind, target, drafter, stream, mask_id, steps=80, seed=seed + offset, log=log), 3
        )
        _save(kind, drafter, tokenizer, target.config, mask_id, root / kind)
    (root / "drafters.json").write_text(json.dumps({"target_layer_ids": TARGET_LAYER_IDS, "block": BLOCK}) + "\n")
    return stats
