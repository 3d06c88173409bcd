"""Per-engine counters of the adaptive verification length (host-side, no device sync needed to keep them).

`steps`: steps with drafts; `scheduled_drafts`: drafts the scheduler proposed; `verified_drafts`: drafts the
policy's budget let through; `trimmed_steps`: steps whose budget was below the schedule; `lengths`: how often
the policy chose each per-request length (its host half, on last step's confidences; the device half then
splits the same budget by this step's); `beyond_budget_drafts`: drafts the host scheduled beyond its budget for
the device cut to verify or neutralise (`CutScheduler`), `beyond_budget_steps`: steps with any. Read them
in-process (`COUNTERS.snapshot()`); they are also logged.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter

logger = logging.getLogger("vllm.hybridspec")

LOG_EVERY_STEPS = 200


class AdaptiveCounters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.scheduled_drafts = 0
        self.verified_drafts = 0
        self.trimmed_steps = 0
        self.beyond_budget_drafts = 0
        self.beyond_budget_steps = 0
        self.lengths: Counter[int] = Counter()

    def observe(self, scheduled: int, lengths: list[int], beyond_budget: int = 0) -> None:
        verified = sum(lengths)
        with self._lock:
            self.beyond_budget_drafts += beyond_budget
            self.beyond_budget_steps += beyond_budget > 0
            self.steps += 1
            self.scheduled_drafts += scheduled
            self.verified_drafts += verified
            self.trimmed_steps += verified < scheduled
            self.lengths.update(lengths)
            report = self.steps % LOG_EVERY_STEPS == 0
        if report:
            self.log()

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "steps": self.steps,
                "scheduled_drafts": self.scheduled_drafts,
                "verified_drafts": self.verified_drafts,
                "trimmed_steps": self.trimmed_steps,
                "beyond_budget_drafts": self.beyond_budget_drafts,
                "beyond_budget_steps": self.beyond_budget_steps,
                "lengths": {str(k): v for k, v in sorted(self.lengths.items())},
            }

    def log(self) -> None:
        logger.info("hybridspec adaptive verification: %s", self.snapshot())


COUNTERS = AdaptiveCounters()
