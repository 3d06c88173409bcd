"""Tiny local models for CPU end-to-end tests and the demo (built offline, no model hub).

    python -m vllm_hybridspec.tiny DIR
    from vllm_hybridspec.tiny import ensure_tiny_models; models = ensure_tiny_models(".tiny")

Importing this package is cheap; torch and transformers load only when a build runs.
"""
from vllm_hybridspec.tiny.build import TinyModels, build, builder_hash, ensure_tiny_models

__all__ = ["TinyModels", "build", "builder_hash", "ensure_tiny_models"]
