"""model.fit, model.token, model.fetch against recorded facts and a recording transport."""

from __future__ import annotations

import hashlib

import pytest

from sparkctl.secrets import forget_secrets, redact_known
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.model.fetch import FetchStep, ModelFetchTask
from sparkctl.tasks.model.fit import ModelFitTask
from sparkctl.tasks.model.token import ModelTokenTask
from tests.taskkit import inventory_from_yaml, make_kit, spark_facts

TOKEN = "hf_UnitTestToken0123456789abcdefXYZ"
HF = "/home/nvidia/.cache/huggingface"
PAIR = """
user: nvidia
nodes: [{name: spark1, host: 127.0.0.1}, {name: spark2, host: 10.0.0.12}]
serve: {preset: qwen3-235b-eagle3}
"""
SINGLE_QWEN = """
user: nvidia
nodes: [{name: spark1, host: 127.0.0.1}]
serve: {preset: qwen3-235b-eagle3, tp_size: 1}
"""


def kit_for(text: str, tmp_path, mem_kb: int = 124_500_000):
    inv = inventory_from_yaml(text, tmp_path)
    facts = {}
    for n in inv.nodes:
        facts[n.name] = spark_facts(n.name)
        facts[n.name].mem_total_kb = mem_kb
    return make_kit(inv, facts)


@pytest.fixture(autouse=True)
def _no_token(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN_FILE", raising=False)
    yield
    forget_secrets()


def test_fit_refuses_qwen3_235b_on_one_spark(tmp_path, monkeypatch):
    kit = kit_for(SINGLE_QWEN, tmp_path)
    with pytest.raises(TaskFailed) as failure:
        ModelFitTask().check(kit.cluster)
    assert "Qwen3-235B-A22B-FP4 does not fit" in failure.value.message
    assert "two Sparks" in failure.value.hint
    kit = kit_for(SINGLE_QWEN.replace("tp_size: 1}", "tp_size: 1, fit_check: warn}"), tmp_path)
    assert ModelFitTask().check(kit.cluster) == []
    assert any("does not fit" in w for w in kit.warnings())


def test_fit_passes_the_pair(tmp_path):
    kit = kit_for(PAIR, tmp_path)
    assert ModelFitTask().check(kit.cluster) == []
    assert kit.warnings() == []


def test_no_serve_section_means_no_model_work(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    kit = kit_for("user: nvidia\nnodes: [{name: spark1, host: 10.0.0.11}]\n", tmp_path, mem_kb=1000)
    node = kit.node("spark1")
    assert ModelFitTask().check(kit.cluster) == []
    assert ModelTokenTask().check(node) == [] and ModelFetchTask().check(node) == []
    assert kit.transport("spark1").calls == []


def test_token_goes_as_a_0600_file_and_never_in_a_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    kit = kit_for(PAIR, tmp_path)
    node, transport = kit.node("spark1"), kit.transport("spark1")
    changes = ModelTokenTask().check(node)
    assert [c.summary for c in changes] == [f"write the HF token to {HF}/token (mode 600)"]
    ModelTokenTask().apply(node, changes)
    (put,) = transport.puts
    assert (put.target, put.content, put.mode) == (f"{HF}/token", TOKEN, 0o600)
    transport.respond(r"sha256sum", f"600\n{hashlib.sha256(TOKEN.encode()).hexdigest()}  -\n")
    assert ModelTokenTask().check(node) == []
    assert not any(TOKEN in c for c in transport.commands)
    assert redact_known(f"x {TOKEN} y") == "x ******** y"


def test_token_from_a_file_and_a_wrong_mode(tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    monkeypatch.setenv("HF_TOKEN_FILE", str(path))
    kit = kit_for(PAIR, tmp_path)
    kit.transport("spark1").respond(r"sha256sum", f"644\n{hashlib.sha256(TOKEN.encode()).hexdigest()}  -\n")
    assert [c.summary for c in ModelTokenTask().check(kit.node("spark1"))] == [f"chmod 600 {HF}/token (it is 644)"]


def test_fetch_downloads_only_what_is_incomplete(tmp_path):
    kit = kit_for(PAIR, tmp_path)
    node, transport = kit.node("spark1"), kit.transport("spark1")
    transport.respond(r"config\.json", "missing\tnvidia/Qwen3-235B-A22B-FP4\t-\t no config.json\n"
                                       "complete\tnvidia/Qwen3-235B-A22B-Eagle3\t-\t\n")
    changes = ModelFetchTask().check(node)
    assert [c.payload for c in changes] == [FetchStep("nvidia/Qwen3-235B-A22B-FP4", None, None, True)]
    script = transport.commands[0]
    assert f"{HF}/hub/models--nvidia--Qwen3-235B-A22B-FP4" in script
    assert f"{HF}/sparkctl-models/nvidia--Qwen3-235B-A22B-Eagle3" in script
    transport.rules.clear()
    ModelFetchTask().apply(node, changes)
    downloads = [c.target for c in transport.calls if c.kind == "exec_in"]
    assert downloads == ["trtllm-multinode: hf download nvidia/Qwen3-235B-A22B-FP4"]


def test_draft_goes_to_the_hf_cache_never_opt(tmp_path):
    kit = kit_for(PAIR, tmp_path)
    node, transport = kit.node("spark1"), kit.transport("spark1")
    transport.respond(r"config\.json", "missing\tnvidia/Qwen3-235B-A22B-Eagle3\t-\t partial\n")
    changes = ModelFetchTask().check(node)
    transport.rules.clear()
    ModelFetchTask().apply(node, changes)
    (download,) = [c.target for c in transport.calls if c.kind == "exec_in"]
    assert download.endswith("--local-dir /root/.cache/huggingface/sparkctl-models/nvidia--Qwen3-235B-A22B-Eagle3")


def test_gated_repo_without_token_fails_with_the_hint(tmp_path):
    kit = kit_for(PAIR, tmp_path)
    node, transport = kit.node("spark1"), kit.transport("spark1")
    transport.respond(r"config\.json", "missing\tnvidia/Qwen3-235B-A22B-Eagle3\t-\t no config.json\n")
    changes = ModelFetchTask().check(node)
    transport.rules.clear()
    transport.respond(r"^hf download", exit_code=1, stderr=(
        "huggingface_hub.errors.GatedRepoError: 401 Client Error.\n\nCannot access gated repo for url "
        "https://huggingface.co/nvidia/Qwen3-235B-A22B-Eagle3/resolve/main/config.json.\n"))
    with pytest.raises(TaskFailed) as failure:
        ModelFetchTask().apply(node, changes)
    assert "gated repo" in failure.value.message
    assert "export HF_TOKEN=" in failure.value.hint
    assert "huggingface.co/nvidia/Qwen3-235B-A22B-Eagle3" in failure.value.hint


RING_TP2 = """
user: nvidia
nodes: [{name: spark1, host: 127.0.0.1}, {name: spark2, host: 10.0.0.12}, {name: spark3, host: 10.0.0.13}]
fabric: {topology: ring}
serve: {preset: qwen3-235b-eagle3}
"""


def test_a_node_left_out_of_the_launch_gets_no_model_token_or_fit_check(tmp_path, monkeypatch):
    from sparkctl.tasks.serve.config import ServeConfigTask

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    kit = kit_for(RING_TP2, tmp_path, mem_kb=8_000_000)  # too small for any node: only the serving ones count
    spark3 = kit.node("spark3")
    assert ModelFetchTask().check(spark3) == [] and ModelTokenTask().check(spark3) == []
    assert ServeConfigTask().check(spark3) == []
    assert kit.transport("spark3").calls == []  # nothing asked of it
    with pytest.raises(TaskFailed) as refused:
        ModelFitTask().check(kit.cluster)
    assert "spark3" not in refused.value.message + "".join(refused.value.details)
    assert len(refused.value.details) == 1  # spark1 in the message, spark2 in the details
