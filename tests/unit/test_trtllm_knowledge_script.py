"""scripts/trtllm_knowledge.py against excerpts of TensorRT-LLM's real source (tests/fixtures/trtllm-source, cited
commits there), committed to a temporary git repository and read by path and ref as from a real checkout."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from sparkctl.knowledge.trtllm_releases import DATA_PATH
from tests.taskkit import REPO

FIXTURE = REPO / "tests" / "fixtures" / "trtllm-source"
SCRIPT = REPO / "scripts" / "trtllm_knowledge.py"


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_generator_reads_a_checkout_by_ref(tmp_path):
    repo = tmp_path / "TensorRT-LLM"
    shutil.copytree(FIXTURE / "tensorrt_llm", repo / "tensorrt_llm")
    git(tmp_path, "init", "-q", str(repo))
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "empty")
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "excerpt")
    git(repo, "tag", "v9.9.9rc1")
    out = tmp_path / "releases.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--repo", str(repo), "--release", "9.9.9rc1=v9.9.9rc1",
                          "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    entry = json.loads(out.read_text())["releases"]["9.9.9rc1"]
    source = entry["source"]
    assert source["commit"] == git(repo, "rev-parse", "v9.9.9rc1").strip() and source["method"] == "generated"
    assert source["files"]["tensorrt_llm/llmapi/llm_args.py"] == git(
        repo, "rev-parse", "v9.9.9rc1:tensorrt_llm/llmapi/llm_args.py").strip()
    assert entry["top_level"] == {"model": "any", "speculative_config": "any", "max_batch_size": "int",
                                  "_mpi_session": "any", "cuda_graph_config": "any", "moe_config": "dict",
                                  "enable_autotuner": "bool"}
    assert entry["sections"]["cuda_graph_config"] == {"batch_sizes": "list", "max_batch_size": "int",
                                                      "enable_padding": "bool", "mode": "str"}
    assert set(entry["sections"]["moe_config"]) == {"backend", "max_num_tokens", "disable_finalize_fusion"}
    tags = entry["speculative"]["tags"]
    assert set(tags) == {"Draft_Target", "Eagle3", "Eagle"}  # the union's members; no DraftTarget alias applied
    assert set(tags["Draft_Target"]) == {"max_draft_len", "speculative_model", "speculative_model_dir",
                                         "decoding_type"}
    assert "eagle3_one_model" in tags["Eagle3"] and "_decoding_type_alias" not in tags["Eagle"]
    assert entry["serve_flags"] == ["--host", "--max_batch_size", "--tensor_parallel_size", "--tp_size", "--config",
                                    "--extra_llm_api_options"]


# Shaped like the releases before the 1.3 tagged union (1.1/1.2: each config names itself in a ClassVar, and
# DecodingBaseConfig.from_dict resolves the YAML's decoding_type through a table); written for this test, not copied.
NAME_TABLE_ARGS = """
class StrictBaseModel(BaseModel):
    pass


class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[int] = None
    speculative_model_dir: Optional[Union[str, Path]] = None

    @classmethod
    def from_dict(cls, data: dict):
        config_classes = {"Eagle": EagleDecodingConfig, "DraftTarget": DraftTargetDecodingConfig}
        return config_classes[data.pop("decoding_type")](**data)


class EagleDecodingConfig(DecodingBaseConfig):
    eagle3_one_model: Optional[bool] = True
    decoding_type: ClassVar[str] = "Eagle"


class DraftTargetDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "Draft_Target"


class SchedulerConfig(StrictBaseModel):
    capacity_scheduler_policy: Literal["MAX_UTILIZATION", "GUARANTEED_NO_EVICT"]


class TorchLlmArgs(StrictBaseModel):
    speculative_config: Optional[Union[DraftTargetDecodingConfig, EagleDecodingConfig]] = None
    scheduler_config: SchedulerConfig
    enable_sleep: bool = False
"""


def test_a_name_table_release_accepts_the_table_keys_and_an_excerpt_records_where_it_came_from(tmp_path):
    repo = tmp_path / "excerpt"
    (repo / "tensorrt_llm" / "llmapi").mkdir(parents=True)
    (repo / "tensorrt_llm" / "llmapi" / "llm_args.py").write_text(NAME_TABLE_ARGS)
    git(tmp_path, "init", "-q", str(repo))
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "excerpt")
    describe = tmp_path / "provenance.json"
    describe.write_text(json.dumps({"ref": "v9.8.0rc1", "commit": "abc1234", "method": "generated-from-rendered-source",
                                    "files": {"tensorrt_llm/llmapi/llm_args.py": "https://example.invalid/page"},
                                    "serve_flags": ["--max_batch_size", "--config"]}))
    out = tmp_path / "releases.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--repo", str(repo), "--release", "9.8.0rc1=HEAD",
                          "--describe", f"9.8.0rc1={describe}", "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    entry = json.loads(out.read_text())["releases"]["9.8.0rc1"]
    tags = entry["speculative"]["tags"]
    assert set(tags) == {"Eagle", "DraftTarget"}  # the table's keys, not the ClassVar "Draft_Target"
    assert tags["DraftTarget"] == {"max_draft_len": "int", "speculative_model_dir": "any", "decoding_type": "str"}
    assert "eagle3_one_model" in tags["Eagle"]
    assert entry["sections"] == {"scheduler_config": {"capacity_scheduler_policy": "str"}}
    assert entry["top_level"] == {"speculative_config": "any", "scheduler_config": "dict", "enable_sleep": "bool"}
    assert entry["source"]["commit"] == "abc1234" and entry["source"]["ref"] == "v9.8.0rc1"
    assert entry["source"]["files"] == {"tensorrt_llm/llmapi/llm_args.py": "https://example.invalid/page"}
    assert entry["serve_flags"] == ["--max_batch_size", "--config"]  # no serve.py in the excerpt: the described ones


def test_the_committed_data_agrees_with_the_excerpts_where_it_was_read_from_the_same_commit():
    """The late-1.3 entry was transcribed from llm_args.py at the excerpts' commit: what the generator finds in the
    excerpt must be there too."""
    late = json.loads(DATA_PATH.read_text())["releases"]["1.3.0rc26"]
    assert late["source"]["commit"] == "0004396720054fd8e205cbf616f21f0b57c6b412"
    assert {"max_batch_size", "cuda_graph_config", "moe_config", "enable_autotuner"} <= set(late["top_level"])
    assert {"backend", "max_num_tokens", "disable_finalize_fusion"} <= set(late["sections"]["moe_config"])
    assert {"batch_sizes", "max_batch_size", "enable_padding", "mode"} <= set(late["sections"]["cuda_graph_config"])
    assert {"Draft_Target", "Eagle3", "Eagle"} <= set(late["speculative"]["tags"])
    assert "DraftTarget" not in late["speculative"]["tags"] and late["speculative"]["aliases"] == {}
