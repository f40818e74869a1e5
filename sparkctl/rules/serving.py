"""PURE: whether a cluster serves a model, and how the model reaches its nodes (tasks and doctor alike)."""

from __future__ import annotations

from sparkctl.inventory import Inventory


def serving_enabled(inventory: Inventory) -> bool:
    """Serving is set up only for an inventory with a `serve:` section (a bare cluster is a valid goal)."""
    return "serve" in inventory.model_fields_set


def copy_mode(inventory: Inventory) -> bool:
    """serve.distribute: copy: the head downloads once and sends the snapshots to the peers over the fabric."""
    return serving_enabled(inventory) and inventory.serve.distribute == "copy" and len(inventory.nodes) > 1
