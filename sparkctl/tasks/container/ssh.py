"""container.ssh: the containers meshed over ssh, every container's key authorized and host key pinned in all.

Each node's container has a client key and a host key made ON that node (container.state); only public keys
travel, into every container's authorized_keys and pinned known_hosts ([fabric ip]:port).
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Callable

from sparkctl.plan.mpi import mpirun_timeout
from sparkctl.plan.paths import CONTAINER_CLIENT_KEY as CLIENT_KEY
from sparkctl.plan.paths import CONTAINER_HOST_KEY as HOST_KEY
from sparkctl.plan.paths import HOSTFILE_PATH
from sparkctl.rules.mesh import (
    Try,
    Verdict,
    container_tries,
    fitting_fixes,
    mesh_script,
    mesh_timeout,
    prelude,
)
from sparkctl.rules.serving import without_mpi
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.container.proofs import CONTAINER_MESH, container_fingerprints
from sparkctl.tasks.context import ClusterContext, HandOver
from sparkctl.tasks.mesh import collect, raise_for
from sparkctl.tasks.mpi.reads import HOSTFILE_READS, hostfile_reads, runs_mpirun
from sparkctl.tasks.proof import PairProofs, pair_id
from sparkctl.tasks.verify.reads import VERIFY_READS, answers, node_reads
from sparkctl.transport.base import q, text_of
from sparkctl.transport.framing import Framing, Section
from sparkctl.transport.hostkeys import host_key_name

SSHD_WAIT_S = 30.0
MESH_WHAT = "container-to-container ssh connection"


def mesh_hint(container: str, port: int) -> Callable[[list[str]], str]:
    """The hint for the broken container-to-container pairs, from their ssh errors (a hint fits its failure)."""
    fixes = {
        "refused": f"the peer container's sshd does not listen on port {port}: `docker logs {container}` on the "
                   f"peer (a process holding port {port} makes it exit)",
        "denied": "the peer container refused this container's key: rerun bootstrap (container.ssh writes "
                  "authorized_keys)",
        "host_key": "a container's host key differs from the pinned one: rerun bootstrap (container.ssh pins them)",
        "timeout": "no answer from the peer's fabric address: see verify.fabric (link up, addresses, routes)",
        "no_route": "no route to the peer's fabric address: see verify.fabric (link up, addresses, routes)",
    }

    def hint(errors: list[str]) -> str:
        found = fitting_fixes(errors, fixes)
        return "; ".join(found or [f"`docker logs {container}` on the peer and ssh -v from the container show why"])
    return hint


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


#: (node, "node" | "container", file name, content): one ssh file of the mesh to write
MeshFile = tuple[str, str, str, str]


class ContainerSshTask(Task[ClusterContext, MeshFile]):
    name = "container.ssh"
    phase = "container"
    scope = Scope.CLUSTER
    # the mesh connects over the fabric addresses, and in a ring through the neighbours' forwarding: `--only` a
    # later phase after `cluster down --network` must bring them back first
    needs = ("container.run", "network.netplan", "network.forwarding")
    description = "mesh the containers over ssh: every container's key authorized and host key pinned in all"
    checks = ("the container sshd listens on the container ssh port on every node (polled, bounded); "
              "/root/.ssh/authorized_keys in each container and container-ssh/ on each node hold every node's "
              "container key, known_hosts every container's host key for [fabric ip]:port; then ssh with every "
              "container's key to every peer container (every ordered pair, at the address mpirun uses, paced like "
              "ssh.verify), tried from the node with the container's key and pinned host keys (it shares the "
              "node's network); the container's files read on the node as root through the container's "
              "/proc/<pid>/root, beside the facts where sudo takes no password (else over an ssh to its own sshd; a "
              "`docker exec` only when that fails or mpirun must run); a pair not ok is tried again from inside the "
              "containers, and that answer decides. A pair whose proof is on record is not tried again while "
              "nothing its login depends on changed (tasks/container/proofs.py; --reprove tries every pair)")
    changes = "rewrites those files (mode 600) on the node and inside the containers (docker exec)"

    def _read(self, ctx: ClusterContext) -> dict[str, dict[str, str]]:
        """ONE round trip per node, all nodes at once (on a no-op, container.state's carried it: see
        mesh_read_script): wait for the container sshd, read the key files on the node and in the container, and
        already try ssh to every peer from the container. The ssh verdicts count only when every file turns out
        right; they change nothing either way."""
        handed = {node: ctx.take_over(CONTAINER_READ.at(node)) for node in ctx.nodes}
        # carried without waiting for the sshd: a node where it did not listen yet is read again, waiting
        ready: dict[str, dict[str, Section]] = {
            node: found for node, found in handed.items()
            if found is not None and "sshd" in found and found["sshd"].output.strip() == "listening"}
        if len(ready) == len(handed):
            sections = ready
        else:
            framing = Framing()
            scripts = {node: mesh_read_script(ctx, node, framing) for node in ctx.nodes}
            sections = {name: framing.split(result.stdout)
                        for name, result in ctx.run_on_all(scripts, timeout=mesh_read_timeout(ctx)).items()}
        if all("container-hostfile" in found for found in sections.values()):
            ctx.hand_over(HOSTFILE_READS, sections)
            ctx.hand_over(VERIFY_READS, {n: answers(Framing.texts_of(found)) for n, found in sections.items()})
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

    def not_applicable(self, ctx: ClusterContext) -> str | None:
        why = without_mpi(ctx.inventory)
        return f"{why}: no ssh mesh between the containers" if why else None

    def check(self, ctx: ClusterContext) -> list[Change[MeshFile]]:
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
        tries = container_ssh_tries(ctx)
        fingerprints = container_fingerprints(ctx, files, tries)
        record = PairProofs(ctx.records, CONTAINER_MESH, reprove=ctx.options.reprove)
        taken = record.proven(fingerprints)
        # the read tried the pairs of a node that had no proof on record (from the node, with the container's key):
        # an ok there counts; anything else is tried again from inside the containers, and that answer decides.
        # A peer's sshd may also have come up only while this node was already trying it.
        seen = collect({n: (f["ssh"], "") for n, f in files.items() if "ssh" in f},
                       {n: t for n, t in tries.items() if "ssh" in files.get(n, {})})
        # a pair that failed there is tried again whatever the record says: the record missed what broke it
        taken -= {pair_id(v.node, v.peer, v.target) for v in seen if v.state != "ok"}
        carried = {pair_id(v.node, v.peer, v.target) for v in seen if v.state == "ok"} - taken
        todo = {node: [t for t in node_tries if pair_id(node, t.peer, t.target) not in taken | carried]
                for node, node_tries in tries.items()}
        todo = {node: node_tries for node, node_tries in todo.items() if node_tries}
        verdicts = try_container_ssh(ctx, todo)
        record.keep(fingerprints, carried | {pair_id(v.node, v.peer, v.target) for v in verdicts if v.state == "ok"},
                    taken)
        total = sum(len(t) for t in tries.values())
        ctx.emit(Event(event="log", task=self.name, message=(
            f"{len(taken)} of {total} container pair(s) taken from the record (nothing their login depends on "
            f"changed), {len(carried)} proven in the read, {sum(len(t) for t in todo.values())} tried now")))
        raise_for(verdicts, MESH_WHAT, mesh_hint(ctx.inventory.container.name, int(ctx.inventory.container.ssh_port)))
        return []

    def apply(self, ctx: ClusterContext, changes: list[Change[MeshFile]]) -> None:
        container = ctx.inventory.container.name
        by_node: dict[str, list[tuple[str, str, str]]] = {}
        for node, where, fname, content in (c.carried() for c in changes):
            by_node.setdefault(node, []).append((where, fname, content))

        def write(node: str) -> None:
            nctx = ctx.nodes[node]
            for where, fname, content in by_node[node]:
                if where == "node":
                    nctx.transport.put(posixpath.join(nctx.state_dir(), "container-ssh", fname), content, mode=0o600)
                    continue
                result = nctx.transport.exec_in(
                    container, f"umask 077 && mkdir -p /root/.ssh && cat > /root/.ssh/{fname}.sparkctl && "
                    f"mv -f /root/.ssh/{fname}.sparkctl /root/.ssh/{fname}", input=content, timeout=30)
                if not result.ok:
                    raise TaskFailed(f"writing /root/.ssh/{fname} in {container} on {node} failed",
                                     details=(result.stderr or result.stdout).strip().splitlines()[-3:])

        # every node's files at once: each node's own in order
        ctx.each_node({node: functools.partial(write, node) for node in by_node})


#: container.state's round trip carries a node's read (ClusterContext.hand_over, per node).
CONTAINER_READ: HandOver[dict[str, Section]] = HandOver("container.ssh")


def container_key_options(ctx: ClusterContext, name: str) -> str:
    """ssh options that make an ssh on the NODE act as its container's client: the container's port, key and
    pinned host keys (the state dir's container-ssh/, which the container mounts), no user or system config."""
    keys = posixpath.join(ctx.nodes[name].state_dir(), "container-ssh")
    return (f"-F /dev/null -p {int(ctx.inventory.container.ssh_port)} -i {q(posixpath.join(keys, CLIENT_KEY))} "
            f"-o IdentitiesOnly=yes -o StrictHostKeyChecking=yes "
            f"-o UserKnownHostsFile={q(posixpath.join(keys, 'known_hosts'))} -o GlobalKnownHostsFile=/dev/null")


def carries_tries(ctx: ClusterContext, name: str) -> bool:
    """Whether `name`'s read tries its container pairs: while one of them has no proof on record."""
    tries = container_tries(ctx.plan().fabric, list(ctx.nodes), name)
    record = PairProofs(ctx.records, CONTAINER_MESH, reprove=ctx.options.reprove)
    return bool(tries) and not record.covers(pair_id(name, t.peer, t.target) for t in tries)


def container_files_as_root(ctx: ClusterContext, name: str, framing: Framing) -> str | None:
    """The container's files that the mesh read reads inside it (sections in-authorized_keys, in-known_hosts,
    in-written, container-hostfile), read as root ON THE NODE through /proc/<pid>/root (the container's own mount
    tree, its bind mounts included): a root read ahead beside the facts (tasks/read_ahead.py), with no login in the
    container and no key exchange, where an ssh to its own sshd cost both ends about 40 ms of CPU.

    Nothing of the container runs: bash's own `read` and the node's `stat` open the files, from the container's root
    made the shell's working directory first (held from then on: a pid given to another process since cannot lead
    elsewhere). It counts only while <pid> is still the container's first process (its cgroup names the container's
    id: the facts' pid and id, rendered in, so a container recreated since makes another script, which is not read
    ahead), its sshd listens (as the ssh read needed: its entrypoint has put the keys in place by then), and no part of
    a path is a symlink, before the reads and after them (one would resolve against the node's root, not the
    container's): else it fails and the task reads over ssh. None where it cannot run: no passwordless sudo, or the
    container not running."""
    facts = ctx.nodes[name].facts()
    info = facts.containers.get(ctx.inventory.container.name)
    if not facts.sudo_nopasswd or info is None or not info.running or not info.pid or not info.id:
        return None
    if not info.id.isalnum():
        return None  # docker's and podman's ids are hex; anything else is not rendered into a script
    hostfile = HOSTFILE_PATH.lstrip("/")
    paths = ("root", "root/.ssh", "root/.ssh/authorized_keys", "root/.ssh/known_hosts",
             posixpath.dirname(hostfile), hostfile)
    return "\n".join([
        f"_p=/proc/{int(info.pid)}; cd \"$_p/root\" 2>/dev/null || exit 6",
        "_g=; IFS= read -r -d '' _g <\"$_p/cgroup\"",
        f"[[ $_g == *{info.id}* ]] || exit 3",
        f"{listening(int(ctx.inventory.container.ssh_port))} || exit 5",
        f"_links() {{ for _f in {' '.join(q(p) for p in paths)}; do [ -L \"$_f\" ] && return 0; done; return 1; }}",
        "_links && exit 4",
        *(framing.section(f"in-{f}", text_of(f"root/.ssh/{f}")) for f in ("authorized_keys", "known_hosts")),
        framing.section("in-written", "stat -c %i:%Y root/.ssh/authorized_keys root/.ssh/known_hosts 2>/dev/null"),
        framing.section("container-hostfile", text_of(q(hostfile))),
        "! _links || exit 4"])


def mesh_read_script(ctx: ClusterContext, name: str, framing: Framing, sshd_wait: float = SSHD_WAIT_S,
                     mpirun: bool = True, tries: bool = True, container_files: bool = True) -> str:
    """One node's read: the container sshd waited for, the key files on the node and in the container, its
    outgoing container pairs tried, mpi.hostfile's reads and verify.fabric's reads on the node. Sections: sshd,
    client, host, node-/in- authorized_keys and known_hosts, ssh, node-hostfile, container-hostfile (mpirun),
    nccl, exposure.

    No `docker exec` when nothing needs one: the pairs are tried from the node with the container's own key and
    pinned host keys (the container shares the node's network; the peer's sshd and its authorized_keys are what
    is proven), and the container's files are read over an ssh to the node's OWN container (on a rerun where sudo
    takes no password, read as root beside the facts instead: container_files_as_root). mpirun (not on
    record), or a container that does not answer its own ssh, is asked through `docker exec` as before.

    `sshd_wait`: how long to wait for the container sshd. Carried by container.state it is 0 (one look): a container
    container.run is about to recreate (a hand-started one that runs no sshd) must not be waited for.
    `mpirun=False`: without mpi.hostfile's `mpirun` (tasks/mpi/reads.py). The pairs are tried only while one has no
    proof on record (carries_tries); `tries=False`: never (the read as it will be once they are on record).
    `container_files=False`: without the container's files (read as root beside the facts instead:
    container_files_as_root)."""
    container = ctx.inventory.container.name
    node = ctx.nodes[name]
    plan = ctx.plan()
    options = container_key_options(ctx, name)
    probe = (mesh_script(container_tries(plan.fabric, list(ctx.nodes), name, options))
             if tries and carries_tries(ctx, name) else "")
    on_node, in_container = hostfile_reads(ctx, framing, only=name, mpirun=mpirun)[name]
    keys = posixpath.join(node.state_dir(), "container-ssh")
    # inode and mtime of the files too: one rewritten (container.ssh's repair, or anyone) is proven again
    written = "stat -c %i:%Y authorized_keys known_hosts 2>/dev/null"
    inside = "\n".join([*(framing.section(f"in-{f}", f"cat /root/.ssh/{f} 2>/dev/null")
                           for f in ("authorized_keys", "known_hosts")),
                         framing.section("in-written", f"cd /root/.ssh && {written}"), in_container, "true"])
    docker = f"docker exec {q(container)} sh -c {q(inside)} 2>/dev/null"
    own = plan.fabric.first_address(name)
    if own is not None and not (mpirun and runs_mpirun(ctx, name)):
        # the files read are public (keys, known hosts, the hostfile): the tries' cheap key exchange will do
        ssh_own = (f'ssh {options} -o BatchMode=yes -o ConnectTimeout=5 ${{_K:+"$_K"}} root@{own} '
                   f"{q('sh -c ' + q(inside))}")
        reader = (f'{prelude()}\nif _c=$({ssh_own} 2>/dev/null </dev/null); then printf "%s\\n" "$_c"; '
                  f'else {docker}; fi')
    else:
        reader = docker
    if probe:
        # the tries run alongside the reads (read-only both); their verdicts are printed after them
        reader = "\n".join(['_o=$(mktemp 2>/dev/null || echo /tmp/sparkctl-ssh.$$)', f'( {probe}\n) >"$_o" 2>&1 &',
                            reader, "wait", framing.section("ssh", 'cat "$_o"; rm -f "$_o"')])
    return "\n".join([
        sshd_wait_script(ctx, sshd_wait), framing.section("sshd", 'printf "%s\\n" "$st"'),
        framing.section("client", text_of(f"{q(keys)}/{CLIENT_KEY}.pub")),
        framing.section("host", text_of(f"{q(keys)}/{HOST_KEY}.pub")),
        framing.section("node-authorized_keys", text_of(f"{q(keys)}/authorized_keys")),
        framing.section("node-known_hosts", text_of(f"{q(keys)}/known_hosts")),
        framing.section("node-written", f"cd {q(keys)} && {written}"),
        on_node,
        f'if [ "$st" = listening ]; then\n{reader}\nfi' if container_files else "",
        # verify.fabric's reads on the node (its container hostfile is mpi.hostfile's read)
        node_reads(node, framing),
        "true"])


def mesh_read_timeout(ctx: ClusterContext) -> float:
    mesh = mesh_timeout(max(0, len(ctx.nodes) - 1))  # each node tries at most every peer
    return SSHD_WAIT_S + max(mpirun_timeout(len(ctx.inventory.nodes)), mesh) + 30


def sshd_wait_script(ctx: ClusterContext, timeout: float = SSHD_WAIT_S) -> str:
    """Shell that polls ON the node until the container sshd listens (mpirun before that fails with
    `Connection refused`), the container stops running, or the timeout; leaves `listening`, the container's
    status or `absent` in $st."""
    port = int(ctx.inventory.container.ssh_port)
    container = q(ctx.inventory.container.name)
    tries = max(1, int(timeout / 0.2))
    return (f"n=0; while :; do if {listening(port)}; then st=listening; break; fi; "
            f"st=$(docker inspect --format '{{{{.State.Status}}}}' {container} 2>/dev/null || echo absent); "
            f'[ "$st" = running ] || break; n=$((n+1)); [ "$n" -ge {tries} ] && break; sleep 0.2; done')


def listening(port: int) -> str:
    """bash: true when a TCP socket (IPv4 or IPv6) listens on `port` here, as the shell itself reads the kernel's
    tables (/proc/net/tcp: `sl: ADDR:PORT ADDR:PORT ST ...` in hex, state 0A = LISTEN); `ss` and a `grep` were two
    processes on every rerun. Each table is read whole: every read(2) of it walks the kernel's socket hash, which a
    `read` per line made once a line (a few ms each where the machine's memory sizes that hash large)."""
    return ('_l=; for _t in /proc/net/tcp /proc/net/tcp6; do _x=; IFS= read -r -d \'\' _x 2>/dev/null <"$_t"; '
            f'[[ $_x =~ :{port:04X}\\ [0-9A-F]+:[0-9A-F]{{4}}\\ 0A\\  ]] && {{ _l=1; break; }}; done; [ -n "$_l" ]')


def sshd_not_listening(ctx: ClusterContext, status: dict[str, str]) -> TaskFailed:
    port = int(ctx.inventory.container.ssh_port)
    container = ctx.inventory.container.name
    return TaskFailed(
        f"the container sshd does not listen on port {port} on {', '.join(status)}",
        hint=sshd_hint(container, port, status),
        details=[f"{n}: container {st or 'unknown'}" for n, st in status.items()])


def sshd_hint(container: str, port: int, status: dict[str, str]) -> str:
    """A running container whose sshd is not up yet is not the port holder's doing; one that exited may be."""
    running = [n for n, st in status.items() if st == "running"]
    stopped = [n for n in status if n not in running]
    hints = []
    if stopped:
        hints.append(f"docker logs {container} on {', '.join(stopped)}: the container is not running (a process "
                     f"holding port {port} makes it exit)")
    if running:
        hints.append(f"docker logs {container} on {', '.join(running)}: the container runs but its sshd did not "
                     f"listen within the wait (did it start? `docker exec {container} ps`)")
    return "; ".join(hints)


def wait_for_sshd(ctx: ClusterContext, timeout: float = SSHD_WAIT_S) -> None:
    """Until the container sshd listens on every node (one round trip per node; the node polls)."""
    script = sshd_wait_script(ctx, timeout) + '; printf "%s\\n" "$st"'
    results = ctx.run_on_all(dict.fromkeys(ctx.nodes, script), timeout=timeout + 20)
    status = {n: r.stdout.strip() for n, r in results.items() if r.stdout.strip() != "listening"}
    if status:
        raise sshd_not_listening(ctx, status)


def container_ssh_tries(ctx: ClusterContext) -> dict[str, list[Try]]:
    """Per node, ssh from its container to every peer's container (rules/mesh.py container_tries)."""
    plan = ctx.plan()
    names = list(ctx.nodes)
    tries = {node: container_tries(plan.fabric, names, node) for node in names}
    return {node: t for node, t in tries.items() if t}


def try_container_ssh(ctx: ClusterContext, tries: dict[str, list[Try]]) -> list[Verdict]:
    """Try these pairs from inside the containers (one round trip per node that has any); their verdicts."""
    if not tries:
        return []
    container = ctx.inventory.container.name
    scripts = {n: f"docker exec {q(container)} sh -c {q(mesh_script(t))} 2>&1" for n, t in tries.items()}
    timeout = container_mesh_timeout(tries)
    results = ctx.run_on_all(scripts, timeout=timeout)
    return collect({n: (r.stdout, f"the check timed out after {timeout:g}s" if r.timed_out else "")
                    for n, r in results.items()}, tries)


def container_mesh_timeout(tries: dict[str, list[Try]]) -> float:
    return mesh_timeout(max((len(t) for t in tries.values()), default=0))
