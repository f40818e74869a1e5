"""Where the models of serve.models run, for `inventory validate`: each model's worlds, then what each node holds."""

from __future__ import annotations

from typing import Any

from sparkctl.inventory.placement import ServedModel, node_loads
from sparkctl.knowledge.fitcheck import SPARK_USABLE_GB


def placement_lines(models: list[ServedModel]) -> list[str]:
    lines = []
    for model in models:
        worlds = ", ".join("+".join(w.nodes) for w in model.worlds)
        also = f" (also {', '.join(model.aliases)})" if model.aliases else ""
        lines.append(f"model {model.name}{also}: {model.spec.engine}, tp_size {model.spec.tp_size}, on {worlds}")
    for node, held in node_loads(models).items():
        known = [gb for _, gb in held if gb is not None]
        unknown = len(held) - len(known)
        size = f"{sum(known):.1f} of {SPARK_USABLE_GB:.1f} GB" + (f", {unknown} of unknown size" if unknown else "")
        lines.append(f"node {node}: {', '.join(m.name for m, _ in held)} ({size})")
    return lines


def placement_data(model: ServedModel) -> dict[str, Any]:
    return {"name": model.name, "aliases": list(model.aliases), "engine": model.spec.engine,
            "model": model.spec.model, "tp_size": model.spec.tp_size, "needed_gb_per_node": model.needed_gb,
            "worlds": [list(w.nodes) for w in model.worlds]}
