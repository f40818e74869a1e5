"""A fabric bench record as sparkctl keeps it, for the tests of the history and of doctor's regressions."""

from __future__ import annotations

from sparkctl.plan.bench import link_settings, nccl_settings

LINK = "spark1 enP2p1s0f1np1 -> spark2 enP2p1s0f1np1"


def bench(time: str, gbps: float, busbw: float = 22.0, method: str = "rdma", nccl_max: int = 256 << 20) -> dict:
    settings = link_settings(method)
    return {"time": time, "nodes": ["spark1", "spark2"],
            "links": [{"key": LINK, "client": "spark1", "gbps": gbps, "summary": f"{gbps} Gb/s", "method": method,
                       "settings": settings},
                      {"key": "spark1 enp1s0f1np1 -> spark2 enp1s0f1np1", "client": "spark1", "gbps": 93.0,
                       "method": method, "settings": settings}],
            "nccl": {"busbw": busbw, "summary": "ok",
                     "settings": nccl_settings("1M", str(nccl_max), ["spark1", "spark2"])}}
