"""Routed experts the way vLLM 0.33 runs a bf16 MoE layer on its Triton path (TritonExperts.apply without
quantization, LoRA or expert parallelism), on vLLM's own kernel and launcher (kernels_loader.load_vllm_moe):

    config      try_get_optimal_moe_config(w1, w2, top_k, dtype, M): tuned JSON nearest to M, else the default rule
    assignment  _prepare_expert_assignment: one block per route when M * top_k * 4 <= E (no alignment), else
                moe_align_block_size (moe_align.py: one Triton launch in place of vLLM's CUDA op)
    GEMM 1      fused_moe_kernel: x [M, K] x w13 [E, 2I, K] -> [M, top_k, 2I]
    activation  silu(gate) * up on the two halves of 2I (vLLM's silu_and_mul; here fused_ops.silu_mul)
    GEMM 2      fused_moe_kernel: [M * top_k, I] x w2 [E, K, I] -> [M, top_k, K], times the routing weight
    sum         over top_k (vLLM's moe_sum; here torch.sum)

The routing weights are vLLM's renormalised top-k softmax of the router logits, here over the imposed ids
(imposed_topk_weights: one small Triton launch, as vLLM's topk_softmax is one).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import fused_ops


@triton.jit
def _imposed_topk_weights_kernel(logits, ids, w_out, stride_l, K: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    o = tl.arange(0, BLOCK_K)
    m = o < K
    e = tl.load(ids + t * K + o, mask=m, other=0)
    x = tl.load(logits + t * stride_l + e, mask=m, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    tl.store(w_out + t * K + o, p / tl.sum(p, 0), mask=m)


def imposed_topk_weights(logits: torch.Tensor, ids: torch.Tensor, backend: str = "triton") -> torch.Tensor:
    """logits [T, E], ids [T, k] int32 -> fp32 [T, k]: softmax over the chosen logits (= vLLM's softmax, top-k,
    renormalise, for these ids)."""
    if backend == "torch":
        return torch.gather(logits.float(), 1, ids.long()).softmax(-1)
    T, k = ids.shape
    out = torch.empty(T, k, dtype=torch.float32, device=logits.device)
    _imposed_topk_weights_kernel[(T,)](logits, ids.contiguous(), out, logits.stride(0), K=k,
                                       BLOCK_K=triton.next_power_of_2(k), num_warps=1)
    return out


def config_dtype(dtype: torch.dtype) -> str | None:
    """vLLM's _get_config_dtype_str for an unquantized model."""
    return "float32" if dtype == torch.float32 else None


def compute_type(dtype: torch.dtype):
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


def fused_experts(vm, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, fused: str = "triton") -> torch.Tensor:
    """x [M, K], w13 [E, 2I, K], w2 [E, K, I], topk_weights [M, k] fp32, topk_ids [M, k] int32 -> [M, K]."""
    fm = vm.module
    M, K = x.shape
    E, N, _ = w13.shape
    top_k = topk_ids.shape[1]
    config = fm.try_get_optimal_moe_config(w13.size(), w2.size(), top_k, config_dtype(x.dtype), M)
    sorted_ids, expert_ids, num_post_pad = fm._prepare_expert_assignment(topk_ids, config, M, top_k, E, None)
    cache1 = torch.empty(M, top_k, N, device=x.device, dtype=x.dtype)
    cache3 = torch.empty(M, top_k, K, device=x.device, dtype=x.dtype)
    flags = dict(compute_type=compute_type(x.dtype), use_fp8_w8a8=False, use_int8_w8a8=False,
                 use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False)
    fm.invoke_fused_moe_triton_kernel(x, w13, cache1, None, None, None, sorted_ids, expert_ids, num_post_pad,
                                      False, top_k, config, **flags)
    act = fused_ops.silu_mul(cache1.view(M * top_k, N), backend=fused)
    fm.invoke_fused_moe_triton_kernel(act, w2, cache3, None, None, topk_weights, sorted_ids, expert_ids,
                                      num_post_pad, True, 1, config, **flags)
    return cache3.sum(dim=1)


def describe_configs(vm, E: int, N: int, K: int, top_k: int, dtype, token_counts) -> dict:
    """Which config file vLLM's lookup reads on this device (or the default rule), and the config per M."""
    fm = vm.module
    name = fm.get_config_file_name(E, N // 2, config_dtype(dtype))
    folder = fm.envs.VLLM_TUNED_CONFIG_FOLDER
    import os
    source = "default rule (get_default_config)"
    for path, label in ((os.path.join(folder, name) if folder else None, "VLLM_TUNED_CONFIG_FOLDER"),
                        (str(vm.config_dir / name), "wheel configs/")):
        if path and os.path.exists(path):
            original = vm.tuned_sources.get(name, name) if label == "VLLM_TUNED_CONFIG_FOLDER" else name
            source = f"{label} {name} (the wheel's {original})"
            break
    w1_shape, w2_shape = (E, N, K), (E, K, N // 2)
    per_m = {}
    for M in token_counts:
        c = fm.try_get_optimal_moe_config(w1_shape, w2_shape, top_k, config_dtype(dtype), M)
        naive = M * top_k * 4 <= E
        per_m[str(M)] = {**c, "assignment": "one block per route" if naive else "moe_align_block_size"}
    return {"config_file_name": name, "source": source, "per_tokens": per_m}
