"""A hint is given for the failure it explains (issue 13): each hint below depends on the failure's own words."""

from __future__ import annotations

import pytest

from sparkctl.errors import SparkctlError
from sparkctl.lab import image
from sparkctl.runs.fabric_bench import container_hint
from sparkctl.tasks.container.ssh import mesh_hint, sshd_hint
from sparkctl.tasks.mpi.hostfile import mpirun_hint
from sparkctl.tasks.ssh.verify import host_mesh_hint
from sparkctl.tasks.verify.fabric import probe_hint

REFUSED = "ssh: connect to host 192.168.100.11 port 2233: Connection refused"
DENIED = "root@192.168.100.11: Permission denied (publickey)."
TIMED_OUT = "ssh: connect to host 192.168.100.11 port 22: Connection timed out"
HOST_KEY = "Host key verification failed."


def test_the_lab_image_asks_about_the_apt_mirror_only_when_apt_could_not_fetch():
    with pytest.raises(SparkctlError) as failed:
        image._run(["sh", "-c", "echo 'Error: payload does not match any of the supported image formats' >&2; "
                    "exit 125"], "podman import", timeout=30)
    assert failed.value.hint is None and "payload does not match" in failed.value.message
    fetch = ("E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  "
             "Could not resolve 'deb.debian.org'")
    assert "apt mirror reachable" in image.build_hint(fetch)
    assert "not in the mirror's suite" in image.build_hint("E: Unable to locate package lldpd")
    assert "apt mirror" not in image.build_hint("E: Unable to locate package lldpd")


def test_mpirun_hostname_names_only_the_cause_its_output_shows():
    refused = mpirun_hint(REFUSED + "\nORTE was unable to reliably start one or more daemons.", hung=False,
                          answered=False)
    assert "Connection refused" in refused and "hang" not in refused
    hung = mpirun_hint("", hung=True, answered=False)
    assert "a hang" in hung and "Connection refused" not in hung
    assert "refused the head's key" in mpirun_hint(DENIED, hung=False, answered=False)
    assert mpirun_hint("mpirun: command not found", hung=False, answered=False) is None
    assert "another order" in mpirun_hint("", hung=False, answered=True)


def test_the_container_mesh_hint_fits_the_refusal():
    hint = mesh_hint("trtllm-multinode", 2233)
    denied = hint([DENIED])
    assert "refused this container's key" in denied and "port" not in denied
    refused = hint([REFUSED])
    assert "does not listen on port 2233" in refused and "key" not in refused
    assert "host key differs" in hint([HOST_KEY])
    assert "verify.fabric" in hint([TIMED_OUT])


def test_a_running_container_is_not_blamed_on_a_port_holder():
    running = sshd_hint("trtllm-multinode", 2233, {"spark2": "running"})
    assert "holding port" not in running and "runs but its sshd did not listen" in running
    exited = sshd_hint("trtllm-multinode", 2233, {"spark2": "exited"})
    assert "holding port 2233" in exited and "spark2" in exited


def test_node_to_node_ssh_asks_to_repair_the_keys_only_when_a_key_was_refused():
    for error in (REFUSED, TIMED_OUT):
        assert "repair the keys" not in host_mesh_hint([error])
    assert "does not listen" in host_mesh_hint([REFUSED])
    assert "verify.fabric" in host_mesh_hint([TIMED_OUT])
    assert "repair the keys" in host_mesh_hint([DENIED])
    assert host_mesh_hint(["something else"]) == "ssh -v from the node to the peer shows why"


def test_the_mpi_probe_names_mpi4py_only_when_it_is_missing():
    missing = probe_hint("[1,0]<stderr>:ModuleNotFoundError: No module named 'mpi4py'")
    assert "mpi4py is not in the image" in missing
    launch = probe_hint(REFUSED + "\nORTE was unable to reliably start one or more daemons.")
    assert "mpi4py" not in launch and "mpi.hostfile" in launch


def test_the_all_reduce_failure_points_at_bootstrap_only_for_a_missing_container():
    assert "bootstrap starts the containers" in container_hint(
        "Error response from daemon: No such container: trtllm-multinode")
    assert "bootstrap" in container_hint("Error response from daemon: container 3f2a is not running")
    assert "bootstrap" in container_hint(
        "Error: can only create exec sessions on running containers: container state improper")
    assert container_hint("ORTE was unable to reliably start one or more daemons.") == ""
