"""Config keys per TensorRT-LLM release, and the release-aware config rendering."""

from __future__ import annotations

import pytest
import yaml

from sparkctl.knowledge.trtllm_releases import Release, keys_for, release_of, unknown_keys
from sparkctl.plan.serve import release_config
from tests.taskkit import inventory_from_yaml

R = Release.parse


def test_release_order_puts_candidates_before_the_final_release():
    assert R("1.3.0rc5") < R("1.3.0rc12") < R("1.3.0rc26") < R("1.3.0") < R("1.3.1rc0")
    assert R("1.1.0rc0") < R("1.1.0rc1")
    assert str(R("1.3.0rc12")) == "1.3.0rc12"
    assert R("spark-single-gpu-dev") is None


def test_release_comes_from_the_label_before_the_tag():
    image = "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc6"
    assert release_of(image) == R("1.2.0rc6")
    assert release_of(image, {"com.nvidia.tensorrt-llm.version": "1.3.0rc27"}) == R("1.3.0rc27")
    assert release_of("nvcr.io/nvidia/tensorrt-llm/release:spark-single-gpu-dev") is None
    assert release_of("localhost:5000/trtllm") is None  # a registry port is not a tag


@pytest.mark.parametrize("release, present, absent", [
    ("1.1.0rc0", ["use_torch_sampler", "speculative_config.eagle3_one_model"], ["sampler_type"]),
    ("1.2.0rc6", ["sampler_type", "speculative_config.eagle3_one_model"], ["use_torch_sampler"]),
    ("1.3.0rc12", ["sampler_type", "speculative_config.eagle3_one_model"], ["use_torch_sampler"]),
    ("1.3.0rc26", ["speculative_config.eagle3_one_model"], ["sampler_type", "use_torch_sampler"]),
    ("1.3.0rc27", [], ["sampler_type", "use_torch_sampler", "speculative_config.eagle3_one_model"]),
])
def test_keys_that_came_and_went(release, present, absent):
    keys = keys_for(R(release))
    assert all(keys.accepts(p) for p in present), [p for p in present if not keys.accepts(p)]
    assert not any(keys.accepts(p) for p in absent), [p for p in absent if keys.accepts(p)]
    assert keys.accepts("kv_cache_config.free_gpu_memory_fraction")


def test_unknown_keys_checks_top_level_and_the_validated_sections():
    config = {"enable_autotuner": False, "enable_autotunr": True,
              "kv_cache_config": {"enable_block_reuse": False, "reuse": True},
              "speculative_config": {"decoding_type": "Eagle", "eagle3_one_model": True}}
    assert unknown_keys(config, keys_for(R("1.3.0rc27"))) == [
        "enable_autotunr", "kv_cache_config.reuse", "speculative_config.eagle3_one_model"]


PAIR = """
user: nvidia
nodes: [{{name: spark1, host: 10.0.0.11}}, {{name: spark2, host: 10.0.0.12}}]
serve:
  preset: qwen3-235b-eagle3
  {extra}
"""


def test_preset_keys_the_release_lacks_are_left_out_and_overrides_it_rejects_are_refused(tmp_path):
    inv = inventory_from_yaml(PAIR.format(extra="config: {sampler_type: TorchSampler, enable_iter_perf_stats: true}"),
                              tmp_path)
    rc = release_config(inv, R("1.3.0rc12"))
    assert rc.refused == [] and yaml.safe_load(rc.text())["sampler_type"] == "TorchSampler"
    rc = release_config(inv, R("1.3.0rc26"))
    assert rc.refused == ["sampler_type is not a key of TensorRT-LLM 1.3.0rc26 (removed by 1.3.0rc26)"]


def test_a_preset_key_missing_in_the_release_is_dropped_not_refused(tmp_path, monkeypatch):
    inv = inventory_from_yaml(PAIR.format(extra="max_draft_len: 4"), tmp_path)
    spec = inv.serve_spec()
    spec.config["speculative_config"]["eagle3_one_model"] = False  # as if the preset carried it
    monkeypatch.setattr(type(inv), "serve_spec", lambda self: spec)
    rc = release_config(inv, R("1.3.0rc27"))
    assert rc.dropped == ["speculative_config.eagle3_one_model"] and rc.refused == []
    assert "eagle3_one_model" not in rc.text()
    assert yaml.safe_load(rc.text())["speculative_config"]["max_draft_len"] == 4


def test_unknown_release_filters_nothing(tmp_path):
    inv = inventory_from_yaml(PAIR.format(extra="config: {use_torch_sampler: true}"), tmp_path)
    rc = release_config(inv, None)
    assert rc.refused == [] and "use_torch_sampler: true" in rc.text()
