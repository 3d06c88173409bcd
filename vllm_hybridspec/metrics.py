"""vLLM's speculative-decoding counters, read from an offline `LLM` (needs `disable_log_stats=False`)."""
from __future__ import annotations

from typing import Any

_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}


def spec_decode_metrics(llm: Any) -> dict[str, Any]:
    """{drafts, draft_tokens, accepted_tokens, accepted_per_position, acceptance_rate, mean_acceptance_length}.

    mean_acceptance_length counts the target's own token: 1 + accepted / drafts (vLLM's definition).
    """
    metrics: dict[str, Any] = {name: 0 for name in _COUNTERS.values()}
    metrics["accepted_per_position"] = []
    for metric in llm.get_metrics():
        if metric.name in _COUNTERS:
            metrics[_COUNTERS[metric.name]] = int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            metrics["accepted_per_position"] = [int(v) for v in metric.values]
    drafts, draft_tokens = metrics["drafts"], metrics["draft_tokens"]
    metrics["acceptance_rate"] = metrics["accepted_tokens"] / draft_tokens if draft_tokens else 0.0
    metrics["mean_acceptance_length"] = 1 + metrics["accepted_tokens"] / drafts if drafts else 0.0
    return metrics
