"""model.pin and the pinned model.fetch: the commit resolved once on the head, kept on every serving node, used by
every later run until the inventory names another revision or --refresh is given; the node-side scripts run for real
against a cache the lab's `hf` stand-in writes."""

from __future__ import annotations

import subprocess

import pytest

from sparkctl.inventory import grammar
from sparkctl.plan.revisions import Pin, commit_in_path, wanted_pin
from sparkctl.tasks.context import RunOptions
from sparkctl.tasks.model.cache import parse_snapshot_check, snapshot_check_script
from sparkctl.tasks.model.fetch import FetchStep, ModelFetchTask
from sparkctl.tasks.model.pin import ModelPinTask, parse_read, read_script
from tests.taskkit import inventory_from_yaml, make_kit, spark_facts
from tests.unit.hf_kit import hf, hf_commit, hf_env, moved_main

HF = "/home/nvidia/.cache/huggingface"
MODEL, DRAFT = "nvidia/Qwen3-235B-A22B-FP4", "nvidia/Qwen3-235B-A22B-Eagle3"
A, B, C = "a" * 40, "b" * 40, "c" * 40
PAIR = """
user: nvidia
nodes: [{{name: spark1, host: 10.0.0.11}}, {{name: spark2, host: 10.0.0.12}}]
serve: {{preset: qwen3-235b-eagle3{extra}}}
"""


def kit_for(tmp_path, extra: str = "", refresh: bool = False):
    inv = inventory_from_yaml(PAIR.format(extra=extra), tmp_path)
    return make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes}, RunOptions(refresh=refresh))


@pytest.mark.parametrize("value", ["main", "v1.0", "refs/pr/1", "release_2025-11", A])
def test_a_revision_is_a_branch_a_tag_or_a_commit(value):
    assert grammar.revision(value) == value


@pytest.mark.parametrize("value", ["", "-main", "a..b", "../x", "main/", "x.lock", "a b", "main;id", "$(id)", "a//b",
                                   "x" * 129])
def test_a_revision_that_is_not_one_is_refused(value):
    with pytest.raises(ValueError):
        grammar.revision(value)


def test_the_pin_holds_until_the_revision_asked_changes_or_a_refresh():
    held = Pin(A, "main")
    assert wanted_pin("main", held, B, refresh=False) == held           # main moved upstream: still A
    assert wanted_pin("v2", held, B, refresh=False) is None             # another revision: resolve it
    assert wanted_pin("main", held, B, refresh=True) is None            # asked to move
    assert wanted_pin(C, held, B, refresh=True) == Pin(C, C)            # a commit is its own pin
    assert wanted_pin("main", None, B, refresh=False) == Pin(B, "main")  # the snapshot an earlier run downloaded
    assert wanted_pin("v2", None, B, refresh=False) is None
    assert wanted_pin("main", None, None, refresh=False) is None


def test_the_commit_is_read_from_the_path_hf_prints():
    assert commit_in_path(f"/tmp/x/models--a--b/snapshots/{A}/config.json\n") == A
    assert commit_in_path("Fetching 1 files\n/tmp/x\n") is None
    assert Pin.parse(f"{A}\tmain\n") == Pin(A, "main") and Pin.parse("garbage\tmain") is None


def pins_answer(pins: dict[int, Pin], held: dict[int, str] | None = None) -> str:
    lines = [f"P\t{i}\t{p.text().strip()}" for i, p in pins.items()]
    lines += [f"H\t{i}\t{c}" for i, c in (held or {}).items()]
    return "\n".join(lines) + "\n"


def test_a_first_run_pins_what_the_head_holds_on_every_node_without_asking_the_hub(tmp_path):
    kit = kit_for(tmp_path)
    kit.transport("spark1").respond(r"sparkctl-pins", pins_answer({}, {0: A, 1: B}))
    changes = ModelPinTask().check(kit.cluster)
    assert sorted((c.node, c.carried().repo, c.carried().pin) for c in changes) == [
        ("spark1", DRAFT, Pin(B, "main")), ("spark1", MODEL, Pin(A, "main")),
        ("spark2", DRAFT, Pin(B, "main")), ("spark2", MODEL, Pin(A, "main"))]
    assert not [c for c in kit.transport("spark1").calls if c.kind == "exec_in"]
    ModelPinTask().apply(kit.cluster, changes)
    path = f"{HF}/sparkctl-pins/models--nvidia--Qwen3-235B-A22B-FP4"
    assert kit.transport("spark2").files[path] == f"{A}\tmain\n"


def test_a_rerun_changes_nothing_and_a_worker_that_lost_its_pin_gets_the_heads(tmp_path):
    kit = kit_for(tmp_path)
    pins = {0: Pin(A, "main"), 1: Pin(B, "main")}
    kit.transport("spark1").respond(r"sparkctl-pins", pins_answer(pins, {0: C, 1: B}))
    kit.transport("spark2").respond(r"sparkctl-pins", pins_answer(pins))
    assert ModelPinTask().check(kit.cluster) == []
    kit.transport("spark2").rules.clear()
    kit.transport("spark2").respond(r"sparkctl-pins", pins_answer({1: pins[1]}))
    assert [(c.node, c.summary) for c in ModelPinTask().check(kit.cluster)] == [
        ("spark2", f"pin {MODEL} at {A[:12]} (main) on spark2")]


def test_a_new_revision_or_a_refresh_is_resolved_on_the_head_online(tmp_path):
    kit = kit_for(tmp_path, extra=", revision: v2")
    pins = {0: Pin(A, "main"), 1: Pin(B, "main")}
    for node in ("spark1", "spark2"):
        kit.transport(node).respond(r"sparkctl-pins", pins_answer(pins))
    kit.transport("spark1").respond(r"hf download", f"/tmp/tmp.x/models--nvidia--Qwen3-235B-A22B-FP4/snapshots/{C}/"
                                                    "config.json\n")
    changes = ModelPinTask().check(kit.cluster)
    assert sorted(c.summary for c in changes) == [f"pin {MODEL} at {C[:12]} (v2) on spark1 (was {A[:12]} (main))",
                                                  f"pin {MODEL} at {C[:12]} (v2) on spark2 (was {A[:12]} (main))"]
    (resolved,) = [c.target for c in kit.transport("spark1").calls if c.kind == "exec_in"]
    assert f"hf download {MODEL} config.json --revision v2 --cache-dir" in resolved

    refreshed = kit_for(tmp_path, refresh=True)
    for node in ("spark1", "spark2"):
        refreshed.transport(node).respond(r"sparkctl-pins", pins_answer(pins))
    refreshed.transport("spark1").respond(r"hf download", f"/t/snapshots/{A}/config.json\n")
    assert [c.summary for c in ModelPinTask().check(refreshed.cluster)] == \
        [f"pin {DRAFT} at {A[:12]} (main) on spark1 (was {B[:12]} (main))",
         f"pin {DRAFT} at {A[:12]} (main) on spark2 (was {B[:12]} (main))"]


def test_a_revision_the_hub_does_not_have_fails_with_where_to_fix_it(tmp_path):
    kit = kit_for(tmp_path, extra=", revision: v9")
    kit.transport("spark1").respond(r"sparkctl-pins", pins_answer({0: Pin(A, "main")}))
    kit.transport("spark1").respond(r"hf download", exit_code=1, stderr=(
        "huggingface_hub.errors.RevisionNotFoundError: 404 Client Error.\n\nInvalid rev id: v9\n"))
    with pytest.raises(Exception) as failure:
        ModelPinTask().check(kit.cluster)
    assert f"{MODEL} has no revision v9 on the Hub" in str(failure.value)
    assert "serve.revision" in failure.value.hint


# --- the node-side scripts, for real ------------------------------------------------------------------------
def sh(script: str, hf_home) -> str:
    result = subprocess.run(["bash", "-c", script.replace(HF, str(hf_home))], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_scripts_read_the_pin_and_judge_the_pinned_snapshot(tmp_path):
    fixtures, old = moved_main(tmp_path, "nvidia--Qwen3-235B-A22B-FP4")
    home = tmp_path / "hf-home"
    env = hf_env(home, fixtures)
    new = hf_commit(fixtures / "nvidia--Qwen3-235B-A22B-FP4")
    assert hf(env, "download", MODEL).returncode == 0  # refs/main: the new main
    kit = kit_for(tmp_path)
    node = kit.node("spark1")
    repos = [(MODEL, None)]
    # no pin: refs/main's snapshot is judged, and the head says what it holds
    assert parse_snapshot_check(sh(snapshot_check_script(node, repos), home)) == [("complete", MODEL, None, "")]
    asked = [(MODEL, None, "main")]
    assert parse_read(sh(read_script(node, asked, head=True), home)) == ({}, {0: new})
    # pinned at the old commit, not downloaded yet: missing; then downloaded by commit: refs/main must follow
    (home / "sparkctl-pins").mkdir()
    (home / "sparkctl-pins" / "models--nvidia--Qwen3-235B-A22B-FP4").write_text(f"{old}\tmain\n")
    assert parse_read(sh(read_script(node, asked, head=False), home)) == ({0: Pin(old, "main")}, {})
    ((verdict, _repo, pin, why),) = parse_snapshot_check(sh(snapshot_check_script(node, repos), home))
    assert (verdict, pin, why) == ("missing", old, "no config.json")
    assert hf(env, "download", MODEL, "--revision", old).returncode == 0
    assert parse_snapshot_check(sh(snapshot_check_script(node, repos), home)) == [("repoint", MODEL, old, "")]
    (home / "hub" / "models--nvidia--Qwen3-235B-A22B-FP4" / "refs" / "main").write_text(old)
    assert parse_snapshot_check(sh(snapshot_check_script(node, repos), home)) == [("complete", MODEL, old, "")]


def test_a_local_dir_from_another_commit_than_the_pin_is_downloaded_again(tmp_path):
    kit = kit_for(tmp_path)
    node = kit.node("spark1")
    local = "/root/.cache/huggingface/sparkctl-models/nvidia--Qwen3-235B-A22B-Eagle3"
    home = tmp_path / "hf-home"
    target = home / "sparkctl-models" / "nvidia--Qwen3-235B-A22B-Eagle3"
    env = hf_env(home, moved_main(tmp_path)[0])
    assert hf(env, "download", DRAFT, "--local-dir", str(target)).returncode == 0
    held = parse_read(sh(read_script(node, [(DRAFT, local, "main")], head=True), home))[1][0]
    (home / "sparkctl-pins").mkdir()
    pin_file = home / "sparkctl-pins" / "models--nvidia--Qwen3-235B-A22B-Eagle3"
    pin_file.write_text(f"{held}\tmain\n")
    assert parse_snapshot_check(sh(snapshot_check_script(node, [(DRAFT, local)]), home)) == \
        [("complete", DRAFT, held, "")]
    pin_file.write_text(f"{A}\tmain\n")
    assert parse_snapshot_check(sh(snapshot_check_script(node, [(DRAFT, local)]), home)) == \
        [("missing", DRAFT, A, "another revision")]
    pin_file.write_text(f"{held}\tmain\n")
    (target / "generation_config.json").unlink()  # removed because it did not verify: not a weight, still missing
    assert parse_snapshot_check(sh(snapshot_check_script(node, [(DRAFT, local)]), home)) == \
        [("missing", DRAFT, held, "files")]


def test_a_snapshot_link_to_nothing_is_missing_weight_or_not(tmp_path):
    home = tmp_path / "hf-home"
    assert hf(hf_env(home), "download", MODEL).returncode == 0
    repo = home / "hub" / "models--nvidia--Qwen3-235B-A22B-FP4"
    revision = (repo / "refs" / "main").read_text()
    script = snapshot_check_script(kit_for(tmp_path).node("spark1"), [(MODEL, None)])
    assert parse_snapshot_check(sh(script, home)) == [("complete", MODEL, None, "")]
    (repo / "snapshots" / revision / "generation_config.json").resolve().unlink()
    assert parse_snapshot_check(sh(script, home)) == [("missing", MODEL, None, "links to nothing")]


def test_fetch_downloads_the_pin_online_and_points_refs_main_at_it(tmp_path):
    kit = kit_for(tmp_path)
    node, transport = kit.node("spark1"), kit.transport("spark1")
    local = "/root/.cache/huggingface/sparkctl-models/nvidia--Qwen3-235B-A22B-Eagle3"
    transport.respond(r"config\.json", f"missing\t{MODEL}\t{A}\t no config.json\n"
                                       f"missing\t{DRAFT}\t{B}\t another revision\n")
    changes = ModelFetchTask().check(node)
    assert [c.payload for c in changes] == [FetchStep(MODEL, None, A, True), FetchStep(DRAFT, local, B, True)]
    assert changes[0].summary.startswith(f"download {MODEL}@{A[:12]} into")
    transport.rules.clear()
    ModelFetchTask().apply(node, changes)
    execs = [c.target for c in transport.calls if c.kind == "exec_in"]
    assert execs[0] == f"trtllm-multinode: hf download {MODEL} --revision {A}"
    assert f"printf %s {A} > /root/.cache/huggingface/hub/models--nvidia--Qwen3-235B-A22B-FP4/refs/main" \
        in execs[1]
    assert execs[2] == f"trtllm-multinode: hf download {DRAFT} --revision {B} --local-dir {local}"
    assert len(execs) == 3  # a --local-dir has no refs

    transport.respond(r"config\.json", f"repoint\t{MODEL}\t{A}\t\ncomplete\t{DRAFT}\t{B}\t\n")
    (repoint,) = ModelFetchTask().check(node)
    assert repoint.payload == FetchStep(MODEL, None, A, False) and "refs/main" in repoint.summary


def test_the_facts_carry_each_nodes_pins(tmp_path):
    from sparkctl.facts.parse import parse_hf_cache
    from sparkctl.facts.sections import FACT_SECTIONS, FactsRequest
    from sparkctl.shipped import shipped_text

    home = tmp_path / "hf"
    (home / "sparkctl-pins").mkdir(parents=True)
    (home / "sparkctl-pins" / "models--nvidia--Qwen3-235B-A22B-FP4").write_text(f"{A}\tmain\n")
    (home / "sparkctl-pins" / "models--x--broken").write_text("not a commit\n")
    call = next(s.script for s in FACT_SECTIONS if s.name == "hf-cache")(FactsRequest((), (), str(home), ()))
    out = sh(f"{shipped_text('facts.sh')}\n{call}", home)
    path, free, pins = parse_hf_cache(out)
    assert path == str(home) and free and pins == {"models--nvidia--Qwen3-235B-A22B-FP4": A}


def test_moving_the_heads_model_pin_under_a_deployment_in_use_marks_the_switch(tmp_path):
    from sparkctl.plan.deployment import Deployment, DeploymentRecord
    from sparkctl.tasks.serve.deployment import record_path

    kit = kit_for(tmp_path, refresh=True)
    serving = Deployment(image="img", image_id="sha256:x", digest=None, engine="trtllm", model=MODEL,
                         fingerprint="f1", inputs={}, revision=A, number=3)
    head = kit.transport("spark1")
    head.respond(r"deployments\.json", DeploymentRecord(serving).text())
    for node in ("spark1", "spark2"):
        kit.transport(node).respond(r"sparkctl-pins", pins_answer({0: Pin(A, "main"), 1: Pin(B, "main")}))
    head.respond(r"hf download", f"/t/snapshots/{C}/config.json\n")  # main moved to C, the draft's too
    changes = ModelPinTask().check(kit.cluster)
    ModelPinTask().apply(kit.cluster, changes)
    marked = DeploymentRecord.parse(head.files[record_path(kit.node("spark1"))])
    assert marked.current == serving and marked.switching.revision == C
    assert not marked.switching.same_world(serving)
    assert any("switch marked" in (e.message or "") for e in kit.events)


def test_a_rollback_pins_its_commit_for_the_revision_asked(tmp_path):
    inv = inventory_from_yaml(PAIR.format(extra=""), tmp_path)
    kit = make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes}, RunOptions(model_commit=A))
    for node in ("spark1", "spark2"):
        kit.transport(node).respond(r"sparkctl-pins", pins_answer({0: Pin(C, "main"), 1: Pin(B, "main")}))
    assert sorted(c.summary for c in ModelPinTask().check(kit.cluster)) == [
        f"pin {MODEL} at {A[:12]} (main) on spark1 (was {C[:12]} (main))",
        f"pin {MODEL} at {A[:12]} (main) on spark2 (was {C[:12]} (main))"]
    assert not [c for c in kit.transport("spark1").calls if c.kind == "exec_in"]  # no Hub asked


def test_cluster_plan_shows_the_revision_asked_and_the_commit_in_use(tmp_path):
    from sparkctl.cli.plan_view import _deployment_lines
    from sparkctl.plan.deployment import Deployment, DeploymentRecord

    inv = inventory_from_yaml(PAIR.format(extra=", revision: v2"), tmp_path)
    assert any(line.startswith("model revision: v2, pinned by model.pin") for line in _deployment_lines(inv, None))
    serving = Deployment(image="img", image_id="sha256:x", digest=None, engine="trtllm", model=MODEL,
                         fingerprint="f1", inputs={}, revision=A, number=1)
    lines = _deployment_lines(inv, DeploymentRecord(serving))
    assert f"pinned at {A} (the commit in use, as this machine last recorded it)" in lines
    assert any(line.startswith("in use (as this machine last recorded it): #1 img") and f"@{A[:12]}" in line
               for line in lines)


def test_a_refresh_asks_the_hub_once_a_run_even_when_the_task_checks_again_after_its_apply(tmp_path):
    kit = kit_for(tmp_path, refresh=True)
    for node in ("spark1", "spark2"):
        kit.transport(node).respond(r"sparkctl-pins", pins_answer({0: Pin(A, "main"), 1: Pin(B, "main")}))
    kit.transport("spark1").respond(r"hf download", f"/t/snapshots/{C}/config.json\n")
    first, again = ModelPinTask().check(kit.cluster), ModelPinTask().check(kit.cluster)
    assert [c.summary for c in first] == [c.summary for c in again]
    asked = [c for c in kit.transport("spark1").calls if c.kind == "exec_in"]
    assert len(asked) == 2  # the model and the draft, once each


def test_a_draft_pinned_at_another_commit_is_another_world(tmp_path):
    from sparkctl.tasks.serve.config import desired_launch

    kit = kit_for(tmp_path)
    head = kit.node("spark1")
    facts = head.facts()
    facts.model_pins = {"models--nvidia--Qwen3-235B-A22B-FP4": A, "models--nvidia--Qwen3-235B-A22B-Eagle3": B}
    before = desired_launch(head)[2]
    facts.model_pins["models--nvidia--Qwen3-235B-A22B-Eagle3"] = C
    assert desired_launch(head)[2] != before


def test_two_files_with_the_same_bytes_keep_a_line_each_in_the_record(tmp_path):
    from sparkctl.tasks.model.verified import keep_verified

    kit = kit_for(tmp_path)
    node = kit.node("spark1")
    same = "5" * 64
    recorded = frozenset({f"{same}\t10\t1.0\t100", f"{same}\t10\t1.0\t200"})
    keep_verified(node, "/r.tsv", recorded, [f"{same}\t10\t2.0\t100"])
    assert kit.transport("spark1").files["/r.tsv"] == f"{same}\t10\t1.0\t200\n{same}\t10\t2.0\t100\n"


SEVERAL = """
user: nvidia
nodes: [{name: spark1, host: 10.0.0.11}, {name: spark2, host: 10.0.0.12}]
container: {image: "nvcr.io/nvidia/vllm:26.05-py3"}
serve:
  models:
    - {model: Qwen/Qwen3-8B, engine: vllm, nodes: [spark1]}
    - {model: Qwen/Qwen3-4B, engine: vllm, name: small, nodes: [spark2]}
"""


def test_with_several_worlds_each_node_pins_its_own_repos_and_the_head_keeps_every_pin(tmp_path):
    """A repo served only off the head is pinned on its node and on the head, whose pins the next run keeps: it is
    not resolved on the Hub again."""
    inv = inventory_from_yaml(SEVERAL, tmp_path)
    kit = make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})
    kit.transport("spark1").respond(r"sparkctl-pins", pins_answer({}, {0: A}))
    kit.transport("spark1").respond(r"hf download", f"{HF}/hub/models--Qwen--Qwen3-4B/snapshots/{B}\n")
    changes = ModelPinTask().check(kit.cluster)
    assert sorted((c.node, c.carried().repo, c.carried().pin.commit) for c in changes) == [
        ("spark1", "Qwen/Qwen3-4B", B), ("spark1", "Qwen/Qwen3-8B", A), ("spark2", "Qwen/Qwen3-4B", B)]
    # the next run: the head holds both pins, spark2 its own: nothing changes and the Hub is not asked
    pins = {0: Pin(A, "main"), 1: Pin(B, "main")}
    for name, answer in (("spark1", pins_answer(pins, {0: A})), ("spark2", pins_answer({1: pins[1]}))):
        kit.transport(name).rules.clear()
        kit.transport(name).respond(r"sparkctl-pins", answer)
    kit.cluster.asked_once.clear()
    asked = len([c for c in kit.transport("spark1").calls if c.kind == "exec_in"])
    assert ModelPinTask().check(kit.cluster) == []
    assert len([c for c in kit.transport("spark1").calls if c.kind == "exec_in"]) == asked
