"""serve.distribute: copy on a lab pair: the head downloads once, the peer receives the snapshot over the fabric.

The draft fixture repo is gated: a fake token is exported; it must reach the head only.
"""

from __future__ import annotations

import json
import os

import pytest

from sparkctl.tasks.model.progress import human_bytes
from tests.lab.doctor_kit import doctor
from tests.lab.lab_kit import HF_TOKEN as TOKEN
from tests.lab.lab_kit import changed, sparkctl, write_inventory
from tests.lab.lab_kit import sh_output as sh

pytestmark = pytest.mark.lab

HF = "/home/nvidia/.cache/huggingface"
SERVE = {"preset": "qwen3-235b-eagle3", "fit_check": "warn", "distribute": "copy"}
MODEL_CACHE = f"{HF}/hub/models--nvidia--Qwen3-235B-A22B-FP4"
SNAPSHOTS = {
    "model": f"{MODEL_CACHE}/snapshots/$(cat {MODEL_CACHE}/refs/main)",
    "draft": f"{HF}/sparkctl-models/nvidia--Qwen3-235B-A22B-Eagle3",
}


def hf_downloads(lab, node: str) -> list[list[str]]:
    lines = sh(lab, node, "cat /run/lab/docker.log 2>/dev/null").splitlines()
    calls = [json.loads(line)["argv"] for line in lines if line.startswith("{")]
    return [argv for argv in calls if any("hf download" in str(a) for a in argv)]


def snapshot_digest(lab, node: str, where: str) -> str:
    return sh(lab, node, f"cd {where} && find -L . -type f ! -path './.cache/*' -exec sha256sum {{}} + | sort")


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    journal = tmp_path_factory.mktemp("copy-state")
    return {**os.environ, "HF_TOKEN": TOKEN, "XDG_STATE_HOME": str(journal)}


@pytest.fixture(scope="module")
def copied(lab_pair, env, tmp_path_factory):
    inventory = write_inventory(lab_pair, tmp_path_factory.mktemp("inv") / "copy.yaml", SERVE)
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json"], env)
    assert code == 0, output[-3000:]
    return {"inventory": inventory, "events": events, "output": output}


def test_the_head_downloads_and_the_peer_gets_the_snapshot_from_it(lab_pair, copied):
    events = copied["events"]
    copy = next(e for e in events if e.get("task") == "model.copy" and e["event"] == "task_result")
    # the head's download is checked against the Hub's hashes before any of it is sent
    assert copy["changes"][0]["summary"].startswith("verify 3 files of nvidia/Qwen3-235B-A22B-FP4 on spark1 "
                                                    "against the hashes the Hub recorded"), copy["changes"]
    for node in ("spark1", "spark2"):  # and each node keeps what it verified, by stat
        record = sh(lab_pair, node, f"cat {HF}/sparkctl-verified/models--nvidia--Qwen3-235B-A22B-FP4.tsv")
        assert len(record.splitlines()) == 3, (node, record)
    assert {("model.fetch", "spark1"), ("model.copy", None), ("serve.launch", None)} <= changed(events)
    assert ("model.fetch", "spark2") not in changed(events)
    assert hf_downloads(lab_pair, "spark1")
    assert hf_downloads(lab_pair, "spark2") == []
    for what, where in SNAPSHOTS.items():
        head, peer = snapshot_digest(lab_pair, "spark1", where), snapshot_digest(lab_pair, "spark2", where)
        assert "config.json" in head and "safetensors" in head, what
        assert peer == head, what


def test_the_rate_is_printed_and_the_token_stays_on_the_head(lab_pair, copied):
    rates = [e["message"] for e in copied["events"]
             if e["event"] == "log" and e.get("task") == "model.copy" and e["message"].startswith("copied")]
    assert len(rates) == 2 and all("MB/s" in r and "spark2" in r for r in rates), rates
    assert "192.168.100.11" in rates[0]  # over the fabric
    assert sh(lab_pair, "spark1", f"stat -c %a {HF}/token").strip() == "600"
    assert sh(lab_pair, "spark2", f"[ -e {HF}/token ] && echo present || echo absent").strip() == "absent"


def test_a_second_run_changes_nothing_and_a_damaged_peer_copy_is_repaired(lab_pair, copied, env):
    code, events, output = sparkctl(["cluster", "bootstrap", copied["inventory"], "--json"], env)
    assert code == 0, output[-3000:]
    assert changed(events) == set()
    draft = SNAPSHOTS["draft"]
    sh(lab_pair, "spark2", f"truncate -s 1 {draft}/model.safetensors; rm -f {draft}/config.json")
    code, events, output = sparkctl(["cluster", "bootstrap", copied["inventory"], "--json", "--only", "model"],
                                    env)
    assert code == 0, output[-3000:]
    copy = next(e for e in events if e.get("task") == "model.copy" and e["event"] == "task_result")
    assert copy["status"] == "changed" and "(2 files," in copy["changes"][0]["summary"]
    assert snapshot_digest(lab_pair, "spark2", draft) == snapshot_digest(lab_pair, "spark1", draft)
    assert hf_downloads(lab_pair, "spark2") == []


def test_from_a_shared_blob_store_the_peer_gets_files_never_links_to_nothing(lab_pair, copied, env):
    """The image's huggingface_hub (1.32 and later) keeps the weights once per cache, in the shared blob store;
    the repo's folder holds links into it. With the worker's copy removed, the next bootstrap gives it every file
    of the head's snapshot, resolving to the head's bytes (a folder copied alone would hold links to nothing), and
    the run after it changes nothing."""
    assert sh(lab_pair, "spark1", f"cat {HF}/hub/blobs/.huggingface-shared-blobs").strip() == "1"
    head_links = sh(lab_pair, "spark1", f"find {MODEL_CACHE}/blobs -type l -lname '../../blobs/*'").split()
    assert head_links, "the head's weights are links into the shared store"
    sh(lab_pair, "spark2", f"rm -rf {MODEL_CACHE}")
    code, events, output = sparkctl(["cluster", "bootstrap", copied["inventory"], "--json"], env)
    assert code == 0, output[-3000:]
    assert ("model.copy", None) in changed(events)
    where = SNAPSHOTS["model"]
    assert snapshot_digest(lab_pair, "spark2", where) == snapshot_digest(lab_pair, "spark1", where)
    assert sh(lab_pair, "spark2", f"find -L {where}/ -type l").strip() == ""  # nothing leads nowhere
    assert sh(lab_pair, "spark2", f"find {MODEL_CACHE}/blobs -type l").strip() == ""  # real files there
    code, events, output = sparkctl(["cluster", "bootstrap", copied["inventory"], "--json"], env)
    assert code == 0 and changed(events) == set(), changed(events)


def test_a_shard_of_the_right_size_but_wrong_bytes_on_the_worker_is_found_and_sent_again(lab_pair, copied, env):
    """Every blob of the snapshot was checked against the hash the Hub recorded for it (its name) when it arrived,
    and the node keeps what it verified by stat: a shard changed in place on the worker, same size, is reported by
    doctor, found by the next bootstrap and sent again from the head, and the run after it reads nothing again.
    (The lab's files are small: the copy's md5 of files under 64 KiB finds this one first; a large shard is found
    by its hash, tests/unit/test_model_copy.py.)"""
    blobs = sh(lab_pair, "spark2", f"find {MODEL_CACHE}/blobs -type f -size +1k -printf '%P\\n'").split()
    shard = next(b for b in blobs if len(b) == 64)
    size = sh(lab_pair, "spark2", f"stat -c %s {MODEL_CACHE}/blobs/{shard}").strip()
    sh(lab_pair, "spark2", f"printf x | dd of={MODEL_CACHE}/blobs/{shard} bs=1 seek=100 conv=notrunc status=none")
    assert sh(lab_pair, "spark2", f"stat -c %s {MODEL_CACHE}/blobs/{shard}").strip() == size
    report = doctor(lab_pair, inventory=copied["inventory"], env=env)
    changed_files = [f for f in report["findings"] if f["id"] == "model.changed"]
    assert [(f["node"], f["severity"]) for f in changed_files] == [("spark2", "warning")], report["findings"]
    assert "1 file(s) of nvidia/Qwen3-235B-A22B-FP4 changed" in changed_files[0]["summary"], changed_files
    code, events, output = sparkctl(["cluster", "bootstrap", copied["inventory"], "--json"], env)
    assert code == 0, output[-3000:]
    copy = next(e for e in events if e.get("task") == "model.copy" and e["event"] == "task_result")
    assert copy["status"] == "changed" and [c["summary"] for c in copy["changes"]] == [
        f"copy nvidia/Qwen3-235B-A22B-FP4 from spark1 to spark2 over the fabric (1 files, {human_bytes(int(size))})"]
    assert sh(lab_pair, "spark2", f"sha256sum < {MODEL_CACHE}/blobs/{shard}").split()[0] == shard
    where = SNAPSHOTS["model"]
    assert snapshot_digest(lab_pair, "spark2", where) == snapshot_digest(lab_pair, "spark1", where)
    code, events, output = sparkctl(["cluster", "bootstrap", copied["inventory"], "--json"], env)
    assert code == 0 and changed(events) == set(), changed(events)
    after = doctor(lab_pair, inventory=copied["inventory"], env=env)
    assert "model.changed" not in {f["id"] for f in after["findings"]}


def move_main_upstream(lab, repo_folder: str = "nvidia--Qwen3-235B-A22B-FP4") -> None:
    """The "Hub" (the stand-in's fixture in each node's container) gets a new commit on main: the old tree is kept
    as history, config.json changes."""
    fixture = f"/opt/sparkctl-lab/fixture-repos/{repo_folder}"
    for node in ("spark1", "spark2"):
        sh(lab, node, "docker exec trtllm-multinode sh -c "
                      f"'old=$(cat {MODEL_CACHE.replace(HF, '/root/.cache/huggingface')}/refs/main) && "
                      f"mkdir -p {fixture}.history && cp -a {fixture} {fixture}.history/$old && "
                      f"sed -i \"0,/{{/s//{{\\\"moved\\\": true, /\" {fixture}/config.json'")


def test_a_main_moved_upstream_is_served_only_after_a_refresh(lab_pair, copied, env):
    """The commit the first run resolved is pinned on both nodes: with main moved on the Hub, a bootstrap changes
    nothing; --refresh moves the pin, downloads the new commit once on the head, sends it to the worker, and starts
    the world again on it; the run after that changes nothing."""
    pinned = sh(lab_pair, "spark1", f"cat {MODEL_CACHE}/refs/main").strip()
    pin_file = f"{HF}/sparkctl-pins/models--nvidia--Qwen3-235B-A22B-FP4"
    for node in ("spark1", "spark2"):
        assert sh(lab_pair, node, f"cat {pin_file}") == f"{pinned}\tmain\n"
    move_main_upstream(lab_pair)
    code, events, output = sparkctl(["cluster", "bootstrap", copied["inventory"], "--json"], env)
    assert code == 0 and changed(events) == set(), changed(events)

    code, events, output = sparkctl(["cluster", "bootstrap", copied["inventory"], "--json", "--refresh"], env)
    assert code == 0, output[-3000:]
    assert {("model.pin", None), ("model.fetch", "spark1"), ("model.copy", None), ("serve.launch", None)} <= \
        changed(events), changed(events)
    moved = sh(lab_pair, "spark1", f"cat {MODEL_CACHE}/refs/main").strip()
    assert moved != pinned
    for node in ("spark1", "spark2"):
        assert sh(lab_pair, node, f"cat {pin_file}") == f"{moved}\tmain\n"
        assert sh(lab_pair, node, f"cat {MODEL_CACHE}/refs/main").strip() == moved
        assert '"moved": true' in sh(lab_pair, node, f"cat {MODEL_CACHE}/snapshots/{moved}/config.json")
    where = SNAPSHOTS["model"]
    assert snapshot_digest(lab_pair, "spark2", where) == snapshot_digest(lab_pair, "spark1", where)
    assert hf_downloads(lab_pair, "spark2") == []  # the worker never asked the Hub
    code, events, output = sparkctl(["cluster", "bootstrap", copied["inventory"], "--json"], env)
    assert code == 0 and changed(events) == set(), changed(events)


def test_a_commit_that_does_not_load_is_rolled_back_to_the_one_that_served(lab_pair, copied, env):
    """Main moves to a commit whose config.json the engine cannot read: --refresh pins it, the new world does not
    start, and bootstrap puts the commit that served back (its pin, refs/main on both nodes, the world); the run
    fails saying so, and the run after it keeps the commit that serves."""
    serving = sh(lab_pair, "spark1", f"cat {MODEL_CACHE}/refs/main").strip()
    move_main_upstream(lab_pair)
    fixture = "/opt/sparkctl-lab/fixture-repos/nvidia--Qwen3-235B-A22B-FP4"
    for node in ("spark1", "spark2"):
        sh(lab_pair, node, f"docker exec trtllm-multinode sh -c 'echo \"{{ truncated\" > {fixture}/config.json'")
    code, events, output = sparkctl(["cluster", "bootstrap", copied["inventory"], "--json", "--refresh"], env)
    assert code == 1, output[-3000:]
    assert "rolled back: serve.launch" in output, output[-3000:]
    marked = [e for e in events if e["event"] == "log" and e.get("task") == "model.pin"
              and "switch marked" in e["message"]]
    assert marked, output[-3000:]
    pin_file = f"{HF}/sparkctl-pins/models--nvidia--Qwen3-235B-A22B-FP4"
    for node in ("spark1", "spark2"):
        assert sh(lab_pair, node, f"cat {pin_file}") == f"{serving}\tmain\n"
        assert sh(lab_pair, node, f"cat {MODEL_CACHE}/refs/main").strip() == serving
    code, events, output = sparkctl(["serve", "status", copied["inventory"]], env)
    assert code == 0 and serving[:12] in output, output[-3000:]
    code, events, output = sparkctl(["cluster", "bootstrap", copied["inventory"], "--json"], env)
    assert code == 0 and changed(events) == set(), changed(events)
