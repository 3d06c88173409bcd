"""The block-parallel verify of one layer through `hybridspec_kernels.gdn_verify` (CUDA; tested on CPU under the
Triton interpreter in fp32). The commit side is `GDNLayerGroup._reconstruct_kernel` (step.py)."""
from __future__ import annotations

import sys

import torch

# Set by the block-parallel layers' conv-weight loaders: vLLM's loaders (the first load, in-place reloads, weight
# syncs) write through `param.data`, which the transposed copies' version check cannot see.
_conv_weights_loaded = False


def note_conv_weight_loaded() -> None:
    global _conv_weights_loaded
    _conv_weights_loaded = True


def sync_conv_weight_copies() -> None:
    """Before a step's forward (the GDN metadata builder, which runs every step, also before graph replays): the
    kernels' cached transposed conv weights (`transposed_conv_weight`) follow the layers' weights, in place. A no-op
    until the kernels have run (nothing cached) and while a graph is being captured."""
    global _conv_weights_loaded
    verify = sys.modules.get("hybridspec_kernels.gdn_verify.verify")
    if verify is None or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        return
    verify.refresh_transposed_conv_weights(everything=_conv_weights_loaded)
    _conv_weights_loaded = False


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
