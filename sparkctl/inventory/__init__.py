"""The inventory: the model, its loader (every problem at once, as file:line), checks, presets."""

from sparkctl.inventory.loader import load_inventory
from sparkctl.inventory.model import Inventory, SshTarget, dump_inventory, inventory_json_schema
from sparkctl.inventory.sections import Node
from sparkctl.inventory.serve import ServeSpec

__all__ = ["Inventory", "Node", "ServeSpec", "SshTarget", "dump_inventory", "inventory_json_schema", "load_inventory"]
