"""The `hybridspec` section of vLLM's `additional_config`.

    LLM(..., additional_config={"hybridspec": {"enabled": True, "verify_length": "adaptive"}})
    vllm serve ... --additional-config '{"hybridspec": {"enabled": true}}'

Every knob of the plugin lives in `HybridSpecConfig`; README's config table documents them. Errors are
`ValueError`s whose lines start with the dotted key, e.g. `hybridspec.verify_length: ...`, so that a user
who mistyped one value in a long `vllm serve` command sees which one.
"""
from __future__ import annotations

import difflib
import functools
import json
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SECTION = "hybridspec"


class HybridSpecConfig(BaseModel):
    # strict: a YAML `enabled: "yes"` or a JSON `"max_verify_length": "8"` is an error, not a guess.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    enabled: bool = False
    head_walk: Literal["megakernel", "reference"] = "megakernel"
    head_walk_residency: Literal["auto", "full", "partial", "off"] = "auto"
    head_walk_w2_dtype: Literal["auto", "bf16", "fp8"] = "auto"
    gdn_verify: Literal["block_parallel", "vllm"] = "block_parallel"
    verify_length: Literal["adaptive", "fixed"] = "fixed"
    min_verify_length: int = Field(default=1, ge=1)
    # None: the engine's `num_speculative_tokens`.
    max_verify_length: int | None = Field(default=None, ge=1)
    # "auto": measure (or look up) the target's verify latency at start-up; otherwise a JSON file.
    latency_profile: str = "auto"
    # With verify_length adaptive on an MoE target: the device cuts each request's scheduled drafts to what the
    # length policy admits on this step's confidences; the rest are neutralised (no experts, never accepted).
    # Off by default: no simulated gain over the host budget alone (eval/notes/simulate.md).
    device_verify_length: bool = False
    routing_correction: bool = False
    routing_correction_threshold: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _check_cross_fields(self) -> HybridSpecConfig:
        if self.max_verify_length is not None and self.min_verify_length > self.max_verify_length:
            raise ValueError(
                f"hybridspec.min_verify_length: {self.min_verify_length} is larger than "
                f"hybridspec.max_verify_length ({self.max_verify_length})"
            )
        if self.latency_profile != "auto":
            if not self.latency_profile.endswith(".json"):
                raise ValueError(
                    f"hybridspec.latency_profile: expected 'auto' or a path to a .json file, got "
                    f"{self.latency_profile!r}"
                )
            if not os.path.isfile(self.latency_profile):
                raise ValueError(f"hybridspec.latency_profile: file not found: {self.latency_profile}")
        return self

    @classmethod
    def from_section(cls, section: Any) -> HybridSpecConfig:
        """Validates the value of `additional_config["hybridspec"]`; raises ValueError naming the key."""
        if not isinstance(section, dict):
            raise ValueError(f"{SECTION}: expected a mapping of options, got {type(section).__name__}")
        try:
            return cls.model_validate(section)
        except ValidationError as error:
            raise ValueError(_describe(error)) from None

    def max_verify_length_for(self, num_speculative_tokens: int) -> int:
        return self.max_verify_length if self.max_verify_length is not None else num_speculative_tokens

    def check_against_speculation(self, num_speculative_tokens: int) -> None:
        """Cross-checks the verify lengths with the engine's `num_speculative_tokens`."""
        for key in ("min_verify_length", "max_verify_length"):
            value = getattr(self, key)
            if value is not None and value > num_speculative_tokens:
                raise ValueError(
                    f"{SECTION}.{key}: {value} is larger than the speculative config's "
                    f"num_speculative_tokens ({num_speculative_tokens})"
                )


def _describe(error: ValidationError) -> str:
    known = list(HybridSpecConfig.model_fields)
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in (SECTION, *item["loc"]))
        if item["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(item["loc"][-1]), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(known)}"
            lines.append(f"{key}: unknown key{hint}")
        elif not item["loc"]:
            # Raised by a model validator: the message already names its key.
            lines.append(str(item["msg"]).removeprefix("Value error, "))
        else:
            lines.append(f"{key}: {item['msg']} (got {item['input']!r})")
    return "\n".join(lines)


@functools.lru_cache(maxsize=64)
def _parse_cached(section_json: str) -> HybridSpecConfig:
    return HybridSpecConfig.from_section(json.loads(section_json))


def hybridspec_config_from_additional_config(additional_config: Any) -> HybridSpecConfig | None:
    """The validated section, or None when the section is absent or `enabled` is false."""
    if not isinstance(additional_config, dict) or SECTION not in additional_config:
        return None
    section = additional_config[SECTION]
    try:
        config = _parse_cached(json.dumps(section, sort_keys=True))
    except TypeError:  # not JSON-serialisable: validate uncached for the error message
        config = HybridSpecConfig.from_section(section)
    return config if config.enabled else None


def hybridspec_config_from_vllm_config(vllm_config: Any) -> HybridSpecConfig | None:
    """The engine's validated `hybridspec` section, or None when hybridspec is not enabled for it.

    Cheap (cached on the section's content): runtime patches call it to decide whether to act.
    """
    config = hybridspec_config_from_additional_config(getattr(vllm_config, "additional_config", None))
    speculative = getattr(vllm_config, "speculative_config", None)
    if config is not None and speculative is not None and speculative.num_speculative_tokens:
        config.check_against_speculation(speculative.num_speculative_tokens)
    return config
