"""PURE: will the model fit? Weights per node at the chosen TP, plus the draft and a KV-cache reserve,
against each node's memory (read from the node), before anything is downloaded.

A Spark's GPU shares its 128 GB with the system (about 119-121 GiB usable), so MemTotal is the budget.
Qwen3-235B-A22B-FP4 (~125 GB) plus its Eagle3 head and a KV cache does not fit one Spark: hence TP=2.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
#: Kept free for the KV cache, activations, CUDA graphs and the OS: the smallest KV cache worth serving with.
KV_RESERVE_GB = 8.0
#: What a Spark's MemTotal shows before anything is read from it (for a check made before any node is asked, as
#: `inventory validate`'s): its 128 GB of unified memory less the firmware's and the kernel's share, about 119-121
#: GiB on DGX OS; the lower end, so that a plan that passes here is not refused by the node.
SPARK_USABLE_GB = 119 * 2**30 / GB
#: Above this share of the node's memory the fit is tight: it may work, or run out of memory at load.
TIGHT_SHARE = 0.9


@dataclass(frozen=True)
class FitVerdict:
    node: str
    verdict: str  # "fits", "tight", "refused", "unknown"
    needed_gb: float | None
    memory_gb: float
    line: str

    @property
    def refused(self) -> bool:
        return self.verdict == "refused"


def needed_per_node_gb(weights_gb: float, tp_size: int, draft_gb: float | None,
                       kv_reserve_gb: float = KV_RESERVE_GB) -> float:
    """Each rank holds 1/tp of the target's weights and a whole copy of the draft."""
    return weights_gb / max(1, tp_size) + (draft_gb or 0.0) + kv_reserve_gb


def fit_verdict(node: str, model: str, weights_gb: float | None, tp_size: int, draft_gb: float | None,
                mem_total_kb: int) -> FitVerdict:
    memory_gb = mem_total_kb * 1024 / GB
    if weights_gb is None:
        return FitVerdict(node, "unknown", None, memory_gb,
                          f"{node}: size of {model} unknown (not a preset's model): fit not checked")
    if mem_total_kb <= 0:
        return FitVerdict(node, "unknown", None, memory_gb, f"{node}: memory size unknown: fit not checked")
    needed = needed_per_node_gb(weights_gb, tp_size, draft_gb)
    parts = (f"{weights_gb:g} GB weights / TP {tp_size} + {draft_gb or 0:g} GB draft + {KV_RESERVE_GB:g} GB "
             f"KV reserve = {needed:.1f} GB per node, {node} has {memory_gb:.1f} GB")
    if needed > memory_gb:
        return FitVerdict(node, "refused", needed, memory_gb, f"{model} does not fit: {parts}")
    if needed > TIGHT_SHARE * memory_gb:
        return FitVerdict(node, "tight", needed, memory_gb, f"{model} fits tightly: {parts}")
    return FitVerdict(node, "fits", needed, memory_gb, f"{model} fits: {parts}")


def refusal_hint(tp_size: int, node_count: int) -> str:
    if tp_size < 2 or node_count < 2:
        return ("serve it with tensor parallelism across two Sparks (preset qwen3-235b-eagle3, TP=2), or choose "
                "a smaller model (e.g. preset gpt-oss-120b-eagle3)")
    return "add nodes and raise serve.tp_size, or choose a smaller model"
