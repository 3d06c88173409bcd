"""The block-parallel verify of one layer through `hybridspec_kernels.gdn_verify` (CUDA; tested on CPU under the
Triton interpreter in fp32). The commit side is `GDNLayerGroup._reconstruct_kernel` (step.py)."""
from __future__ import annotations

import torch


def kernel_verify(layer, workspace, mixed_qkv, a, b, state_indices, cu_seqlens, max_seqlen, out=None) -> torch.Tensor:
    """[T, HV, V] core attention output of the spec tokens from the layer's committed states; writes `out` if
    given (a contiguous [T, HV, V] slice of vLLM's core_attn_out) and this step's rows of `workspace`."""
    from hybridspec_kernels.gdn_verify import gdn_verify

    weight = layer.conv1d.weight
    return gdn_verify(
        mixed_qkv, a, b, weight.view(weight.size(0), weight.size(-1)), layer.conv1d.bias, layer.A_log,
        layer.dt_bias, layer.kv_cache[0], layer.kv_cache[1], state_indices, cu_seqlens, workspace,
        max_seqlen=max_seqlen, out=out,
    )
