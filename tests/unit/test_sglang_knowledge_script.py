"""scripts/sglang_knowledge.py against excerpts of three SGLang releases (tests/fixtures/sglang-source, the PyPI
distributions and line ranges cited in its README; line numbers kept as the release's): read as unpacked
distributions (VERSION=PATH) and by ref from a git checkout (VERSION=PATH@REF); and the committed
sparkctl/knowledge/sglang_releases.json held to what the generator finds in the excerpts. 0.5.3.post3 and 0.5.12
register their flags in ServerArgs.add_cli_args; 0.5.23 derives them from annotated fields (arg_groups/fields/) and
resolves in arg_groups/ hooks."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import shlex
import shutil
import subprocess
import sys

import pytest

from sparkctl.knowledge.sglang_releases import DATA_PATH
from tests.taskkit import REPO

FIXTURE = REPO / "tests" / "fixtures" / "sglang-source"
SCRIPT = REPO / "scripts" / "sglang_knowledge.py"
RELEASES = ("0.5.3.post3", "0.5.12", "0.5.23")
OLD_LAYOUT = ("0.5.3.post3", "0.5.12")  # flags added one by one in ServerArgs.add_cli_args
FIELDS_LAYOUT = "0.5.23"  # flags derived from arg_groups/fields/, hooks in arg_groups/
DIST_SHA256 = {"0.5.3.post3": "a6a78aac22e282147e60657e46b045ddec6b57451a6d96ea021324005d991c58",
               "0.5.12": "d3fc7ecb61ad3e533ebe1ae9b4109fbb62ecbf2d17453b62770c8a7ec49d539a",
               "0.5.23": "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"}
IMAGE = "lmsysorg/sglang:spark"
ALGORITHMS_0_5_3 = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
NEW = FIXTURE / FIELDS_LAYOUT / "sglang" / "srt"
SPEC_ALGORITHM = ["field", "speculative_algorithm"]


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


def module_constant(path, name):
    """The value node of a module-level assignment in an excerpt file, read on its own (not through the
    generator)."""
    tree = ast.parse(path.read_text())
    return next(n.value for n in tree.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in n.targets))


def files_of(root) -> dict[str, str]:
    """The excerpt's files by the names the generator records: python/<path>, a distribution's own files as they
    are."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            rel = p.relative_to(root).as_posix()
            named = rel if rel == "PKG-INFO" or ".dist-info/" in rel else f"python/{rel}"
            out[named] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("sglang-knowledge") / "releases.json"
    return generate(out, *[a for v in RELEASES for a in ("--release", f"{v}={FIXTURE / v}")],
                    *[a for v, sha in DIST_SHA256.items() for a in ("--dist-sha256", f"{v}={sha}")],
                    "--image", f"{IMAGE}=0.5.3.post3", "--image-source", f"{IMAGE}=secondary: a test says so")


def test_the_flags_are_the_ones_add_cli_args_adds_with_their_kind_default_and_field(generated):
    old, new = (generated["releases"][v]["server_flags"] for v in OLD_LAYOUT)
    for flags in (old, new):
        # --tensor-parallel-size first: argparse's dest; from_cli_args copies it to ServerArgs.tp_size
        assert flags["--tensor-parallel-size"] == {"kind": "int", "type": "int", "aliases": ["--tp-size"],
                                                   "dest": "tensor_parallel_size", "field": "tp_size", "default": 1}
        assert flags["--enable-metrics"] == {"kind": "flag", "dest": "enable_metrics", "field": "enable_metrics",
                                             "default": False}
        assert flags["--cuda-graph-bs"]["kind"] == "list" and flags["--cuda-graph-bs"]["item"] == "int"
        assert flags["--cuda-graph-bs"]["nargs"] == "+"
        assert flags["--load-format"]["choices"][:3] == ["auto", "pt", "safetensors"]
        assert flags["--load-format"]["choices_extendable"] is True  # add_load_format_choices extends the list
        assert flags["--model-path"]["required"] is True and flags["--model-path"]["aliases"] == ["--model"]
        assert flags["--dist-init-addr"]["aliases"] == ["--nccl-init-addr"]
    assert old["--speculative-algorithm"]["choices"] == ALGORITHMS_0_5_3
    assert "choices" not in new["--speculative-algorithm"]  # a free string from 0.5.12 (see speculative)
    assert old["--enable-ep-moe"] == {
        "kind": "refused", "action": "DeprecatedAction", "error": "ValueError", "dest": "enable_ep_moe",
        "default": None, "message": "NOTE: --enable-ep-moe is deprecated. Please set `--ep-size` to the same value "
                                    "as `--tp-size` instead."}
    # type=human_readable_int: an int, with the suffix pattern of its re.fullmatch
    assert new["--context-length"]["kind"] == "int" and new["--context-length"]["type"] == "human_readable_int"
    assert new["--context-length"]["pattern"] == r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)"


def test_the_parser_and_entry_points_of_each_release(generated):
    old, new = (generated["releases"][v] for v in OLD_LAYOUT)
    assert old["parser"]["prog"] is None and new["parser"]["prog"] == "sglang serve"
    for release in (old, new):
        assert release["parser"]["allow_abbrev"] is True and release["parser"]["underscores"] is False
        assert release["parser"]["config"]["exact_token"] is True
        assert release["entry_points"]["launch_server"]["command"] == "python3 -m sglang.launch_server"
    assert "serve" not in old["entry_points"]  # 0.5.3.post3 has no sglang/cli
    serve = new["entry_points"]["serve"]
    assert serve["script"] == "sglang = sglang.cli.main:main"
    assert serve["model_path_spellings"] == ["--model", "--model-path", "--model-path=", "--model="]
    assert serve["model_path_missing"] == "Error: --model-path is required. Please provide the path to the model."


def test_the_speculative_algorithms_and_checks_are_read_as_data(generated):
    old, new = (generated["releases"][v]["speculative"] for v in OLD_LAYOUT)
    assert old["algorithms"] == ALGORITHMS_0_5_3 and old["names"] == "choices" and old["case_sensitive"] is True
    assert old["aliases"] == {"NEXTN": "EAGLE"}
    assert new["algorithms"] == ["DFLASH", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM"]
    assert new["case_sensitive"] is False and new["unknown_error"] == "ValueError"
    assert new["unknown_message"] == "Unknown speculative algorithm name: {name}"
    assert new["aliases"] == {"NEXTN": "EAGLE", "EAGLE": "EAGLE"}
    # num-steps as the user set it (0.5.12's DFLASH branch may set it before: there it is that assignment)
    assert old["checks"][1]["when"][-1] == ["cmp", "is", ["field", "speculative_num_steps"], ["const", None]]
    for spec in (old, new):
        bare = [c for c in spec["checks"] if c["kind"] == "assert" and not c["message"]]
        assert bare[0]["source"] == ("assert self.speculative_eagle_topk is None and "
                                     "self.speculative_num_draft_tokens is None")
        assert bare[0]["when"][-1][:2] == ["cmp", "is"] and bare[0]["when"][-1][3] == ["const", None]
        paged = next(c for c in spec["checks"] if c["kind"] == "test" and "self.page_size > 1" in c["source"])
        assert paged["test"][1][:2] == ["cmp", ">"] and paged["test"][1][2][0] == "set"
        filled = spec["assignments"][paged["test"][1][2][1]]
        assert filled["field"] == "speculative_eagle_topk" and filled["value"][0] == "cond"


def test_multi_node_checks_env_and_metrics(generated):
    for version in OLD_LAYOUT:
        release = generated["releases"][version]
        assert release["multi_node"]["flags"] == {"--nnodes": "--nnodes", "--node-rank": "--node-rank",
                                                  "--dist-init-addr": "--dist-init-addr",
                                                  "--tp-size": "--tensor-parallel-size",
                                                  "--pp-size": "--pipeline-parallel-size"}
        assert [c["message"] for c in release["multi_node"]["checks"]] == [
            "tp_size must be divisible by number of nodes",
            "multi-node data parallel is not supported unless dp attention!"]
        assert {"SGLANG_HOST_IP", "HOST_IP", "SGLANG_LOCAL_IP_NIC", "SGLANG_USE_MODELSCOPE"} <= set(release["env"])
        assert release["env_registry"]["renames_prefix"] == {"SGL_": "SGLANG_"}
        assert {"sglang:num_running_reqs": "gauge", "sglang:gen_throughput": "gauge",
                "sglang:spec_accept_length": "gauge"}.items() <= release["metrics"].items()
    assert generated["releases"]["0.5.12"]["metrics"]["sglang:generation_tokens_total"] == "counter"
    assert generated["releases"]["0.5.3.post3"]["env_direct"]["SGLANG_HOST_IP"] == ["python/sglang/srt/utils/common.py"]


def test_the_0_5_23_flags_are_derived_from_the_annotated_fields(generated):
    flags = generated["releases"][FIELDS_LAYOUT]["server_flags"]
    # A[int, Arg(aliases=["--tensor-parallel-size"])] = 1 on Parallel.tp_size: the field's spelling is the key
    assert flags["--tp-size"] == {"kind": "int", "type": "int", "aliases": ["--tensor-parallel-size"],
                                  "dest": "tp_size", "field": "tp_size", "default": 1}
    assert "--tensor-parallel-size" not in flags
    assert flags["--pp-size"] == {"kind": "int", "type": "int", "aliases": ["--pipeline-parallel-size"],
                                  "dest": "pp_size", "field": "pp_size", "default": 1}
    assert flags["--nnodes"] == {"kind": "int", "type": "int", "dest": "nnodes", "field": "nnodes", "default": 1}
    assert flags["--node-rank"]["default"] == 0 and flags["--node-rank"]["kind"] == "int"
    assert flags["--dist-init-addr"] == {"kind": "str", "type": "str", "aliases": ["--nccl-init-addr"],
                                         "dest": "dist_init_addr", "field": "dist_init_addr", "default": None}
    # A[bool, "help"] = False: store_true
    assert flags["--enable-metrics"] == {"kind": "flag", "dest": "enable_metrics", "field": "enable_metrics",
                                         "default": False}
    # Arg(action=argparse.BooleanOptionalAction): --x and --no-x
    assert flags["--dcp-replicate-q-proj"] == {"kind": "bool", "dest": "dcp_replicate_q_proj",
                                               "field": "dcp_replicate_q_proj", "default": None}
    # a field with no default is required
    assert flags["--model-path"] == {"kind": "str", "type": "str", "aliases": ["--model"], "dest": "model_path",
                                     "field": "model_path", "default": None, "required": True}
    assert not any(spec.get("required") for key, spec in flags.items() if key != "--model-path")
    # Arg(choices=<constant>): the list of arg_groups/choices.py, followed through the fields module's import
    choices = NEW / "arg_groups" / "choices.py"
    load_formats = ast.literal_eval(module_constant(choices, "LOAD_FORMAT_CHOICES"))
    assert flags["--load-format"]["choices"] == load_formats and flags["--load-format"]["default"] == "auto"
    assert flags["--speculative-draft-load-format"]["choices"] == load_formats
    assert flags["--attention-backend"]["choices"] == ast.literal_eval(module_constant(choices,
                                                                                       "ATTENTION_BACKEND_CHOICES"))
    # Literal["null", "prefill", "decode"]: its members are the choices
    assert flags["--disaggregation-mode"] == {"kind": "str", "type": "str", "choices": ["null", "prefill", "decode"],
                                              "dest": "disaggregation_mode", "field": "disaggregation_mode",
                                              "default": "null"}
    # Optional[List[int]]: nargs "+"
    assert flags["--cuda-graph-bs-decode"] == {"kind": "list", "item": "int", "type": "int", "nargs": "+",
                                               "dest": "cuda_graph_bs_decode", "field": "cuda_graph_bs_decode",
                                               "default": None}
    # Arg(no_cli=True) gives no flag; add_cli_args' deprecated registrations are those fields' only spelling
    assert "--speculative-boundary-reduction" not in flags
    assert flags["--disable-cuda-graph"] == {"kind": "flag", "action": "DeprecatedStoreTrueAction",
                                             "dest": "disable_cuda_graph", "field": "disable_cuda_graph",
                                             "default": False}
    assert flags["--enable-dp-attention"]["field"] == "enable_dp_attention"
    assert flags["--monokernel-backend"]["field"] == flags["--enable-amd-monokernel"]["field"] == \
        "enable_amd_monokernel"
    assert flags["--config"] == {"kind": "str", "type": "str", "dest": "config", "default": None}
    # every speculative field the Spec namespace declares for the command line has its flag
    spec = next(n for n in ast.parse((NEW / "arg_groups" / "fields" / "spec.py").read_text()).body
                if isinstance(n, ast.ClassDef) and n.name == "Spec")
    declared = {st.target.id for st in spec.body if isinstance(st, ast.AnnAssign)
                and "no_cli=True" not in ast.unparse(st.annotation)}
    assert {"speculative_algorithm", "speculative_eagle_topk", "speculative_num_draft_tokens"} <= declared
    assert declared <= {f["field"] for f in flags.values() if "field" in f}


def test_the_0_5_23_flags_come_in_the_positional_field_order():
    """collect_input_fields orders the namespaces' fields by POSITIONAL_FIELD_ORDER (arg_groups/field_order.py; in
    0.5.23 it lists every field), not by _INPUT_NAMESPACES, and add_cli_args' own registrations follow. The JSON is
    written with sorted keys, so the parser's order is read from the generator's Flags."""
    spec = importlib.util.spec_from_file_location("sglang_knowledge_under_test", SCRIPT)
    knowledge = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(knowledge)
    source = knowledge.Source(str(FIXTURE / FIELDS_LAYOUT))
    flags = knowledge.Flags(source, knowledge._class(source.tree(knowledge.SERVER_ARGS), "ServerArgs")).flags
    order = ast.literal_eval(module_constant(NEW / "arg_groups" / "field_order.py", "POSITIONAL_FIELD_ORDER"))
    namespaces = [e.id for e in module_constant(NEW / "server_args.py", "_INPUT_NAMESPACES").elts]
    keys = list(flags)
    manual = ["--config", "--disable-cuda-graph", "--enable-dp-attention", "--monokernel-backend",
              "--enable-flashinfer-allreduce-fusion"]
    assert keys[-len(manual):] == manual
    derived = [flags[key]["field"] for key in keys[:-len(manual)]]
    assert set(derived) <= set(order) and derived == sorted(derived, key=order.index)
    # Spec comes before Parallel in _INPUT_NAMESPACES; the positional order puts tp_size first
    assert namespaces.index("Spec") < namespaces.index("Parallel")
    assert keys[0] == "--model-path" and keys.index("--tp-size") < keys.index("--speculative-algorithm")
    assert keys.index("--dist-init-addr") < keys.index("--nnodes") < keys.index("--node-rank") < \
        keys.index("--tp-size") < keys.index("--pp-size")


def test_the_0_5_23_speculative_handler_is_its_hook_read_through_the_dispatch(generated):
    spec = generated["releases"][FIELDS_LAYOUT]["speculative"]
    hook = (NEW / "arg_groups" / "speculative_hook.py").read_text().split("\n")
    line = 1 + next(i for i, text in enumerate(hook) if text.startswith("def handle_speculative_decoding("))
    assert spec["evidence"] == f"python/sglang/srt/arg_groups/speculative_hook.py:{line} handle_speculative_decoding"
    assert spec["algorithms"] == ["DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM"]
    assert spec["names"] == "free string, upper-cased and looked up" and spec["case_sensitive"] is False
    assert spec["names_evidence"] == "python/sglang/srt/speculative/spec_info.py:32 class SpeculativeAlgorithm"
    assert spec["aliases"] == {"NEXTN": "EAGLE", "EAGLE": "EAGLE"}  # _resolve_speculative_algorithm_alias
    # the eagle family's bare assert: in _handle_eagle_family, which only algo.handle_server_args(server_args) calls
    bare = next(c for c in spec["checks"] if c.get("source") == (
        "assert cfg.speculative_eagle_topk is None and cfg.speculative_num_draft_tokens is None"))
    assert bare["kind"] == "assert" and bare["message"] == "" and bare["error"] == "AssertionError"
    assert bare["at"].startswith("python/sglang/srt/arg_groups/speculative_hook.py:")
    assert bare["at"].endswith(" _handle_eagle_family")
    # SpeculativeAlgorithm.handle_server_args: `elif self.is_eagle() or self.is_standalone()`, after the DFLASH,
    # UNO, DSPARK and FROZEN_KV_MTP branches, each is_x() read as a test of the algorithm's name
    eagle = ["cmp", "in", SPEC_ALGORITHM, ["tuple", *(["const", a] for a in ("EAGLE", "EAGLE3", "FROZEN_KV_MTP"))]]
    assert ["or", eagle, ["cmp", "==", SPEC_ALGORITHM, ["const", "STANDALONE"]]] in bare["when"]
    for earlier in ("DFLASH", "UNO", "DSPARK", "FROZEN_KV_MTP"):
        assert ["not", ["cmp", "==", SPEC_ALGORITHM, ["const", earlier]]] in bare["when"]
    topk = bare["test"][1]  # speculative_eagle_topk as an earlier hook may have left it
    assert topk[:2] == ["cmp", "is"] and topk[3] == ["const", None] and topk[2][0] == "set"
    assert spec["assignments"][topk[2][1]]["field"] == "speculative_eagle_topk"
    # declare_resolution(server_args, "handle_speculative_decoding", speculative_draft_window_size=...) is what a
    # later `cfg.speculative_draft_window_size` reads
    sink = next(c for c in spec["checks"]
                if c["message"] == "--speculative-draft-sink-size requires --speculative-draft-window-size.")
    window = sink["when"][-1]
    assert window[:2] == ["cmp", "is"] and window[3] == ["const", None] and window[2][0] == "set"
    declared = spec["assignments"][window[2][1]]
    assert declared["field"] == "speculative_draft_window_size"
    assert declared["at"].startswith("python/sglang/srt/arg_groups/speculative_hook.py:")
    assert declared["at"].endswith(" handle_speculative_decoding")


def test_the_0_5_23_multi_node_checks_come_from_the_arg_groups_hooks_and_env_and_metrics(generated):
    release = generated["releases"][FIELDS_LAYOUT]
    multi = release["multi_node"]
    # --tp-size and --pp-size are now the canonical spellings (the --*-parallel-size ones their aliases)
    assert multi["flags"] == {"--nnodes": "--nnodes", "--node-rank": "--node-rank", "--dist-init-addr":
                              "--dist-init-addr", "--tp-size": "--tp-size", "--pp-size": "--pp-size"}
    divisible = next(c for c in multi["checks"] if c["message"] == "tp_size must be divisible by number of nodes")
    assert divisible["at"] == "python/sglang/srt/arg_groups/validation_hook.py:179 check_server_args"
    assert divisible["source"] == "assert cfg.tp_size * cfg.pp_size % cfg.nnodes == 0"
    assert divisible["test"] == ["cmp", "==", ["bin", "%", ["bin", "*", ["field", "tp_size"], ["field", "pp_size"]],
                                               ["field", "nnodes"]], ["const", 0]]
    assert divisible["when"] == [["cmp", "!=", ["field", "ep_join_mode"], ["const", "scale"]]]
    assert "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes" in \
        [c["message"] for c in multi["checks"]]
    # none in ServerArgs (its check_server_args hands the record to the hook): each is a hook's, in arg_groups/
    assert {c["at"].split(":")[0] for c in multi["checks"]} == {
        f"python/sglang/srt/arg_groups/{name}.py" for name in ("moe_hook", "parallel_hook", "serving_hook",
                                                               "validation_hook")}
    assert {"SGLANG_HOST_IP", "HOST_IP", "SGLANG_LOCAL_IP_NIC", "SGLANG_USE_MODELSCOPE"} <= set(release["env"])
    assert release["env_direct"]["SGLANG_HOST_IP"] == ["python/sglang/srt/utils/network.py"]
    assert release["env_registry"]["registry"]["SGLANG_USE_MODELSCOPE"] == {"kind": "bool", "default": False}
    assert {"sglang:num_running_reqs": "gauge", "sglang:gen_throughput": "gauge", "sglang:spec_accept_length": "gauge",
            "sglang:generation_tokens_total": "counter"}.items() <= release["metrics"].items()


def test_the_0_5_23_parser_and_entry_points(generated):
    release = generated["releases"][FIELDS_LAYOUT]
    assert release["parser"]["prog"] == "sglang serve" and release["parser"]["allow_abbrev"] is True
    assert release["parser"]["config"]["exact_token"] is True
    assert release["parser"]["evidence"].startswith("python/sglang/srt/server_args.py:")
    assert release["errors"]["prog"] == "sglang serve"
    assert release["entry_points"]["launch_server"]["command"] == "python3 -m sglang.launch_server"
    serve = release["entry_points"]["serve"]
    assert serve["script"] == "sglang = sglang.cli.main:main" and serve["prog"] == "sglang serve"
    assert serve["model_path_missing"] == "Error: --model-path is required. Please provide the path to the model."
    # the spellings are in try_get_model_path, which get_model_path calls
    assert serve["model_path_spellings"] == ["--model", "--model-path", "--model-path=", "--model="]
    # `add_load_format_choices = LOAD_FORMAT_CHOICES.extend` in choices.py: plugins may add formats
    assert release["server_flags"]["--load-format"]["choices_extendable"] is True
    # the SGL_ prefix is rewritten by _handle_deprecated_envs from 0.5.20 (_convert_SGL_to_SGLANG before)
    assert release["env_registry"]["renames_prefix"] == {"SGL_": "SGLANG_"}


def test_each_release_records_its_sources_and_the_image_map(generated):
    for version in RELEASES:
        source = generated["releases"][version]["source"]
        dist = "sdist" if version == "0.5.3.post3" else "wheel"
        assert source == {"repo": "sgl-project/sglang", "ref": f"v{version}", "dist": dist,
                          "dist_url": f"https://pypi.org/project/sglang/{version}/#files",
                          "dist_sha256": DIST_SHA256[version],
                          "files": files_of(FIXTURE / version)}  # every excerpt file is read, and nothing else
    assert generated["images"]["tags"] == {IMAGE: "0.5.3.post3"}
    assert generated["images"]["sources"] == {IMAGE: "secondary: a test says so"}
    assert "lmsysorg/sglang:v" in generated["images"]["version_tag"]["pattern"]
    assert set(generated["releases"]) == set(RELEASES)


def test_a_release_read_by_ref_from_a_git_checkout_gives_the_same_facts(generated, tmp_path):
    repo = tmp_path / "sglang"
    shutil.copytree(FIXTURE / "0.5.3.post3", repo / "python")
    git(tmp_path, "init", "-q", str(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "excerpt")
    git(repo, "tag", "-a", "v0.5.3.post3", "-m", "v0.5.3.post3")  # annotated: the tag object is not the commit
    shutil.rmtree(repo / "python")  # read with `git show REF:python/...`, not from the work tree
    entry = generate(tmp_path / "releases.json", "--release", f"0.5.3.post3={repo}@v0.5.3.post3")["releases"][
        "0.5.3.post3"]
    dist = generated["releases"]["0.5.3.post3"]
    assert {k: v for k, v in entry.items() if k != "source"} == {k: v for k, v in dist.items() if k != "source"}
    head = git(repo, "rev-parse", "HEAD").strip()
    files = {k: v for k, v in files_of(FIXTURE / "0.5.3.post3").items() if k != "PKG-INFO"}
    assert entry["source"] == {"repo": "sgl-project/sglang", "ref": "v0.5.3.post3", "commit": head, "files": files}
    wrong = subprocess.run([sys.executable, str(SCRIPT), "--release", f"0.5.12={repo}@v0.5.3.post3", "--out",
                            str(tmp_path / "wrong.json")], capture_output=True, text=True)
    assert wrong.returncode != 0 and "v0.5.3.post3 is not tagged v0.5.12" in wrong.stderr


def test_a_second_run_naming_one_release_keeps_the_others_and_the_images(generated, tmp_path):
    out = tmp_path / "releases.json"
    out.write_text(json.dumps(generated))
    args = ["--release", f"0.5.12={FIXTURE / '0.5.12'}", "--image", "lmsysorg/sglang:v0.5.12-cu130=0.5.12"]
    merged = generate(out, *args)
    assert merged["releases"]["0.5.3.post3"] == generated["releases"]["0.5.3.post3"]
    assert merged["releases"]["0.5.12"] == generated["releases"]["0.5.12"]  # same files: the dist hash is kept
    assert merged["releases"]["0.5.23"] == generated["releases"]["0.5.23"]
    assert merged["images"]["tags"] == {IMAGE: "0.5.3.post3", "lmsysorg/sglang:v0.5.12-cu130": "0.5.12"}
    assert merged["about"].endswith("Last run: " + shlex.join(["scripts/sglang_knowledge.py", *args, "--out",
                                                                 str(out)]))


def test_a_tree_of_another_release_is_refused(tmp_path):
    done = run(tmp_path / "releases.json", "--release", f"0.5.12={FIXTURE / '0.5.3.post3'}")
    assert done.returncode != 0 and "is not SGLang 0.5.12" in done.stderr
    assert not (tmp_path / "releases.json").exists()


@pytest.mark.parametrize("version", RELEASES)
def test_the_committed_data_agrees_with_the_excerpts(generated, version):
    """What the generator reads in an excerpt, the committed entry (generated from the whole distribution) must say
    too; the excerpts keep the release's line numbers, so evidence compares as it is."""
    mine, committed = generated["releases"][version], json.loads(DATA_PATH.read_text())["releases"][version]
    for flag, spec in mine["server_flags"].items():
        assert committed["server_flags"].get(flag) == spec, flag
    for section in ("parser", "errors", "speculative", "multi_node", "entry_points", "metrics_exposition"):
        assert committed[section] == mine[section], section
    assert set(mine["env"]) <= set(committed["env"])
    assert mine["env_registry"]["registry"].items() <= committed["env_registry"]["registry"].items()
    assert mine["metrics"].items() <= committed["metrics"].items()
    assert mine["metrics_conditional"].items() <= committed["metrics_conditional"].items()
    source = committed["source"]
    assert {k: source[k] for k in ("repo", "ref", "dist", "dist_url", "dist_sha256")} == {
        k: mine["source"][k] for k in ("repo", "ref", "dist", "dist_url", "dist_sha256")}
    assert {k: v for k, v in mine["source"]["files"].items() if k.startswith("python/")}.keys() <= \
        source["files"].keys()
