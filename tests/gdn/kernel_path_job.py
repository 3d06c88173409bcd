"""The CUDA path's plumbing with the folded reconstruction, run on CPU under the Triton interpreter (fp32):
layer group -> per step: builder's begin_step (fold rows, flush launch) -> kernel verify per layer (fold, then
verify) -> commit (one conv-only reconstruct launch per KV-cache group), against the naive reference per layer
that reconstructs every state right after each step (the unfolded path).

    TRITON_INTERPRET=1 python tests/gdn/kernel_path_job.py      (prints OK; started by test_gdn_kernel_path.py)

Fake layers carry what the path reads from vLLM's layer. Two KV-cache groups, strided like vLLM's, with their
own slots; one cudagraph padding row (slot 0, no tokens); accepted counts 1..L per row. Step 2 verifies two of
step 1's requests again in other batch rows (fold), drops one (flush before the forward) and adds one without
pending; a build without spec rows then flushes everything left.
"""
import os
from types import SimpleNamespace

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"

import torch  # noqa: E402

from hybridspec_kernels.gdn_verify import naive_gdn_reconstruct, naive_gdn_verify  # noqa: E402
from vllm_hybridspec.gdn.plan import BlockParallelPlan  # noqa: E402
from vllm_hybridspec.gdn.step import COUNTERS, GDNLayerGroup, VerifiedRows  # noqa: E402

H, HV, K, V, W = 1, 2, 16, 16, 4
D = 2 * H * K + HV * V
NUM_SLOTS, NUM_LAYERS, MAX_LEN, MAX_REQUESTS = 6, 4, 4, 4
TOLERANCE = dict(atol=2e-4, rtol=2e-3)


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
    generator = torch.Generator().manual_seed(0)
    group = GDNLayerGroup(BlockParallelPlan(max_verify_len=MAX_LEN, max_requests=MAX_REQUESTS, use_kernels=True),
                          NUM_LAYERS)
    layers = [fake_layer(i, generator) for i in range(NUM_LAYERS)]
    for layer in layers:
        group.add_layer(layer)
    group.allocate_workspace(layers[0], torch.device("cpu"), torch.float32)
    assert group.workspace.max_requests == 2 * MAX_REQUESTS
    names = [layer.prefix for layer in layers]
    kv_groups = [group.add_kv_group(names[g::2]) for g in range(2)]
    unfolded = [tuple(t.clone() for t in layer.kv_cache) for layer in layers]  # the naive path, reconstructed eagerly

    def step(cu, slots, accepted):
        cu = torch.tensor(cu, dtype=torch.int32)
        slots = {g: torch.tensor(s, dtype=torch.int32) for g, s in slots.items()}
        num_rows = cu.shape[0] - 1
        for kv_group in kv_groups:
            group.begin_step(kv_group, VerifiedRows(slots[kv_group], cu, torch.arange(num_rows)))
        n = torch.zeros(num_rows, dtype=torch.int32)
        n[: len(accepted)] = torch.tensor(accepted, dtype=torch.int32)
        for i, layer in enumerate(layers):
            num_tokens = int(cu[-1])
            x = torch.randn(num_tokens, D, generator=generator)
            a, b = torch.randn(num_tokens, HV, generator=generator), torch.randn(num_tokens, HV, generator=generator)
            state_indices = slots[group.kv_group_of[i]]
            got = group.verify(i, x, a, b, state_indices, cu)
            operands = (layer.conv1d.weight.view(D, W), None, layer.A_log, layer.dt_bias, *unfolded[i])
            want = naive_gdn_verify(x, a, b, *operands, state_indices, cu, dtype=torch.float64)
            torch.testing.assert_close(got.double(), want, **TOLERANCE)
            naive_gdn_reconstruct(x, a, b, *operands, state_indices, cu, n, dtype=torch.float64)
        group.commit(torch.tensor(accepted))

    def check_states(which):  # 0: conv windows, 1: ssm states, of every slot of every layer
        for i, layer in enumerate(layers):
            torch.testing.assert_close(layer.kv_cache[which], unfolded[i][which], **TOLERANCE)

    # step 1: L = 3, 1, 4 and a padding row
    step([0, 3, 4, 8, 8], {0: [2, 5, 1, 0], 1: [4, 3, 5, 0]}, [2, 1, 4])
    check_states(0)  # conv windows are committed eagerly
    assert COUNTERS.reconstructions == 2 and group.parity == 1
    # step 2: slots 1 / 5 (group 0 / 1) and 2 / 4 fold in new batch rows, 5 / 3 are flushed, 3 / 1 are new
    step([0, 2, 6, 7, 7], {0: [1, 2, 3, 0], 1: [5, 4, 1, 0]}, [2, 4, 1])
    assert COUNTERS.flushes == 2
    check_states(0)
    for kv_group in kv_groups:  # a step without spec rows: the builder flushes every pending ssm state
        group.begin_step(kv_group, None)
    assert group.pending == {} and COUNTERS.flushes == 4
    check_states(0)
    check_states(1)
    print("OK")


if __name__ == "__main__":
    main()
