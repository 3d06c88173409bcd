"""Target shapes for the verify-latency profile (anchors.md, "Target shapes")."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetShape:
    name: str
    num_layers: int
    full_attention_interval: int  # every n-th layer is gated full attention, the others GDN
    hidden: int
    vocab: int
    attn_q_heads: int
    attn_kv_heads: int
    attn_head_dim: int
    partial_rotary: float
    gdn_k_heads: int
    gdn_v_heads: int
    gdn_head_dim: int
    conv_width: int
    num_experts: int
    top_k: int
    expert_inter: int
    shared_inter: int
    rms_eps: float = 1e-6

    def __post_init__(self):
        if self.num_layers % self.full_attention_interval:
            raise ValueError("num_layers must be a multiple of full_attention_interval")
        if self.attn_q_heads % self.attn_kv_heads or self.gdn_v_heads % self.gdn_k_heads:
            raise ValueError("query / value heads must be a multiple of key heads")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError("top_k must be in [1, num_experts]")

    @property
    def layer_types(self) -> list[str]:
        n = self.full_attention_interval
        return ["attention" if (i + 1) % n == 0 else "gdn" for i in range(self.num_layers)]

    @property
    def gdn_key_dim(self) -> int:
        return self.gdn_k_heads * self.gdn_head_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.gdn_v_heads * self.gdn_head_dim

    @property
    def gdn_conv_dim(self) -> int:  # q, k, v go through the short convolution
        return 2 * self.gdn_key_dim + self.gdn_value_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.attn_head_dim * self.partial_rotary)

    def with_layers(self, num_layers: int) -> "TargetShape":
        """Same shape on fewer layers (kept a multiple of the attention interval)."""
        if num_layers % self.full_attention_interval or num_layers <= 0:
            raise ValueError(f"--layers must be a positive multiple of {self.full_attention_interval}")
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["num_layers"] = num_layers
        return TargetShape(**d)


QWEN36_35B_A3B = TargetShape(
    name="qwen36_35b_a3b", num_layers=40, full_attention_interval=4, hidden=2048, vocab=248_320,
    attn_q_heads=16, attn_kv_heads=2, attn_head_dim=256, partial_rotary=0.25,
    gdn_k_heads=16, gdn_v_heads=32, gdn_head_dim=128, conv_width=4,
    num_experts=256, top_k=8, expert_inter=512, shared_inter=512,
)

QWEN3_NEXT_80B_A3B = TargetShape(
    name="qwen3_next_80b_a3b", num_layers=48, full_attention_interval=4, hidden=2048, vocab=151_936,
    attn_q_heads=16, attn_kv_heads=2, attn_head_dim=256, partial_rotary=0.25,
    gdn_k_heads=16, gdn_v_heads=32, gdn_head_dim=128, conv_width=4,
    num_experts=512, top_k=10, expert_inter=512, shared_inter=512,
)

# CPU smoke shape: every code path, tiny sizes (head dims stay powers of two for the Triton kernels).
TINY = TargetShape(
    name="tiny", num_layers=4, full_attention_interval=4, hidden=64, vocab=512,
    attn_q_heads=4, attn_kv_heads=2, attn_head_dim=32, partial_rotary=0.25,
    gdn_k_heads=2, gdn_v_heads=4, gdn_head_dim=16, conv_width=4,
    num_experts=16, top_k=4, expert_inter=32, shared_inter=32,
)

SHAPES = {s.name: s for s in (QWEN36_35B_A3B, QWEN3_NEXT_80B_A3B, TINY)}
