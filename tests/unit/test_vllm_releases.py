"""What sparkctl knows of each vLLM release (sparkctl/knowledge/vllm_releases.json, read from vLLM's own source) and
the inventory's vLLM flags and config judged against the image's release, at file:line."""

from __future__ import annotations

import pytest

from sparkctl.inventory import dump_inventory, load_inventory
from sparkctl.inventory.vllm_check import OWNED_FLAGS
from sparkctl.knowledge.vllm_releases import (
    VllmVersion,
    judged_note,
    known_releases,
    release_of,
    schema_for,
)
from tests.unit.inventory_kit import PAIR, problems_of

V = VllmVersion.parse
RELEASES = ("0.10.2", "0.11.1", "0.17.1", "0.20.1")


def schema(version: str):
    parsed = V(version)
    assert parsed is not None
    return schema_for(parsed)


def test_the_data_holds_four_releases_each_with_its_source():
    assert [str(v) for v in known_releases()] == list(RELEASES)
    for version in RELEASES:
        source = schema(version).source
        assert source["repo"] == "vllm-project/vllm" and source["ref"] == f"v{version}"
        assert source["sdist"] == f"vllm-{version}.tar.gz" and len(source["sdist_sha256"]) == 64
        assert "vllm/engine/arg_utils.py" in source["files"] and source["commit_id"].startswith("g")


def test_ngc_tags_map_to_releases_and_version_tags_parse():
    assert release_of("nvcr.io/nvidia/vllm:26.05-py3") == V("0.20.1")
    assert release_of("nvcr.io/nvidia/vllm:25.10-py3") == V("0.10.2")
    assert release_of("vllm/vllm-openai:v0.17.1") == V("0.17.1")
    assert release_of("eugr/spark-vllm:latest") is None and release_of(None) is None


@pytest.mark.parametrize(("flag", "present"), [
    # read from each release's vllm/engine/arg_utils.py (EngineArgs.add_cli_args)
    ("--swap-space", {"0.10.2", "0.11.1", "0.17.1"}),
    ("--task", {"0.10.2", "0.11.1"}),
    ("--disable-log-requests", {"0.10.2", "0.11.1"}),
    ("--nnodes", {"0.11.1", "0.17.1", "0.20.1"}),
    ("--master-addr", {"0.11.1", "0.17.1", "0.20.1"}),
    ("--headless", set(RELEASES)),
    ("--api-key", set(RELEASES)),
])
def test_which_release_has_which_flag(flag, present):
    assert {v for v in RELEASES if flag in schema(v).flags} == present


def test_speculative_config_and_multi_node_per_release():
    for version in RELEASES:
        assert "eagle3" in schema(version).speculative["methods"]
    # SpeculativeConfig(**d): pydantic dataclasses ignore extra keys until @config sets extra="forbid" (0.17)
    assert [schema(v).speculative["unknown_keys"] for v in RELEASES] == ["ignored", "ignored", "refused", "refused"]
    assert [schema(v).has_nnodes for v in RELEASES] == [False, True, True, True]
    assert [schema(v).multi_node["ray_with_nnodes"] for v in RELEASES[1:]] == ["refused"] * 3
    assert schema("0.10.2").multi_node["default_multi_node_executor"] == "ray"


def test_flags_are_judged_as_the_release_parses_them():
    s = schema("0.20.1")

    def said(*argv):
        return [(p.where, p.message, p.hint) for p in s.check_args(list(argv), OWNED_FLAGS)]

    assert said("--enforce-eager", "--max-model-len", "32k", "--gpu_memory_utilization", "0.8", "--no-enforce-eager",
                "--speculative-config.num_speculative_tokens", "2", "-O3", "--hf-token") == []
    assert said("--gpu-memory-util", "0.8") == []  # argparse's allow_abbrev, which vLLM leaves on
    assert said("--swap-space", "4", "--enforce-eager") == [
        (("args", 0), "--swap-space is gone from vLLM 0.20.1 (vLLM 0.17.1 had it)",
         "remove it; the release notes say what replaced it")]
    assert said("--max-modl-len", "3") == [(("args", 0), "vLLM 0.20.1 has no flag --max-modl-len",
                                            "did you mean --max-model-len?")]
    where, message, hint = said("--kv-cache-dtype", "fp9")[0]
    assert message.startswith("--kv-cache-dtype: 'fp9' is not one of vLLM 0.20.1's choices (auto, ") and \
        hint == "did you mean 'fp8'?"
    assert said("--max", "3")[0][1].startswith("--max is ambiguous in vLLM 0.20.1: it could be --max-cpu-loras")
    assert said("--enforce-eager=1")[0][1] == "--enforce-eager takes no value (write --enforce-eager or " \
                                              "--no-enforce-eager)"
    assert said("--max-num-seqs", "many")[0][1] == "--max-num-seqs: 'many' is not an integer"
    assert said("-tp", "2") == [(("args", 0), "--tensor-parallel-size is sparkctl's to set", "use serve.tp_size")]
    assert said("--speculative-config.model", "x")[0][1] == "--speculative-config.model is sparkctl's to set"
    assert said("stray")[0][1] == "'stray' is not a flag (each value follows its --flag)"


def test_a_speculative_key_is_refused_or_said_to_be_ignored_as_the_release_does():
    config = {"speculative-config": {"method": "eagle3", "num_speculative_tokenz": 3}}
    old, new = (schema(v).check_config(config, OWNED_FLAGS) for v in ("0.11.1", "0.20.1"))
    assert old[0].message.endswith("has no num_speculative_tokenz: the release would ignore it without a word "
                                   "(it would have no effect)")
    assert new[0].message.endswith("has no num_speculative_tokenz: the release refuses it")
    assert old[0].hint == new[0].hint == "did you mean num_speculative_tokens?"
    wrong_method = schema("0.20.1").check_config({"speculative-config": {"method": "eagle-3"}}, OWNED_FLAGS)
    assert wrong_method[0].where == ("config", "speculative-config", "method")


def test_a_release_not_in_the_data_is_judged_by_the_nearest_earlier_one():
    version = V("0.18.0")
    assert version is not None
    assert schema_for(version).version == V("0.17.1")
    assert judged_note(version, schema_for(version)) == "vLLM 0.18.0 is not in sparkctl's data: judged as 0.17.1"


# -- the inventory ---------------------------------------------------------------------------------------------------
def test_a_vllm_preset_brings_its_engine_and_container_and_the_file_is_given_back_as_written(inv_file):
    inventory = load_inventory(inv_file(PAIR + "serve:\n  preset: llama-3.3-70b-vllm-eagle3\n"))
    spec = inventory.serve_spec()
    assert spec.engine == "vllm" and spec.tp_size == 2
    assert spec.config["speculative-config"] == {"method": "eagle3", "num_speculative_tokens": 3,
                                                 "draft_tensor_parallel_size": 2}
    assert (inventory.container.name, inventory.container.image) == ("vllm-multinode",
                                                                     "nvcr.io/nvidia/vllm:26.05-py3")
    assert "container" not in dump_inventory(inventory)
    own = load_inventory(inv_file(PAIR + "container:\n  image: nvcr.io/nvidia/vllm:26.03-py3\n"
                                  "serve:\n  engine: vllm\n  config:\n    max_model_len: 4096\n"))
    assert own.container.image == "nvcr.io/nvidia/vllm:26.03-py3" and own.container.name == "vllm-multinode"
    assert own.serve_spec().preset == "llama-3.3-70b-vllm-eagle3"
    assert own.serve_spec().config["max-model-len"] == 4096  # vLLM reads max_model_len and max-model-len alike
    trtllm = load_inventory(inv_file(PAIR))
    assert trtllm.serve_spec().engine == "trtllm" and trtllm.container.name == "trtllm-multinode"


def test_flags_the_images_release_refuses_are_reported_at_their_line(inv_file):
    text = PAIR + ("serve:\n  preset: llama-3.3-70b-vllm-eagle3\n  args: [--enforce-eager, --swap-space, '4']\n"
                   "  config:\n    max_modl_len: 4096\n    speculative-config: {method: eagle3, model: x}\n")
    assert problems_of(inv_file(text)) == [
        "inv.yaml:9: serve.args[1]: --swap-space is gone from vLLM 0.20.1 (vLLM 0.17.1 had it) (remove it; the "
        "release notes say what replaced it)",
        "inv.yaml:11: serve.config.max_modl_len: vLLM 0.20.1 has no flag max-modl-len (did you mean "
        "--max-model-len?)",
        "inv.yaml:12: serve.config.speculative-config.model: speculative-config.model is sparkctl's to set (use "
        "serve.draft (the plan knows where the draft lives on each node))",
    ]
    plain = PAIR + "serve:\n  preset: llama-3.3-70b-vllm\n  config:\n    speculative_config: {method: eagle3}\n"
    assert problems_of(inv_file(plain)) == ["inv.yaml:10: serve.config.speculative_config: set while decoding is none "
                                         "(set serve.decoding: eagle3 and serve.draft, or remove it)"]
    # the same flag on the image of a release that still has it loads
    older = text.replace("  config:\n    max_modl_len: 4096\n    speculative-config: {method: eagle3, model: x}\n", "")
    assert load_inventory(inv_file(PAIR.replace("user:", "container: {image: 'nvcr.io/nvidia/vllm:26.03-py3'}\nuser:")
                                   + older[len(PAIR):])).serve_spec().args == ("--enforce-eager", "--swap-space", "4")


def test_engine_and_preset_must_agree_and_args_are_vllms(inv_file):
    assert problems_of(inv_file(PAIR + "serve:\n  engine: trtllm\n  preset: llama-3.3-70b-vllm\n")) == [
        "inv.yaml:8: serve.engine: trtllm, but preset llama-3.3-70b-vllm runs on vllm (remove serve.engine, or "
        "choose a trtllm preset: qwen3-235b-eagle3, gpt-oss-120b-eagle3, llama-3.3-70b-draft-target)"]
    assert problems_of(inv_file(PAIR + "serve:\n  args: [--enforce-eager]\n")) == [
        "inv.yaml:8: serve.args: are vllm serve or sglang.launch_server flags: TensorRT-LLM's settings go in "
        "serve.config (its extra_llm_api_options keys), or set serve.engine: vllm or sglang"]
    single = "user: nvidia\nnodes: [{name: spark1, host: h1}]\nserve:\n  engine: vllm\n"
    assert problems_of(inv_file(single)) == ["inv.yaml:3: serve: no vllm preset fits 1 node(s): name the model "
                                          "(serve.model)"]
    assert problems_of(inv_file(PAIR + "serve:\n  engine: tgi\n"))[0].startswith("inv.yaml:8: serve.engine: ")


def test_a_vllm_variable_the_release_no_longer_reads_is_reported(inv_file):
    # VLLM_ATTENTION_BACKEND: in vllm/envs.py's environment_variables up to 0.11.1, gone from 0.17.1
    text = ("container:\n  env:\n    VLLM_ATTENTION_BACKEND: FLASHINFER\n    VLLM_HOST_IPP: 1.2.3.4\n" + PAIR
            + "serve:\n  engine: vllm\n")
    assert problems_of(inv_file(text)) == [
        "inv.yaml:3: container.env.VLLM_ATTENTION_BACKEND: vLLM 0.20.1 does not read VLLM_ATTENTION_BACKEND (vLLM "
        "0.11.1 read it): set, it changes nothing (remove it)",
        "inv.yaml:4: container.env.VLLM_HOST_IPP: vLLM 0.20.1 does not read VLLM_HOST_IPP: set, it changes nothing "
        "(did you mean VLLM_HOST_IP?)"]
    older = text.replace("container:\n", "container:\n  image: nvcr.io/nvidia/vllm:26.01-py3\n").replace(
        "    VLLM_HOST_IPP: 1.2.3.4\n", "")
    assert load_inventory(inv_file(older)).container.env["VLLM_ATTENTION_BACKEND"] == "FLASHINFER"


def test_mp_on_a_release_without_nnodes_is_refused_at_its_line(inv_file):
    text = ("container:\n  image: nvcr.io/nvidia/vllm:25.10-py3\n" + PAIR
            + "serve:\n  engine: vllm\n  vllm:\n    executor: mp\n")
    assert problems_of(inv_file(text)) == [
        "inv.yaml:12: serve.vllm.executor: mp: vLLM 0.10.2 has no --nnodes (0.11.1 and later), so its ranks meet "
        "across nodes only over Ray (set executor: ray or auto, or use an image with a later vLLM)"]
    assert load_inventory(inv_file(text.replace("executor: mp", "executor: auto"))).serve.vllm.executor == "auto"
