"""container.ssh: the containers meshed over ssh, every container's key authorized and host key pinned in all.

Each node's container has a client key and a host key made ON that node (container.state); only public keys
travel, into every container's authorized_keys and pinned known_hosts ([fabric ip]:port).
"""

from __future__ import annotations

import posixpath

from sparkctl.engine.diff import unified_diff
from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.plan.mpi import MPIRUN_TIMEOUT
from sparkctl.tasks.container.state import CLIENT_KEY, HOST_KEY
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.mpi.reads import HOSTFILE_TASK, hostfile_reads
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing
from sparkctl.transport.hostkeys import host_key_name

SSHD_WAIT_S = 30.0
#: concurrent ssh tries one container sshd may receive from all its peers together (sshd's MaxStartups is 10)
PROBES_PER_SSHD = 8


def desired_ssh_files(ctx: ClusterContext, pubs: dict[str, tuple[str, str]]) -> dict[str, str]:
    """authorized_keys and known_hosts every container must hold. pubs: node -> (client pub, host pub).

    Each key is accepted only from the fabric subnets (sshd's from="..."): even a container sshd reachable some other
    way lets no one in from the management network."""
    plan = ctx.plan()
    port = ctx.inventory.container.ssh_port
    subnets = sorted({str(a.network) for addrs in plan.fabric.addresses.values() for a in addrs.values()})
    only_from = f'from="{",".join(subnets)}" ' if subnets else ""
    authorized, known = [], []
    for node in ctx.inventory.nodes:
        if node.name not in pubs:
            continue
        client, host = pubs[node.name]
        authorized.append(only_from + client.strip())
        names = [host_key_name(str(a.ip), port) for a in plan.fabric.addresses.get(node.name, {}).values()]
        if names:
            known.append(f"{','.join(names)} {' '.join(host.split()[:2])}")
    return {"authorized_keys": "\n".join(authorized) + "\n", "known_hosts": "\n".join(known) + "\n"}


class ContainerSshTask(Task):
    name = "container.ssh"
    phase = "container"
    scope = Scope.CLUSTER
    needs = ("container.run",)
    description = "mesh the containers over ssh: every container's key authorized and host key pinned in all"
    checks = ("the container sshd listens on the container ssh port on every node (polled, bounded); "
              "/root/.ssh/authorized_keys in each container and container-ssh/ on each node hold every node's "
              "container key, known_hosts every container's host key for [fabric ip]:port; then ssh from every "
              "container to every peer address on a shared subnet")
    changes = "rewrites those files (mode 600) on the node and inside the containers (docker exec)"

    def _read(self, ctx: ClusterContext) -> dict[str, dict[str, str]]:
        """ONE round trip per node, all nodes at once: wait (on the node) for the container sshd, read the key
        files on the node and in the container, and already try ssh to every peer from the container. The ssh
        verdicts count only when every file turns out right; they change nothing either way."""
        container = ctx.inventory.container.name
        probes = container_ssh_probes(ctx)
        framing = Framing()
        # mpi.hostfile runs next and reads the hostfiles and `mpirun hostname` (after the ssh tries, in the same
        # docker exec): handed over, they save it a round trip and a docker exec per node.
        mpi_reads = hostfile_reads(ctx, framing)
        scripts = {}
        for name, node in ctx.nodes.items():
            keys = posixpath.join(node.state_dir(), "container-ssh")
            inside = [framing.section(f"in-{f}", f"cat /root/.ssh/{f} 2>/dev/null")
                      for f in ("authorized_keys", "known_hosts")]
            if probes.get(name):
                # the ssh tries run alongside mpirun (read-only both); their verdicts are printed after it
                inside += ['_o=$(mktemp 2>/dev/null || echo /tmp/sparkctl-ssh.$$)',
                           f'( {probes[name]}\n) >"$_o" 2>&1 &', mpi_reads[name][1],
                           "wait", framing.section("ssh", 'cat "$_o"; rm -f "$_o"')]
            else:
                inside.append(mpi_reads[name][1])
            scripts[name] = "\n".join([
                sshd_wait_script(ctx), framing.section("sshd", 'printf "%s\\n" "$st"'),
                framing.section("client", f"cat {q(keys)}/{CLIENT_KEY}.pub"),
                framing.section("host", f"cat {q(keys)}/{HOST_KEY}.pub"),
                framing.section("node-authorized_keys", f"cat {q(keys)}/authorized_keys 2>/dev/null"),
                framing.section("node-known_hosts", f"cat {q(keys)}/known_hosts 2>/dev/null"),
                mpi_reads[name][0],
                f'if [ "$st" = listening ]; then docker exec {q(container)} sh -c {q(chr(10).join(inside))} '
                "2>/dev/null; fi",
                "true"])
        sections = {name: framing.split(result.stdout)
                    for name, result in ctx.run_on_all(scripts, timeout=SSHD_WAIT_S + MPIRUN_TIMEOUT + 60).items()}
        if all("container-hostfile" in found for found in sections.values()):
            ctx.hand_over(HOSTFILE_TASK, sections)
        out = {n: {name: s.output for name, s in found.items()} for n, found in sections.items()}
        not_listening = {n: f.get("sshd", "").strip() for n, f in out.items() if f.get("sshd", "").strip()
                         != "listening"}
        if not_listening:
            raise sshd_not_listening(ctx, not_listening)
        for name, files in out.items():
            if not files.get("client", "").strip() or not files.get("host", "").strip():
                raise TaskFailed(f"{name}: the container keys are missing in {ctx.nodes[name].state_dir()}",
                                 hint="rerun bootstrap (container.state generates them)")
        return out

    def check(self, ctx: ClusterContext) -> list[Change]:
        files = self._read(ctx)
        pubs = {n: (f["client"].strip(), f["host"].strip()) for n, f in files.items()}
        want = desired_ssh_files(ctx, pubs)
        changes = []
        for node, have in files.items():
            for fname, content in want.items():
                for where, key in (("node", f"node-{fname}"), ("container", f"in-{fname}")):
                    current = have.get(key, "")
                    if current.strip() != content.strip():
                        label = (f"{node}: container-ssh/{fname}" if where == "node"
                                 else f"{node}: /root/.ssh/{fname} in the container")
                        changes.append(Change(f"update {label}", diff=unified_diff(label, current or None, content),
                                              payload=(node, where, fname, content), node=node))
        if changes:
            return changes
        probed = container_ssh_probes(ctx)
        failures = ssh_failures({n: f.get("ssh", "") for n, f in files.items() if n in probed})
        if failures:
            # A peer's sshd may have come up while this node was already trying it: ask once more, now that
            # every one listens, and believe that answer.
            failures = verify_container_ssh(ctx)
        if failures:
            raise TaskFailed(f"{len(failures)} container-to-container ssh connection(s) failed",
                             hint="`docker logs` of the container on the peer; its sshd port must be free",
                             details=failures)
        return []

    def apply(self, ctx: ClusterContext, changes: list[Change]) -> None:
        container = ctx.inventory.container.name
        for node, where, fname, content in (c.payload for c in changes):
            nctx = ctx.nodes[node]
            if where == "node":
                nctx.transport.put(posixpath.join(nctx.state_dir(), "container-ssh", fname), content, mode=0o600)
            else:
                result = nctx.transport.exec_in(
                    container, f"umask 077 && mkdir -p /root/.ssh && cat > /root/.ssh/{fname}.sparkctl && "
                    f"mv -f /root/.ssh/{fname}.sparkctl /root/.ssh/{fname}", input=content, timeout=30)
                if not result.ok:
                    raise TaskFailed(f"writing /root/.ssh/{fname} in {container} on {node} failed",
                                     details=(result.stderr or result.stdout).strip().splitlines()[-3:])


def sshd_wait_script(ctx: ClusterContext, timeout: float = SSHD_WAIT_S) -> str:
    """Shell that polls ON the node until the container sshd listens (mpirun before that fails with
    `Connection refused`), the container stops running, or the timeout; leaves `listening`, the container's
    status or `absent` in $st."""
    port = int(ctx.inventory.container.ssh_port)
    container = q(ctx.inventory.container.name)
    tries = max(1, int(timeout / 0.2))
    return (f"n=0; while :; do if ss -ltnH 'sport = :{port}' | grep -q .; then st=listening; break; fi; "
            f"st=$(docker inspect --format '{{{{.State.Status}}}}' {container} 2>/dev/null || echo absent); "
            f'[ "$st" = running ] || break; n=$((n+1)); [ "$n" -ge {tries} ] && break; sleep 0.2; done')


def sshd_not_listening(ctx: ClusterContext, status: dict[str, str]) -> TaskFailed:
    port = int(ctx.inventory.container.ssh_port)
    container = ctx.inventory.container.name
    return TaskFailed(
        f"the container sshd does not listen on port {port} on {', '.join(status)}",
        hint=f"docker logs {container} on those nodes (a process holding port {port} makes the container exit)",
        details=[f"{n}: container {st or 'unknown'}" for n, st in status.items()])


def wait_for_sshd(ctx: ClusterContext, timeout: float = SSHD_WAIT_S) -> None:
    """Until the container sshd listens on every node (one round trip per node; the node polls)."""
    script = sshd_wait_script(ctx, timeout) + '; printf "%s\\n" "$st"'
    results = ctx.run_on_all(dict.fromkeys(ctx.nodes, script), timeout=timeout + 20)
    status = {n: r.stdout.strip() for n, r in results.items() if r.stdout.strip() != "listening"}
    if status:
        raise sshd_not_listening(ctx, status)


def container_ssh_probes(ctx: ClusterContext) -> dict[str, str]:
    """Per node, the shell (run in its container) that tries ssh to every peer address on a subnet it shares."""
    plan = ctx.plan()
    scripts = {}
    for node in ctx.nodes:
        mine = {a.network for a in plan.fabric.addresses.get(node, {}).values()}
        lines = []
        for peer in ctx.nodes:
            if peer == node:
                continue
            for addr in plan.fabric.addresses.get(peer, {}).values():
                if addr.network not in mine:
                    continue
                tag = f"{peer} {addr.ip}"
                lines.append(f"{{ if out=$(ssh -o ConnectTimeout=5 root@{addr.ip} true 2>&1 </dev/null); then "
                             f"echo {q('ok ' + tag)}; else echo {q('fail ' + tag)} \"$(echo \"$out\" | tail -n1)\"; "
                             "fi; } &")
        if lines:
            # Several at once (each verdict is one short write, never interleaved), but every node probes every
            # peer at the same time and sshd starts dropping unauthenticated connections at 10 (MaxStartups).
            at_once = max(1, PROBES_PER_SSHD // max(1, len(ctx.nodes) - 1))
            batches = ["\n".join([*lines[i:i + at_once], "wait"]) for i in range(0, len(lines), at_once)]
            scripts[node] = "\n".join(batches)
    return scripts


def ssh_failures(outputs: dict[str, str]) -> list[str]:
    """PURE: the `ok`/`fail` lines of each node's ssh probes as failure lines (a node with none failed to run)."""
    failures = []
    for node, stdout in outputs.items():
        seen = 0
        for line in stdout.splitlines():
            verdict, _, rest = line.partition(" ")
            if verdict in ("ok", "fail"):
                seen += 1
            if verdict == "fail":
                peer, _, err = rest.partition(" ")
                ip, _, err = err.partition(" ")
                failures.append(f"{node} container -> {peer} container ({ip}): {err or 'failed'}")
        if not seen:
            failures.append(f"{node}: could not run ssh in the container ({stdout.strip()[-200:] or 'no output'})")
    return failures


def verify_container_ssh(ctx: ClusterContext) -> list[str]:
    """ssh from every container to every peer address on a subnet it shares; failures as lines."""
    container = ctx.inventory.container.name
    scripts = {n: f"docker exec {q(container)} sh -c {q(probe)} 2>&1"
               for n, probe in container_ssh_probes(ctx).items()}
    return ssh_failures({n: r.stdout for n, r in ctx.run_on_all(scripts, timeout=60).items()})
