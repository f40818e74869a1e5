"""A lab that serves, as the serve-phase doctor tests and the controller-fault tests both seed it: the serve
section, the fake token, where the draft lands, and the server killed on the head."""

from __future__ import annotations

from tests.lab.lab_kit import CONTAINER

TOKEN = "hf_LabDoctorToken7c1e9a2b4d6f8a0c3e5b"
SERVE = {"preset": "qwen3-235b-eagle3", "fit_check": "warn"}
HF = "/home/nvidia/.cache/huggingface"
DRAFT = f"{HF}/sparkctl-models/nvidia--Qwen3-235B-A22B-Eagle3"


def kill_server(lab, node: str) -> None:
    """The server and its launcher gone from the head (an OOM kill, a reboot of the container's processes)."""
    result = lab.exec(node, f"docker exec {CONTAINER} pkill -KILL -f 'trtllm-serve|trtllm-llmapi-launch|mpirun'")
    assert result.returncode == 0, result.stderr
    wait = lab.exec(node, "for i in $(seq 1 300); do ss -ltnH 'sport = :18355' | grep -q . || exit 0; sleep 0.2; done; "
                          "exit 1")
    assert wait.returncode == 0, "the engine's port is still taken"
