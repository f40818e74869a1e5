"""PURE: the mpirun lines sparkctl runs from the head container, and the MPI probe it ships into them."""

from __future__ import annotations

from pathlib import Path

from sparkctl.plan.paths import CONTAINER_STATE, HOSTFILE_PATH
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

MPIRUN_TIMEOUT = 60.0


def mpirun_timeout(ranks: int) -> float:
    """How long an mpirun over `ranks` nodes may take: ORTE starts one daemon per node over ssh and every rank
    starts a Python (a 16-node probe took ~20 s on the lab's two busy cores); a limit sized for 2 nodes would
    fail a healthy big cluster under load."""
    return MPIRUN_TIMEOUT + 4.0 * max(0, int(ranks))
MPI_PROBE = "mpi_probe.py"
# Enough for a real cross-node sum and for the tx counters to show which interface carried it (a few
# hundred KiB against the ~KiB of ORTE chatter); a bandwidth figure is NCCL's business, not this probe's.
PROBE_DOUBLES = 1 << 16          # 512 KiB per rank per round
PROBE_ROUNDS = 2


def probe_source() -> str:
    """mpi_probe.py's text, written to the node's state dir (mounted in the container)."""
    return (Path(__file__).resolve().parent / MPI_PROBE).read_text()


def probe_program(result: str) -> str:
    """The probe, rank 0 writing its report to `result` (a shell word, e.g. "$_r")."""
    return f"python3 {CONTAINER_STATE}/{MPI_PROBE} {PROBE_DOUBLES} {PROBE_ROUNDS} {result}"


def probe_shell(ranks: int, framing: Framing, seconds: float | None = None) -> str:
    """Shell for the head's container: the probe over mpirun; section `probe` holds mpirun's own output (for the
    error message), section `probe-result` the report rank 0 wrote (a file: never mpirun's chunked stdout)."""
    run = timed(mpirun_line(ranks, probe_program('"$_r"')), mpirun_timeout(ranks) if seconds is None else seconds)
    return "\n".join([
        '_r=$(mktemp /tmp/sparkctl-probe.XXXXXX 2>/dev/null || echo /tmp/sparkctl-probe.$$); rm -f "$_r"',
        framing.section("probe", f"{run} 2>&1"),
        framing.section("probe-result", 'cat "$_r"'),
        'rm -f "$_r" "$_r.part"'])


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
