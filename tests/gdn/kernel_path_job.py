"""The CUDA path's plumbing, run on CPU under the Triton interpreter (fp32): layer group -> kernel verify per
layer -> one reconstruct launch per KV-cache group, against the naive reference per layer.

    TRITON_INTERPRET=1 python tests/gdn/kernel_path_job.py      (prints OK; started by test_gdn_kernel_path.py)

Fake layers carry what the path reads from vLLM's layer. Two KV-cache groups, strided like vLLM's, with their
own slots; one cudagraph padding row (slot 0, no tokens); accepted counts 1..L per row. Run twice: plain, then
with prefix caching's block-boundary states (each row reaches a boundary at a different token of its step).
"""
import os
from types import SimpleNamespace

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"

import torch  # noqa: E402

from hybridspec_kernels.gdn_verify import naive_gdn_reconstruct, naive_gdn_verify  # noqa: E402
from vllm_hybridspec.gdn.kernel_path import kernel_verify  # noqa: E402
from vllm_hybridspec.gdn.plan import BlockParallelPlan  # noqa: E402
from vllm_hybridspec.gdn.step import BlockCheckpoints, GDNLayerGroup, VerifiedRows  # noqa: E402

H, HV, K, V, W = 1, 2, 16, 16, 4
D = 2 * H * K + HV * V
NUM_SLOTS, NUM_LAYERS, MAX_LEN = 10, 4, 4
BLOCK_SIZE = 4
# rows computed 2, 3, 5 tokens before the step and accept 2, 1, 4: boundaries 4, 4, 8 after 2, 1, 3 of their tokens
COMPUTED = torch.tensor([2, 3, 5, 0], dtype=torch.int32)
BLOCK_TABLE = torch.tensor([[6, 2, 0], [7, 5, 0], [1, 8, 0], [0, 0, 0]], dtype=torch.int32)
CHECKPOINT_SLOTS, CHECKPOINT_LENS = torch.tensor([6, 7, 8, 0]), torch.tensor([2, 1, 3, 0])


def fake_layer(index, generator):
    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=generator) * scale

    return SimpleNamespace(
        prefix=f"model.layers.{index}.linear_attn", tp_size=1, num_k_heads=H, num_v_heads=HV, head_k_dim=K,
        head_v_dim=V, conv_kernel_size=W,
        conv1d=SimpleNamespace(weight=rand(D, 1, W, scale=0.3), bias=None),
        A_log=rand(HV, scale=0.5), dt_bias=rand(HV),
        kv_cache=(rand(NUM_SLOTS, W - 1, D), rand(NUM_SLOTS, HV, V, K, scale=0.1)),
    )


def main():
    for checkpoints in (False, True):
        run_step(checkpoints)
    run_after_weight_reload()
    print("OK")


def run_after_weight_reload():
    """The H200's tuned verify configs read a cached transposed copy of the conv weight. vLLM reloads and weight
    syncs write the weight through `.data` (no version bump): once its loader noted the load, the next step's
    builder sync (sync_conv_weight_copies) refreshes the copy and the verify uses the new weight."""
    from hybridspec_kernels.gdn_verify import verify as verify_module
    from vllm_hybridspec.gdn.kernel_path import note_conv_weight_loaded, sync_conv_weight_copies

    generator = torch.Generator().manual_seed(1)
    group = GDNLayerGroup(BlockParallelPlan(max_verify_len=MAX_LEN, max_requests=4, use_kernels=True), 1)
    layer = fake_layer(0, generator)
    group.add_layer(layer)
    group.allocate_workspace(layer, torch.device("cpu"), torch.float32)
    group.add_kv_group([layer.prefix])
    cu = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    state_indices = torch.tensor([2, 5, 1], dtype=torch.int32)
    shipped = verify_module.default_verify_config
    verify_module.default_verify_config = lambda *args, **kwargs: verify_module.VerifyConfig(hoist=True,
                                                                                             weight_tiles=True)
    try:
        for reload in (False, True):
            if reload:
                layer.conv1d.weight.data.copy_(torch.randn(D, 1, W, generator=generator) * 0.3)
                note_conv_weight_loaded()
                sync_conv_weight_copies()
            x, a, b = (torch.randn(8, D, generator=generator), torch.randn(8, HV, generator=generator),
                       torch.randn(8, HV, generator=generator))
            got = kernel_verify(layer, group.workspace_of(0), x, a, b, state_indices, cu, MAX_LEN)
            want = naive_gdn_verify(x, a, b, layer.conv1d.weight.view(D, W), None, layer.A_log, layer.dt_bias,
                                    layer.kv_cache[0], layer.kv_cache[1], state_indices, cu, dtype=torch.float64)
            torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=2e-3)
    finally:
        verify_module.default_verify_config = shipped


def run_step(checkpoints: bool):
    generator = torch.Generator().manual_seed(0)
    plan = BlockParallelPlan(max_verify_len=MAX_LEN, max_requests=4, use_kernels=True)
    group = GDNLayerGroup(plan, NUM_LAYERS)
    layers = [fake_layer(i, generator) for i in range(NUM_LAYERS)]
    for layer in layers:
        group.add_layer(layer)
    group.allocate_workspace(layers[0], torch.device("cpu"), torch.float32)
    names = [layer.prefix for layer in layers]
    kv_groups = [group.add_kv_group(names[g::2]) for g in range(2)]
    expected = [tuple(t.clone() for t in layer.kv_cache) for layer in layers]

    cu = torch.tensor([0, 3, 4, 8, 8], dtype=torch.int32)  # L = 3, 1, 4, and a padding row
    slots = {0: torch.tensor([2, 5, 1, 0], dtype=torch.int32), 1: torch.tensor([4, 3, 5, 0], dtype=torch.int32)}
    accepted = torch.tensor([2, 1, 4])  # per sampled batch row; the padding row gets 0
    inputs = []
    for i, layer in enumerate(layers):
        x, a, b = torch.randn(8, D, generator=generator), torch.randn(8, HV, generator=generator), torch.randn(8, HV, generator=generator)
        inputs.append((x, a, b))
        state_indices = slots[group.kv_group_of[i]]
        got = kernel_verify(layer, group.workspace_of(i), x, a, b, state_indices, cu, MAX_LEN)
        weight = layer.conv1d.weight.view(D, W)
        want = naive_gdn_verify(x, a, b, weight, None, layer.A_log, layer.dt_bias, layer.kv_cache[0],
                                layer.kv_cache[1], state_indices, cu, dtype=torch.float64)
        torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=2e-3)
        n = torch.tensor([2, 1, 4, 0], dtype=torch.int32)
        naive_gdn_reconstruct(x, a, b, weight, None, layer.A_log, layer.dt_bias, expected[i][0], expected[i][1],
                              state_indices, cu, n, dtype=torch.float64,
                              checkpoint_indices=CHECKPOINT_SLOTS if checkpoints else None,
                              checkpoint_lens=CHECKPOINT_LENS if checkpoints else None)
    blocks = BlockCheckpoints(COMPUTED, BLOCK_TABLE, BLOCK_SIZE) if checkpoints else None
    for kv_group in kv_groups:
        group.record(kv_group, VerifiedRows(slots[kv_group], cu, torch.arange(4), blocks))
    group.commit(accepted)
    for i, layer in enumerate(layers):
        torch.testing.assert_close(layer.kv_cache[1], expected[i][1], atol=2e-4, rtol=2e-3)
        torch.testing.assert_close(layer.kv_cache[0], expected[i][0])
    assert group.pending == {}


if __name__ == "__main__":
    main()
