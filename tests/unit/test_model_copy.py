"""model.copy (serve.distribute: copy): manifests of real directories, the copy script run for real, the task."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.model.copy import ModelCopyTask
from sparkctl.tasks.model.fetch import FetchStep, ModelFetchTask
from sparkctl.tasks.model.manifest import RepoDir, manifest_script, missing_on_peer, parse_manifests, snapshot_entries
from sparkctl.tasks.model.progress import human_bytes
from sparkctl.tasks.model.streams import copy_script, share_out, streams_script
from sparkctl.tasks.model.token import ModelTokenTask
from tests.taskkit import inventory_from_yaml, make_kit, spark_facts

HF = "/home/nvidia/.cache/huggingface"
MODEL = "nvidia/Qwen3-235B-A22B-FP4"
DRAFT = "nvidia/Qwen3-235B-A22B-Eagle3"
COPY_PAIR = """
user: nvidia
nodes: [{name: spark1, host: 10.0.0.11}, {name: spark2, host: 10.0.0.12}]
serve: {preset: qwen3-235b-eagle3, distribute: copy}
"""
REV = "a" * 40


def hub_repo(root: Path, files: dict[str, bytes], rev: str = REV, stale: dict[str, bytes] | None = None) -> Path:
    """A repo in the real hub cache layout: blobs named by content, snapshot links, refs/main."""
    import hashlib

    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(rev)
    for revision, content in ((rev, files), ("b" * 40, stale or {})):
        for name, data in content.items():
            blob = root / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            link = root / "snapshots" / revision / name
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "blobs" / "deadbeef.incomplete").write_bytes(b"half")
    return root


def manifest_of(root: Path, hub: bool = True) -> dict:
    out = subprocess.run(["bash", "-c", manifest_script([RepoDir("org/m", str(root), hub)])],
                         capture_output=True, text=True, check=True).stdout
    held = parse_manifests(out)["org/m"]
    return snapshot_entries(hub, held.ref, held.entries)


def test_manifest_of_a_real_hub_repo_is_the_current_snapshot_only(tmp_path):
    root = hub_repo(tmp_path / "models--org--m", {"config.json": b"{}", "model.safetensors": b"w" * 70_000},
                    stale={"old.safetensors": b"old"})
    wanted = manifest_of(root)
    assert wanted["refs/main"][0] == "F" and wanted["refs/main"][2]  # small: compared by content
    assert wanted[f"snapshots/{REV}/config.json"][0] == "L"
    big = [e for p, e in wanted.items() if p.startswith("blobs/") and e[1] == 70_000]
    assert big == [("F", 70_000, "")]  # large blobs: by size (their name is their hash)
    assert not any("old" in p or "b" * 40 in p or p.endswith(".incomplete") for p in wanted)
    assert len(wanted) == 5  # refs/main, 2 links, 2 blobs


def test_missing_on_peer_sends_only_what_differs_blobs_first_ref_last(tmp_path):
    head = manifest_of(hub_repo(tmp_path / "head", {"config.json": b"{}", "model.safetensors": b"w" * 10}))
    assert missing_on_peer(head, head) == []
    peer = dict(head)
    peer["refs/main"] = ("F", 40, "other")
    blob = next(p for p, e in head.items() if p.startswith("blobs/") and e[1] == 10)
    peer[blob] = ("F", 5, peer[blob][2])  # truncated by an interrupted copy
    assert missing_on_peer(head, peer) == [blob, "refs/main"]
    assert missing_on_peer(head, {})[-1] == "refs/main"
    assert snapshot_entries(True, None, {}) == {}


def fake_ssh(bin_dir: Path) -> dict[str, str]:
    """`ssh [opts] HOST CMD...` that runs CMD here: the copy script is real, only the hop is local."""
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text('#!/bin/bash\nwhile [ "${1#-}" != "$1" ]; do shift 2; done\nshift\n'
                   'echo "ssh $*" >> "$(dirname "$0")/ssh.log"\nexec bash -c "$*"\n')
    ssh.chmod(0o755)
    # no rsync on this PATH: the tar path (rsync, when present, is only preferred)
    tools = bin_dir / "tools"
    tools.mkdir()
    for tool in ("tar", "mkdir", "dirname", "bash", "cat", "env"):
        (tools / tool).symlink_to(subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                                                 text=True).stdout.strip())
    return {"PATH": f"{bin_dir}:{tools}", "HOME": str(bin_dir)}


def test_copy_script_sends_exactly_the_listed_files_with_tar_over_ssh(tmp_path):
    source = hub_repo(tmp_path / "head" / "models--org--m", {"config.json": b"{}", "model.safetensors": b"w" * 9})
    dest = tmp_path / "peer" / "hub" / "models--org--m"
    wanted = manifest_of(source)
    paths = missing_on_peer(wanted, {})
    env = fake_ssh(tmp_path / "bin")
    result = subprocess.run(["bash", "-c", copy_script(str(source), str(dest), "192.168.100.11")],
                            input="".join(p + "\0" for p in paths), capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("via tar")
    assert manifest_of(dest) == wanted
    assert (dest / "snapshots" / REV / "model.safetensors").read_bytes() == b"w" * 9
    assert not (dest / "blobs" / "deadbeef.incomplete").exists()
    assert "192.168.100.11" not in (tmp_path / "bin" / "ssh.log").read_text()  # the host is ssh's, not the command's
    # an interrupted copy: only what is missing goes again
    (dest / "refs" / "main").unlink()
    assert missing_on_peer(wanted, manifest_of_raw(dest)) == ["refs/main"]


def manifest_of_raw(root: Path) -> dict:
    out = subprocess.run(["bash", "-c", manifest_script([RepoDir("org/m", str(root), True)])],
                         capture_output=True, text=True, check=True).stdout
    return parse_manifests(out)["org/m"].entries


def shared_store_repo(hub: Path, files: dict[str, bytes], rev: str = REV) -> Path:
    """A repo as huggingface_hub 1.32 and later writes it (utils/_shared_blobs.py): the weights once per cache at
    hub/blobs/<hash[:2]>/<hash> (the store marked), the repo's blobs/<etag> a relative link to it."""
    import hashlib

    root = hub_repo(hub / "models--org--m", {n: d for n, d in files.items() if not n.endswith(".safetensors")}, rev)
    (hub / "blobs").mkdir(parents=True, exist_ok=True)
    (hub / "blobs" / ".huggingface-shared-blobs").write_text("1\n")
    for name, data in files.items():
        if not name.endswith(".safetensors"):
            continue
        xet = hashlib.sha256(b"xet" + data).hexdigest()
        payload = hub / "blobs" / xet[:2] / xet
        payload.parent.mkdir(parents=True, exist_ok=True)
        payload.write_bytes(data)
        etag = hashlib.sha256(data).hexdigest()
        (root / "blobs" / etag).symlink_to(f"../../blobs/{xet[:2]}/{xet}")
        (root / "snapshots" / rev / name).symlink_to(f"../../blobs/{etag}")
    return root


def test_a_shared_store_repo_is_judged_by_what_its_links_lead_to_and_copied_as_files(tmp_path):
    """huggingface_hub 1.32's layout: copying the repo's folder alone would ship links to nothing. The head's
    links out of the folder are files to the peer; a peer that holds those links leading nowhere lacks them; the
    copy sends them as files (tar -h here) and the peer then holds the head's snapshot, every file resolving."""
    weights = b"w" * 70_000
    source = shared_store_repo(tmp_path / "head" / "hub", {"config.json": b"{}", "model.safetensors": weights})
    out = subprocess.run(["bash", "-c", manifest_script([RepoDir("org/m", str(source), True)])],
                         capture_output=True, text=True, check=True).stdout
    held = parse_manifests(out)["org/m"]
    wanted = snapshot_entries(True, held.ref, held.entries)
    (blob,) = held.outside
    assert wanted[blob] == ("F", 70_000, "") and blob.startswith("blobs/")
    # the folder copied alone (what the peers' tools shipped): the same links, leading nowhere there
    dest = tmp_path / "peer" / "hub" / "models--org--m"
    dest.parent.mkdir(parents=True)
    subprocess.run(["cp", "-a", str(source), str(dest.parent)], check=True)
    assert not (dest / "snapshots" / REV / "model.safetensors").exists()
    assert missing_on_peer(wanted, manifest_of_raw(dest)) == [blob]
    env = fake_ssh(tmp_path / "bin")
    result = subprocess.run(["bash", "-c", copy_script(str(source), str(dest), "192.168.100.11", dereference=True)],
                            input=blob + "\0", capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert (dest / blob).is_file() and not (dest / blob).is_symlink()
    assert (dest / "snapshots" / REV / "model.safetensors").read_bytes() == weights
    assert missing_on_peer(wanted, manifest_of_raw(dest)) == []


def test_a_head_whose_store_lost_a_file_is_refused_not_copied(tmp_path):
    source = shared_store_repo(tmp_path / "hub", {"config.json": b"{}", "model.safetensors": b"w" * 10})
    for payload in (tmp_path / "hub" / "blobs").glob("*/*"):
        payload.unlink()
    out = subprocess.run(["bash", "-c", manifest_script([RepoDir("org/m", str(source), True)])],
                         capture_output=True, text=True, check=True).stdout
    held = parse_manifests(out)["org/m"]
    assert held.outside == frozenset()  # nothing resolves: the link stays a link, to nothing
    wanted = snapshot_entries(True, held.ref, held.entries)
    assert any(e[0] == "L" and e[1].startswith("../../blobs/") for e in wanted.values())


def test_copy_script_quotes_hostile_paths():
    script = copy_script("/src/it's", "/dst/a b;rm -rf ~", "192.168.100.11", "-p 22")
    assert "'/dst/a b;rm -rf ~'" in script
    assert "rm -rf ~ " not in script.replace("'/dst/a b;rm -rf ~'", "")


# --- the task against a recording transport ------------------------------------------------------------------

def copy_kit(tmp_path):
    inv = inventory_from_yaml(COPY_PAIR, tmp_path)
    return make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})


def head_manifest() -> str:
    return ("@@repo\tnvidia/Qwen3-235B-A22B-FP4\nV\t" + REV + "\nF\trefs/main\t40\n"
            f"L\tsnapshots/{REV}/model.safetensors\t../../blobs/b1\nF\tblobs/b1\t3000000000\nM\tr1  ./refs/main\n"
            "@@repo\tnvidia/Qwen3-235B-A22B-Eagle3\nF\tconfig.json\t2\nF\tmodel.safetensors\t1000000000\n"
            "M\tc1  ./config.json\n")


def test_peers_in_copy_mode_neither_download_nor_get_the_token(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_CopyModeToken0123456789abcdefXY")
    kit = copy_kit(tmp_path)
    assert ModelFetchTask().check(kit.node("spark2")) == []
    assert ModelTokenTask().check(kit.node("spark2")) == []
    assert kit.transport("spark2").calls == []
    kit.transport("spark1").respond(r"config\.json", f"missing\t{MODEL}\t-\t no config.json\n")
    assert [c.payload for c in ModelFetchTask().check(kit.node("spark1"))] == [FetchStep(MODEL, None, None, True)]


def test_copy_sends_the_missing_files_from_the_head_and_logs_the_rate(tmp_path):
    kit = copy_kit(tmp_path)
    head, peer = kit.transport("spark1"), kit.transport("spark2")
    head.respond("@@repo", head_manifest())
    peer.respond("@@repo", "@@repo\tnvidia/Qwen3-235B-A22B-Eagle3\nF\tconfig.json\t2\nM\tc1  ./config.json\n")
    changes = ModelCopyTask().check(kit.cluster)
    assert [c.summary for c in changes] == [
        f"copy {MODEL} from spark1 to spark2 over the fabric (3 files, {human_bytes(3e9)})",
        f"copy {DRAFT} from spark1 to spark2 over the fabric (1 files, {human_bytes(1e9)})"]
    head.rules.clear()
    head.respond(r"mktemp -d", "/tmp/sparkctl-copy.x\n")
    head.respond(r"via tar", "via tar\n")
    ModelCopyTask().apply(kit.cluster, changes)
    copies = [c for c in head.calls if c.kind == "run" and "tar -C" in c.target]
    assert len(copies) == 3 and not [c for c in peer.calls if "tar" in c.target and "du -sb" not in c.target]
    # the model: its one file over a stream of its own, then the snapshot's link and refs/main once it is there
    files, rest = copies[0], copies[1]
    assert "192.168.100.11" in files.target  # spark2's fabric address, never the management one
    assert f"{HF}/hub/models--nvidia--Qwen3-235B-A22B-FP4" in files.target and "--copy-links" in files.target
    lists = [c.content for c in head.calls if c.kind == "put" and c.target == "/tmp/sparkctl-copy.x/list.0"]
    assert lists == ["blobs/b1\0", "model.safetensors\0"]  # the model's, then the draft's
    assert rest.input == f"snapshots/{REV}/model.safetensors\0" + "refs/main\0" and "--copy-links" not in rest.target
    rates = [e.message for e in kit.events if e.event == "log" and (e.message or "").startswith("copied")]
    assert len(rates) == 2 and "MB/s" in rates[0] and "tar over ssh" in rates[0] and "1 stream(s)" in rates[0]
    assert [c for c in head.calls if c.target.startswith("rm -rf /tmp/sparkctl-copy.x")]  # the lists go
    assert all(e.task == "model.copy" and e.node == "spark2" for e in kit.events if e.event == "log")


def test_a_peer_with_the_same_snapshot_is_ok_and_download_mode_does_nothing(tmp_path):
    kit = copy_kit(tmp_path)
    kit.transport("spark1").respond("@@repo", head_manifest())
    kit.transport("spark2").respond("@@repo", head_manifest())
    assert ModelCopyTask().check(kit.cluster) == []
    inv = inventory_from_yaml(COPY_PAIR.replace("distribute: copy", "distribute: download"), tmp_path)
    kit = make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})
    assert ModelCopyTask().check(kit.cluster) == []
    assert kit.transport("spark1").calls == []


def test_the_head_without_a_snapshot_fails_and_check_mode_reports_the_copy(tmp_path):
    kit = copy_kit(tmp_path)
    with pytest.raises(TaskFailed) as failure:
        ModelCopyTask().check(kit.cluster)
    assert "spark1 has no snapshot of" in failure.value.message
    kit.cluster.options.check = True
    summaries = [c.summary for c in ModelCopyTask().check(kit.cluster)]
    assert summaries[0] == f"copy {MODEL} from spark1 to spark2 over the fabric (once spark1 has downloaded it)"


def test_a_refused_ssh_names_the_mesh(tmp_path):
    kit = copy_kit(tmp_path)
    kit.transport("spark1").respond("@@repo", head_manifest())
    changes = ModelCopyTask().check(kit.cluster)
    kit.transport("spark1").rules.clear()
    kit.transport("spark1").respond(r"mktemp -d", "/tmp/sparkctl-copy.x\n")
    kit.transport("spark1").respond(r"via tar", exit_code=3, stderr="Host key verification failed.\n")
    with pytest.raises(TaskFailed) as failure:
        ModelCopyTask().apply(kit.cluster, changes)
    assert "cannot ssh to spark2 over the fabric" in failure.value.message
    assert "ssh.mesh" in failure.value.hint


def test_distribute_is_an_inventory_key_with_located_errors(tmp_path):
    from sparkctl.errors import InventoryError
    from sparkctl.inventory import inventory_json_schema, load_inventory

    assert inventory_from_yaml(COPY_PAIR, tmp_path).serve.distribute == "copy"
    assert inventory_from_yaml(COPY_PAIR.replace(", distribute: copy", ""), tmp_path).serve.distribute == "download"
    path = tmp_path / "typo.yaml"
    path.write_text(COPY_PAIR.replace("serve: {preset: qwen3-235b-eagle3, distribute: copy}",
                                      "serve:\n  preset: qwen3-235b-eagle3\n  distribute: cpy\n"))
    with pytest.raises(InventoryError) as error:
        load_inventory(path)
    assert f"{path}:6: serve.distribute: 'cpy' is not allowed (did you mean 'copy'?)" in str(error.value)
    serve_schema = inventory_json_schema()["$defs"]["ServeSettings"]["properties"]["distribute"]
    assert serve_schema["enum"] == ["download", "copy"] and "fabric" in serve_schema["description"]


# --- verified against the Hub's hashes ------------------------------------------------------------------------

SHA = "5" * 64
STAT = ("3000000000", "1795946574.993381358", "2769649")


def etag_manifest(stats: tuple[str, str, str] | None, record: str = "") -> str:
    """The model's snapshot as a node lists it, its one weight a blob named by its sha256, with its stat and the
    node's record of what it verified."""
    lines = ["@@repo\tnvidia/Qwen3-235B-A22B-FP4", f"V\t{REV}", "F\trefs/main\t40",
             f"L\tsnapshots/{REV}/model.safetensors\t../../blobs/{SHA}", f"F\tblobs/{SHA}\t3000000000",
             "M\tr1  ./refs/main"]
    if record:
        lines.append(f"C\t{record}")
    if stats:
        lines.append("S\tblobs/" + SHA + "\t" + "\t".join(stats))
    lines += [f"@@repo\t{DRAFT}", "F\tconfig.json\t2", "M\tc1  ./config.json"]  # a local dir: no etags
    return "\n".join(lines) + "\n"


def test_a_wrong_file_of_the_right_size_on_the_peer_is_found_sent_again_and_recorded(tmp_path):
    kit = copy_kit(tmp_path)
    head, peer = kit.transport("spark1"), kit.transport("spark2")
    verified = "\t".join((SHA, *STAT))
    head.respond("@@repo", etag_manifest(STAT, verified))
    peer.respond("@@repo", etag_manifest(STAT))  # the same size, never verified here
    changes = ModelCopyTask().check(kit.cluster)
    assert [c.summary for c in changes] == [f"verify 1 files of {MODEL} on spark2 against the hashes the Hub "
                                            "recorded (a wrong one is sent again from spark1)"]
    digests = iter(["0" * 64, SHA])  # wrong as found, right once sent again
    peer.respond("sha256sum", lambda: f"H\tblobs/{SHA}\t{next(digests)}\t" + "\t".join(STAT) + "\n")
    head.rules.clear()
    head.respond(r"mktemp -d", "/tmp/sparkctl-copy.x\n")
    head.respond(r"via tar", "via tar\n")
    ModelCopyTask().apply(kit.cluster, changes)
    assert any("rm -f" in c.target and f"blobs/{SHA}" in c.target for c in peer.calls)
    (sent,) = [c for c in head.calls if c.kind == "run" and "tar -C" in c.target]
    assert head.files["/tmp/sparkctl-copy.x/list.0"] == f"blobs/{SHA}\0"
    record = f"{HF}/sparkctl-verified/models--nvidia--Qwen3-235B-A22B-FP4.tsv"
    assert peer.files[record] == verified + "\n"
    assert any("do not match the hash the Hub recorded: sending them again" in (e.message or "")
               for e in kit.events)


def test_a_verified_file_is_not_read_again_until_its_stat_changes(tmp_path):
    kit = copy_kit(tmp_path)
    verified = "\t".join((SHA, *STAT))
    kit.transport("spark1").respond("@@repo", etag_manifest(STAT, verified))
    kit.transport("spark2").respond("@@repo", etag_manifest(STAT, verified))
    assert ModelCopyTask().check(kit.cluster) == []
    kit.cluster.options.reprove = True
    assert [c.summary.split(" against")[0] for c in ModelCopyTask().check(kit.cluster)] == [
        f"verify 1 files of {MODEL} on spark1", f"verify 1 files of {MODEL} on spark2"]
    kit.cluster.options.reprove = False
    touched = (STAT[0], "1795999999.000000001", STAT[2])
    kit.transport("spark2").rules.clear()
    kit.transport("spark2").respond("@@repo", etag_manifest(touched, verified))
    assert [c.node for c in ModelCopyTask().check(kit.cluster)] == ["spark2"]


def test_a_wrong_file_on_the_head_is_removed_and_the_run_says_to_download_it_again(tmp_path):
    kit = copy_kit(tmp_path)
    head = kit.transport("spark1")
    head.respond("@@repo", etag_manifest(STAT))
    kit.transport("spark2").respond("@@repo", etag_manifest(STAT, "\t".join((SHA, *STAT))))
    (change,) = ModelCopyTask().check(kit.cluster)
    assert change.node == "spark1"
    head.respond("sha256sum", f"H\tblobs/{SHA}\t{'0' * 64}\t" + "\t".join(STAT) + "\n")
    with pytest.raises(TaskFailed) as failure:
        ModelCopyTask().apply(kit.cluster, [change])
    assert "do not match the hash the Hub recorded" in failure.value.message
    assert failure.value.hint == "rerun: model.fetch downloads them again"
    assert any("rm -f" in c.target for c in head.calls)


def test_files_are_shared_among_streams_by_bytes_and_each_stream_goes_to_a_twin(tmp_path):
    sizes = {"a": 50, "b": 40, "c": 30, "d": 20, "e": 10}
    assert share_out(list(sizes), sizes, 2) == [["a", "d", "e"], ["b", "c"]]
    assert share_out(["a"], sizes, 4) == [["a"]] and share_out([], sizes, 4) == []
    routes = [("192.168.100.11", ""), ("192.168.101.11", "")]
    script = streams_script("/src", "/dst", routes, [["blobs/a"], ["b"], ["blobs/c"]], "/tmp/l",
                            allow=["192.168.100.10", "192.168.101.10"])
    assert "192.168.100.11 \"$@\"; }\n\ncontrol 'mkdir -p /dst /dst/blobs' </dev/null || exit 3" in script
    # the daemon: one per twin address the streams use, taking files from the head's fabric addresses only
    assert "for a in 192.168.100.11 192.168.101.11 ; do" in script
    assert "hosts allow = 192.168.100.10 192.168.101.10 " in script
    daemon = [line for line in script.splitlines() if line.strip().startswith("a=")]
    assert daemon == ["    a=192.168.100.11; p=$(port \"$a\")", "    a=192.168.101.11; p=$(port \"$a\")",
                      "    a=192.168.100.11; p=$(port \"$a\")"]
    tar = [line for line in script.splitlines() if "tar -C /dst -xf -" in line]
    assert ["192.168.100.11" in tar[0], "192.168.101.11" in tar[1], "192.168.100.11" in tar[2]] == [True] * 3
    # a route off the fabric (a peer reached on its management address): never a daemon there
    off = streams_script("/src", "/dst", [("10.0.0.12", "-p 22 -o IdentitiesOnly=yes -i ~/.ssh/k")], [["b"]],
                         "/tmp/l", allow=["192.168.100.10"])
    assert "if false && command -v rsync" in off and "-p 22 -o IdentitiesOnly=yes -i ~/.ssh/k 10.0.0.12" in off


@pytest.mark.parametrize("rsync", [
    pytest.param(True, marks=pytest.mark.skipif(shutil.which("rsync") is None, reason="no rsync on this machine")),
    False])
def test_several_streams_copy_for_real_into_one_tree(tmp_path, rsync):
    """The streams script run here, ssh standing in as a local shell (with rsync on the peer, or without: tar): with
    rsync, its daemon for real on two loopback addresses standing for the peer's twins, taking files only with the
    copy's secret; every file lands once, whole, into folders no stream has made yet, and nothing of the daemon is
    left."""
    src = tmp_path / "src"
    (src / "blobs").mkdir(parents=True)
    for i in range(7):
        (src / "blobs" / f"f{i}").write_bytes(bytes([i]) * (1000 * (i + 1)))
    lists = tmp_path / "lists"
    lists.mkdir()
    streams = share_out([f"blobs/f{i}" for i in range(7)], {f"blobs/f{i}": 1000 * (i + 1) for i in range(7)}, 3)
    for i, paths in enumerate(streams):
        (lists / f"list.{i}").write_text("".join(p + "\0" for p in paths))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # ssh to a twin's address runs the rest of its line here, as the peer would
    (bin_dir / "ssh").write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do case $1 in 127.*|192.0.2.*) shift; break ;; "
                                 "*) shift ;; esac; done\n"
                                 "case \"$*\" in *'command -v rsync'*) [ -n \"$NO_RSYNC\" ] && exit 1 ;; esac\n"
                                 "exec sh -c \"$*\"\n")
    os.chmod(bin_dir / "ssh", 0o755)
    dest = tmp_path / "dst"
    peer_tmp = tmp_path / "peer-tmp"
    peer_tmp.mkdir()
    routes = [("127.0.0.2", ""), ("127.0.0.3", "")]
    script = streams_script(str(src), str(dest), routes, streams, str(lists), allow=["127.0.0.1"])
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(peer_tmp),
                                 **({} if rsync else {"NO_RSYNC": "1"})})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("via rsync daemon\n" if rsync else "via tar\n"), result.stdout
    for i in range(7):
        assert (dest / "blobs" / f"f{i}").read_bytes() == bytes([i]) * (1000 * (i + 1))
    assert list(peer_tmp.iterdir()) == []  # the daemon's folder (its secret) is gone
    assert not (lists / "secret").exists() or (lists / "secret").stat().st_mode & 0o077 == 0
    if rsync:
        alive = subprocess.run(["pgrep", "-af", f"rsync --daemon .*{peer_tmp}"], capture_output=True, text=True)
        assert alive.stdout == "", "the daemons were stopped"


@pytest.mark.skipif(shutil.which("rsync") is None, reason="no rsync on this machine")
def test_the_daemon_takes_nothing_without_the_copys_secret(tmp_path):
    """What the daemon listens with refuses a client that does not have the secret (rsyncd.conf auth users)."""
    dest = tmp_path / "dst"
    dest.mkdir()
    (tmp_path / "secrets").write_text("sparkctl:" + "ab" * 32 + "\n")
    os.chmod(tmp_path / "secrets", 0o600)
    (tmp_path / "conf").write_text(f"use chroot = no\npid file = {tmp_path}/pid\n[copy]\npath = {dest}\n"
                                   f"read only = false\nauth users = sparkctl\nsecrets file = {tmp_path}/secrets\n"
                                   "strict modes = true\nhosts allow = 127.0.0.1\n")
    port = 20000 + os.getpid() % 40000
    daemon = subprocess.Popen(["rsync", "--daemon", "--no-detach", "--address=127.0.0.4", f"--port={port}",
                               f"--config={tmp_path}/conf"])
    try:
        wrong = tmp_path / "wrong"
        wrong.write_text("cd" * 32 + "\n")
        os.chmod(wrong, 0o600)
        (tmp_path / "f").write_text("x")
        for _ in range(50):
            refused = subprocess.run(["rsync", f"--password-file={wrong}", str(tmp_path / "f"),
                                      f"rsync://sparkctl@127.0.0.4:{port}/copy/"], capture_output=True, text=True)
            if "auth failed" in refused.stderr:
                break
            import time
            time.sleep(0.1)
        assert refused.returncode != 0 and "auth failed" in refused.stderr, refused.stderr
        assert list(dest.iterdir()) == []
    finally:
        daemon.terminate()
        daemon.wait(10)


@pytest.mark.skipif(shutil.which("rsync") is None, reason="no rsync on this machine")
def test_a_daemon_that_cannot_listen_leaves_the_copy_to_tar_over_ssh(tmp_path):
    """An address the peer does not have (a twin down under the run): rsync's daemon cannot listen there, so the
    copy goes as tar over ssh, and says why."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"w" * 5000)
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "list.0").write_text("f\0")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do case $1 in 192.0.2.*) shift; break ;; "
                                 "*) shift ;; esac; done\nexec sh -c \"$*\"\n")
    os.chmod(bin_dir / "ssh", 0o755)
    peer_tmp = tmp_path / "peer-tmp"
    peer_tmp.mkdir()
    script = streams_script(str(src), str(tmp_path / "dst"), [("192.0.2.7", "")], [["f"]], str(lists),
                            allow=["192.0.2.1"])
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(peer_tmp)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("via tar\n") and "could not listen on 192.0.2.7" in result.stderr
    assert (tmp_path / "dst" / "f").read_bytes() == b"w" * 5000
    assert list(peer_tmp.iterdir()) == []
