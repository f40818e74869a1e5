"""Shared by the inventory tests: a two-node inventory's text, and what loading a file refuses."""

from __future__ import annotations

import pytest

from sparkctl.errors import InventoryError
from sparkctl.exitcodes import ExitStatus
from sparkctl.inventory import load_inventory

PAIR = """\
user: nvidia
nodes:
  - name: spark1
    host: 10.0.0.11
  - name: spark2
    host: 10.0.0.12
"""
#: A pair serving two vLLM worlds, one on each node: the first unnamed (its repo id), the second named `small`.
TWO_VLLM_WORLDS = """\
user: nvidia
nodes:
  - {name: spark1, host: 10.0.0.11}
  - {name: spark2, host: 10.0.0.12}
container: {image: "nvcr.io/nvidia/vllm:26.05-py3"}
serve:
  models:
    - {model: Qwen/Qwen3-8B, engine: vllm, nodes: [spark1]}
    - {model: Qwen/Qwen3-4B, engine: vllm, name: small, nodes: [spark2]}
"""


def problems_of(path) -> list[str]:
    """Every problem loading `path` reports (exit 2, one line each)."""
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert caught.value.exit_status == ExitStatus.BAD_INPUT
    assert str(caught.value) == "\n".join(caught.value.problems)
    return caught.value.problems


def only_problem(path) -> str:
    problems = problems_of(path)
    assert len(problems) == 1, problems
    return problems[0]
