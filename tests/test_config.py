import json
from types import SimpleNamespace

import pytest

from vllm_hybridspec.config import (
    HybridSpecConfig,
    hybridspec_config_from_additional_config,
    hybridspec_config_from_vllm_config,
)


def test_defaults():
    config = HybridSpecConfig()
    assert config.enabled is False
    assert (config.head_walk, config.head_walk_residency, config.head_walk_w2_dtype) == ("megakernel", "auto", "auto")
    assert (config.gdn_verify, config.verify_length) == ("block_parallel", "fixed")
    assert (config.min_verify_length, config.max_verify_length) == (1, None)
    assert config.latency_profile == "auto"
    assert (config.routing_correction, config.routing_correction_threshold) == (False, 1.0)


def test_every_knob_accepts_its_documented_values(tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text("{}")
    section = {
        "enabled": True, "head_walk": "reference", "head_walk_residency": "partial", "head_walk_w2_dtype": "fp8",
        "gdn_verify": "vllm", "verify_length": "adaptive", "min_verify_length": 2, "max_verify_length": 8,
        "latency_profile": str(profile), "routing_correction": True, "routing_correction_threshold": 0.5,
        "device_verify_length": True,
    }
    assert HybridSpecConfig.from_section(section).model_dump() == section


@pytest.mark.parametrize(
    "section, key",
    [
        pytest.param({"verify_length": "adapt"}, "hybridspec.verify_length", id="bad-literal"),
        pytest.param({"head_walk": "fast"}, "hybridspec.head_walk", id="bad-head-walk"),
        pytest.param({"head_walk_residency": "half"}, "hybridspec.head_walk_residency", id="bad-residency"),
        pytest.param({"head_walk_w2_dtype": "fp4"}, "hybridspec.head_walk_w2_dtype", id="bad-dtype"),
        pytest.param({"gdn_verify": "chunk"}, "hybridspec.gdn_verify", id="bad-gdn-verify"),
        pytest.param({"enabled": "yes"}, "hybridspec.enabled", id="string-bool"),
        pytest.param({"max_verify_length": "8"}, "hybridspec.max_verify_length", id="string-int"),
        pytest.param({"min_verify_length": 0}, "hybridspec.min_verify_length", id="min-zero"),
        pytest.param({"max_verify_length": 0}, "hybridspec.max_verify_length", id="max-zero"),
        pytest.param({"min_verify_length": 5, "max_verify_length": 3}, "hybridspec.min_verify_length", id="min>max"),
        pytest.param({"routing_correction_threshold": 0}, "hybridspec.routing_correction_threshold", id="thr-zero"),
        pytest.param({"routing_correction_threshold": -1.5}, "hybridspec.routing_correction_threshold", id="thr-neg"),
        pytest.param({"latency_profile": "/nonexistent/p.json"}, "hybridspec.latency_profile", id="profile-missing"),
        pytest.param({"latency_profile": "fast"}, "hybridspec.latency_profile", id="profile-not-json"),
        pytest.param({"verify_lenght": "fixed"}, "hybridspec.verify_lenght", id="typo-key"),
    ],
)
def test_errors_name_the_key(section, key):
    with pytest.raises(ValueError) as error:
        HybridSpecConfig.from_section({"enabled": True, **section})
    assert str(error.value).startswith(key + ":"), str(error.value)


def test_typo_suggests_the_known_key():
    with pytest.raises(ValueError, match="did you mean 'verify_length'"):
        HybridSpecConfig.from_section({"verify_lenght": "fixed"})


def test_section_must_be_a_mapping():
    with pytest.raises(ValueError, match=r"^hybridspec: expected a mapping"):
        hybridspec_config_from_additional_config({"hybridspec": ["enabled"]})


@pytest.mark.parametrize("additional_config", [None, {}, {"other_plugin": {"x": 1}}, {"hybridspec": {}},
                                               {"hybridspec": {"enabled": False, "verify_length": "adaptive"}}])
def test_absent_or_disabled_section_gives_none(additional_config):
    assert hybridspec_config_from_additional_config(additional_config) is None


def test_disabled_section_is_still_validated():
    with pytest.raises(ValueError, match="hybridspec.head_walk"):
        hybridspec_config_from_additional_config({"hybridspec": {"enabled": False, "head_walk": "nope"}})


def _vllm_config(section, num_speculative_tokens=None):
    speculative = None if num_speculative_tokens is None else SimpleNamespace(num_speculative_tokens=num_speculative_tokens)
    return SimpleNamespace(additional_config={"hybridspec": section}, speculative_config=speculative)


def test_from_vllm_config_checks_lengths_against_num_speculative_tokens():
    config = hybridspec_config_from_vllm_config(_vllm_config({"enabled": True}, 4))
    assert config.max_verify_length_for(4) == 4
    assert hybridspec_config_from_vllm_config(_vllm_config({"enabled": True, "max_verify_length": 3}, 4)) is not None
    with pytest.raises(ValueError, match=r"^hybridspec.max_verify_length: 6 is larger .*num_speculative_tokens \(4\)"):
        hybridspec_config_from_vllm_config(_vllm_config({"enabled": True, "max_verify_length": 6}, 4))
    with pytest.raises(ValueError, match=r"^hybridspec.min_verify_length"):
        hybridspec_config_from_vllm_config(_vllm_config({"enabled": True, "min_verify_length": 5}, 4))


def test_config_round_trips_through_json():
    config = HybridSpecConfig.from_section({"enabled": True, "verify_length": "adaptive", "max_verify_length": 7})
    assert HybridSpecConfig.from_section(json.loads(config.model_dump_json())) == config
