"""TensorRT-LLM release data (sparkctl/knowledge/trtllm_releases.json): ordering, nearest release, and the config
check at every depth, against every example inventory, preset and known release."""

from __future__ import annotations

import json

import pytest
import yaml

from sparkctl.inventory.presets import get_preset, preset_names
from sparkctl.knowledge.trtllm_releases import DATA_PATH, Release, known_releases, release_of, schema_for
from sparkctl.plan.trtllm import launch_argv, release_config
from tests.taskkit import REPO, inventory_from_yaml

R = Release.parse
INVENTORIES = sorted((REPO / "inventories").glob("*.yaml"))


def test_release_order_puts_candidates_before_the_final_release():
    assert R("1.3.0rc5") < R("1.3.0rc12") < R("1.3.0rc26") < R("1.3.0") < R("1.3.1rc0")
    assert str(R("1.3.0rc12")) == "1.3.0rc12" and R("1.2.0rc6.post3") == R("1.2.0rc6")
    assert R("spark-single-gpu-dev") is None


def test_release_comes_from_the_label_before_the_tag():
    image = "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc6"
    assert release_of(image) == R("1.2.0rc6")
    assert release_of(image, {"com.nvidia.tensorrt-llm.version": "1.3.0rc27"}) == R("1.3.0rc27")
    assert release_of("nvcr.io/nvidia/tensorrt-llm/release:spark-single-gpu-dev") is None
    assert release_of("localhost:5000/trtllm") is None  # a registry port is not a tag


def test_every_release_records_where_its_data_came_from():
    data = json.loads(DATA_PATH.read_text())
    assert {"1.1.0rc5", "1.2.0rc6", "1.3.0rc12"} <= set(data["releases"])
    for name, entry in data["releases"].items():
        source = entry["source"]
        assert source["repo"] == "NVIDIA/TensorRT-LLM" and source["ref"] and source["method"] and source["note"], name
        assert "--max_batch_size" in entry["serve_flags"], name  # every release's trtllm-serve has the flag


def test_releases_read_from_source_say_so_and_the_rest_say_what_stands_in():
    data = json.loads(DATA_PATH.read_text())["releases"]
    for name in ("1.1.0rc5", "1.2.0rc6", "1.3.0rc11"):  # read from the release's own rendered llm_args.py
        source = data[name]["source"]
        assert source["method"] == "generated-from-rendered-source" and source["commit"], name
        assert source["files"]["tensorrt_llm/llmapi/llm_args.py"].startswith(
            f"https://nvidia.github.io/TensorRT-LLM/{name}"), name
    stand_in = data["1.3.0rc12"]["source"]
    assert stand_in["method"] == "nearest-readable-release" and stand_in["commit"] is None
    assert stand_in["note"].startswith("NOT read from 1.3.0rc12's source") and stand_in["data_from"]["release"] \
        == "1.3.0rc11"
    assert {k: v for k, v in data["1.3.0rc12"].items() if k != "source"} == \
        {k: v for k, v in data["1.3.0rc11"].items() if k != "source"}


def test_what_the_sources_read_say_per_release():
    rc5, rc6, rc11 = schema_for(R("1.1.0rc5")), schema_for(R("1.2.0rc6")), schema_for(R("1.3.0rc11"))
    assert list(rc5.tags) == ["MTP", "Medusa", "Eagle", "Lookahead", "NGram", "DraftTarget", "UserProvided", "AUTO"]
    assert "build_config" in rc5.top_level and "build_config" not in rc6.top_level  # 1.1's PyTorch args keep a dummy
    assert "speculative_model" not in rc5.tags["DraftTarget"]  # 1.1 has speculative_model_dir only
    assert "--config" not in rc5.serve_flags and "--tp_size" in rc5.serve_flags
    assert "DraftTarget" in rc6.tags and "Eagle3" not in rc6.tags  # the 1.2 name table
    assert list(rc11.tags)[:3] == ["Draft_Target", "Eagle", "Eagle3"] and "DraftTarget" not in rc11.tags
    assert rc11.aliases == {}  # _decoding_type_alias is declared, applied nowhere in llm_args.py
    assert "enable_sleep" in rc6.top_level and "enable_sleep" not in rc11.top_level and "sleep_config" in rc11.top_level
    assert "onboard_blocks" in rc11.sections["kv_cache_config"]
    assert "onboard_blocks" not in schema_for(R("1.3.0rc26")).sections["kv_cache_config"]


def test_an_unknown_release_is_judged_as_the_nearest_older_one():
    assert schema_for(R("1.3.0rc14")).release == R("1.3.0rc12")
    assert schema_for(R("1.2.0rc6")).release == R("1.2.0rc6")
    assert schema_for(R("0.21.0")).release == known_releases()[0]  # older than all: the oldest known


@pytest.mark.parametrize("release, tag, refused", [
    ("1.2.0rc6", "DraftTarget", False), ("1.2.0rc6", "Draft_Target", True),
    ("1.3.0rc12", "Draft_Target", False), ("1.3.0rc12", "DraftTarget", True),
    ("1.3.0rc26", "DraftTarget", True), ("1.3.0rc26", "Eagle", False),
])  # fmt: skip
def test_the_draft_target_tag_is_release_dependent(release, tag, refused):
    problems = schema_for(R(release)).validate(
        {"speculative_config": {"decoding_type": tag, "max_draft_len": 4, "speculative_model_dir": "/d/"}})
    assert bool(problems) == refused, problems
    if refused:
        assert problems[0].kind == "union_tag_invalid" and problems[0].dotted() == "speculative_config.decoding_type"


def test_unknown_keys_and_wrong_types_are_refused_at_every_depth_with_their_path():
    schema = schema_for(R("1.3.0rc26"))
    problems = schema.validate({
        "enable_autotunr": False, "max_batch_size": "1",
        "kv_cache_config": {"onbord_blocks": True, "free_gpu_memory_fraction": 0.9},
        "moe_config": {"backend": "CUTLASS", "backnd": 1},
        "speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3, "is_auto_heuristic": True},
    })
    found = {p.dotted(): (p.kind, p.hint) for p in problems}
    assert found["enable_autotunr"] == ("extra_forbidden", "did you mean 'enable_autotuner'?")
    assert found["max_batch_size"][0] == "int_type"
    assert found["kv_cache_config.onbord_blocks"][0] == "extra_forbidden"
    assert found["moe_config.backnd"] == ("extra_forbidden", "did you mean 'backend'?")
    assert found["speculative_config.is_auto_heuristic"][0] == "extra_forbidden"
    assert len(problems) == 5


def test_removed_sampler_type_is_dropped_for_torch_sampler_and_refused_otherwise():
    schema = schema_for(R("1.3.0rc26"))
    assert schema.validate({"sampler_type": "TorchSampler"}) == []
    assert [p.kind for p in schema.validate({"sampler_type": "TRTLLMSampler"})] == ["value_error"]
    assert schema_for(R("1.2.0rc6")).validate({"sampler_type": "TRTLLMSampler"}) == []


def _inventory(tmp_path, path, preset, release):
    data = yaml.safe_load(path.read_text())
    serve = data.setdefault("serve", {})
    if serve.get("engine") in ("vllm", "sglang"):  # its config holds the server's flags
        serve.pop("config", None)
    for key in ("preset", "model", "draft", "decoding", "max_draft_len", "tp_size", "engine", "vllm", "sglang",
                "args"):
        serve.pop(key, None)
    serve["preset"] = preset
    serve["tp_size"] = min(len(data["nodes"]), 2 if preset.startswith("qwen3") else 1)
    data.setdefault("container", {})["image"] = f"nvcr.io/nvidia/tensorrt-llm/release:{release}"
    return inventory_from_yaml(yaml.safe_dump(data), tmp_path)


@pytest.mark.parametrize("release", [str(r) for r in known_releases()])
@pytest.mark.parametrize("preset", [n for n in preset_names() if get_preset(n).engine == "trtllm"])
def test_every_example_inventory_and_preset_renders_what_the_release_accepts(tmp_path, release, preset):
    for path in INVENTORIES:
        inv = _inventory(tmp_path, path, preset, release)
        rc = release_config(inv, R(release))
        assert rc.refused == [], (path.name, rc.refused)
        assert schema_for(R(release)).validate(rc.config) == [], path.name
        argv = launch_argv(inv)
        flags = [a for a in argv[argv.index("trtllm-serve") + 2:] if a.startswith("--")]
        assert set(flags) <= set(schema_for(R(release)).serve_flags), path.name
        assert argv[argv.index("--max_batch_size") + 1] == str(inv.serve.max_batch_size)


PAIR = """
user: nvidia
nodes: [{{name: spark1, host: 10.0.0.11}}, {{name: spark2, host: 10.0.0.12}}]
container: {{image: "nvcr.io/nvidia/tensorrt-llm/release:{release}"}}
serve:
  preset: qwen3-235b-eagle3
  max_batch_size: 4
  {extra}
"""


def test_serve_max_batch_size_reaches_the_server(tmp_path):
    inv = inventory_from_yaml(PAIR.format(release="1.3.0rc12", extra=""), tmp_path)
    argv = launch_argv(inv)
    assert argv[argv.index("--max_batch_size") + 1] == "4"
    assert release_config(inv, R("1.3.0rc12")).config["cuda_graph_config"]["max_batch_size"] == 4


def test_a_preset_key_the_release_lacks_is_dropped_an_override_is_refused(tmp_path, monkeypatch):
    # the tag says 1.3.0rc12 (which has the key); the running image's label says a late 1.3 (which does not)
    inv = inventory_from_yaml(PAIR.format(release="1.3.0rc12", extra="config: {disable_flashinfer_sampling: true}"),
                              tmp_path)
    assert release_config(inv, R("1.3.0rc12")).refused == []
    assert release_config(inv, R("1.3.0rc26")).refused == [
        "serve.config.disable_flashinfer_sampling: Extra inputs are not permitted "
        "(did you mean 'enable_in_graph_sampling'?)"]
    inv = inventory_from_yaml(PAIR.format(release="1.3.0rc12", extra=""), tmp_path)
    spec = inv.serve_spec()
    spec.config["kv_cache_config"]["onboard_blocks"] = True  # as if the preset carried it
    monkeypatch.setattr(type(inv), "serve_spec", lambda self: spec)
    assert release_config(inv, R("1.3.0rc11")).dropped == []  # 1.3.0rc11's KvCacheConfig still has it
    rc = release_config(inv, R("1.3.0rc26"))
    assert rc.dropped == ["kv_cache_config.onboard_blocks"] and rc.refused == []
    assert "onboard_blocks" not in rc.text()


def test_the_draft_target_preset_is_spelled_for_the_image_release(tmp_path):
    single = """
user: nvidia
nodes: [{{name: spark1, host: 10.0.0.11}}]
container: {{image: "nvcr.io/nvidia/tensorrt-llm/release:{release}"}}
serve: {{preset: llama-3.3-70b-draft-target}}
"""
    for release, tag in (("1.2.0rc6", "DraftTarget"), ("1.3.0rc12", "Draft_Target"), ("1.3.0rc14", "Draft_Target")):
        inv = inventory_from_yaml(single.format(release=release), tmp_path)
        assert release_config(inv, R(release)).config["speculative_config"]["decoding_type"] == tag


def test_unknown_release_filters_nothing(tmp_path):
    inv = inventory_from_yaml(PAIR.format(release="1.3.0rc12", extra=""), tmp_path)
    rc = release_config(inv, None)
    assert rc.refused == [] and rc.release is None
