"""DSpark's top-k Markov walk (vLLM's `dspark_draft_topk` mode) in one launch: `head_walk_topk`, and its reference
`naive_head_walk_topk` (torch, step by step)."""
from .naive import dense_step_logits, naive_head_walk_topk
from .walk import MAX_TOPK, head_walk_topk

__all__ = ["head_walk_topk", "naive_head_walk_topk", "dense_step_logits", "MAX_TOPK"]
