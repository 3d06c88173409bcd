"""DSpark's draft walk, checked in every rank: vLLM imports this module in each worker process as the engine's
`worker_extension_cls` (tests/tp/tp_job.py), which installs tests/head_walk's shadow walk there (every draft step
walked by vLLM's `_sample_sequential`, then by hybridspec's, drafts compared; the engine keeps ours). The mixin
adds nothing to the worker but a way to read this rank's comparison."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "head_walk"))
import head_walk_job  # noqa: E402

STATS = head_walk_job.new_stats()
head_walk_job.install_shadow_walk(STATS)


def reset() -> None:
    STATS.update(head_walk_job.new_stats())


class ShadowWalkReport:
    def shadow_walk_stats(self) -> dict:
        return dict(STATS)
