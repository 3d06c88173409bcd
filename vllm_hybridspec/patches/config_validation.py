from __future__ import annotations

from typing import Any, Callable

from vllm_hybridspec.patches.base import VllmPatch


class ValidateHybridSpecConfig(VllmPatch):
    target = "vllm.config.vllm:VllmConfig.__post_init__"
    what = "validates additional_config['hybridspec'] and the vLLM version; records the component plan"
    why = "a bad section must fail LLM() / `vllm serve` before the engine starts; vLLM keeps additional_config opaque"
    vllm_versions = ">=0.32,<0.34"
    process = "frontend"

    @staticmethod
    def replacement(original: Callable[..., Any]) -> Callable[..., Any]:
        def __post_init__(self: Any, *args: Any, **kwargs: Any) -> Any:
            from vllm_hybridspec.plugin import check_engine_config

            check_engine_config(self)
            return original(self, *args, **kwargs)

        return __post_init__
