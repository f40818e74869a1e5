"""Programs sparkctl ships into the containers (read as text, written to the node's state dir)."""

from __future__ import annotations

from pathlib import Path

MPI_PROBE = "mpi_probe.py"


def probe_source(name: str = MPI_PROBE) -> str:
    return (Path(__file__).resolve().parent / name).read_text()
