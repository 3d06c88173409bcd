"""DSpark serial head walk with W2 resident on chip: `head_walk` (one persistent launch) and its reference
`naive_head_walk` (torch, step by step)."""
from .naive import gumbel_noise, naive_head_walk
from .walk import barrier_errors, draft_to_target_increases, head_walk, plan_walk, quantize_w2_fp8

__all__ = ["head_walk", "naive_head_walk", "gumbel_noise", "plan_walk", "quantize_w2_fp8", "barrier_errors",
           "draft_to_target_increases"]
