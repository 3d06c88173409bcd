"""Find the production kernels the verify model runs on the GPU, without vLLM installed.

    vLLM 0.33's GDN verify ops   extracted from .vendor/vllm033 by eval/_vllm_sources.py (ignored folder)
    OpenAI's triton_kernels      copied from the wheel's vllm/third_party/triton_kernels (ignored folder); it
                                 imports itself as top-level `triton_kernels`, so its folder goes on sys.path
    ours                         hybridspec_kernels.gdn_verify (installed, or the repo folder via a symlink)
"""
from __future__ import annotations

import importlib
import shutil
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENDOR_TREE = REPO / ".vendor" / "vllm033" / "vllm"
EXTRACTED_DIR = REPO / ".vendor" / "extracted_profile"      # vLLM GDN ops (vllm_extracted package)
OAI_DIR = REPO / ".vendor" / "oai_triton_kernels"            # holds triton_kernels/ (OpenAI's)


def prepare_sources() -> None:
    """Run here (CPU machine) before the GPU call: fill the two ignored folders that the call carries."""
    sys.path.insert(0, str(REPO / "eval"))
    import _vllm_sources
    _vllm_sources.extract(_vllm_sources.GDN_VERIFY_MODULES, EXTRACTED_DIR)
    dst = OAI_DIR / "triton_kernels"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(VENDOR_TREE / "third_party" / "triton_kernels", dst,
                    ignore=shutil.ignore_patterns("__pycache__"))


def load_vllm_gdn():
    if not EXTRACTED_DIR.exists():
        raise FileNotFoundError(f"{EXTRACTED_DIR} missing: run `python eval/bench_verify_profile.py --prepare` here")
    sys.path.insert(0, str(EXTRACTED_DIR))
    conv = importlib.import_module("vllm_extracted.model_executor.layers.mamba.ops.causal_conv1d")
    gating = importlib.import_module("vllm_extracted.third_party.flash_linear_attention.ops.fused_sigmoid_gating")
    return types.SimpleNamespace(causal_conv1d_update=conv.causal_conv1d_update,
                                 fused_sigmoid_gating_delta_rule_update=gating.fused_sigmoid_gating_delta_rule_update)


def load_oai_moe():
    if not (OAI_DIR / "triton_kernels").exists():
        raise FileNotFoundError(f"{OAI_DIR} missing: run `python eval/bench_verify_profile.py --prepare` here")
    sys.path.insert(0, str(OAI_DIR))
    tk = importlib.import_module("triton_kernels")
    if not str(Path(tk.__file__).resolve()).startswith(str(OAI_DIR.resolve())):
        raise ImportError(f"`triton_kernels` resolved to {tk.__file__}, not OpenAI's copy under {OAI_DIR}")
    routing = importlib.import_module("triton_kernels.routing")
    mo = importlib.import_module("triton_kernels.matmul_ogs")
    swiglu = importlib.import_module("triton_kernels.swiglu")
    flags = importlib.import_module("triton_kernels.matmul_ogs_details.opt_flags")
    return types.SimpleNamespace(routing=routing.routing, matmul_ogs=mo.matmul_ogs,
                                 FusedActivation=mo.FusedActivation, FnSpecs=mo.FnSpecs, swiglu_fn=swiglu.swiglu_fn,
                                 update_opt_flags_constraints=flags.update_opt_flags_constraints,
                                 reset_opt_flags_constraints=flags.reset_opt_flags_constraints)


def load_ours():
    return importlib.import_module("hybridspec_kernels.gdn_verify")
