"""sparkctl's MPI probe, run by mpirun in the containers (one rank per node).

Each rank reports its hostname, the settings it saw and the interfaces whose tx byte counters grew
during an allreduce (the interface Open MPI really used); rank 0 checks the sum and writes one JSON report to
the file named by its third argument (atomically: a temp file renamed).

Not to stdout: mpirun forwards a rank's output in chunks of at most 4 KiB (ORTE_IOF_BASE_MSG_MAX) and, with
--tag-output, puts its `[1,0]<stdout>:` tag before EVERY chunk, mid-line. At 16 ranks the report is ~7 KiB, so
the tag landed inside it: between two tokens (the JSON no longer parsed) or inside a key such as
"OMPI_MCA_oob_tcp_if_include" (the rank then seemed to have that setting unset).
Only the Python standard library and mpi4py: it runs in any image that has them.
"""

import array
import json
import os
import socket
import sys
import time

SETTINGS = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "UCX_NET_DEVICES", "OMPI_MCA_btl_tcp_if_include",
            "OMPI_MCA_oob_tcp_if_include")


def tx_bytes():
    counters = {}
    for name in os.listdir("/sys/class/net"):
        try:
            with open(f"/sys/class/net/{name}/statistics/tx_bytes") as handle:
                counters[name] = int(handle.read())
        except (OSError, ValueError):
            continue
    return counters


def main():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20  # doubles per rank
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    result = sys.argv[3] if len(sys.argv) > 3 else None
    send = array.array("d", [float(rank + 1)]) * count
    recv = array.array("d", [0.0]) * count
    comm.Barrier()
    before = tx_bytes()
    started = time.perf_counter()
    for _ in range(rounds):
        comm.Allreduce([send, MPI.DOUBLE], [recv, MPI.DOUBLE], op=MPI.SUM)
    elapsed = time.perf_counter() - started
    after = tx_bytes()
    expected = size * (size + 1) / 2
    first, last = recv[0], recv[-1]
    moved = {name: after[name] - before.get(name, after[name]) for name in after}
    report = {
        "rank": rank, "hostname": socket.gethostname(),
        "env": {k: os.environ.get(k) for k in SETTINGS},
        "tx_bytes": {k: v for k, v in moved.items() if v > 0 and k != "lo"},
        "sum_ok": first == expected and last == expected,
        "seconds": elapsed,
    }
    reports = comm.gather(report, root=0)
    if rank == 0:
        payload = 8 * count * rounds
        text = json.dumps({"size": size, "bytes": payload, "seconds": max(r["seconds"] for r in reports),
                           "expected_sum": expected, "ranks": reports})
        if result is None:
            print(text, flush=True)
            return
        with open(result + ".part", "w") as handle:
            handle.write(text + "\n")
        os.replace(result + ".part", result)


if __name__ == "__main__":
    main()
