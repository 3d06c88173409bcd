"""Measured target verification latency T(batch, L), as the length policy and eval/simulate.py load it.

A profile is one (device, model shape, variant) table: `t_us[i][j]` is the time in microseconds of one whole
verify pass (embedding to LM head) for `batch_sizes[i]` requests of `lengths[j]` tokens each. It is written by
eval/bench_verify_profile.py from a CUDA-graph-timed run, never typed in.

Standard library only (no torch, no pydantic): the benchmark writes it on a GPU machine that has neither vLLM
nor pydantic, and the runtime policy reads it inside vLLM processes.

File formats accepted by `LatencyProfile.load`:
  - one profile: {"device": ..., "model": ..., "variant": ..., "batch_sizes": [...], "lengths": [...],
    "t_us": [[...], ...], ...}
  - several: {"default_variant": "...", "profiles": [<profile>, ...]} (`load(path, variant=...)` picks one;
    without `variant` the default one).
  - a benchmark result file holding either of the above under the key "profile" / "profiles".
"""
from __future__ import annotations

import bisect
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

LAYER_TYPES = ("gdn", "attention", "moe", "rest")


def _check_table(name: str, table, n_rows: int, n_cols: int) -> list[list[float]]:
    if len(table) != n_rows or any(len(row) != n_cols for row in table):
        raise ValueError(f"{name} must be [len(batch_sizes)={n_rows}][len(lengths)={n_cols}]")
    out = [[float(v) for v in row] for row in table]
    if any(not math.isfinite(v) or v < 0 for row in out for v in row):
        raise ValueError(f"{name} holds a negative or non-finite value")
    return out


def _check_axis(name: str, values) -> list[int]:
    out = [int(v) for v in values]
    if not out or any(v < 1 for v in out) or any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"{name} must be non-empty, positive and strictly increasing, got {values!r}")
    return out


def _interp_1d(xs: list[int], ys: list[float], x: float) -> float:
    """Piecewise linear in x; beyond the ends, linear from the two outermost points, never below 0."""
    if len(xs) == 1:
        return ys[0]
    j = min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass
class LatencyProfile:
    """T(batch, L) of one verify variant on one device and target shape.

    Attributes:
        device: e.g. "NVIDIA H200".
        model: target shape name, e.g. "qwen36_35b_a3b".
        variant: "baseline", "ours", "ours_probe" (ours + routing probe), ...
        batch_sizes: [NB] increasing request counts.
        lengths: [NL] increasing verified tokens per request.
        t_us: [NB][NL] whole verify pass, microseconds.
        per_layer_type: optional {"gdn"|"attention"|"moe"|"rest": [NB][NL] us}, summed over the layers.
        unique_experts: optional [NB][NL] mean distinct experts touched per MoE layer.
        meta: free-form provenance (routing rho, KV context, commit, timing method).
    """

    device: str
    model: str
    variant: str
    batch_sizes: list[int]
    lengths: list[int]
    t_us: list[list[float]]
    per_layer_type: dict[str, list[list[float]]] | None = None
    unique_experts: list[list[float]] | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("device", "model", "variant"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        self.batch_sizes = _check_axis("batch_sizes", self.batch_sizes)
        self.lengths = _check_axis("lengths", self.lengths)
        nb, nl = len(self.batch_sizes), len(self.lengths)
        self.t_us = _check_table("t_us", self.t_us, nb, nl)
        if self.per_layer_type is not None:
            unknown = set(self.per_layer_type) - set(LAYER_TYPES)
            if unknown:
                raise ValueError(f"per_layer_type has unknown layer types {sorted(unknown)}; known: {LAYER_TYPES}")
            self.per_layer_type = {
                k: _check_table(f"per_layer_type[{k}]", v, nb, nl) for k, v in self.per_layer_type.items()
            }
        if self.unique_experts is not None:
            self.unique_experts = _check_table("unique_experts", self.unique_experts, nb, nl)

    def interpolate(self, batch: float, L: float) -> float:
        """T in microseconds at (batch, L): bilinear between measured points, linear beyond the ends."""
        if batch <= 0 or L <= 0:
            raise ValueError(f"batch and L must be positive, got batch={batch}, L={L}")
        per_batch = [_interp_1d(self.lengths, row, L) for row in self.t_us]
        return _interp_1d(self.batch_sizes, per_batch, batch)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LatencyProfile":
        known = {"device", "model", "variant", "batch_sizes", "lengths", "t_us", "per_layer_type",
                 "unique_experts", "meta"}
        missing = {"device", "model", "variant", "batch_sizes", "lengths", "t_us"} - set(d)
        if missing:
            raise ValueError(f"latency profile lacks keys {sorted(missing)}")
        return cls(**{k: v for k, v in d.items() if k in known})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path, variant: str | None = None) -> "LatencyProfile":
        return select_profile(json.loads(Path(path).read_text()), variant)


def select_profile(doc: dict, variant: str | None = None) -> LatencyProfile:
    """Pick one profile out of any of the accepted file layouts (see module docstring)."""
    if "t_us" in doc:
        profile = LatencyProfile.from_dict(doc)
        if variant is not None and profile.variant != variant:
            raise ValueError(f"file holds variant {profile.variant!r}, asked for {variant!r}")
        return profile
    if "profiles" in doc:
        profiles = [LatencyProfile.from_dict(p) for p in doc["profiles"]]
        wanted = variant or doc.get("default_variant") or profiles[0].variant
        for p in profiles:
            if p.variant == wanted:
                return p
        raise ValueError(f"no profile of variant {wanted!r}; have {[p.variant for p in profiles]}")
    if "profile" in doc:
        return select_profile(doc["profile"], variant)
    raise ValueError("not a latency profile file: no 't_us', 'profiles' or 'profile' key")


def save_profiles(path: str | Path, profiles: list[LatencyProfile], default_variant: str) -> None:
    """Write several variants to one file; `LatencyProfile.load(path)` returns the default one."""
    if default_variant not in {p.variant for p in profiles}:
        raise ValueError(f"default_variant {default_variant!r} is not among the profiles")
    doc = {"default_variant": default_variant, "profiles": [p.to_dict() for p in profiles]}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")
