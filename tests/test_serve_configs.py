"""The serve_configs/*.yaml files parse the way `vllm serve --config` parses them, and their hybridspec
sections validate."""
import json
from pathlib import Path

import pytest

from vllm_hybridspec.config import HybridSpecConfig

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "serve_configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_serve_config_parses_and_validates(path):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", "dummy-model", "--config", str(path)])
    assert args.speculative_config["method"] in ("dflash", "dspark")
    section = args.additional_config["hybridspec"]
    assert HybridSpecConfig.from_section(section).enabled
    assert args.enable_prefix_caching is False


def test_there_are_serve_configs():
    assert {p.name for p in CONFIGS} >= {"qwen3-next-80b-a3b-dflash.yaml", "qwen3.6-35b-a3b-dspark.yaml"}
