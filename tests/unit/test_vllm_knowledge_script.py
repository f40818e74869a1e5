"""scripts/vllm_knowledge.py against excerpts of two vLLM releases (tests/fixtures/vllm-source, the sdists and line
ranges cited in its README): read as unpacked sdists (VERSION=PATH) and by ref from a git checkout (VERSION=PATH@REF);
and the committed sparkctl/knowledge/vllm_releases.json held to what the generator finds in the excerpts."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from sparkctl.knowledge.vllm_releases import DATA_PATH
from tests.taskkit import REPO

FIXTURE = REPO / "tests" / "fixtures" / "vllm-source"
SCRIPT = REPO / "scripts" / "vllm_knowledge.py"
SDIST_SHA256 = {"0.11.1": "672af6f0a56117b9e84b8caacbfe437afba9f366cef8e524dcc5f3f03edd954e",
                "0.17.1": "d26a95dcb92e2ff78ed4b48bff247d845b0c768edf6c0acf2401376a56c57b61"}
COMMIT_ID = {"0.11.1": "g439368496", "0.17.1": "g95c0f928c"}
IMAGE = "nvcr.io/nvidia/vllm:26.01-py3"
#: speculative fields whose type lives in a file the excerpts leave out (README): read as a plain str there
UNRESOLVED = {"0.11.1": {"quantization"}, "0.17.1": {"quantization", "draft_load_config"}}
KV_CACHE_DTYPES = ["auto", "bfloat16", "fp8", "fp8_ds_mla", "fp8_e4m3", "fp8_e5m2", "fp8_inc"]
BACKENDS = ["external_launcher", "mp", "ray", "uni"]
COMMON_FLAGS = {"model_tag", "--headless", "--api-server-count", "--config", "--host", "--port", "--api-key",
                "--max-model-len", "--enforce-eager", "--distributed-executor-backend", "--master-addr",
                "--master-port", "--nnodes", "--node-rank", "--tensor-parallel-size", "--swap-space",
                "--kv-cache-dtype", "--speculative-config", "--enable-log-requests"}


def run(out, *args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args), "--out", str(out)], capture_output=True,
                          text=True)


def generate(out, *args) -> dict:
    done = run(out, *args)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                          capture_output=True, text=True).stdout


def files_of(root) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def unlined(section):
    """An evidence string names `path:line`; the excerpts' line numbers are not the release's."""
    return json.loads(re.sub(r"(\.py):\d+", r"\1", json.dumps(section)))


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm-knowledge") / "releases.json"
    return generate(out, "--release", f"0.11.1={FIXTURE / '0.11.1'}", "--release", f"0.17.1={FIXTURE / '0.17.1'}",
                    *[a for v, sha in SDIST_SHA256.items() for a in ("--sdist-sha256", f"{v}={sha}")],
                    "--image", f"{IMAGE}=0.11.1")


def test_the_flags_of_each_release_are_the_ones_its_source_adds(generated):
    old, new = (generated["releases"][v]["serve_flags"] for v in ("0.11.1", "0.17.1"))
    assert set(old) == COMMON_FLAGS | {"--task", "--disable-log-requests"}
    assert set(new) == COMMON_FLAGS
    for flags in (old, new):
        assert flags["--tensor-parallel-size"] == {"kind": "int", "aliases": ["-tp"], "config": "ParallelConfig",
                                                   "field": "tensor_parallel_size"}
        # str | Literal[...] | type[Executor] | None: the Literal is only a suggestion next to str
        assert flags["--distributed-executor-backend"] == {"kind": "str", "suggestions": BACKENDS, "optional": True,
                                                           "config": "ParallelConfig",
                                                           "field": "distributed_executor_backend"}
        assert flags["--swap-space"] == {"kind": "float", "config": "CacheConfig", "field": "swap_space"}
        assert flags["--enforce-eager"] == {"kind": "bool", "config": "ModelConfig", "field": "enforce_eager"}
        assert flags["--kv-cache-dtype"] == {"kind": "choice", "choices": KV_CACHE_DTYPES, "config": "CacheConfig",
                                             "field": "cache_dtype"}
        # type=optional_type(json.loads) replaces the SpeculativeConfig schema: plain JSON at parse time
        assert flags["--speculative-config"] == {"kind": "json", "optional": True, "config": "VllmConfig",
                                                 "field": "speculative_config"}
        assert flags["--nnodes"]["aliases"] == ["-n"] and flags["--node-rank"]["aliases"] == ["-r"]
        assert [flags[f]["kind"] for f in ("--nnodes", "--node-rank", "--master-addr", "--master-port")] == [
            "int", "int", "str", "int"]
        assert flags["--headless"] == {"kind": "flag"}
        assert flags["--api-key"] == {"kind": "list", "item": "str", "optional": True, "config": "FrontendArgs",
                                      "field": "api_key"}
        assert flags["--max-model-len"] == {"kind": "int", "human_readable": True, "config": "ModelConfig",
                                            "field": "max_model_len"}
        assert flags["--api-server-count"] == {"kind": "int", "aliases": ["-asc"]}
        assert flags["model_tag"] == {"kind": "str", "nargs": "?", "positional": True}
    tasks = ["auto", "classify", "draft", "embed", "embedding", "generate", "reward", "score", "transcription"]
    assert old["--task"] == {"kind": "choice", "choices": [*tasks, "None"], "optional": True, "deprecated": True,
                             "config": "ModelConfig", "field": "task"}
    assert old["--disable-log-requests"] == {"kind": "bool", "deprecated": True}


def test_speculative_config_multi_node_parser_env_and_metrics_of_each_release(generated):
    old, new = generated["releases"]["0.11.1"], generated["releases"]["0.17.1"]
    spec = old["speculative_config"]
    assert spec["unknown_keys"] == "ignored"  # @config returns the class; pydantic's @dataclass ignores extra keys
    assert "create_speculative_config(): SpeculativeConfig(**self.speculative_config)" in spec["evidence"]
    assert "vllm/config/speculative.py" in spec["evidence"] and "from pydantic.dataclasses" in spec["evidence"]
    assert spec["methods"] == ["ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "eagle", "eagle3",
                               "deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "ernie_mtp", "qwen3_next_mtp",
                               "longcat_flash_mtp", "mtp", "pangu_ultra_moe_mtp"]  # nested Literals flattened
    assert spec["fields"]["method"] == {"kind": "choice", "choices": sorted(spec["methods"]) + ["None"],
                                        "optional": True}
    assert spec["fields"]["target_model_config"] == {"kind": "json", "schema": "ModelConfig"}
    assert len(spec["fields"]) == 22
    spec = new["speculative_config"]
    assert spec["unknown_keys"] == "refused"
    assert "vllm/config/speculative.py" in spec["evidence"]
    assert "vllm/config/utils.py" in spec["evidence"] and "ConfigDict(extra='forbid')" in spec["evidence"]
    assert {"eagle3", "extract_hidden_states", "qwen3_5_mtp"} <= set(spec["methods"])
    assert "extract_hidden_states" not in old["speculative_config"]["methods"]
    assert {"draft_load_config", "parallel_drafting"} <= set(spec["fields"]) - set(old["speculative_config"]["fields"])

    for entry in (old, new):
        multi = entry["multi_node"]
        assert multi["nnodes_flags"] and multi["nnodes_field"] and multi["executor_backends"] == BACKENDS
        assert multi["ray_with_nnodes"] == "refused" and multi["default_multi_node_executor"] == "raises"
        assert multi["default_with_nnodes"] == "mp"
        assert multi["dp_backend_with_nnodes_message"] == "nnodes > 1 is only supported with data_parallel_backend=mp"
        assert multi["evidence"].startswith("vllm/config/parallel.py:")
        assert multi["ray_with_nnodes_evidence"].startswith("vllm/config/parallel.py:")
        assert entry["env"] == ["CUDA_VISIBLE_DEVICES", "VLLM_HOST_IP", "VLLM_PORT", "VLLM_TARGET_DEVICE"]
        assert entry["requires_python"] == "<3.14,>=3.10"
        assert entry["parser"]["underscores"] and entry["parser"]["dotted_json"] and entry["parser"]["abbrev"]
        assert entry["parser"]["serve_model_option"] == "moved to model_tag, warning"
        assert entry["errors"]["overrides"] == [] and entry["errors"]["choice"].startswith("vllm serve: error:")
        assert entry["errors"]["optional_type"] == ("vllm serve: error: argument %s: Value {val} cannot be converted "
                                                    "to {return_type}.")
    # verbatim, the typo of 0.11.1 included
    assert old["multi_node"]["ray_with_nnodes_message"] == (
        "nnodes > 1 can only be set when distributed exectuor backend is mp.")
    assert new["multi_node"]["ray_with_nnodes_message"] == (
        "nnodes > 1 can only be set when distributed executor backend is mp, uni or external_launcher.")
    assert old["multi_node"]["message"] == (
        "Tensor parallel size ({self.world_size}) cannot be larger than the number of available GPUs ({gpu_count}).")
    assert new["multi_node"]["message"] == (
        "World size ({self.world_size}) is larger than the number of available GPUs ({gpu_count}) in this node. If "
        "this is intentional and you are using:\n- ray, set '--distributed-executor-backend ray'.\n- multiprocessing,"
        " set '--nnodes' appropriately.")
    assert old["parser"]["o_shorthand_to"] == "-O.mode={mode}" and new["parser"]["o_shorthand_to"] == (
        "--optimization-level")

    shared = {"vllm:num_requests_running": "gauge", "vllm:corrupted_requests": "counter",
              "vllm:prompt_tokens": "counter", "vllm:e2e_request_latency_seconds": "histogram"}
    assert old["metrics"] == {**shared, "vllm:gpu_cache_usage_perc": "gauge"}
    assert new["metrics"] == {**shared, "vllm:prompt_tokens_cached": "counter"}
    nans = "vllm/v1/metrics/loggers.py: if envs.VLLM_COMPUTE_NANS_IN_LOGITS"
    assert old["metrics_conditional"] == {"vllm:corrupted_requests": nans,
                                          "vllm:gpu_cache_usage_perc": "vllm/v1/metrics/loggers.py: if "
                                                                       "self.show_hidden_metrics"}
    assert new["metrics_conditional"] == {"vllm:corrupted_requests": nans}


def test_each_sdist_release_records_its_sources(generated):
    for version in ("0.11.1", "0.17.1"):
        source = generated["releases"][version]["source"]
        assert source == {"repo": "vllm-project/vllm", "ref": f"v{version}", "commit_id": COMMIT_ID[version],
                          "sdist": f"vllm-{version}.tar.gz", "sdist_sha256": SDIST_SHA256[version],
                          "files": files_of(FIXTURE / version)}  # every excerpt file is read, and nothing else
    assert generated["images"]["tags"] == {IMAGE: "0.11.1"}
    assert list(generated["releases"]) == ["0.11.1", "0.17.1"]


def test_a_release_read_by_ref_from_a_git_checkout_gives_the_same_facts(generated, tmp_path):
    repo = tmp_path / "vllm"
    shutil.copytree(FIXTURE / "0.17.1", repo)
    git(tmp_path, "init", "-q", str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "excerpt")
    git(repo, "tag", "-a", "v0.17.1", "-m", "v0.17.1")  # annotated: the tag object is not the commit
    shutil.rmtree(repo / "vllm")  # read with `git show REF:path`, not from the work tree
    (repo / "PKG-INFO").write_text("Version: 0.0.0\n")
    out = tmp_path / "releases.json"
    entry = generate(out, "--release", f"0.17.1={repo}@v0.17.1")["releases"]["0.17.1"]
    sdist = generated["releases"]["0.17.1"]
    assert {k: v for k, v in entry.items() if k != "source"} == {k: v for k, v in sdist.items() if k != "source"}
    head = git(repo, "rev-parse", "HEAD").strip()
    assert head != git(repo, "rev-parse", "v0.17.1").strip()
    files = {k: v for k, v in files_of(FIXTURE / "0.17.1").items() if k != "vllm/_version.py"}  # commit from git
    assert entry["source"] == {"repo": "vllm-project/vllm", "ref": "v0.17.1", "commit_id": "g" + head[:9],
                               "commit": head, "files": files}
    # a ref that is not the named release's tag is refused
    wrong = subprocess.run([sys.executable, str(SCRIPT), "--release", f"0.11.1={repo}@v0.17.1", "--out",
                            str(tmp_path / "wrong.json")], capture_output=True, text=True)
    assert wrong.returncode != 0 and "v0.17.1 is not tagged v0.11.1" in wrong.stderr


def test_a_second_run_naming_one_release_keeps_the_others_and_the_images(generated, tmp_path):
    out = tmp_path / "releases.json"
    out.write_text(json.dumps(generated))
    args = ["--release", f"0.17.1={FIXTURE / '0.17.1'}", "--image", "nvcr.io/nvidia/vllm:26.03-py3=0.17.1"]
    merged = generate(out, *args)
    assert merged["releases"]["0.11.1"] == generated["releases"]["0.11.1"]
    assert merged["releases"]["0.17.1"] == generated["releases"]["0.17.1"]  # same commit: the sdist hash is kept
    assert merged["images"] == {"source": generated["images"]["source"],
                                "tags": {IMAGE: "0.11.1", "nvcr.io/nvidia/vllm:26.03-py3": "0.17.1"}}
    assert merged["about"].endswith("Last run: " + shlex.join(["scripts/vllm_knowledge.py", *args, "--out", str(out)]))


def test_a_tree_of_another_release_is_refused(tmp_path):
    done = run(tmp_path / "releases.json", "--release", f"0.17.1={FIXTURE / '0.11.1'}")
    assert done.returncode != 0 and "PKG-INFO is not vLLM 0.17.1" in done.stderr
    assert not (tmp_path / "releases.json").exists()


@pytest.mark.parametrize("version", ["0.11.1", "0.17.1"])
def test_the_committed_data_agrees_with_the_excerpts(generated, version):
    """What the generator reads in an excerpt, the committed entry (generated from the whole sdist) must say too."""
    mine, committed = generated["releases"][version], json.loads(DATA_PATH.read_text())["releases"][version]
    for flag, spec in mine["serve_flags"].items():
        assert committed["serve_flags"].get(flag) == spec, flag
    for section in ("parser", "errors", "multi_node"):
        assert unlined(committed[section]) == unlined(mine[section]), section
    spec, ours = committed["speculative_config"], mine["speculative_config"]
    assert spec["unknown_keys"] == ours["unknown_keys"] and spec["methods"] == ours["methods"]
    assert unlined(spec["evidence"]) == unlined(ours["evidence"])
    assert set(spec["fields"]) == set(ours["fields"])
    assert {k for k, v in ours["fields"].items() if spec["fields"][k] != v} == UNRESOLVED[version]
    assert set(mine["env"]) <= set(committed["env"])
    assert mine["metrics"].items() <= committed["metrics"].items()
    assert mine["metrics_conditional"].items() <= committed["metrics_conditional"].items()
    assert committed["requires_python"] == mine["requires_python"]
    assert committed["metrics_exposition"] == mine["metrics_exposition"]
    source = committed["source"]
    assert {k: source[k] for k in ("repo", "ref", "commit_id", "sdist", "sdist_sha256")} == {
        k: mine["source"][k] for k in ("repo", "ref", "commit_id", "sdist", "sdist_sha256")}
    assert set(mine["source"]["files"]) <= set(source["files"])
