"""container.relay (container.distribute: relay): the engine's image pulled once, by the head, and sent to each
peer over the fabric: `docker save | ssh <peer fabric ip> docker load`, run on the head with the cluster key that
ssh.mesh set up. No peer contacts a registry (an image of tens of GB is pulled once, over one internet line), and
each peer ends with the head's image ID, which the task checks after the load.

Idempotent: a peer that holds the head's image ID is ok (the facts' `docker inspect`: no round trip of its own).
"""

from __future__ import annotations

import time

from sparkctl.plan.ssh import FABRIC_SSH_OPTIONS, peer_route
from sparkctl.rules.serving import relay_mode
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.container.image import PULL_TIMEOUT
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.model.progress import TransferProgress, human_bytes, rate_text
from sparkctl.transport.base import q


def _short(image_id: str | None) -> str:
    return (image_id or "none").split(":", 1)[-1][:12]


def relay_script(ref: str, target: str, extra_options: str, counter: str) -> str:
    """Run on the head: the image as `docker save` writes it, through dd (its byte count, every second, in
    `counter`, for the progress line), into `docker load` on the peer."""
    ssh = f"ssh {FABRIC_SSH_OPTIONS} {extra_options}".strip()
    return "\n".join([
        "set -o pipefail",
        f"docker save {q(ref)} | dd bs=4M status=progress 2>{q(counter)} | {ssh} {q(target)} 'docker load'",
        "rc=$?",
        f"rm -f {q(counter)}",
        "exit $rc",
    ])


class ContainerRelayTask(Task[ClusterContext, str]):
    name = "container.relay"
    phase = "container"
    scope = Scope.CLUSTER
    needs = ("container.image",)
    # a peer lost mid-run is left out; the others still get the image
    needs_every_node = False
    description = "container.distribute: relay: send the head's image to the peers over the fabric"
    checks = ("every peer holds the image with the head's image ID (docker inspect, with the facts); nothing to do "
              "with container.distribute: pull")
    changes = ("run on the head: `docker save <image> | ssh <peer fabric ip> docker load` with the cluster key, with "
               "the bytes so far every few seconds; then the peer's image ID must be the head's")

    def check(self, ctx: ClusterContext) -> list[Change[str]]:
        inv = ctx.inventory
        if not relay_mode(inv):
            return []
        ref, head = inv.container.image, ctx.head()
        theirs = head.facts().images.get(ref)
        changes = []
        for name, node in ctx.nodes.items():
            if name == head.name or name in ctx.lost:
                continue
            have = node.facts().images.get(ref)
            if theirs is not None and have == theirs:
                continue
            why = f"it has {_short(have)}" if have else "it has none"
            what = f"image {_short(theirs)}" if theirs else f"once {head.name} has pulled it"
            changes.append(Change(f"relay {ref} ({what}) from {head.name} to {name} over the fabric ({why})",
                                  payload=name, node=name))
        return changes

    def apply(self, ctx: ClusterContext, changes: list[Change[str]]) -> None:
        inv = ctx.inventory
        ref, head = inv.container.image, ctx.head()
        wanted = head.facts().images.get(ref)
        size = head.run(f"docker image inspect --format '{{{{.Size}}}}' {q(ref)}", timeout=60).stdout.strip()
        total = int(size) if size.isdigit() else None
        for change in changes:
            peer = change.carried()
            target, extra = peer_route(inv, ctx.plan().fabric, head.name, peer)
            counter = f"/tmp/sparkctl-relay-{peer}.bytes"
            started = time.monotonic()

            def sent(path: str = counter) -> int | None:
                out = head.run(f"tr '\\r' '\\n' < {q(path)} 2>/dev/null | grep -o '^[0-9]* bytes' | tail -n 1 "
                               "| cut -d' ' -f1", timeout=30).stdout.strip()
                return int(out) if out.isdigit() else None

            with TransferProgress(ctx.emit, task=self.name, node=peer, what=f"{ref} from {head.name}",
                                  measure=sent, total=total):
                result = head.run(relay_script(ref, target, extra, counter), timeout=PULL_TIMEOUT)
            node = ctx.nodes[peer]
            node.invalidate()
            if not result.ok:
                tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
                raise TaskFailed(f"relaying {ref} from {head.name} to {peer} failed (exit {result.exit_code})",
                                 hint=f"rerun; `docker save {ref}` on {head.name} and `docker load` on {peer} "
                                      "must work as the login user, over the fabric with the cluster key",
                                 details=tail)
            have = node.facts().images.get(ref)
            if have != wanted:
                raise TaskFailed(f"{peer} loaded {ref} as image {_short(have)}, not {head.name}'s {_short(wanted)}",
                                 hint=f"remove the image on {peer} (`docker rmi {ref}`) and rerun")
            seconds = time.monotonic() - started
            ctx.emit(Event("log", task=self.name, node=peer, message=(
                f"relayed {ref} from {head.name} to {peer} ({target}): {human_bytes(total or 0)} in {seconds:.1f}s, "
                f"{rate_text(total or 0, seconds)}"),
                data={"relay": {"image": ref, "from": head.name, "bytes": total, "seconds": round(seconds, 3)}}))
