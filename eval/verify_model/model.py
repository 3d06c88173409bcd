"""A real-shaped hybrid GDN + MoE target (random weights) and its decode-time verify pass.

One verify pass: B requests x L tokens each (T = B * L rows, request-major), every request with `ctx_len`
tokens of prefix already in the attention KV cache and committed GDN conv/ssm states.

    embedding -> 40 x [RMSNorm -> mixer (GDN | gated attention) -> RMSNorm -> MoE] -> RMSNorm -> LM head

Mixer / MoE implementations are pluggable (`Kernels`): on the GPU the GDN core is vLLM 0.33's verify path
(causal_conv1d_update + fused_sigmoid_gating_delta_rule_update, per-token state writes into L slots) or ours
(hybridspec_kernels.gdn_verify + one gdn_reconstruct launch for all layers); attention is torch SDPA (flash with
native GQA and bottom-right causal mask, or memory-efficient with the query heads folded per KV head); MoE is
vLLM 0.33's fused-MoE Triton kernel with its launcher and config lookup (vllm_moe.py) or OpenAI's triton_kernels
(routing with imposed expert ids + two matmul_ogs), each with its own weight layout. On the CPU every piece has
a torch path with the same math (tiny shapes, smoke tests), and the Triton ones run under the interpreter.

`forward(..., parts=...)` runs only the ops of the listed layer types and feeds the others' outputs from
static buffers, so each layer type can be captured and timed on its own (the per-layer-type breakdown).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from . import fused_ops
from .shapes import TargetShape

LAYER_TYPES = ("gdn", "attention", "moe", "rest")
SWIGLU_ALPHA = 1.0  # OAI swiglu: x_g * sigmoid(alpha x_g) * (x_l + 1); alpha = 1 is SiLU-and-mul (+ x_g term)


@dataclass
class Kernels:
    """Which implementation runs each piece. `vllm_gdn` is a namespace with vLLM's `causal_conv1d_update` and
    `fused_sigmoid_gating_delta_rule_update`; `ours_gdn` one with `gdn_verify`, `gdn_reconstruct` and the
    workspace / state-table classes; `oai_moe` one with `routing`, `matmul_ogs`, `FusedActivation`, `FnSpecs`,
    `swiglu_fn`; `vllm_moe` the namespace of kernels_loader.load_vllm_moe. None means the torch path.
    `moe_impl` picks the MoE kernels and the expert weight layout: "vllm" (w13 [E, 2I, H] gate|up halves,
    SiLU-and-mul, w2 [E, H, I]) or "oai" (w1 [E, H, 2I] interleaved, OAI swiglu, w2 [E, I, H])."""
    fused: str = "triton"            # "triton" | "torch" for fused_ops
    vllm_gdn: object | None = None
    ours_gdn: object | None = None
    oai_moe: object | None = None
    attention: str = "flash_gqa"     # "flash_gqa" | "efficient_folded" | "math"
    moe_routing: str = "provided"    # OAI: impose ids by "provided" (routing's expt_indx) | "mask" (-inf router bias)
    moe_impl: str = "vllm"           # "vllm" | "oai" (see above)
    vllm_moe: object | None = None


def _normal_(t: torch.Tensor, std: float, gen: torch.Generator | None = None) -> torch.Tensor:
    return t.normal_(0.0, std, generator=gen)


class GDNLayer:
    def __init__(self, s: TargetShape, device, dtype, gen):
        std = s.hidden ** -0.5
        self.w_qkvz = _normal_(torch.empty(s.gdn_conv_dim + s.gdn_value_dim, s.hidden, device=device, dtype=dtype), std, gen)
        self.w_ba = _normal_(torch.empty(2 * s.gdn_v_heads, s.hidden, device=device, dtype=dtype), std, gen)
        self.conv_w = _normal_(torch.empty(s.gdn_conv_dim, s.conv_width, device=device, dtype=dtype), 0.5, gen)
        self.A_log = torch.empty(s.gdn_v_heads, device=device, dtype=torch.float32).uniform_(-1.0, 1.0, generator=gen)
        self.dt_bias = torch.empty(s.gdn_v_heads, device=device, dtype=torch.float32).uniform_(-1.0, 1.0, generator=gen)
        self.norm_w = 1.0 + _normal_(torch.empty(s.gdn_head_dim, device=device, dtype=dtype), 0.1, gen)
        self.w_out = _normal_(torch.empty(s.hidden, s.gdn_value_dim, device=device, dtype=dtype), s.gdn_value_dim ** -0.5, gen)
        self.conv_state = None   # [slots, W-1+Lmax-1, conv_dim] (vLLM's SD layout)
        self.ssm_state = None    # [slots, HV, V, K] fp32


class AttentionLayer:
    def __init__(self, s: TargetShape, device, dtype, gen):
        std = s.hidden ** -0.5
        n_q = s.attn_q_heads * s.attn_head_dim
        n_kv = s.attn_kv_heads * s.attn_head_dim
        self.w_qkv = _normal_(torch.empty(2 * n_q + 2 * n_kv, s.hidden, device=device, dtype=dtype), std, gen)
        self.q_norm_w = 1.0 + _normal_(torch.empty(s.attn_head_dim, device=device, dtype=dtype), 0.1, gen)
        self.k_norm_w = 1.0 + _normal_(torch.empty(s.attn_head_dim, device=device, dtype=dtype), 0.1, gen)
        self.w_o = _normal_(torch.empty(s.hidden, n_q, device=device, dtype=dtype), n_q ** -0.5, gen)
        self.k_cache = None      # [Bmax, KV, S_max, D]
        self.v_cache = None


class MoELayer:
    def __init__(self, s: TargetShape, device, dtype, gen, layout: str = "vllm"):
        if layout not in ("vllm", "oai"):
            raise ValueError(f"layout must be 'vllm' or 'oai', got {layout!r}")
        std = s.hidden ** -0.5
        E, I, H = s.num_experts, s.expert_inter, s.hidden
        self.layout = layout
        self.w_router = _normal_(torch.empty(E, H, device=device, dtype=dtype), std, gen)
        if layout == "vllm":
            # vLLM's [E, N, K]: w1 = w13 rows [gate (I) | up (I)], w2 [E, H, I]
            self.w1 = _normal_(torch.empty(E, 2 * I, H, device=device, dtype=dtype), std, gen)
            self.w2 = _normal_(torch.empty(E, H, I, device=device, dtype=dtype), I ** -0.5, gen)
        else:
            # OAI matmul_ogs layout [E, K, N]; w1's N interleaves (gate, linear) pairs for its fused swiglu
            self.w1 = _normal_(torch.empty(E, H, 2 * I, device=device, dtype=dtype), std, gen)
            self.w2 = _normal_(torch.empty(E, I, H, device=device, dtype=dtype), I ** -0.5, gen)
        self.w_shared_gu = _normal_(torch.empty(2 * s.shared_inter, H, device=device, dtype=dtype), std, gen)
        self.w_shared_down = _normal_(torch.empty(H, s.shared_inter, device=device, dtype=dtype), s.shared_inter ** -0.5, gen)
        self.w_shared_gate = _normal_(torch.empty(1, H, device=device, dtype=dtype), std, gen)


@dataclass
class PassBuffers:
    """Static inputs of one (batch, length) verify pass; graphs capture pointers into these."""
    batch: int
    length: int
    input_ids: torch.Tensor          # [T] int64
    cos: torch.Tensor                # [T, rot/2] fp32
    sin: torch.Tensor
    cu_seqlens: torch.Tensor         # [B+1] int32
    spec_state_indices: torch.Tensor  # [B, L] int32  baseline: L state slots per request
    num_accepted: torch.Tensor       # [B] int32      baseline: read the state of slot num_accepted-1
    ours_state_indices: torch.Tensor  # [B] int32     ours: one committed slot per request
    ours_num_accepted: torch.Tensor  # [B] int32      ours: tokens reconstruction applies (all: worst case)
    expert_ids: torch.Tensor         # [num_moe_layers, T, top_k] int16 (imposed routing)
    expert_ids32: torch.Tensor       # the same, int32 (vLLM's topk_ids dtype)
    attn_mask: torch.Tensor | None   # additive [G*L, S] (folded efficient path only)
    router_bias: torch.Tensor | None  # [num_moe_layers, T, E] 0 at imposed ids, -inf elsewhere ("mask" mode)
    static_x: torch.Tensor           # [T, hidden] stand-in input of a skipped op
    static_mixer_in: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return self.batch * self.length


class VerifyModel:
    def __init__(self, shape: TargetShape, *, device, dtype, max_batch: int, max_len: int, ctx_len: int,
                 kernels: Kernels, seed: int = 0):
        if max_len < 1 or max_batch < 1 or ctx_len < 0:
            raise ValueError("max_len, max_batch must be >= 1 and ctx_len >= 0")
        self.s, self.device, self.dtype, self.k = shape, torch.device(device), dtype, kernels
        self.max_batch, self.max_len, self.ctx_len = max_batch, max_len, ctx_len
        gen = torch.Generator(device=self.device).manual_seed(seed)
        s = shape
        self.embedding = _normal_(torch.empty(s.vocab, s.hidden, device=device, dtype=dtype), 1.0, gen)
        self.lm_head = _normal_(torch.empty(s.vocab, s.hidden, device=device, dtype=dtype), s.hidden ** -0.5, gen)
        self.final_norm_w = 1.0 + _normal_(torch.empty(s.hidden, device=device, dtype=dtype), 0.1, gen)
        self.layer_types = s.layer_types
        self.mixers, self.moes, self.norm_w = [], [], []
        for t in self.layer_types:
            self.mixers.append(GDNLayer(s, device, dtype, gen) if t == "gdn" else AttentionLayer(s, device, dtype, gen))
            self.moes.append(MoELayer(s, device, dtype, gen, layout=kernels.moe_impl if kernels.moe_impl == "oai"
                                      else "vllm"))
            self.norm_w.append([1.0 + _normal_(torch.empty(s.hidden, device=device, dtype=dtype), 0.1, gen)
                                for _ in range(2)])
        self.gdn_layers = [m for m in self.mixers if isinstance(m, GDNLayer)]
        self._allocate_states(gen)
        self.rot_half = s.rotary_dim // 2
        inv_freq = 1.0 / (10_000_000 ** (torch.arange(0, self.rot_half, device=device, dtype=torch.float32) / self.rot_half))
        self.inv_freq = inv_freq

    # ---------------------------------------------------------------- states
    def _allocate_states(self, gen):
        s, B, L = self.s, self.max_batch, self.max_len
        # baseline: L slots per request (slot 0 is vLLM's null block); ours reuses slots 1..B
        num_slots = 1 + B * L
        state_len = s.conv_width - 1 + (L - 1) + 1  # + 1: ours' probe runs L + 1 tokens
        for layer in self.gdn_layers:
            layer.conv_state = _normal_(torch.empty(num_slots, state_len, s.gdn_conv_dim, device=self.device,
                                                    dtype=self.dtype), 1.0, gen)
            layer.ssm_state = _normal_(torch.empty(num_slots, s.gdn_v_heads, s.gdn_head_dim, s.gdn_head_dim,
                                                   device=self.device, dtype=torch.float32), 0.05, gen)
        s_max = self.ctx_len + L + 1
        s_max = (s_max + 15) // 16 * 16
        for m in self.mixers:
            if isinstance(m, AttentionLayer):
                shape = (B, s.attn_kv_heads, s_max, s.attn_head_dim)
                m.k_cache = _normal_(torch.empty(shape, device=self.device, dtype=self.dtype), 1.0, gen)
                m.v_cache = _normal_(torch.empty(shape, device=self.device, dtype=self.dtype), 1.0, gen)
        self.ours_workspace = None
        self.ours_state_table = None
        if self.k.ours_gdn is not None:
            self.ours_workspace = self.k.ours_gdn.GDNVerifyWorkspace.allocate(
                len(self.gdn_layers), B, L + 1, s.gdn_k_heads, s.gdn_v_heads, s.gdn_head_dim, s.gdn_head_dim,
                input_dtype=self.dtype, device=self.device)
            table_args = [[lay.ssm_state for lay in self.gdn_layers], [lay.conv_state for lay in self.gdn_layers]]
            if "conv_width" in inspect.signature(self.k.ours_gdn.GDNStateTable).parameters:
                table_args.append(s.conv_width)
            self.ours_state_table = self.k.ours_gdn.GDNStateTable(*table_args)

    def reset_states(self, seed: int = 1) -> None:
        """Fresh random committed states (after checks that leave garbage in them)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for layer in self.gdn_layers:
            _normal_(layer.conv_state, 1.0, gen)
            _normal_(layer.ssm_state, 0.05, gen)
        if self.ours_workspace is not None:
            for t in (self.ours_workspace.u, self.ours_workspace.k, self.ours_workspace.g, self.ours_workspace.x):
                t.zero_()

    # ---------------------------------------------------------------- inputs
    def prepare(self, batch: int, length: int, seed: int = 0) -> PassBuffers:
        if not 1 <= batch <= self.max_batch or not 1 <= length <= self.max_len + 1:
            raise ValueError(f"batch {batch} / length {length} outside the allocated {self.max_batch} / {self.max_len}")
        s, dev, T = self.s, self.device, batch * length
        g = torch.Generator(device="cpu").manual_seed(seed)
        input_ids = torch.randint(0, s.vocab, (T,), generator=g).to(dev)
        pos = (self.ctx_len + torch.arange(length, device=dev, dtype=torch.float32)).repeat(batch)
        freqs = pos[:, None] * self.inv_freq[None, :]
        cu = torch.arange(0, T + 1, length, device=dev, dtype=torch.int32)
        spec = (1 + torch.arange(batch, device=dev, dtype=torch.int32)[:, None] * self.max_len
                + torch.arange(min(length, self.max_len), device=dev, dtype=torch.int32)[None, :])
        n_moe = len(self.moes)
        ids = torch.zeros(n_moe, T, s.top_k, dtype=torch.int16, device=dev)
        ids.copy_(torch.arange(s.top_k, dtype=torch.int16, device=dev).expand(n_moe, T, s.top_k))
        mask = None
        if self.k.attention == "efficient_folded":
            G, S = s.attn_q_heads // s.attn_kv_heads, self.ctx_len + length
            rows = torch.arange(G * length, device=dev) % length
            allowed = torch.arange(S, device=dev)[None, :] <= (self.ctx_len + rows)[:, None]
            S_pad = (S + 15) // 16 * 16
            mask_full = torch.zeros(G * length, S_pad, device=dev, dtype=self.dtype)
            mask_full[:, :S].masked_fill_(~allowed, float("-inf"))
            mask = mask_full[:, :S]
        static_x = _normal_(torch.empty(T, s.hidden, device=dev, dtype=self.dtype), 1.0)
        bias = None
        if self.k.moe_impl == "oai" and self.k.moe_routing == "mask":
            bias = torch.full((n_moe, T, s.num_experts), float("-inf"), device=dev, dtype=self.dtype)
            bias.scatter_(2, ids.long(), 0.0)
        return PassBuffers(
            batch=batch, length=length, input_ids=input_ids, cos=torch.cos(freqs), sin=torch.sin(freqs),
            cu_seqlens=cu, spec_state_indices=spec,
            num_accepted=torch.ones(batch, device=dev, dtype=torch.int32),
            ours_state_indices=1 + torch.arange(batch, device=dev, dtype=torch.int32) * self.max_len,
            ours_num_accepted=torch.full((batch,), length, device=dev, dtype=torch.int32),
            expert_ids=ids, expert_ids32=ids.to(torch.int32), attn_mask=mask, router_bias=bias, static_x=static_x,
        )

    def set_routing(self, buf: PassBuffers, ids: np.ndarray) -> None:
        """Impose expert ids [num_moe_layers, T, top_k] (rows sorted, distinct) on every MoE layer."""
        want = (len(self.moes), buf.tokens, self.s.top_k)
        if tuple(ids.shape) != want:
            raise ValueError(f"expert ids must be {want}, got {tuple(ids.shape)}")
        buf.expert_ids.copy_(torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int16)))
        buf.expert_ids32.copy_(buf.expert_ids)
        if buf.router_bias is not None:
            buf.router_bias.fill_(float("-inf"))
            buf.router_bias.scatter_(2, buf.expert_ids.long(), 0.0)

    # ---------------------------------------------------------------- ops
    def _norm(self, x, w, residual, run: bool, buf):
        if not run:
            return buf.static_x
        return fused_ops.rmsnorm(x, w, self.s.rms_eps, residual=residual, backend=self.k.fused)

    def gdn_mixer(self, layer: GDNLayer, x, buf: PassBuffers, variant: str, gdn_index: int):
        s, T = self.s, x.shape[0]
        # one merged in_proj_qkvz GEMM; vLLM's conv kernel and gdn_verify both read the strided mixed_qkv slice
        qkvz = F.linear(x, layer.w_qkvz)
        mixed_qkv = qkvz[:, :s.gdn_conv_dim]
        z = qkvz[:, s.gdn_conv_dim:].view(T, s.gdn_v_heads, s.gdn_head_dim)
        ba = F.linear(x, layer.w_ba)
        if variant == "baseline":
            # vLLM's gating kernel wants contiguous a / b
            b, a = fused_ops.split_columns(ba, [s.gdn_v_heads, s.gdn_v_heads], backend=self.k.fused)
        else:  # gdn_verify reads row-strided a / b: column views, no copy
            b, a = ba[:, :s.gdn_v_heads], ba[:, s.gdn_v_heads:]
        if variant == "baseline":
            core = self._gdn_core_baseline(layer, mixed_qkv, a, b, buf)
        else:
            core = self._gdn_core_ours(layer, mixed_qkv, a, b, buf, gdn_index)
        y = fused_ops.gated_rmsnorm(core, z, layer.norm_w, s.rms_eps, backend=self.k.fused)
        return F.linear(y, layer.w_out)

    def _gdn_core_baseline(self, layer, mixed_qkv, a, b, buf):
        """vLLM 0.33's spec-decode GDN path: conv update + recurrence storing the state after every token."""
        s, T, L = self.s, mixed_qkv.shape[0], buf.length
        vk = self.k.vllm_gdn
        if vk is None:
            return torch_gdn_core(layer, mixed_qkv, a, b, buf.spec_state_indices, buf.num_accepted, L, s)
        conv_out = vk.causal_conv1d_update(
            mixed_qkv, layer.conv_state.transpose(-1, -2), layer.conv_w, None, "silu",
            conv_state_indices=buf.spec_state_indices[:, 0], num_accepted_tokens=buf.num_accepted,
            query_start_loc=buf.cu_seqlens, max_query_len=L, validate_data=False)
        q, k, v = fused_ops.split_columns(conv_out, [s.gdn_key_dim, s.gdn_key_dim, s.gdn_value_dim],
                                          backend=self.k.fused)
        o, _ = vk.fused_sigmoid_gating_delta_rule_update(
            A_log=layer.A_log, a=a, b=b, dt_bias=layer.dt_bias,
            q=q.view(1, T, s.gdn_k_heads, s.gdn_head_dim), k=k.view(1, T, s.gdn_k_heads, s.gdn_head_dim),
            v=v.view(1, T, s.gdn_v_heads, s.gdn_head_dim), initial_state=layer.ssm_state,
            inplace_final_state=True, cu_seqlens=buf.cu_seqlens, ssm_state_indices=buf.spec_state_indices,
            num_accepted_tokens=buf.num_accepted, use_qk_l2norm_in_kernel=True)
        return o.view(T, s.gdn_v_heads, s.gdn_head_dim)

    def _gdn_core_ours(self, layer, mixed_qkv, a, b, buf, gdn_index):
        ok = self.k.ours_gdn
        s, T = self.s, mixed_qkv.shape[0]
        if ok is None:  # CPU smoke: same math, no per-token state
            return torch_gdn_core(layer, mixed_qkv, a, b, buf.ours_state_indices[:, None], None, buf.length, s,
                                  store_states=False)
        # max_seqlen is passed as a host int: reading it from cu_seqlens would sync inside graph capture
        return ok.gdn_verify(mixed_qkv, a, b, layer.conv_w, None, layer.A_log, layer.dt_bias, layer.conv_state,
                             layer.ssm_state, buf.ours_state_indices, buf.cu_seqlens,
                             self.ours_workspace.layer(gdn_index), max_seqlen=buf.length)

    def reconstruct(self, buf: PassBuffers):
        """Ours: one launch advances every GDN layer's committed state by the accepted tokens."""
        ok = self.k.ours_gdn
        if ok is None:
            return
        ok.gdn_reconstruct(self.ours_state_table, self.ours_workspace, buf.ours_state_indices,
                           buf.ours_num_accepted, buf.cu_seqlens)

    def attention_mixer(self, layer: AttentionLayer, x, buf: PassBuffers):
        s, T, B, L = self.s, x.shape[0], buf.batch, buf.length
        H, KV, D = s.attn_q_heads, s.attn_kv_heads, s.attn_head_dim
        G, ctx = H // KV, self.ctx_len
        qkv = F.linear(x, layer.w_qkv)
        qg = qkv[:, :2 * H * D].view(T, H, 2 * D)
        q_in, gate = qg[:, :, :D], qg[:, :, D:]
        k_in = qkv[:, 2 * H * D:2 * H * D + KV * D].view(T, KV, D)
        v_in = qkv[:, 2 * H * D + KV * D:].view(T, KV, D)
        q = torch.empty(B, H, L, D, device=x.device, dtype=x.dtype)
        k_new = layer.k_cache[:B, :, ctx:ctx + L]
        fused_ops.head_norm_rope(q_in, layer.q_norm_w, buf.cos, buf.sin, self.s.rms_eps, q, L, backend=self.k.fused)
        fused_ops.head_norm_rope(k_in, layer.k_norm_w, buf.cos, buf.sin, self.s.rms_eps, k_new, L,
                                 backend=self.k.fused)
        layer.v_cache[:B, :, ctx:ctx + L].copy_(v_in.view(B, L, KV, D).transpose(1, 2))
        k_all, v_all = layer.k_cache[:B, :, :ctx + L], layer.v_cache[:B, :, :ctx + L]
        o = attention(q, k_all, v_all, buf.attn_mask, self.k.attention)   # [B, H, L, D] (any strides)
        y = fused_ops.sigmoid_gate(o, gate, backend=self.k.fused)           # [T, H*D]
        return F.linear(y, layer.w_o)

    def moe(self, layer: MoELayer, x, buf: PassBuffers, moe_index: int):
        ids = buf.expert_ids32[moe_index] if layer.layout == "vllm" else buf.expert_ids[moe_index]
        bias = None if buf.router_bias is None else buf.router_bias[moe_index]
        routed = routed_experts(x, layer, ids, self.s.top_k, self.k, bias)
        shared = F.linear(fused_ops.silu_mul(F.linear(x, layer.w_shared_gu), backend=self.k.fused),
                          layer.w_shared_down)
        gate = F.linear(x, layer.w_shared_gate)
        return fused_ops.moe_combine(routed, shared, gate, backend=self.k.fused)

    # ---------------------------------------------------------------- passes
    def forward(self, buf: PassBuffers, variant: str, parts=LAYER_TYPES, reconstruct: bool = True):
        """One verify pass; returns logits [T, vocab] (or None when the LM head is skipped)."""
        if variant not in ("baseline", "ours"):
            raise ValueError(f"variant must be 'baseline' or 'ours', got {variant!r}")
        rest = "rest" in parts
        h = F.embedding(buf.input_ids, self.embedding) if rest else buf.static_x
        residual = h.clone() if rest else None
        x = self._norm(h, self.norm_w[0][0], None, rest, buf)
        gdn_i = 0
        for i, (kind, mixer, moe) in enumerate(zip(self.layer_types, self.mixers, self.moes)):
            if i > 0:
                x = self._norm(out, self.norm_w[i][0], residual, rest, buf)
            if kind == "gdn":
                out = self.gdn_mixer(mixer, x, buf, variant, gdn_i) if "gdn" in parts else buf.static_x
                gdn_i += 1
            else:
                out = self.attention_mixer(mixer, x, buf) if "attention" in parts else buf.static_x
            x = self._norm(out, self.norm_w[i][1], residual, rest, buf)
            out = self.moe(moe, x, buf, i) if "moe" in parts else buf.static_x
        if variant == "ours" and reconstruct and "gdn" in parts:
            self.reconstruct(buf)
        if not rest:
            return None
        x = self._norm(out, self.final_norm_w, residual, rest, buf)
        return F.linear(x, self.lm_head)

    def probe(self, buf: PassBuffers):
        """Routing-correction probe on L + 1 tokens (buf prepared at length L + 1): embedding, layer 0 (GDN,
        ours: no state written) and layer 0's router - what the correction needs before deciding to keep or
        drop the extra token."""
        if self.layer_types[0] != "gdn":
            raise ValueError("the probe expects layer 0 to be GDN")
        h = F.embedding(buf.input_ids, self.embedding)
        residual = h.clone()
        x = fused_ops.rmsnorm(h, self.norm_w[0][0], self.s.rms_eps, backend=self.k.fused)
        out = self.gdn_mixer(self.mixers[0], x, buf, "ours", 0)
        x = fused_ops.rmsnorm(out, self.norm_w[0][1], self.s.rms_eps, residual=residual, backend=self.k.fused)
        return F.linear(x, self.moes[0].w_router)


def routed_experts(x, layer: MoELayer, ids, top_k, k: Kernels, bias=None):
    """Router GEMM (run for its cost: it gives the routing weights) + routed experts on the imposed ids
    [T, top_k] (rows sorted; int32 for the vLLM layout, int16 for OAI), on the kernels of the layer's layout.
    vLLM: renormalised softmax over the imposed ids + vLLM's fused experts. OAI (k.oai_moe): k.moe_routing
    "provided" passes the ids to routing(); "mask" adds a -inf bias outside them to the router logits (in the
    GEMM) and lets its top-k pick. Without the kernels (None) the torch path."""
    if layer.layout == "vllm":
        logits = F.linear(x, layer.w_router)
        if k.vllm_moe is None:
            return torch_moe(x, logits, ids, layer)
        from .vllm_moe import fused_experts, imposed_topk_weights
        weights = imposed_topk_weights(logits, ids, backend=k.fused)
        return fused_experts(k.vllm_moe, x, layer.w1, layer.w2, weights, ids, fused=k.fused)
    om, mode = k.oai_moe, k.moe_routing
    if om is None:
        return torch_moe(x, F.linear(x, layer.w_router), ids, layer)
    if mode == "mask":
        logits = torch.addmm(bias, x, layer.w_router.t())
        rdata, gather, scatter = om.routing(logits, top_k, sm_first=False)
    else:
        logits = F.linear(x, layer.w_router)
        rdata, gather, scatter = om.routing(logits, top_k, sm_first=False, expt_indx=ids)
    act = om.FusedActivation(om.FnSpecs("swiglu", om.swiglu_fn, ("alpha", "limit")), (SWIGLU_ALPHA, None), 2)
    inter = om.matmul_ogs(x, layer.w1, None, rdata, gather_indx=gather, fused_activation=act)
    return om.matmul_ogs(inter, layer.w2, None, rdata, scatter_indx=scatter, gammas=rdata.gate_scal)


# -------------------------------------------------------------------- torch paths (CPU smoke, references)
def attention(q, k, v, mask, mode):
    """q [B, H, L, D], k/v [B, KV, S, D] (last L keys are the new tokens). Returns [B, H, L, D]."""
    B, H, L, D = q.shape
    KV = k.shape[1]
    if mode in ("flash_gqa", "efficient_folded") and q.is_cuda:
        # pin the backend: a silent fallback to the math path would time a different kernel
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = SDPBackend.FLASH_ATTENTION if mode == "flash_gqa" else SDPBackend.EFFICIENT_ATTENTION
        with sdpa_kernel([backend]):
            return _sdpa(q, k, v, mask, mode)
    if mode in ("flash_gqa", "efficient_folded"):
        return _sdpa(q, k, v, mask, mode)
    if mode == "math":
        return naive_attention(q, k, v)
    raise ValueError(f"unknown attention mode {mode!r}")


def _sdpa(q, k, v, mask, mode):
    B, H, L, D = q.shape
    KV = k.shape[1]
    if mode == "flash_gqa":
        from torch.nn.attention.bias import causal_lower_right
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, k.shape[2]), enable_gqa=True)
    G = H // KV   # efficient_folded: the G query heads of a KV head become G*L query rows, mask per row
    o = F.scaled_dot_product_attention(q.view(B, KV, G * L, D), k, v, attn_mask=mask)
    return o.unflatten(2, (G, L)).flatten(1, 2) if o.is_contiguous() else o.reshape(B, KV, G, L, D).reshape(B, H, L, D)


def naive_attention(q, k, v):
    B, H, L, D = q.shape
    KV, S = k.shape[1], k.shape[2]
    kf = k.float().repeat_interleave(H // KV, dim=1)
    vf = v.float().repeat_interleave(H // KV, dim=1)
    scores = q.float() @ kf.transpose(-1, -2) / math.sqrt(D)
    allowed = torch.arange(S, device=q.device)[None, :] <= (S - L + torch.arange(L, device=q.device))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ vf).to(q.dtype)


def torch_moe(x, logits, ids, layer: MoELayer):
    """Routed experts with imposed ids: softmax over the chosen logits; vLLM layout: SiLU(gate) * up on the two
    halves of w13 rows; OAI layout: OAI swiglu on interleaved w1 columns."""
    idx = ids.long()
    w = torch.gather(logits.float(), 1, idx).softmax(-1)
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in idx.unique().tolist():
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if layer.layout == "vllm":
            hcat = x[rows].float() @ layer.w1[e].float().t()
            gate, up = hcat.chunk(2, dim=1)
            y = (F.silu(gate) * up) @ layer.w2[e].float().t()
        else:
            hcat = x[rows].float() @ layer.w1[e].float()
            g, lin = hcat[:, 0::2], hcat[:, 1::2]
            y = (g * torch.sigmoid(SWIGLU_ALPHA * g) * (lin + 1)) @ layer.w2[e].float()
        out.index_add_(0, rows, y * w[rows, slot][:, None])
    return out.to(x.dtype)


def torch_gdn_core(layer: GDNLayer, mixed_qkv, a, b, state_indices, num_accepted, length, s: TargetShape,
                   store_states: bool = True):
    """GDN verify in torch, vectorised over requests and heads (uniform length). With store_states, the state
    after token t goes to slot state_indices[:, t] (vLLM's layout); the conv window is advanced as vLLM does."""
    T = mixed_qkv.shape[0]
    B, W = T // length, s.conv_width
    H, HV, K, V = s.gdn_k_heads, s.gdn_v_heads, s.gdn_head_dim, s.gdn_head_dim
    read = state_indices[:, 0].long() if num_accepted is None else \
        torch.gather(state_indices.long(), 1, (num_accepted.long() - 1)[:, None])[:, 0]
    x = mixed_qkv.float().view(B, length, -1)
    window = layer.conv_state[read, :W - 1].float()                          # [B, W-1, D]
    seq = torch.cat([window, x], dim=1)                                      # [B, W-1+L, D]
    w = layer.conv_w.float()                                                 # [D, W]
    conv = sum(seq[:, j:j + length] * w[:, j] for j in range(W))
    conv = conv * torch.sigmoid(conv)
    q, k, v = conv.split([H * K, H * K, HV * V], dim=-1)
    q = q.view(B, length, H, K).repeat_interleave(HV // H, dim=2)
    k = k.view(B, length, H, K).repeat_interleave(HV // H, dim=2)
    v = v.view(B, length, HV, V)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * K ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    gate_in = a.float().view(B, length, HV) + layer.dt_bias
    g = -torch.exp(layer.A_log) * torch.where(gate_in <= 20.0, torch.log1p(torch.exp(gate_in)), gate_in)
    beta = torch.sigmoid(b.float().view(B, length, HV))
    S = layer.ssm_state[read].float()                                        # [B, HV, V, K]
    out = torch.empty(B, length, HV, V, dtype=torch.float32, device=x.device)
    for t in range(length):
        S = S * torch.exp(g[:, t])[:, :, None, None]
        delta = (v[:, t] - (S @ k[:, t, :, :, None])[..., 0]) * beta[:, t, :, None]
        S = S + delta[..., None] * k[:, t, :, None, :]
        out[:, t] = (S @ q[:, t, :, :, None])[..., 0]
        if store_states:
            layer.ssm_state[state_indices[:, t].long()] = S.to(layer.ssm_state.dtype)
    return out.view(T, HV, V).to(mixed_qkv.dtype)
