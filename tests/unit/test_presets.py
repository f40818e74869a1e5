from __future__ import annotations

import pytest

from sparkctl.inventory.presets import PRESETS, default_preset_name, get_preset, preset_names

# nvidia/speculative-decoding/README.md, the two-Spark playbook's extra_llm_api_options without
# speculative_model_dir
PLAYBOOK_CONFIG = {
    "enable_attention_dp": False,
    "disable_overlap_scheduler": False,
    "enable_autotuner": False,
    "enable_chunked_prefill": False,
    "cuda_graph_config": {"max_batch_size": 1},
    "speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3},
    "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": False},
}


def test_table():
    rows = {name: (p.engine, p.model, p.draft, p.decoding, p.max_draft_len, p.tp_size, p.port)
            for name, p in PRESETS.items()}
    assert rows == {
        "qwen3-235b-eagle3": ("trtllm", "nvidia/Qwen3-235B-A22B-FP4", "nvidia/Qwen3-235B-A22B-Eagle3", "eagle3", 3, 2,
                              8355),
        "gpt-oss-120b-eagle3": ("trtllm", "openai/gpt-oss-120b", "nvidia/gpt-oss-120b-Eagle3", "eagle3", 5, 1, 8000),
        "llama-3.3-70b-draft-target": ("trtllm", "nvidia/Llama-3.3-70B-Instruct-FP4",
                                       "nvidia/Llama-3.1-8B-Instruct-FP4", "draft-target", 4, 1, 8000),
        "llama-3.3-70b-vllm": ("vllm", "meta-llama/Llama-3.3-70B-Instruct", None, "none", None, 2, 8000),
        "llama-3.3-70b-vllm-eagle3": ("vllm", "meta-llama/Llama-3.3-70B-Instruct",
                                      "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", "eagle3", 3, 2, 8000),
        "gpt-oss-120b-sglang": ("sglang", "openai/gpt-oss-120b", None, "none", None, 2, 8000),
        "llama-3.3-70b-sglang-eagle3": ("sglang", "meta-llama/Llama-3.3-70B-Instruct",
                                        "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", "eagle3", 3, 2, 8000),
    }
    assert [PRESETS[n].weights_gb for n in PRESETS] == [125, 61, 40, 142, 142, 61, 142]


# NVIDIA/dgx-spark-playbooks at 0e4cfe880b119e5173d31ddff0d3d2350811ffa9, nvidia/vllm/README.md, Run on two Sparks,
# step 8: `vllm serve meta-llama/Llama-3.3-70B-Instruct --tensor-parallel-size 2 --max_model_len 2048`
def test_vllm_presets_are_the_two_spark_playbooks_and_vllms_eagle3_example():
    plain, eagle3 = PRESETS["llama-3.3-70b-vllm"], PRESETS["llama-3.3-70b-vllm-eagle3"]
    assert plain.config_dict() == {"max-model-len": 2048} and plain.tp_size == 2
    assert "nvidia/vllm/README.md" in plain.source
    # vLLM docs/features/speculative_decoding/eagle.md (v0.20.1): method eagle3, draft TP = the target's TP
    assert eagle3.config_dict()["speculative-config"] == {
        "method": "eagle3", "num_speculative_tokens": eagle3.max_draft_len, "draft_tensor_parallel_size": 2}
    assert "model" not in eagle3.config_dict()["speculative-config"]  # the plan knows where the draft lives
    assert "eagle.md" in eagle3.source and "SafeAILab/EAGLE" in eagle3.source


def test_two_spark_config_is_the_playbooks():
    assert PRESETS["qwen3-235b-eagle3"].config_dict() == PLAYBOOK_CONFIG


def test_every_preset_config_agrees_with_its_fields():
    decoding_types = {"eagle3": "Eagle", "draft-target": "DraftTarget"}
    for preset in (p for p in PRESETS.values() if p.engine == "trtllm"):
        speculative = preset.config["speculative_config"]
        assert speculative["decoding_type"] == decoding_types[preset.decoding]
        assert speculative["max_draft_len"] == preset.max_draft_len
        assert "speculative_model_dir" not in speculative
    assert PRESETS["gpt-oss-120b-eagle3"].config["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9


# NVIDIA/dgx-spark-playbooks at 0db7c141da60870ca6ed5c99436320f4e35cd531, nvidia/speculative-decoding/README.md:
# Option 1 EAGLE-3 (gpt-oss-120b) and Option 2 Draft Target (its --kv_cache_free_gpu_memory_fraction 0.9 folded in).
SINGLE_SPARK_PLAYBOOK = {
    "gpt-oss-120b-eagle3": {
        "enable_attention_dp": False, "disable_overlap_scheduler": False, "enable_autotuner": False,
        "cuda_graph_config": {"max_batch_size": 1},
        "speculative_config": {"decoding_type": "Eagle", "max_draft_len": 5},
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": False}},
    "llama-3.3-70b-draft-target": {
        "print_iter_log": False, "disable_overlap_scheduler": True,
        "speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 4},
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": False}},
}  # fmt: skip


def test_single_spark_presets_are_the_playbooks_and_every_preset_cites_its_source():
    for name, config in SINGLE_SPARK_PLAYBOOK.items():
        assert PRESETS[name].config_dict() == config, name
    for preset in (p for p in PRESETS.values() if p.engine == "trtllm"):
        assert "nvidia/speculative-decoding/README.md" in preset.source, preset.name


def test_config_is_frozen_and_config_dict_is_a_copy():
    preset = PRESETS["qwen3-235b-eagle3"]
    with pytest.raises(TypeError):
        preset.config["kv_cache_config"]["enable_block_reuse"] = True  # type: ignore[index]
    copy = preset.config_dict()
    copy["kv_cache_config"]["enable_block_reuse"] = True
    assert preset.config_dict() == PLAYBOOK_CONFIG


@pytest.mark.parametrize("variant", ["long-context", "v2", "throughput", "v3"])
def test_gpt_oss_variants(variant):
    preset = get_preset(f"gpt-oss-120b-eagle3:{variant}")
    assert preset.name == f"gpt-oss-120b-eagle3:{variant}"
    assert preset.draft == f"nvidia/gpt-oss-120b-Eagle3-{variant}"
    assert preset.model == "openai/gpt-oss-120b" and preset.port == 8000
    assert get_preset("gpt-oss-120b-eagle3").draft == "nvidia/gpt-oss-120b-Eagle3"


def test_unknown_names():
    with pytest.raises(KeyError, match="unknown preset 'nope'"):
        get_preset("nope")
    with pytest.raises(KeyError, match="has no variant 'v9'"):
        get_preset("gpt-oss-120b-eagle3:v9")
    with pytest.raises(KeyError, match="has no variant"):
        get_preset("qwen3-235b-eagle3:v2")


def test_names_and_default():
    assert "gpt-oss-120b-eagle3:throughput" in preset_names()
    assert all(get_preset(name) for name in preset_names())
    assert default_preset_name(1) == "gpt-oss-120b-eagle3"
    assert default_preset_name(2) == default_preset_name(4) == "qwen3-235b-eagle3"
    assert default_preset_name(2, "vllm") == "llama-3.3-70b-vllm-eagle3"
    assert default_preset_name(1, "vllm") is None  # no vLLM preset fits one Spark: serve.model says
