"""DSpark's serial head walk through hybridspec's resident-W2 megakernel (hybridspec_kernels.head_walk).

With `additional_config={"hybridspec": {"enabled": true, "head_walk": "megakernel"}}` and a `dspark` speculative
config, `DSparkSpeculator._sample_sequential` runs `walk.sample_sequential`; the config's `head_walk: reference`
runs the kernel's torch reference instead. Anything the kernel does not reproduce exactly (draft top-k mode, a
draft watermarker, fp64 Gumbel, other head types, a vLLM whose walk changed, no GPU and no Triton interpreter)
leaves vLLM's walk in place, logged and recorded in `vllm_hybridspec.status` ("head_walk").

- walk.py: `sample_sequential` (the step), `why_not` (the fallbacks), `WalkPlan`.
- patches.py: `UseHybridSpecHeadWalk`, the one patched vLLM method.
- upstream.py: digests of the vLLM code the walk reproduces, per vLLM release.

Importing this package is cheap: torch and vLLM load only when the walk first runs.
"""
from vllm_hybridspec.head_walk.patches import HEAD_WALK_PATCHES, UseHybridSpecHeadWalk

__all__ = ["HEAD_WALK_PATCHES", "UseHybridSpecHeadWalk"]
