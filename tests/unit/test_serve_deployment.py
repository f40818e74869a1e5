"""A serving cluster's deployment: the record the head keeps, serve.switch (one image ID on every node, the switch
marked), serve.record (the deployment that answered), the inventory a rollback runs, and when bootstrap rolls
back."""

from __future__ import annotations

import pytest

from sparkctl.errors import BadInput
from sparkctl.facts.parse import parse_docker_answer
from sparkctl.plan.deployment import Deployment, DeploymentRecord, deployment_inputs, with_deployment
from sparkctl.runs import rollback
from sparkctl.runs.request import RunRequest
from sparkctl.taskgraph.outcome import RunResult, TaskOutcome
from sparkctl.taskgraph.task import Change, Status, TaskFailed
from sparkctl.tasks.serve import deployment
from sparkctl.tasks.serve.deployment import ServeRecordTask, ServeSwitchTask, record_path
from tests.taskkit import inventory_from_yaml, make_kit, spark_facts

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"
PAIR = f"""
user: nvidia
cluster: {{name: duo}}
nodes: [{{name: spark1, host: 10.0.0.11}}, {{name: spark2, host: 10.0.0.12}}]
container: {{image: "{IMAGE}"}}
serve:
  preset: qwen3-235b-eagle3
  max_draft_len: 3
"""


def deployed(image_id: str, fingerprint: str = "f1", **kw) -> Deployment:
    return Deployment(image=kw.pop("image", IMAGE), image_id=image_id, digest=None, engine="trtllm", model="m",
                      fingerprint=fingerprint, inputs=kw.pop("inputs", {}), **kw)


def test_the_record_keeps_the_one_in_use_and_the_one_before_it():
    first = DeploymentRecord().answered(deployed("sha256:a"), now=1.0)
    assert (first.current.number, first.previous) == (1, None)
    second = first.answered(deployed("sha256:b"), now=2.0)
    assert (second.current.number, second.current.image_id, second.previous.number) == (2, "sha256:b", 1)
    # back to the first world: the two swap, each keeps its number and when it first answered
    back = second.answered(deployed("sha256:a"), now=3.0)
    assert (back.current.number, back.current.at, back.previous.number) == (1, 1.0, 2)
    # a third world: the oldest goes
    third = back.answered(deployed("sha256:c"), now=4.0)
    assert (third.current.number, third.previous.number) == (3, 1)
    # the same world with other words (a setting that does not touch the launch) is updated in place
    same = third.answered(deployed("sha256:c", inputs={"serve": {"ready_timeout": 60}}), now=5.0)
    assert (same.current.number, same.current.inputs, same.previous.number) == (3, {"serve": {"ready_timeout": 60}}, 1)
    assert same.switching is None and DeploymentRecord.parse(same.text()) == same


def test_an_unreadable_record_is_no_record():
    for text in ("", "{", "[]", '{"current": 3}', '{"current": {"bogus": 1}}'):
        assert DeploymentRecord.parse(text) == DeploymentRecord()


def test_the_registry_digest_is_read_from_repo_digests():
    text = ('[{"Id": "sha256:abc", "RepoTags": ["nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"], "RepoDigests": '
            '["nvcr.io/nvidia/tensorrt-llm/release@sha256:d1g"]}]')
    answer = parse_docker_answer(text, [], [IMAGE])
    assert answer.images[IMAGE] == "sha256:abc" and answer.digests[IMAGE] == "sha256:d1g"
    local = parse_docker_answer('[{"Id": "sha256:abc", "RepoTags": ["localhost/x:1"], "RepoDigests": []}]', [],
                                ["localhost/x:1"])
    assert local.digests["localhost/x:1"] is None


def test_a_rollback_runs_the_inventory_with_the_deployment_s_words(tmp_path):
    inv = inventory_from_yaml(PAIR, tmp_path)
    before = deployed("sha256:a", inputs={"container_image": "nvcr.io/nvidia/tensorrt-llm/release:1.2.0",
                                          "serve": {"preset": "qwen3-235b-eagle3", "max_draft_len": 5}})
    back = with_deployment(inv, before)
    assert back.container.image == "nvcr.io/nvidia/tensorrt-llm/release:1.2.0"
    assert back.serve_spec().max_draft_len == 5
    assert [n.name for n in back.nodes] == ["spark1", "spark2"]
    assert deployment_inputs(back) == before.inputs
    # a deployment whose serve: no longer fits the inventory is refused with what to do
    gone = deployed("sha256:a", inputs={"serve": {"preset": "qwen3-235b-eagle3", "nodes": ["spark1", "spark9"]}})
    with pytest.raises(BadInput) as refused:
        with_deployment(inv, gone)
    assert "does not fit the inventory as it is now" in refused.value.message


def kit_with_images(tmp_path, ids: dict[str, str | None]):
    inv = inventory_from_yaml(PAIR, tmp_path)
    facts = {n.name: spark_facts(n.name) for n in inv.nodes}
    for name, image_id in ids.items():
        facts[name].images = {IMAGE: image_id}
        facts[name].image_digests = {IMAGE: None}
    return make_kit(inv, facts)


@pytest.fixture
def head_record(monkeypatch):
    """The head's record as the head's transport holds the file (the lab reads the real one)."""
    def read(head, task):
        return DeploymentRecord.parse(str(head.transport.files.get(record_path(head), ""))), "rev1"

    monkeypatch.setattr(deployment, "read_record", read)


def test_no_switch_while_the_image_differs_between_nodes(tmp_path, head_record):
    kit = kit_with_images(tmp_path, {"spark1": "sha256:aaaa", "spark2": "sha256:bbbb"})
    with pytest.raises(TaskFailed) as refused:
        ServeSwitchTask().check(kit.cluster)
    assert "is not the same image on every node (aaaa on spark1; bbbb on spark2): nothing was switched" in \
        refused.value.message
    assert "pin container.image by digest" in refused.value.hint


def test_a_switch_is_marked_then_recorded_once_it_answered(tmp_path, head_record):
    kit = kit_with_images(tmp_path, {"spark1": "sha256:new", "spark2": "sha256:new"})
    head = kit.transport("spark1")
    # nothing recorded: nothing to switch from; the first deployment is recorded at the end
    assert ServeSwitchTask().check(kit.cluster) == []
    (change,) = ServeRecordTask().check(kit.cluster)
    assert change.summary.startswith(f"record the deployment in use: #1 {IMAGE} (image new")
    ServeRecordTask().apply(kit.cluster, [change])
    assert ServeRecordTask().check(kit.cluster) == []
    # the head ran another image before: the switch is marked, converges, and the record ends it
    path = record_path(kit.node("spark1"))
    old = DeploymentRecord.parse(str(head.files[path]))
    old_current = old.current
    assert old_current is not None
    head.files[path] = DeploymentRecord(deployed("sha256:old", fingerprint=old_current.fingerprint,
                                                 number=4)).text()
    (switch,) = ServeSwitchTask().check(kit.cluster)
    assert "switch the deployment (image changed): from #4" in switch.summary
    ServeSwitchTask().apply(kit.cluster, [switch])
    assert ServeSwitchTask().check(kit.cluster) == []
    marked = DeploymentRecord.parse(str(head.files[path]))
    assert marked.current.number == 4 and marked.switching.image_id == "sha256:new"
    (record,) = ServeRecordTask().check(kit.cluster)
    ServeRecordTask().apply(kit.cluster, [record])
    done = DeploymentRecord.parse(str(head.files[path]))
    assert (done.current.number, done.current.image_id, done.previous.number, done.switching) == \
        (5, "sha256:new", 4, None)
    assert ServeRecordTask().check(kit.cluster) == [] and ServeSwitchTask().check(kit.cluster) == []


def failed_run(phase: str, check_mode: bool = False, touched: bool = True) -> RunResult:
    """A run that failed in `phase`; `touched`: after the containers were made again for the new image."""
    outcomes = [TaskOutcome("container.run", "container", "spark1", Status.CHANGED,
                            changes=[Change("recreate container trtllm-multinode: image differs")])] if touched else []
    if phase == "model":
        outcomes.append(TaskOutcome("model.fetch", phase, "spark1", Status.FAILED, message="a gated repo"))
    else:
        outcomes.append(TaskOutcome("serve.launch" if phase == "serve" else "network.netplan", phase, None,
                                    Status.FAILED, message="the server exited during start-up"))
    return RunResult(nodes=["spark1"], outcomes=outcomes, unreachable={}, check_mode=check_mode, duration=1.0)


@pytest.mark.parametrize("record, result, request_, expected", [
    (DeploymentRecord(deployed("a"), None, deployed("b")), failed_run("serve"), RunRequest(), True),
    # no switch under way, or the one marked is the one in use (a rollback already happened)
    (DeploymentRecord(deployed("a"), None, None), failed_run("serve"), RunRequest(), False),
    (DeploymentRecord(deployed("a"), None, deployed("a")), failed_run("serve"), RunRequest(), False),
    # a failure before any deployment's phase, --check, or a part of the playbook
    (DeploymentRecord(deployed("a"), None, deployed("b")), failed_run("network"), RunRequest(), False),
    (DeploymentRecord(deployed("a"), None, deployed("b")), failed_run("serve", True), RunRequest(), False),
    (DeploymentRecord(deployed("a"), None, deployed("b")), failed_run("serve"), RunRequest(only={"serve"}), False),
    # a download refused (after the containers were made again for the new image, or before): a person's to fix
    (DeploymentRecord(deployed("a"), None, deployed("b")), failed_run("model"), RunRequest(), False),
    (DeploymentRecord(deployed("a"), None, deployed("b")), failed_run("model", touched=False), RunRequest(), False),
    # the new world failed before anything of the old one was touched (nothing to put back)
    (DeploymentRecord(deployed("a"), None, deployed("b")), failed_run("serve", touched=False), RunRequest(), False),
])
def test_bootstrap_rolls_back_only_a_failed_switch(monkeypatch, tmp_path, record, result, request_, expected):
    inv = inventory_from_yaml(PAIR, tmp_path)
    put_back = []
    monkeypatch.setattr(rollback, "read_head_record", lambda inventory: record)
    monkeypatch.setattr(rollback, "_put_back", lambda inventory, target, request, view, why, done:
                        put_back.append((target, why, done)) or result)
    rolled = rollback.roll_back_failed_switch(inv, result, request_, view=None)
    assert (rolled is not None) is expected
    if expected and result.failed[0].task == "serve.launch":
        assert put_back == [(record.current, "the new deployment failed (serve.launch: the server exited during "
                             "start-up)", "rolled back: serve.launch: the server exited during start-up")]
    assert len(put_back) == int(expected)


def test_serve_rollback_needs_a_previous_deployment(monkeypatch, tmp_path):
    inv = inventory_from_yaml(PAIR, tmp_path)
    monkeypatch.setattr(rollback, "read_head_record", lambda inventory: DeploymentRecord(deployed("a", number=1)))
    with pytest.raises(BadInput) as refused:
        rollback.roll_back(inv, RunRequest(), view=None)
    assert refused.value.message.startswith("the head keeps no previous deployment to go back to (in use: #1 ")


def test_no_switch_while_a_serving_node_lacks_the_new_image_and_no_refusal_when_nothing_switches(tmp_path,
                                                                                                 head_record):
    kit = kit_with_images(tmp_path, {"spark1": "sha256:new", "spark2": None})  # spark2's pull failed
    assert ServeSwitchTask().check(kit.cluster) == []  # nothing recorded: nothing to switch, spark1 goes on
    head = kit.transport("spark1")
    head.files[record_path(kit.node("spark1"))] = DeploymentRecord(deployed("sha256:old", number=2)).text()
    with pytest.raises(TaskFailed) as refused:
        ServeSwitchTask().check(kit.cluster)
    assert refused.value.message == (f"{IMAGE} is not on spark2 (its pull failed or did not run): nothing was "
                                     "switched, the old world serves")


def test_a_model_commit_moved_is_another_world_where_both_know_it():
    assert not deployed("a", revision="1" * 40).same_world(deployed("a", revision="2" * 40))
    assert deployed("a", revision="1" * 40).same_world(deployed("a"))  # not known yet: judged by the rest


def test_a_rollback_pins_the_commit_the_deployment_served_and_does_not_refresh(monkeypatch, tmp_path):
    inv = inventory_from_yaml(PAIR, tmp_path)
    runs = []
    monkeypatch.setattr(rollback, "journaled_run", lambda kind, inventory, graph, request, sink:
                        runs.append(request) or RunResult(nodes=["spark1"], outcomes=[], unreachable={},
                                                          check_mode=False, duration=1.0))
    events = []

    class View:
        def __enter__(self):
            return events.append

        def __exit__(self, *exc):
            return False

    target = deployed("a", revision="1" * 40, inputs=deployment_inputs(inv))
    rollback._put_back(inv, target, RunRequest.of(refresh=True), View, "why", "rolled back")
    (request,) = runs
    assert (request.options.model_commit, request.options.refresh) == ("1" * 40, False)
    # the inventory's words are the deployment's: only the commit moved, and it stays pinned
    assert "the next bootstrap keeps it (`--refresh` tries the Hub's commit again)" in events[-1].message
