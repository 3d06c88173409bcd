"""DSpark's top-k Markov walk (vLLM's `dspark_draft_topk` mode) in one launch: `head_walk_topk`, and its reference
`naive_head_walk_topk` (torch, step by step); its candidates (torch.topk's set, faster for 16-bit logits):
`topk_candidates`, and `naive_topk_candidates`."""
from .naive import dense_step_logits, naive_head_walk_topk, naive_topk_candidates
from .select import topk_candidates, walk_candidates
from .walk import MAX_TOPK, TABLE_MAX_TOPK, head_walk_topk

__all__ = ["head_walk_topk", "naive_head_walk_topk", "dense_step_logits", "topk_candidates", "naive_topk_candidates",
           "walk_candidates", "MAX_TOPK", "TABLE_MAX_TOPK"]
