"""Which hybridspec components are active in this process, and why the others are not.

Config validation writes the plan (`plan("gdn_verify", REQUESTED, "block_parallel")`); the runtime code that
does the work then records what happened (`record("gdn_verify", ACTIVE)`, `record("gdn_verify", FALLBACK,
"model has no GDN layers")`). A record replaces anything; a plan never replaces a record. The demo prints `describe()`; metrics can read
`snapshot()`.

The registry is per process. With `VLLM_ENABLE_V1_MULTIPROCESSING=0` (the demo, the tests) and one GPU the
engine and its worker run in the caller's process and everything lands here; in a multi-process engine (tensor or
pipeline parallelism, or the default engine-core process) each process sees its own records, every record is also
logged, and `per_rank(llm)` brings each worker's snapshot back to an offline `LLM`.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

logger = logging.getLogger("vllm.hybridspec")

ACTIVE = "active"          # the hybridspec implementation runs
REFERENCE = "reference"    # the hybridspec implementation runs through its slow reference path (no GPU)
FALLBACK = "fallback"      # plain vLLM does this part (reason says why)
OFF = "off"                # disabled by the config, or does not apply to this drafter
REQUESTED = "requested"    # enabled by the config; no runtime code has reported yet
STATES = (ACTIVE, REFERENCE, FALLBACK, OFF, REQUESTED)

# Display order; a component not listed here may still record.
COMPONENTS = ("config", "head_walk", "gdn_verify", "verify_length", "routing_correction", "latency_profile")


@dataclass(frozen=True)
class ComponentStatus:
    state: str
    reason: str = ""
    planned: bool = False  # written by config validation (plan), not by the code that does the work


    def __str__(self) -> str:
        return f"{self.state}: {self.reason}" if self.reason else self.state


_records: dict[str, ComponentStatus] = {}
_lock = threading.Lock()


def record(component: str, state: str, reason: str = "") -> None:
    """What the component's runtime code did; replaces any earlier record."""
    _write(component, ComponentStatus(state, reason))


def plan(component: str, state: str, reason: str = "") -> None:
    """What config validation expects; never replaces a runtime record (vLLM re-validates config copies)."""
    _write(component, ComponentStatus(state, reason, planned=True))


def _write(component: str, status: ComponentStatus) -> None:
    if status.state not in STATES:
        raise ValueError(f"status.record: unknown state {status.state!r}; expected one of {STATES}")
    with _lock:
        current = _records.get(component)
        if status.planned and current is not None and not current.planned:
            return
        changed = current != status
        _records[component] = status
    if changed:
        logger.info("hybridspec %s: %s", component, status)


def get(component: str) -> ComponentStatus | None:
    with _lock:
        return _records.get(component)


def snapshot() -> dict[str, str]:
    """{component: "state" or "state: reason"} in display order."""
    with _lock:
        names = [c for c in COMPONENTS if c in _records] + sorted(set(_records) - set(COMPONENTS))
        return {name: str(_records[name]) for name in names}


def reset() -> None:
    with _lock:
        _records.clear()


def describe() -> str:
    rows = snapshot()
    if not rows:
        return "hybridspec: not enabled in this process"
    width = max(len(name) for name in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows.items())


def rank_snapshot(worker) -> dict:
    """Runs in a worker (vLLM's collective_rpc): its parallel ranks and its snapshot()."""
    from vllm.distributed import get_pipeline_model_parallel_rank, get_tensor_model_parallel_rank

    return {"tp_rank": get_tensor_model_parallel_rank(), "pp_rank": get_pipeline_model_parallel_rank(),
            "status": snapshot()}


def per_rank(llm) -> list[dict]:
    """Every worker's {tp_rank, pp_rank, status} of an offline `vllm.LLM`, in rank order: under tensor parallelism
    the records live in the workers, and the caller's own snapshot() only shows what config validation planned."""
    return sorted(llm.collective_rpc(rank_snapshot), key=lambda rank: (rank["pp_rank"], rank["tp_rank"]))
