"""model.fit: refuse a model that cannot fit the nodes before anything is downloaded."""

from __future__ import annotations

from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.knowledge.fitcheck import fit_verdict, refusal_hint
from sparkctl.rules.serving import serves, serving_enabled
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.worlds import world_inventories


class ModelFitTask(Task[ClusterContext, None]):
    name = "model.fit"
    phase = "model"
    scope = Scope.CLUSTER
    needs = ("preflight.node",)
    description = "refuse a model that cannot fit before anything is downloaded"
    checks = ("per node: the target's weights / tp_size + the draft + a KV-cache reserve against the node's "
              "MemTotal; refused when larger, a warning above 90%")
    changes = "nothing (read-only)"
    needs_every_node = False  # judged on each node's memory as last read

    def check(self, ctx: ClusterContext) -> list[Change[None]]:
        if not serving_enabled(ctx.inventory):
            return []
        facts_by_node = ctx.facts_by_node()
        for inv in world_inventories(ctx.inventory):
            self._check_world(ctx, inv, facts_by_node)
        return []

    def _check_world(self, ctx: ClusterContext, inv: Inventory, facts_by_node: dict[str, Facts]) -> None:
        """One world's model against each of its nodes' memory (several models on a node are summed by `inventory
        validate`, against a Spark's usable memory)."""
        spec = inv.serve_spec()
        ranks = min(spec.world_size, len(inv.nodes))  # each rank holds 1/(tp x pp) of the weights
        refused = []
        for name, facts in facts_by_node.items():
            if not serves(inv, name):
                continue
            verdict = fit_verdict(name, spec.model, spec.weights_gb, ranks, spec.draft_gb, facts.mem_total_kb)
            if verdict.refused:
                refused.append(verdict.line)
            elif verdict.verdict in ("tight", "unknown"):
                ctx.warn(verdict.line, task=self.name)
            else:
                ctx.emit(Event(event="log", task=self.name, node=name, message=verdict.line))
        if not refused:
            return
        hint = refusal_hint(spec.tp_size, len(inv.nodes))
        if inv.serve.fit_check == "warn":
            ctx.warn(f"{refused[0]} (going on: serve.fit_check is warn)", task=self.name)
            return
        raise TaskFailed(refused[0], hint=f"{hint}; serve.fit_check: warn to try anyway", details=refused[1:])
