"""container.relay (container.distribute: relay): the head's image sent to each peer over the fabric, the peers
never pulling; the relay script run for real against stand-in docker and ssh commands."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sparkctl.inventory import Inventory
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.container.image import ContainerImageTask
from sparkctl.tasks.container.relay import ContainerRelayTask, relay_script
from tests.taskkit import make_kit, spark_facts

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"


def relay_kit(head_id: str | None = "sha256:aaaa", peer_id: str | None = None, distribute: str = "relay"):
    inv = Inventory.model_validate({
        "cluster": {"name": "pair"}, "user": "nvidia", "fabric": {"topology": "pair"},
        "nodes": [{"name": "spark1", "host": "10.0.0.1"}, {"name": "spark2", "host": "10.0.0.2"}],
        "container": {"image": IMAGE, "distribute": distribute}})
    facts = {n.name: spark_facts(n.name) for n in inv.nodes}
    facts["spark1"].images, facts["spark2"].images = {IMAGE: head_id}, {IMAGE: peer_id}
    return make_kit(inv, facts)


def test_only_the_head_pulls_and_each_peer_without_its_image_gets_it_over_the_fabric():
    kit = relay_kit()
    assert ContainerImageTask().check(kit.node("spark2")) == []  # a peer never pulls
    facts = kit.node("spark1").facts()
    facts.images = {IMAGE: None}
    assert [c.summary for c in ContainerImageTask().check(kit.node("spark1"))] == [f"pull {IMAGE}"]
    kit = relay_kit(peer_id="sha256:bbbb")
    (change,) = ContainerRelayTask().check(kit.cluster)
    assert change.summary == (f"relay {IMAGE} (image aaaa) from spark1 to spark2 over the fabric (it has bbbb)")
    assert change.node == "spark2"
    assert ContainerRelayTask().check(relay_kit(peer_id="sha256:aaaa").cluster) == []
    assert ContainerRelayTask().check(relay_kit(distribute="pull").cluster) == []


def test_the_relay_runs_on_the_head_to_the_peer_s_fabric_address_and_checks_the_id():
    kit = relay_kit()
    head = kit.transport("spark1")
    head.respond(r"docker image inspect", "1000\n")
    head.respond(r"docker save", "Loaded image: x\n")
    (change,) = ContainerRelayTask().check(kit.cluster)
    with pytest.raises(TaskFailed) as failure:  # the peer's facts still say it has none
        ContainerRelayTask().apply(kit.cluster, [change])
    assert "spark2 loaded" in failure.value.message and "not spark1's aaaa" in failure.value.message
    (sent,) = [c for c in head.calls if "docker save" in c.target]
    assert "192.168.100.11 'docker load'" in sent.target  # spark2's fabric address, not 10.0.0.2
    assert "10.0.0.2" not in sent.target
    assert not [c for c in kit.transport("spark2").calls if "docker pull" in c.target]


def test_the_relay_script_sends_the_saved_image_through_ssh_into_docker_load(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"""#!/bin/sh
case "$1" in
save) head -c 300000 /dev/zero | tr '\\0' 'i' ;;
load) cat > {tmp_path}/loaded; echo "Loaded image: $2" ;;
esac
""")
    (bin_dir / "ssh").write_text("""#!/bin/sh
# the stand-in ssh runs the last argument here, as the peer would
for last; do :; done
exec sh -c "$last"
""")
    for tool in ("docker", "ssh"):
        os.chmod(bin_dir / tool, 0o755)
    counter = tmp_path / "bytes"
    script = relay_script(IMAGE, "192.168.100.2", "", str(counter))
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "loaded").read_bytes() == b"i" * 300000
    assert not counter.exists()  # the progress file goes with the relay
    assert "Loaded image" in result.stdout
