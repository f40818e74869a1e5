"""serve.switch and serve.record: a serving cluster's deployment (sparkctl/plan/deployment.py) switched only
once its image is the same on every node, and recorded once it answered.

serve.switch runs between the pull (container.image, while the old world keeps serving) and the first container
that would be made again: the image's ID must be the same on every node, else nothing is switched. It marks the
switch on the head; bootstrap goes back to the deployment in use when the new world fails (runs/rollback.py).
serve.record, after the smoke test, writes the deployment that answered and keeps the one before it.

Both read the head's record once (`cat`, read ahead with the facts on a rerun): a no-op adds no round trip.
"""

from __future__ import annotations

import hashlib
import time

from sparkctl.plan.deployment import COPY_KEY, Deployment, DeploymentRecord, deployment_inputs
from sparkctl.rules.serving import serves, serving_enabled
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext, NodeContext
from sparkctl.tasks.model.cache import hub_repo_dir
from sparkctl.tasks.serve.config import desired_launch
from sparkctl.tasks.serve.server import ServerHandle
from sparkctl.tasks.worlds import cluster_worlds
from sparkctl.transport.base import q, text_of
from sparkctl.transport.framing import Framing


def _short(image_id: str | None) -> str:
    return (image_id or "absent").split(":", 1)[-1][:12]


def agreed_image(ctx: ClusterContext) -> tuple[str | None, str | None, list[str]]:
    """(image ID, digest) of the inventory's image, the same on every node that holds it, and the nodes that do not
    hold it (a pull that failed or was not reached; --check: not pulled yet); TaskFailed where it differs (the tag
    moved between pulls, or someone pulled by hand on one node). A node lost mid-run is not asked."""
    ref = ctx.inventory.container.image
    ids = {name: node.facts().images.get(ref) for name, node in ctx.nodes.items() if name not in ctx.lost}
    found = {i for i in ids.values() if i}
    if len(found) > 1:
        by_id: dict[str, list[str]] = {}
        for name, image_id in ids.items():
            by_id.setdefault(_short(image_id), []).append(name)
        odd = min(by_id.values(), key=len)
        raise TaskFailed(f"{ref} is not the same image on every node ("
                         + "; ".join(f"{i} on {', '.join(n)}" for i, n in by_id.items()) + "): nothing was switched",
                         hint=f"the tag moved between pulls: pin container.image by digest ({ref.split(':')[0]}"
                              f"@sha256:...), or `docker pull {ref}` on {', '.join(odd)} and rerun")
    head = ctx.head().facts()
    return (found.pop() if found else None), head.image_digests.get(ref), [n for n, i in ids.items() if not i]


def planned_deployment(ctx: ClusterContext, revision: str | None = None,
                       agreed: tuple[str | None, str | None, list[str]] | None = None) -> Deployment:
    inv = ctx.inventory
    image_id, digest, _without = agreed or agreed_image(ctx)
    return Deployment(image=inv.container.image, image_id=image_id, digest=digest, engine=inv.engine().name,
                      model=", ".join(m.spec.model for m in inv.served_models()), fingerprint=worlds_fingerprint(ctx),
                      inputs=deployment_inputs(inv), revision=revision)


def worlds_fingerprint(ctx: ClusterContext) -> str:
    """What the deployment's worlds are started from: the one world's launch fingerprint, or of several, one over
    each world's (any world's changed launch is a new deployment)."""
    worlds = cluster_worlds(ctx)
    if len(worlds) == 1:
        return desired_launch(worlds[0].head())[2]
    each = "\n".join(f"{w.inventory.world_key}:{desired_launch(w.head())[2]}" for w in worlds)
    return hashlib.sha256(each.encode()).hexdigest()[:16]


def record_path(head: NodeContext) -> str:
    return ServerHandle.of(head).deployments_path


def read_record(head: NodeContext, task: str) -> tuple[DeploymentRecord, str | None]:
    """The head's record and the model's revision in its hub cache (None: not there), one read."""
    model = head.inventory.served_models()[0].spec.model
    framing = Framing()
    script = "\n".join([framing.section("record", text_of(q(record_path(head))) + "; true"),
                        framing.section("revision", text_of(f"{q(hub_repo_dir(head, model))}/refs/main") + "; true"),
                        "true"])
    texts = Framing.texts_of(framing.split(head.read(task, script, framing).stdout))
    return DeploymentRecord.parse(texts.get("record", "")), texts.get("revision", "").strip() or None


def write_record(head: NodeContext, record: DeploymentRecord) -> None:
    head.must(f"install -d -m 755 {q(ServerHandle.of(head).dir)}", "making the serving state dir")
    head.transport.put(record_path(head), record.text(), mode=0o644)


def keep_copy(ctx: ClusterContext, record: DeploymentRecord) -> None:
    if ctx.records is not None and not ctx.options.check and ctx.records.get(COPY_KEY) != record.text():
        ctx.records.put(COPY_KEY, record.text())


class ServeSwitchTask(Task[ClusterContext, DeploymentRecord]):
    name = "serve.switch"
    phase = "container"
    scope = Scope.CLUSTER
    needs = ("container.image", "container.relay")
    # a node that failed or was lost does not stop the others' containers when nothing is switched; when something
    # is, the check refuses while any node lacks the new image
    needs_every_node = False
    description = ("switch the serving world to a new deployment only once its image is the same on every node, "
                   "and mark the switch so a new world that fails is rolled back")
    checks = ("the inventory's image has one ID on every node (docker image inspect, with the facts); the planned "
              "deployment (image ID, launch fingerprint) against the one in use in the head's "
              "<state>/run/serve/deployments.json (read ahead with its facts on a rerun)")
    changes = ("marks the switch in the head's record (the old world keeps serving until its container is made "
               "again); when a later task of the run fails while the mark stands, bootstrap puts the deployment in "
               "use back and the run fails with \"rolled back\"")

    def check(self, ctx: ClusterContext) -> list[Change[DeploymentRecord]]:
        if not serving_enabled(ctx.inventory):
            return []
        head = ctx.head()
        agreed = agreed_image(ctx)
        planned = planned_deployment(ctx, agreed=agreed)
        record, _revision = read_record(head, self.name)
        current = record.current
        if current is None or planned.same_world(current) or planned.same_world(record.switching):
            return []
        without = agreed[2]
        serving = [n.name for n in ctx.inventory.nodes if serves(ctx.inventory, n.name)]
        missing = [n for n in without if n in serving] + [n for n in serving if n in ctx.lost]
        if missing and not ctx.options.check:
            raise TaskFailed(f"{ctx.inventory.container.image} is not on {', '.join(missing)} (its pull failed or "
                             "did not run): nothing was switched, the old world serves",
                             hint="fix what stopped the pull there (the run says), then rerun")
        what = "image" if planned.image_id != current.image_id else "launch (config or command line)"
        pulled = "" if planned.image_id else " (to be pulled)"
        return [Change(f"switch the deployment ({what} changed): from {current.summary()} to "
                       f"{planned.summary()}{pulled}", payload=record.begun(planned), node=head.name)]

    def apply(self, ctx: ClusterContext, changes: list[Change[DeploymentRecord]]) -> None:
        head = ctx.head()
        try:
            write_record(head, changes[0].carried())
        finally:
            head.invalidate()



class ServeRecordTask(Task[ClusterContext, DeploymentRecord]):
    name = "serve.record"
    phase = "serve"
    scope = Scope.CLUSTER
    needs = ("serve.smoke",)
    description = "record the deployment that answered on the head, keeping the one before it"
    checks = ("the head's <state>/run/serve/deployments.json names the planned deployment (image, ID, digest, "
              "launch, the model's revision in the head's cache) as the one in use, with no switch under way; one "
              "read of the head, read ahead with its facts on a rerun")
    changes = ("writes the record: the planned deployment in use, the one it replaced kept as the previous "
               "(`sparkctl serve rollback` goes back to it)")

    def check(self, ctx: ClusterContext) -> list[Change[DeploymentRecord]]:
        if not serving_enabled(ctx.inventory):
            return []
        head = ctx.head()
        record, revision = read_record(head, self.name)
        planned = planned_deployment(ctx, revision)
        if record.switching is None and planned.same(record.current):
            keep_copy(ctx, record)
            return []
        now = record.answered(planned, time.time())
        assert now.current is not None
        verb = "record" if not planned.same_world(record.current) else "update"
        return [Change(f"{verb} the deployment in use: {now.current.summary()}", payload=now, node=head.name)]

    def apply(self, ctx: ClusterContext, changes: list[Change[DeploymentRecord]]) -> None:
        head = ctx.head()
        try:
            write_record(head, changes[0].carried())
            keep_copy(ctx, changes[0].carried())
        finally:
            head.invalidate()
