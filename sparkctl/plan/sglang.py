"""PURE SGLang planning: each serving node's `python3 -m sglang.launch_server` line, per the image's SGLang release.

One server per serving node, tensor (and pipeline) parallel across them: every node gets `--nnodes N --node-rank r
--dist-init-addr <head's fabric address>:<serve.sglang.dist_port>` (docs.sglang.io, references/multi_node_deployment);
rank 0 serves the API on the head's loopback, behind the gateway, the others run their scheduler only. Each node's
own address (SGLANG_HOST_IP) and interfaces are in its container's environment (plan/container.py), never passed
from the head. `python3 -m sglang.launch_server` is the entry of every release (`sglang serve` came with 0.5.5.post2).

SGLang reads no config file in every release (`--config` came late): serve.config is the server's flags, on its
command line, so the launch has no config file and its lines are its whole setup.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, ClassVar

from sparkctl.engines import ENGINES
from sparkctl.inventory import Inventory
from sparkctl.inventory.sglang_check import flag_argv
from sparkctl.knowledge.sglang_releases import SglangSchema, SglangVersion, judged_note, release_of, schema_for
from sparkctl.plan.fabric import FabricPlan
from sparkctl.plan.gateway import ENGINE_HOST
from sparkctl.plan.launch import Launch
from sparkctl.plan.paths import draft_dir
from sparkctl.plan.serve_unit import UnitRun, leftovers_script
from sparkctl.plan.world import WorldNames, engine_host, world_names

SERVER = ["python3", "-m", "sglang.launch_server"]
#: SGLang names its processes `sglang::scheduler`, `sglang::detokenizer`... (setproctitle in
#: python/sglang/srt/managers/scheduler.py and detokenizer_manager.py): the ones left in our container after their
#: launch_server ended are ours
PROCESS_TITLE = "^sglang::"


@dataclass(frozen=True, kw_only=True)
class SglangLaunch(Launch):
    config_file: ClassVar[str | None] = None

    flags: dict[str, Any]              # serve.config resolved (flag -> value), the draft's path in it
    argv: dict[str, list[str]]         # serving node -> its launch_server line
    dist: str | None                   # --dist-init-addr, where the ranks meet; None on one node

    def config_text(self) -> str:
        return ""

    def commands(self) -> dict[str, list[str]]:
        return self.argv

    def command_lines(self) -> str:
        """Every serving node's line (`node: ...`): a worker's changed line restarts the world too."""
        return "\n".join(f"{node}: {shlex.join(argv)}" for node, argv in self.argv.items())

    @classmethod
    def leftovers(cls, names: WorldNames) -> str:
        # `[.]` matches the dot in a process's command line but not the script's own text; with no config file of
        # its own, a world's processes are told apart by their marker alone
        return leftovers_script(("sglang[.]launch_server", PROCESS_TITLE), names.marker)

    @classmethod
    def servers(cls, names: WorldNames | None = None) -> tuple[str, ...]:
        return (r"sglang\.launch_server",)

    def unit_run(self, inventory: Inventory, node: str) -> UnitRun:
        spec = inventory.serve_spec()
        names = list(self.argv)
        rank = names.index(node)
        role = "the API server" if rank == 0 else "its scheduler only"
        return UnitRun(
            command=shlex.join(self.argv[node]), config="", ours=self.servers(self.names)[0],
            leftovers=self.leftovers(self.names),
            world=f"SGLang TP={spec.tp_size} x PP={spec.pp_size}, rank {rank} of {len(names)} ({role})", rank=rank)

    def describe(self) -> list[str]:
        release = f"SGLang {self.release}" if self.release else "the image's SGLang (release not known from its tag)"
        out = [f"SGLang: {release}" + (f"; {self.note}" if self.note else ""),
               "no container sshd, mesh or hostfile: SGLang's ranks meet over their own sockets"
               + (f" at {self.dist}" if self.dist else "")]
        if self.dropped:
            out.append(f"left out (the release has no such flag): {', '.join(self.dropped)}")
        for node, argv in self.argv.items():
            out.append(f"--- sglang.launch_server on {node} (in its container)")
            out.append(shlex.join(argv))
        return out

    def configured(self, inventory: Inventory, labels: dict[str, str]) -> SglangLaunch:
        return self  # judged by the image's tag

    def rendezvous(self) -> str | None:
        return self.dist


def sglang_flags(inventory: Inventory, schema: SglangSchema | None) -> tuple[dict[str, Any], list[str]]:
    """serve.config's flags with the draft's path, and the preset's flags the release lacks (left out, not the user's
    to fix; a flag the user wrote and the release lacks is refused by the inventory loader)."""
    spec = inventory.serve_spec()
    flags = json.loads(json.dumps(spec.config))  # a plain deep copy
    if spec.decoding != "none" and spec.draft:
        flags["speculative-draft-model-path"] = draft_dir(spec.draft)
    written = {key.replace("_", "-") for key in inventory.serve.config}
    dropped = [key for key in flags if schema is not None and schema.canonical(f"--{key}") is None
               and key not in written]
    return {k: v for k, v in flags.items() if k not in dropped}, dropped


def sglang_launch(inventory: Inventory, fabric: FabricPlan, release: SglangVersion | None = None) -> SglangLaunch:
    """Every serving node's line, for `release` (the image tag's when None)."""
    release = release or release_of(inventory.container.image)
    schema = schema_for(release) if release else None
    flags, dropped = sglang_flags(inventory, schema)
    spec = inventory.serve_spec()
    nodes = inventory.serving_nodes()
    head, host = nodes[0], engine_host(inventory, fabric)
    dist = None
    if len(nodes) > 1:
        dist = f"{fabric.first_address(head) or inventory.node(head).host}:{inventory.serve.sglang.dist_port}"
    common = [*SERVER, "--model-path", spec.model, "--served-model-name", spec.served_name,
              "--tp-size", str(spec.tp_size), *(["--pp-size", str(spec.pp_size)] if spec.pp_size > 1 else []),
              # the engine's own figures for top, serve status and serve bench (off by default)
              "--enable-metrics"]
    argv: dict[str, list[str]] = {}
    for rank, node in enumerate(nodes):
        multi = ["--nnodes", str(len(nodes)), "--node-rank", str(rank), "--dist-init-addr", dist] if dist else []
        # a worker's own address is never the head's: it keeps loopback (its HTTP side is not asked)
        own = host if rank == 0 else ENGINE_HOST
        argv[node] = [*common, *multi, "--host", own, "--port", str(spec.engine_port), *flag_argv(flags), *spec.args]
    return SglangLaunch(engine=ENGINES["sglang"], names=world_names(inventory), host=host, release=release,
                        dropped=dropped, note=judged_note(release, schema) if release and schema else "",
                        flags=flags, argv=argv, dist=dist)
