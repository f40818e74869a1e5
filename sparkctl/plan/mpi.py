"""PURE: the mpirun lines sparkctl runs from the head container, and the MPI probe it ships into them."""

from __future__ import annotations

from pathlib import Path

from sparkctl.plan.paths import CONTAINER_STATE, HOSTFILE_PATH
from sparkctl.transport.base import q

MPIRUN_TIMEOUT = 60.0
MPI_PROBE = "mpi_probe.py"
#: The probe's result line starts with this (mpi_probe.py prints it).
PROBE_RESULT = "@@sparkctl-mpi-probe@@"
# Enough for a real cross-node sum and for the tx counters to show which interface carried it (a few
# hundred KiB against the ~KiB of ORTE chatter); a bandwidth figure is NCCL's business, not this probe's.
PROBE_DOUBLES = 1 << 16          # 512 KiB per rank per round
PROBE_ROUNDS = 2


def probe_source() -> str:
    """mpi_probe.py's text, written to the node's state dir (mounted in the container)."""
    return (Path(__file__).resolve().parent / MPI_PROBE).read_text()


def probe_program() -> str:
    return f"python3 {CONTAINER_STATE}/{MPI_PROBE} {PROBE_DOUBLES} {PROBE_ROUNDS}"


def mpirun_line(ranks: int, program: str, env: dict[str, str] | None = None) -> str:
    """mpirun from the head container, one rank per node in hostfile order.

    Open MPI's ssh launcher copies the head's OMPI_MCA_* environment onto every remote daemon's command
    line; with that off, each daemon keeps its OWN node's interface settings (from its sshd SetEnv).
    """
    exported = "".join(f"-x {q(f'{k}={v}')} " for k, v in (env or {}).items())
    return (f"mpirun -np {int(ranks)} --hostfile {HOSTFILE_PATH} --map-by ppr:1:node --tag-output "
            f"--mca plm_rsh_pass_environ_mca_params 0 {exported}{program}")


def timed(command: str, seconds: float = MPIRUN_TIMEOUT) -> str:
    """The command under coreutils `timeout` where the image has it: a hung mpirun must not hold the round trip
    that also carries other reads."""
    return (f"if command -v timeout >/dev/null 2>&1; then timeout {int(seconds)} {command}; "
            f"else {command}; fi")
