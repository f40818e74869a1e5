"""model.verify: a node's own download checked against the Hub's hashes (download mode), kept by stat, a wrong file
removed for the next download; copy mode leaves it to model.copy."""

from __future__ import annotations

import pytest

from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.model.verify import ModelVerifyTask
from tests.taskkit import framed, inventory_from_yaml, make_kit, spark_facts

HF = "/home/nvidia/.cache/huggingface"
MODEL_DIR = f"{HF}/hub/models--nvidia--Qwen3-235B-A22B-FP4"
RECORD = f"{HF}/sparkctl-verified/models--nvidia--Qwen3-235B-A22B-FP4.tsv"
PAIR = """
user: nvidia
nodes: [{{name: spark1, host: 10.0.0.11}}, {{name: spark2, host: 10.0.0.12}}]
serve: {{preset: qwen3-235b-eagle3, distribute: {mode}}}
"""
SHA, GIT = "5" * 64, "4" * 40
STATS = {f"blobs/{SHA}": ("3000000000", "1795946574.993381358", "2769649"),
         f"blobs/{GIT}": ("700", "1795946574.100000000", "2769650")}


def kit_for(tmp_path, mode: str = "download"):
    inv = inventory_from_yaml(PAIR.format(mode=mode), tmp_path)
    return make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})


def listing(record: list[str]) -> str:
    lines = [f"P\t{p}" for p in STATS] + [f"C\t{line}" for line in record]
    return "\n".join(lines + [f"S\t{p}\t" + "\t".join(s) for p, s in STATS.items()]) + "\n"


def line(path: str) -> str:
    return "\t".join((path.removeprefix("blobs/"), *STATS[path]))


def test_a_download_is_read_once_then_kept_verified_by_stat(tmp_path):
    kit = kit_for(tmp_path)
    node, transport = kit.node("spark2"), kit.transport("spark2")
    transport.respond("begin repo0@@", framed([("repo0", listing([line(f"blobs/{SHA}")]))]))
    (change,) = ModelVerifyTask().check(node)
    assert change.summary.startswith("verify 1 files of nvidia/Qwen3-235B-A22B-FP4 against the hashes the Hub "
                                     "recorded (700")
    assert change.carried().paths == (f"blobs/{GIT}",)
    transport.respond("sha1sum", f"H\tblobs/{GIT}\t{GIT}\t" + "\t".join(STATS[f"blobs/{GIT}"]) + "\n")
    ModelVerifyTask().apply(node, [change])
    assert transport.files[RECORD] == "\n".join(sorted([line(f"blobs/{SHA}"), line(f"blobs/{GIT}")])) + "\n"
    kit.node("spark2").cluster.options.reprove = True
    assert len(ModelVerifyTask().check(node)[0].carried().paths) == 2


def test_a_wrong_file_is_removed_and_the_run_says_to_download_it_again(tmp_path):
    kit = kit_for(tmp_path)
    node, transport = kit.node("spark1"), kit.transport("spark1")
    transport.respond("begin repo0@@", framed([("repo0", listing([]))]))
    (change,) = ModelVerifyTask().check(node)
    transport.respond("sha256sum", f"H\tblobs/{SHA}\t{'0' * 64}\t" + "\t".join(STATS[f"blobs/{SHA}"]) + "\n"
                      f"H\tblobs/{GIT}\t{GIT}\t" + "\t".join(STATS[f"blobs/{GIT}"]) + "\n")
    with pytest.raises(TaskFailed) as failure:
        ModelVerifyTask().apply(node, [change])
    assert failure.value.message.startswith("1 file(s) of nvidia/Qwen3-235B-A22B-FP4 on spark1 do not match the hash "
                                            "the Hub recorded")
    assert failure.value.hint == "rerun: model.fetch downloads them again"
    removal = [c for c in transport.calls if "rm -f" in c.target]
    assert len(removal) == 1 and removal[0].sudo and f"blobs/{SHA}" in removal[0].target
    assert transport.files[RECORD] == line(f"blobs/{GIT}") + "\n"  # what was right is kept


def test_copy_mode_leaves_it_to_model_copy(tmp_path):
    kit = kit_for(tmp_path, mode="copy")
    assert ModelVerifyTask().check(kit.node("spark1")) == [] and kit.transport("spark1").calls == []


def test_the_listing_names_the_blobs_the_current_snapshot_leads_to(tmp_path):
    import os
    import subprocess

    from sparkctl.tasks.model.verify import snapshot_blobs_script

    repo = tmp_path / "models--org--m"
    for rev, blob in (("new", SHA), ("old", GIT)):
        (repo / "snapshots" / rev / "sub").mkdir(parents=True)
        (repo / "blobs").mkdir(exist_ok=True)
        (repo / "blobs" / blob).write_text(rev)
        os.symlink(f"../../../blobs/{blob}", repo / "snapshots" / rev / "sub" / "model.safetensors")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("new")
    out = subprocess.run(["bash", "-c", snapshot_blobs_script(str(repo))], capture_output=True, text=True).stdout
    assert out == f"P\tblobs/{SHA}\n"  # the old revision's blob is not the snapshot in use
