"""Find the production kernels the verify model runs on the GPU, without vLLM installed.

    vLLM 0.33's GDN verify ops   extracted from .vendor/vllm033 by eval/_vllm_sources.py (ignored folder)
    OpenAI's triton_kernels      copied from the wheel's vllm/third_party/triton_kernels (ignored folder); it
                                 imports itself as top-level `triton_kernels`, so its folder goes on sys.path
    vLLM 0.33's fused MoE        the Triton `fused_moe_kernel` with its launcher, config lookup (tuned JSON files,
                                 default rule) and expert assignment, copied definition by definition out of
                                 fused_moe.py (its module imports half of vLLM) into the same ignored folder,
                                 with the wheel's config files for the profiled shapes
    ours                         hybridspec_kernels.gdn_verify (installed, or the repo folder via a symlink)
"""
from __future__ import annotations

import importlib
import json
import shutil
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENDOR_TREE = REPO / ".vendor" / "vllm033" / "vllm"
EXTRACTED_DIR = REPO / ".vendor" / "extracted_profile"      # vLLM GDN ops (vllm_extracted package)
OAI_DIR = REPO / ".vendor" / "oai_triton_kernels"            # holds triton_kernels/ (OpenAI's)


FUSED_MOE_MODULE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
FUSED_MOE_OUT = "fused_moe_subset"
FUSED_MOE_DEFINITIONS = [
    "write_zeros_to_output", "fused_moe_kernel", "invoke_fused_moe_triton_kernel", "get_config_file_name",
    "get_moe_configs", "should_moe_wna16_use_cuda", "get_default_config", "try_get_optimal_moe_config",
    "_prepare_expert_assignment",
]
# what the copied definitions use from the rest of vLLM, for a bf16 / fp32 model without quantization, LoRA or
# expert parallelism; `moe_align_block_size` (a CUDA op there) is set by load_vllm_moe
FUSED_MOE_PREAMBLE = """
import functools
import json
import logging
import os
import re
import types
from typing import Any

import torch

from vllm_extracted._shim import current_platform, tl, triton

envs = types.SimpleNamespace(VLLM_BATCH_INVARIANT=False, VLLM_TUNED_CONFIG_FOLDER=None, VLLM_TRITON_USE_TD=None)


class _Logger(logging.LoggerAdapter):
    def info_once(self, msg, *args, **kwargs):
        kwargs.pop("scope", None)
        self.info(msg, *args, **kwargs)

    def warning_once(self, msg, *args, **kwargs):
        kwargs.pop("scope", None)
        self.warning(msg, *args, **kwargs)


logger = _Logger(logging.getLogger("vllm_extracted.fused_moe"), {})


def next_power_of_2(n):
    return 1 if n < 1 else 1 << (n - 1).bit_length()


def get_device_name_as_file_name(device_id=0):
    name = torch.cuda.get_device_name(device_id) if torch.cuda.is_available() else "cpu"
    return re.sub(r"[\\s/]+", "_", name)


def get_config():  # vLLM's override_config context: unset
    return None


def enable_swap_ab(BLOCK_SIZE_M, BLOCK_SIZE_N):  # fp8 only
    return False


def resolve_moe_use_td():  # VLLM_TRITON_USE_TD unset: on for XPU only
    return False


def warn_if_moe_use_td_ineffective(active_backend, is_quantized=False):
    return None


def set_triton_allocator(device):
    return None


def moe_align_block_size(*args, **kwargs):
    raise RuntimeError("moe_align_block_size is set by eval/verify_model/kernels_loader.load_vllm_moe")
"""
MOE_CONFIG_PREFIX = "vllm/model_executor/layers/fused_moe/configs"
TUNED_DIR = EXTRACTED_DIR / "tuned_moe_configs"   # VLLM_TUNED_CONFIG_FOLDER of the "tuned" MoE option
TUNED_FOR_DEVICE = "NVIDIA_H200"
TUNED_FALLBACK_DEVICE = "NVIDIA_H100_80GB_HBM3"   # the Hopper file when the wheel has no H200 one


def moe_config_shapes():
    from .shapes import SHAPES
    return sorted({(s.num_experts, s.expert_inter) for s in SHAPES.values() if s.name != "tiny"})


def prepare_sources() -> None:
    """Run here (CPU machine) before the GPU call: fill the two ignored folders that the call carries."""
    sys.path.insert(0, str(REPO / "eval"))
    import _vllm_sources
    _vllm_sources.extract(_vllm_sources.GDN_VERIFY_MODULES, EXTRACTED_DIR)
    _vllm_sources.extract_definitions(FUSED_MOE_MODULE, FUSED_MOE_DEFINITIONS, EXTRACTED_DIR, FUSED_MOE_OUT,
                                      FUSED_MOE_PREAMBLE, replace={
                                          "from vllm.model_executor.layers.fused_moe import get_config":
                                          f"from vllm_extracted.{FUSED_MOE_OUT} import get_config"})
    prefixes = tuple(f"E={e},N={n}," for e, n in moe_config_shapes())
    config_dir = EXTRACTED_DIR / "vllm_extracted" / "configs"
    if config_dir.exists():
        shutil.rmtree(config_dir)
    _vllm_sources.extract_wheel_files(MOE_CONFIG_PREFIX, config_dir, lambda name: name.startswith(prefixes))
    # the "tuned" option: vLLM's user folder (VLLM_TUNED_CONFIG_FOLDER) holding, under the H200 file name, the
    # wheel's H200 file for the shape, else its H100 (Hopper) one; tuned_sources.json says which
    if TUNED_DIR.exists():
        shutil.rmtree(TUNED_DIR)
    TUNED_DIR.mkdir(parents=True)
    sources = {}
    for e, n in moe_config_shapes():
        target = f"E={e},N={n},device_name={TUNED_FOR_DEVICE}.json"
        for device in (TUNED_FOR_DEVICE, TUNED_FALLBACK_DEVICE):
            src = config_dir / f"E={e},N={n},device_name={device}.json"
            if src.exists():
                shutil.copyfile(src, TUNED_DIR / target)
                sources[target] = src.name
                break
    (TUNED_DIR / "tuned_sources.json").write_text(json.dumps(sources, indent=1) + "\n")
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


def load_vllm_moe(config_mode: str = "lookup"):
    """vLLM's fused-MoE Triton path. config_mode "lookup": vLLM's own lookup on this device (its configs/ file
    for the device name, else get_default_config); "tuned": the same lookup with VLLM_TUNED_CONFIG_FOLDER set
    to TUNED_DIR (the wheel's H200 file for the shape, else its H100 one)."""
    if config_mode not in ("lookup", "tuned"):
        raise ValueError(f"config_mode must be 'lookup' or 'tuned', got {config_mode!r}")
    if not (EXTRACTED_DIR / "vllm_extracted" / f"{FUSED_MOE_OUT}.py").exists():
        raise FileNotFoundError(f"{EXTRACTED_DIR} has no fused MoE: run `python eval/bench_verify_profile.py --prepare` here")
    if str(EXTRACTED_DIR) not in sys.path:
        sys.path.insert(0, str(EXTRACTED_DIR))
    fm = importlib.import_module(f"vllm_extracted.{FUSED_MOE_OUT}")
    from . import moe_align
    fm.moe_align_block_size = moe_align.moe_align_block_size
    fm.envs.VLLM_TUNED_CONFIG_FOLDER = str(TUNED_DIR) if config_mode == "tuned" else None
    fm.get_moe_configs.cache_clear()
    sources_file = TUNED_DIR / "tuned_sources.json"
    tuned_sources = json.loads(sources_file.read_text()) if sources_file.exists() else {}
    return types.SimpleNamespace(module=fm, config_mode=config_mode, tuned_sources=tuned_sources,
                                 config_dir=Path(fm.__file__).parent / "configs")


def load_ours():
    return importlib.import_module("hybridspec_kernels.gdn_verify")
