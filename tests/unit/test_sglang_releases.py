"""What sparkctl knows of each SGLang release (sparkctl/knowledge/sglang_releases.json, read from SGLang's own
source): the image -> release map, post-release ordering, flags judged as the release's argparse would word them
(held to CPython's own argparse built from the same data), and the speculative and multi-node checks the release
makes at start."""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

from sparkctl.knowledge.sglang_releases import (
    SglangSchema,
    SglangVersion,
    image_source,
    judged_note,
    known_releases,
    release_of,
    schema_for,
)

V = SglangVersion.parse
RELEASES = ("0.5.3.post3", "0.5.5.post2", "0.5.8", "0.5.12", "0.5.18", "0.5.20", "0.5.23")


def schema(version: str) -> SglangSchema:
    parsed = V(version)
    assert parsed is not None
    return schema_for(parsed)


def said(version: str, *argv: str) -> list[tuple[str, str]]:
    return [(p.message, p.hint) for p in schema(version).check_flags(list(argv))]


def argparse_says(s: SglangSchema, *argv: str) -> str:
    """CPython's argparse, given the release's flags as the data records them: its error line."""
    parser = argparse.ArgumentParser(prog=s.prog())
    for flag, spec in s.flags.items():
        names = [flag, *spec.get("aliases", [])]
        if spec["kind"] == "flag":
            parser.add_argument(*names, action="store_true")
        elif spec["kind"] in ("int", "float", "str") and "pattern" not in spec:
            parser.add_argument(*names, type={"int": int, "float": float, "str": str}[spec["kind"]],
                                choices=spec.get("choices"), nargs=spec.get("nargs"))
        elif spec["kind"] == "list":
            parser.add_argument(*names, type=int if spec["item"] == "int" else str, nargs=spec["nargs"])
        else:
            parser.add_argument(*names)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        parser.parse_args(list(argv))
    return err.getvalue().strip().splitlines()[-1]


def test_the_data_holds_the_releases_in_order_each_with_its_source():
    assert [str(v) for v in known_releases()] == list(RELEASES)
    for version in RELEASES:
        source = schema(version).source
        assert source["repo"] == "sgl-project/sglang" and source["ref"] == f"v{version}"
        assert source["dist"] in ("sdist", "wheel") and len(source["dist_sha256"]) == 64
        assert "python/sglang/srt/server_args.py" in source["files"]


def test_post_releases_order_between_their_release_and_the_next():
    order = ["0.5.3", "0.5.3.post1", "0.5.3.post3", "0.5.4", "0.5.5.post2", "0.5.8", "0.5.12"]
    parsed = [v for v in map(V, order) if v is not None]
    assert len(parsed) == len(order) and sorted(parsed, key=str) != parsed  # text order: 0.5.12 before 0.5.3
    assert sorted(reversed(parsed)) == parsed
    assert [str(v) for v in parsed] == order and V("v0.5.3.post3-cu129") == V("0.5.3.post3")
    assert V("latest") is None


def test_images_map_to_releases_and_version_tags_parse():
    assert release_of("lmsysorg/sglang:spark") == V("0.5.3.post3")
    assert release_of("nvcr.io/nvidia/sglang:26.01-py3") == V("0.5.5.post2")
    assert release_of("nvcr.io/nvidia/sglang:26.02-py3") == V("0.5.8")
    assert release_of("lmsysorg/sglang:v0.5.8") == V("0.5.8")
    assert release_of("lmsysorg/sglang:v0.5.12-cu130") == V("0.5.12")
    assert release_of("lmsysorg/sglang:v0.5.3.post3-cu129-arm64") == V("0.5.3.post3")
    assert release_of("lmsysorg/sglang:v0.5.8-amd64@sha256:" + "0" * 64) == V("0.5.8")
    assert release_of("lmsysorg/sglang:latest") is None and release_of(None) is None
    assert release_of("someone/sglang:v0.5.8") is None  # only SGLang's own repository names its release so
    assert image_source("nvcr.io/nvidia/sglang:26.02-py3").startswith("secondary:")


@pytest.mark.parametrize(("flag", "present"), [
    # read from each release's python/sglang/srt/server_args.py (ServerArgs.add_cli_args)
    ("--speculative-draft-window-size", {"0.5.12", "0.5.18", "0.5.20", "0.5.23"}),
    # a plain flag to 0.5.12; 0.5.18 refuses it by name (DeprecatedAction with an error_message); gone from 0.5.20
    ("--enable-expert-distribution-metrics", {"0.5.3.post3", "0.5.5.post2", "0.5.8", "0.5.12", "0.5.18"}),
    # declared as an A[...] field in arg_groups/fields/parallel.py from 0.5.20
    ("--gated-launch-port", {"0.5.20", "0.5.23"}),
    ("--enable-beta-spec", {"0.5.3.post3"}),
    ("--tensor-parallel-size", set(RELEASES)),
    ("--enable-metrics", set(RELEASES)),
])
def test_which_release_has_which_flag(flag, present):
    assert {v for v in RELEASES if flag in schema(v).option_strings()} == present


def test_underscores_are_not_rewritten_and_the_error_is_argparses():
    s = schema("0.5.3.post3")
    assert said("0.5.3.post3", "--tp_size", "2") == [
        ("launch_server.py: error: unrecognized arguments: --tp_size 2",
         "did you mean --tp-size? (SGLang 0.5.3.post3's argparse matches option strings as written: no _ for -)")]
    assert argparse_says(s, "--tp_size", "2") == "launch_server.py: error: unrecognized arguments: --tp_size 2"
    # 0.5.12's parser names itself
    assert said("0.5.12", "--tp_size", "2")[0][0] == "sglang serve: error: unrecognized arguments: --tp_size 2"
    assert said("0.5.12", "--max-modl-len", "3")[0][1].startswith(("did you mean", "`python3 -m"))


def test_abbreviations_are_taken_when_unique_and_refused_when_ambiguous():
    s = schema("0.5.8")
    assert s.canonical("--tp") == "--tensor-parallel-size" and s.canonical("--tp-size") == "--tensor-parallel-size"
    assert s.canonical("--tp_size") is None and s.canonical("--spec") is None
    assert said("0.5.8", "--tp", "2", "--enable-metrics", "--speculative-algorithm", "EAGLE3") == []
    assert said("0.5.8", "--tp=2") == []
    (message, hint), = said("0.5.8", "--spec", "x")
    assert message.startswith("launch_server.py: error: ambiguous option: --spec could match "
                              "--speculative-accept-threshold-single, ") or message.startswith(
        "launch_server.py: error: ambiguous option: --spec could match --speculative-")
    assert message == argparse_says(s, "--spec", "x") and hint == "write the whole flag"


@pytest.mark.parametrize(("argv", "expected"), [
    (("--tp-size", "x"), "launch_server.py: error: argument --tensor-parallel-size/--tp-size: invalid int value: 'x'"),
    (("--tp-size",), "launch_server.py: error: argument --tensor-parallel-size/--tp-size: expected one argument"),
    (("--tp-size", "--enable-metrics"),
     "launch_server.py: error: argument --tensor-parallel-size/--tp-size: expected one argument"),
    (("--enable-metrics=true",), "launch_server.py: error: argument --enable-metrics: ignored explicit argument "
                                 "'true'"),
    (("--enable-metrics", "true"), "launch_server.py: error: unrecognized arguments: true"),
    (("--cuda-graph-bs",), "launch_server.py: error: argument --cuda-graph-bs: expected at least one argument"),
    (("--cuda-graph-bs", "1", "x"), "launch_server.py: error: argument --cuda-graph-bs: invalid int value: 'x'"),
    (("--mem-fraction-static", "lots"),
     "launch_server.py: error: argument --mem-fraction-static: invalid float value: 'lots'"),
])
def test_each_kind_of_value_error_is_worded_as_argparse_words_it(argv, expected):
    s = schema("0.5.8")
    assert [m for m, _ in said("0.5.8", *argv)] == [expected]
    assert argparse_says(s, *argv) == expected


def test_a_value_not_in_the_choices_and_a_refused_flag():
    (message, hint), = said("0.5.3.post3", "--load-format", "safetensor")
    assert message.startswith("launch_server.py: error: argument --load-format: invalid choice: 'safetensor' "
                              "(choose from 'auto', 'pt', 'safetensors',") and hint == "did you mean 'safetensors'?"
    assert said("0.5.3.post3", "--speculative-algorithm", "eagle3")[0][0].startswith(
        "launch_server.py: error: argument --speculative-algorithm: invalid choice: 'eagle3' (choose from 'EAGLE',")
    assert said("0.5.12", "--speculative-algorithm", "eagle3") == []  # a free string from 0.5.12
    assert said("0.5.3.post3", "--enable-ep-moe") == [
        ("ValueError: NOTE: --enable-ep-moe is deprecated. Please set `--ep-size` to the same value as `--tp-size` "
         "instead.", "SGLang 0.5.3.post3 refuses --enable-ep-moe")]
    assert said("0.5.12", "--context-length", "32k") == [] and said("0.5.12", "--context-length", "32q")[0][0] == (
        "sglang serve: error: argument --context-length: invalid human_readable_int value: '32q'")


def test_config_is_read_only_as_two_tokens_and_owned_flags_are_said():
    assert said("0.5.8", "--config", "a.yaml") == []
    (message, hint), = said("0.5.8", "--config=a.yaml")
    assert message.startswith("--config=a.yaml: SGLang 0.5.8 reads a config file only from `--config FILE` as two "
                              "tokens") and hint == "write --config FILE"
    problems = schema("0.5.8").check_flags(["--tp", "2"], {"--tensor-parallel-size": "serve.tp_size"})
    assert [(p.where, p.message, p.hint) for p in problems] == [
        (("args", 0), "--tensor-parallel-size is sparkctl's to set", "use serve.tp_size")]


def test_speculative_rules_as_each_release_checks_them():
    old, new = schema("0.5.3.post3"), schema("0.5.12")
    # topk or draft tokens without num-steps: the bare assert of _handle_speculative_decoding
    for s in (old, new):
        (problem,) = s.speculative_problems({"--speculative-algorithm": "EAGLE3", "--speculative-eagle-topk": "4"})
        assert problem.message == (f"SGLang {s.version} stops at start: AssertionError (assert "
                                   "self.speculative_eagle_topk is None and self.speculative_num_draft_tokens is None)")
        assert problem.hint.startswith("python/sglang/srt/server_args.py:")
    # num-steps without topk: `self.speculative_eagle_topk > 1` meets None
    (problem,) = old.speculative_problems({"--speculative-algorithm": "NEXTN", "--speculative-num-steps": "3"})
    assert problem.message == ("SGLang 0.5.3.post3 stops at start: TypeError: '>' not supported between instances of "
                               "'NoneType' and 'int'")
    assert problem.hint.startswith("speculative_eagle_topk is None: set --speculative-eagle-topk (python/sglang/srt/"
                                   "server_args.py:")
    # all three, or none of them (the release picks them from the model, not known here): nothing to say
    full = {"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": "3", "--speculative-eagle-topk": "1",
            "--speculative-num-draft-tokens": "4"}
    assert old.speculative_problems(full) == [] and new.speculative_problems({"speculative_algorithm": "eagle3"}) == []
    # a name the release does not know: argparse's choices, or the free string's lookup from 0.5.12
    assert old.speculative_problems({"--speculative-algorithm": "DFLASH"})[0].message.startswith(
        "launch_server.py: error: argument --speculative-algorithm: invalid choice: 'DFLASH'")
    (unknown,) = new.speculative_problems({"--speculative-algorithm": "dspark"})
    assert unknown.message == "ValueError: Unknown speculative algorithm name: dspark"
    assert unknown.hint.endswith("(or a name a plugin registers)")
    assert new.speculative_problems({"--speculative-algorithm": "dflash", "--enable-dp-attention": True})[0].message \
        == "SGLang 0.5.12 stops at start: ValueError: Currently DFLASH speculative decoding does not support dp " \
           "attention."


def test_multi_node_checks():
    s = schema("0.5.8")
    assert s.multi_node["flags"]["--tp-size"] == "--tensor-parallel-size"
    assert s.multi_node_problems({"--tp-size": "2", "--nnodes": "2", "--node-rank": "1"}) == []
    (problem,) = s.multi_node_problems({"--tp": "3", "--nnodes": "2"})
    assert problem.message == "SGLang 0.5.8 stops at start: AssertionError: tp_size must be divisible by number of " \
                              "nodes"


def test_env_metrics_and_entry_points():
    for version in RELEASES:
        s = schema(version)
        assert {"SGLANG_HOST_IP", "HOST_IP", "SGLANG_LOCAL_IP_NIC"} <= set(s.env_names())
        assert {"sglang:num_running_reqs", "sglang:gen_throughput", "sglang:prompt_tokens_total",
                "sglang:generation_tokens_total", "sglang:spec_accept_length"} <= set(s.metric_names())
        assert s.entry_points["launch_server"]["command"] == "python3 -m sglang.launch_server"
    assert [("serve" in schema(v).entry_points) for v in RELEASES] == [False, True, True, True, True, True, True]
    assert schema("0.5.5.post2").entry_points["serve"]["model_path_spellings"] == ["--model-path", "--model-path="]
    assert schema("0.5.5.post2").prog("serve") == "sglang" and schema("0.5.12").prog("serve") == "sglang serve"


def test_a_release_not_in_the_data_is_judged_by_the_nearest_earlier_one():
    version = V("0.5.6.post2")
    assert version is not None
    assert schema_for(version).version == V("0.5.5.post2")
    assert judged_note(version, schema_for(version)) == "SGLang 0.5.6.post2 is not in sparkctl's data: judged as " \
                                                        "0.5.5.post2"
    earliest = V("0.4.10")
    assert earliest is not None and schema_for(earliest).version == V("0.5.3.post3")
    assert judged_note(V("0.5.8") or earliest, schema("0.5.8")) == ""


def test_releases_from_0_5_18_read_from_the_record_s_fields_and_hooks():
    """0.5.18 derives most flags from ServerArgs' annotated fields and moves the start-up checks into
    arg_groups/ hooks; 0.5.20 moves the fields into arg_groups/fields/."""
    for version in ("0.5.18", "0.5.20", "0.5.23"):
        s = schema(version)
        # the field's own name is the flag; the long spelling sparkctl writes is its alias
        assert s.canonical("--tensor-parallel-size") == "--tp-size" == s.canonical("--tp")
        assert s.flags["--tp-size"]["field"] == "tp_size" and s.flags["--tp-size"]["default"] == 1
        owned = s.check_flags(["--tensor-parallel-size", "2"], {"--tensor-parallel-size": "serve.tp_size"})
        assert [(p.message, p.hint) for p in owned] == [("--tp-size is sparkctl's to set", "use serve.tp_size")]
        assert s.flags["--model-path"]["required"] is True
        # DSPARK is a built-in algorithm from 0.5.18 (0.5.12 does not know it)
        assert "DSPARK" in s.speculative["algorithms"]
        assert not any("Unknown speculative algorithm" in p.message
                       for p in s.speculative_problems({"--speculative-algorithm": "dspark"}))
        (stop,) = s.speculative_problems({"--speculative-algorithm": "EAGLE3", "--speculative-eagle-topk": "4"})
        assert re.fullmatch(rf"SGLang {version} stops at start: AssertionError \(assert (server_args|cfg)\."
                            r"speculative_eagle_topk is None and \1\.speculative_num_draft_tokens is None\)",
                            stop.message), stop.message
        assert stop.hint.startswith("python/sglang/srt/arg_groups/speculative_hook.py:") and "_handle_eagle_family" \
            in stop.hint
        (world,) = s.multi_node_problems({"--tensor-parallel-size": "3", "--nnodes": "2"})
        assert world.message == f"SGLang {version} stops at start: AssertionError: tp_size must be divisible by " \
                                "number of nodes"
        assert s.multi_node_problems({"--tensor-parallel-size": "2", "--nnodes": "2", "--node-rank": "1"}) == []
    assert said("0.5.12", "--speculative-algorithm", "x") == [] and schema("0.5.12").speculative_problems(
        {"--speculative-algorithm": "dspark"})[0].message.startswith("ValueError: Unknown speculative algorithm")
    # a retired flag 0.5.18 refuses by parser.error, in argparse's words; gone (unrecognized) from 0.5.20
    assert said("0.5.18", "--enable-expert-distribution-metrics") == [
        ("sglang serve: error: --enable-expert-distribution-metrics is no longer supported. Use "
         "--expert-balancedness-report-mode with one of: off, server_log, prometheus, both.",
         "SGLang 0.5.18 refuses --enable-expert-distribution-metrics")]
    (gone,) = said("0.5.23", "--enable-expert-distribution-metrics")
    assert gone[0] == "sglang serve: error: unrecognized arguments: --enable-expert-distribution-metrics"
    # the latest data judges a newer release, and says so
    later = V("0.5.30")
    assert later is not None and judged_note(later, schema_for(later)) == (
        "SGLang 0.5.30 is not in sparkctl's data: judged as 0.5.23")
