"""The fit check: weights per node at the chosen TP + draft + KV reserve against the node's memory."""

from __future__ import annotations

from sparkctl.inventory.presets import get_preset
from sparkctl.knowledge.fitcheck import fit_verdict, needed_per_node_gb

SPARK_KB = 124_500_000  # MemTotal of a DGX Spark: ~119 GiB usable


def verdict(preset: str, tp: int, mem_kb: int = SPARK_KB):
    p = get_preset(preset)
    return fit_verdict("spark1", p.model, p.weights_gb, tp, p.draft_gb, mem_kb)


def test_qwen3_235b_is_refused_on_one_spark_and_fits_on_two():
    one = verdict("qwen3-235b-eagle3", 1)
    assert one.refused and "does not fit" in one.line and "spark1 has 127.5 GB" in one.line
    assert verdict("qwen3-235b-eagle3", 2).verdict == "fits"


def test_single_spark_presets_fit_one_spark():
    assert verdict("gpt-oss-120b-eagle3", 1).verdict == "fits"
    assert verdict("llama-3.3-70b-draft-target", 1).verdict == "fits"


def test_tight_and_unknown():
    needed = needed_per_node_gb(125, 2, 1)
    assert verdict("qwen3-235b-eagle3", 2, mem_kb=int(needed * 1.05 * 1e9 / 1024)).verdict == "tight"
    assert fit_verdict("spark1", "me/custom", None, 1, None, SPARK_KB).verdict == "unknown"
    assert fit_verdict("spark1", "m", 10, 1, None, 0).verdict == "unknown"
