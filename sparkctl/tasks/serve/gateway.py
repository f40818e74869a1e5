"""serve.gateway: NGINX on the head in front of the engine (sparkctl/plan/gateway.py): the key checked on every
path but /health, answering on serve.listen's addresses only, coming back with the node (restart policy).

Idempotent: the config on the head has the planned content (judged by its sha256: the key never travels back),
the container runs from the planned spec and listens on every planned address; a new config (a rotated key,
another address) is reloaded in place (`nginx -s reload` in the container: NGINX's graceful reload), the rest
recreated. Not `docker kill -s HUP`: Docker marks a container it sent any signal but the image's STOPSIGNAL as
stopped by hand (moby's daemon/kill.go, ExitOnNext), and `unless-stopped` then leaves it down at the next boot.
"""

from __future__ import annotations

import hashlib
import shlex
import time
from typing import Literal

from sparkctl.facts.parse import listening_on
from sparkctl.inventory import Inventory
from sparkctl.inventory.tls_files import TlsFiles, TlsUnreadable, tls_files
from sparkctl.plan.collector import COLLECTOR_CONTAINER, is_collector
from sparkctl.plan.container import SPEC_LABEL
from sparkctl.plan.gateway import GATEWAY_CONTAINER, GatewaySpec, ListenUnknown, gateway_dir, gateway_spec
from sparkctl.rules.serving import serving_enabled
from sparkctl.secrets import MASK
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.container.retire import labelled_script
from sparkctl.tasks.container.run import remove_command
from sparkctl.tasks.context import ClusterContext, NodeContext
from sparkctl.tasks.serve.api_key import api_key, key_path
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

#: what one change asks apply to do
GatewayAction = Literal["key", "config", "create", "start", "reload"]
LISTEN_WAIT_S = 15.0
#: what the removal's check prints when the gateway's folder is there (no container is named so: `sparkctl-` names)
FOLDER_FOUND = "gateway-folder"
#: stands for a key not made yet in what `--check` shows (shown masked, like any key)
NO_KEY_YET = "0" * 43


def head_gateway(head: NodeContext) -> GatewaySpec:
    try:
        return gateway_spec(head.inventory, head.facts(), head.state_dir(), hosts=head.plan().hosts)
    except ListenUnknown as exc:
        raise TaskFailed(f"the endpoint's address on {head.name} cannot be told: {exc}",
                         hint="name it in the inventory: serve.listen: [<the head's address>]") from None


def _files_hash(*contents: str) -> str:
    """The sha256 of each of the config and the router, or of serve.tls's files, as the head's one `sha256sum` of
    them prints them (_hashes)."""
    return " ".join(hashlib.sha256(content.encode()).hexdigest() for content in contents)


def _hashes(text: str) -> str:
    """`sha256sum`'s lines: their hashes, in order (a name it had to escape puts a `\\` before its line)."""
    return " ".join(line.split()[0].lstrip("\\") for line in text.splitlines() if line.strip())


def head_tls(inventory: Inventory) -> TlsFiles | None:
    """serve.tls's certificate and key as they are on this machine now (None: plain HTTP)."""
    tls = inventory.serve.tls
    if tls is None:
        return None
    try:
        return tls_files(tls)
    except TlsUnreadable as exc:
        raise TaskFailed(exc.message, hint=exc.hint) from None


class ServeGatewayTask(Task[ClusterContext, GatewayAction]):
    name = "serve.gateway"
    phase = "serve"
    scope = Scope.CLUSTER
    # the collector first: the first world's is the gateway's /metrics
    needs = ("serve.launch", "serve.collector")
    description = "put NGINX in front of the engine on the head: the API key on every path, the chosen addresses"
    checks = ("<state>/gateway/nginx.conf and router.js (njs: a request's `model` picks its world), and serve.tls's "
              "certificate and key, on the head have the planned content (their sha256: no key travels back), the "
              "sparkctl-gateway container runs from the planned spec (image, mount, command, --restart unless-stopped; "
              "as the head's facts inspected it) and listens on every address serve.listen names (default: the "
              "head's management address), on the serve port; one read of the head, on a rerun read ahead with its "
              "facts")
    changes = ("makes the cluster's API key when there is none (0600 on this machine), writes the config and "
               "serve.tls's files (mode 600, content on stdin), has NGINX test them (`nginx -t`), reloads it in place "
               "(`nginx -s reload`) or runs the container again")

    def check(self, ctx: ClusterContext) -> list[Change[GatewayAction]]:
        inv = ctx.inventory
        if not serving_enabled(inv):
            return []
        head = ctx.head()
        spec = head_gateway(head)
        key = api_key(inv)
        changes: list[Change[GatewayAction]] = []
        if key is None and spec.authenticated:
            changes.append(Change(f"make the endpoint's API key (kept 0600 in {key_path(inv.cluster.name)})",
                                  node=head.name, payload="key"))
        framing = Framing()
        state = framing.split(head.read(self.name, self._read_script(spec, framing), framing, timeout=30).stdout)
        texts = Framing.texts_of(state)
        have_hash, have_tls = _hashes(texts.get("config", "")), _hashes(texts.get("tls", ""))
        # the container as the head's facts inspected it (their one `docker inspect`: tasks/context.py)
        container = head.facts().containers.get(GATEWAY_CONTAINER)
        inspected = container is not None and container.exists
        running = container is not None and container.running
        label = container.labels.get(SPEC_LABEL, "") if container is not None else ""
        policy = (container.restart_policy or "") if container is not None else ""
        shown_key = key or NO_KEY_YET
        want = spec.config(shown_key)
        tls = head_tls(inv)
        if (spec.authenticated and key is None) or _files_hash(want, spec.router()) != have_hash:
            before = "(absent)\n" if not have_hash else "(another config: its content stays on the node)\n"
            scheme = f"https, {tls.info.subject}" if tls else "http"
            changes.append(Change(f"write the gateway's config on {head.name} (listen "
                                  f"{', '.join(spec.listen)}:{spec.port} {scheme}, auth {inv.serve.auth})",
                                  diff=unified_diff("nginx.conf", before, want.replace(shown_key, MASK)),
                                  node=head.name, payload="config"))
        elif tls and _files_hash(tls.certificates, tls.key) != have_tls:
            changes.append(Change(f"write serve.tls's certificate ({tls.info.subject}, until {tls.info.ends()}) and "
                                  f"key on {head.name}", node=head.name, payload="config"))
        if not inspected or label != spec.spec_hash() or policy != "unless-stopped":
            why = "absent" if not inspected else "made from another spec"
            changes.append(Change(f"run the gateway container {GATEWAY_CONTAINER} on {head.name} ({why})",
                                  node=head.name, payload="create"))
        elif not running:
            changes.append(Change(f"start the gateway container {GATEWAY_CONTAINER} on {head.name}",
                                  node=head.name, payload="start"))
        else:
            missing = set(spec.bound) - listening_on(texts.get("listening", ""), spec.port)
            if missing:
                changes.append(Change(f"the gateway on {head.name} does not listen on "
                                      f"{', '.join(sorted(missing))}:{spec.port}: reload it", node=head.name,
                                      payload="reload"))
        return changes

    @staticmethod
    def _read_script(spec: GatewaySpec, framing: Framing) -> str:
        files = " ".join(q(path) for path in spec.tls_paths) if spec.tls else ""
        return "\n".join([
            framing.section("config", f"[ -f {q(spec.config_path)} ] && sha256sum {q(spec.config_path)} "
                                      f"{q(spec.router_path)} 2>/dev/null"),
            *([framing.section("tls", f"[ -f {q(spec.tls_paths[0])} ] && sha256sum {files} 2>/dev/null")]
              if spec.tls else []),
            framing.section("listening", f"ss -ltnH 'sport = :{int(spec.port)}'"),
            "true"])

    def apply(self, ctx: ClusterContext, changes: list[Change[GatewayAction]]) -> None:
        head = ctx.head()
        spec = head_gateway(head)
        key = api_key(ctx.inventory, create=True)
        actions: set[GatewayAction | None] = {c.payload for c in changes}
        head.must(f"install -d -m 700 {q(spec.config_dir)}", f"making {spec.config_dir}")
        head.transport.put(spec.router_path, spec.router(), mode=0o600)
        tls = head_tls(ctx.inventory)
        if tls:
            for path, content in zip(spec.tls_paths, (tls.certificates, tls.key), strict=True):
                head.transport.put(path, content, mode=0o600)
        else:
            head.run(f"rm -f {' '.join(q(path) for path in spec.tls_paths)}", timeout=30)
        head.transport.put(spec.config_path, spec.config(key), mode=0o600)
        try:
            if "create" in actions:
                head.run(f"docker stop -t 0 {GATEWAY_CONTAINER} >/dev/null 2>&1; "
                         f"docker rm -f {GATEWAY_CONTAINER} >/dev/null 2>&1; true", timeout=60)
                head.must(shlex.join(spec.run_argv()), f"docker run {GATEWAY_CONTAINER}", timeout=300)
            elif "start" in actions:
                head.must(f"docker start {GATEWAY_CONTAINER}", f"docker start {GATEWAY_CONTAINER}", timeout=60)
            elif actions & {"config", "key", "reload"}:
                # `nginx -s reload` succeeds even when the master refuses the new files and keeps serving the old
                tested = head.run(shlex.join(spec.test_argv()) + " 2>&1", timeout=60)
                if not tested.ok:
                    raise TaskFailed(f"NGINX on {head.name} refuses the gateway's new files; it keeps serving the "
                                     "ones before", details=tested.stdout.strip().splitlines()[-5:])
                head.must(shlex.join(spec.reload_argv()), f"reloading {GATEWAY_CONTAINER}", timeout=60)
            self._wait_listening(head, spec)
        finally:
            head.invalidate()

    @staticmethod
    def _wait_listening(head: NodeContext, spec: GatewaySpec) -> None:
        deadline = time.monotonic() + LISTEN_WAIT_S
        while True:
            listening = listening_on(head.run(f"ss -ltnH 'sport = :{int(spec.port)}'", timeout=15).stdout, spec.port)
            missing = set(spec.bound) - listening
            if not missing:
                return
            if time.monotonic() > deadline:
                log = head.run(f"docker logs --tail 5 {GATEWAY_CONTAINER} 2>&1", timeout=30).stdout.strip()
                raise TaskFailed(f"the gateway on {head.name} does not listen on {', '.join(sorted(missing))}:"
                                 f"{spec.port} after {LISTEN_WAIT_S:g} s",
                                 hint="is that address the head's? (serve.listen)",
                                 details=log.splitlines()[-5:])
            time.sleep(0.3)


class GatewayRemoveTask(Task[NodeContext, str]):
    name = "serve.gateway_remove"
    phase = "container"
    description = ("stop and remove the cluster's gateway container and its worlds' figures collectors, and the "
                   "gateway's files")
    checks = (f"whether a {GATEWAY_CONTAINER} or {COLLECTOR_CONTAINER} container (any world's) labelled with this "
              "cluster exists on the node, and whether the gateway's folder (its config with the API key, "
              "serve.tls's key) is there")
    changes = (f"`docker stop -t 0 NAME; docker rm -f NAME` for {GATEWAY_CONTAINER} and each {COLLECTOR_CONTAINER}; "
               "the gateway's folder removed")

    def check(self, ctx: NodeContext) -> list[Change[str]]:
        folder = gateway_dir(ctx.state_dir())
        found = ctx.run(f"{labelled_script(ctx.inventory.cluster.name)}; [ -d {q(folder)} ] && echo {FOLDER_FOUND}",
                        timeout=30).stdout.split()
        out = [Change(f"remove the gateway container {name}", payload=name) for name in found
               if name == GATEWAY_CONTAINER]
        out += [Change(f"remove the figures collector container {name}", payload=name) for name in found
                if is_collector(name)]
        if FOLDER_FOUND in found:
            out.append(Change(f"remove the gateway's files {folder} (the API key, serve.tls's key)",
                              payload=FOLDER_FOUND))
        return out

    def apply(self, ctx: NodeContext, changes: list[Change[str]]) -> None:
        try:
            for change in changes:
                if change.carried() == FOLDER_FOUND:
                    ctx.must(f"rm -rf {q(gateway_dir(ctx.state_dir()))}", "removing the gateway's files")
                else:
                    ctx.must(remove_command(change.carried()), f"removing {change.carried()}", timeout=120)
        finally:
            ctx.invalidate()
