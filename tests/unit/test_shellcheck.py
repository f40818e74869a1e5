"""Every script sparkctl renders from templates/ to run on a node, as the planners render it for each engine and
topology of inventories/, read by shellcheck (Debian's package, which the test command installs) for the shell its
shebang names. What shellcheck finds is fixed in the template; a finding that is the point (an expansion meant for
the peer's shell) is said so by a directive on that line, with the reason beside it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sparkctl.doctor.probes import probe_script
from sparkctl.facts.model import ContainerInfo
from sparkctl.facts.script import render_script
from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster
from sparkctl.plan.bench import probe_script as bench_probe
from sparkctl.plan.nccl_tests import build_script
from sparkctl.plan.top import NodeRead, Twin, agent_script
from sparkctl.runs import lock
from sparkctl.shipped import shipped_text
from sparkctl.tasks.model.streams import streams_script
from sparkctl.tasks.network.firewall_guard import guard_script
from sparkctl.tasks.network.safe_apply import revert_script
from sparkctl.tasks.serve.server import ServerHandle
from sparkctl.tasks.ssh.proofs import login_script
from sparkctl.tasks.ssh.refusals import refusal_script
from sparkctl.transport.framing import Framing
from tests.taskkit import REPO, make_kit, spark_facts
from tests.taskkit import inventory as pair_inventory
from tests.unit.doctor_snapshot_kit import healthy_snapshot

INVENTORIES = sorted((REPO / "inventories").glob("*.yaml"))
STATE = "/home/nvidia/.local/state/sparkctl/cluster"


def rendered_scripts() -> dict[str, str]:
    """name -> text of every node-side script the plans of the example inventories render."""
    out = {}
    for path in INVENTORIES:
        inventory = load_inventory(str(path))
        plan = plan_cluster(inventory)
        if plan.entrypoint:
            out[f"{path.stem}: container entrypoint"] = plan.entrypoint
        for node in plan.launch.commands():
            unit = plan.launch.unit(inventory, node, state_dir=STATE, user="nvidia", fingerprint="f")
            out[f"{path.stem}: {node}'s unit.sh"] = unit.host_text()
            out[f"{path.stem}: {node}'s world.sh"] = unit.world_text()
    routes = [("192.168.100.11", ""), ("192.168.101.11", "")]
    out["copy streams"] = streams_script("/src", "/dst", routes, [["blobs/a"], ["b"], ["c"]], "/tmp/l",
                                         repo="org/m", peer="spark2", allow=["192.168.100.10"])
    out["copy streams off the fabric"] = streams_script("/src", "/dst", [("10.0.0.12", "-p 22 -i ~/.ssh/k")],
                                                        [["b"]], "/tmp/l", repo="org/m", peer="spark2")
    out["firewall revert guard"] = guard_script("1795970183756", 60)
    out["cluster lock: holder"] = lock.hold_script()
    out["cluster lock: takeover"] = lock.takeover_script()
    out["cluster lock: peek"] = lock.peek_script()
    # the facts: every section, each way it is scheduled (in order, in the background, in the root shell), a side
    # read's own text kept single-quoted
    out["facts"] = render_script("n0nce", container_names=["trtllm-multinode", "it's"], image_refs=["img:1"],
                                 label="sparkctl.cluster=it's",
                                 hf_cache="~/hf cache", guard_dirs=["/var/lib/sparkctl/c/network"],
                                 side_reads={"container.state": ("cat /etc/hostname; echo \"$HOME\"", 5)})
    out["facts, nothing to inspect"] = render_script("n0nce")
    out["netplan revert guards"] = shipped_text("netplan-guards.sh")
    out["netplan revert guard"] = revert_script("/var/lib/sparkctl/c/network", "1795970183756", 60)
    # top's agent, with the metrics and the NCCL lines to read
    read = NodeRead(twins=(Twin("enp1s0f1np1", "rocep1s0f1"), Twin("enP2p1s0f1np1", None)),
                    container="trtllm-multinode", metrics_url="http://127.0.0.1:8355/metrics", authorized=True,
                    nccl_log=f"{STATE}/run/serve/serve.log")
    out["top's agent"] = agent_script(read, Framing("n0nce"), 2.0)
    # what a node's cluster logins depend on (its proofs on record), and sshd's digests read as root
    fabric = {n: {"enp1s0f1np1": [f"192.168.100.1{i}/24"], "enP2p1s0f1np1": [f"192.168.101.1{i}/24"]}
              for i, n in enumerate(("spark1", "spark2"))}
    kit = make_kit(pair_inventory(), {n: spark_facts(n, addresses=fabric[n], mtu=9000) for n in fabric})
    out["ssh login state"] = login_script(kit.cluster, "spark2", "sparkctl-spark-pair_ed25519")
    out["sshd digests"] = shipped_text("sshd-digest.sh")
    # serve.launch's state read, by the node itself where it sees the container's processes, else in the container
    seen = ContainerInfo("trtllm-multinode", exists=True, running=True, id="c0ffee" * 10 + "0000", pid=4000)
    out["serving state"] = "#!/bin/bash\n" + ServerHandle.of(kit.node("spark1")).state_script(
        18355, Framing("n0nce"), container=seen)
    # a read the transport runs with bash, as the others
    out["why a peer's sshd refused a key"] = "#!/bin/bash\n" + refusal_script(kit.cluster, "spark2", {"spark1"},
                                                                              Framing("n0nce"))
    out["fabric bench's probe"] = bench_probe({"enp1s0f1np1": "192.168.100.10", "enP2p1s0f1np1": "192.168.101.10"})
    out["nccl-tests build"] = build_script("sha256:" + "a" * 64)
    # doctor's probe of a serving head (asking a peer's listeners) and of a worker whose container stopped
    s = healthy_snapshot()
    out["doctor's probe: head"] = probe_script(s.inventory, s.plan, s.facts["spark1"], "spark1", ["spark1", "spark2"],
                                               nonce="n0nce", targets=(("spark2", "10.0.0.12", 22),))
    s.facts["spark2"].containers["trtllm-multinode"].running = False
    out["doctor's probe: worker"] = probe_script(s.inventory, s.plan, s.facts["spark2"], "spark2",
                                                 ["spark1", "spark2"], nonce="n0nce")
    return out


SCRIPTS = rendered_scripts()


def test_every_engine_and_topology_renders_its_scripts():
    names = " ".join(SCRIPTS)
    for engine in ("two-sparks", "two-sparks-vllm", "two-sparks-sglang", "four-sparks-ring"):
        assert f"{engine}: spark1's world.sh" in names, names


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is installed by scripts/test")
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_shellcheck_finds_nothing(name: str, tmp_path: Path):
    script = tmp_path / "script"
    script.write_text(SCRIPTS[name])
    assert SCRIPTS[name].startswith(("#!/bin/bash\n", "#!/bin/sh\n")), "a shebang names the shell it runs under"
    result = subprocess.run(["shellcheck", "--severity=info", "--format=gcc", str(script)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, f"{name}:\n{result.stdout}"
