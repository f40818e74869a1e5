"""container.state and container.ssh: the node-side files the container mounts, and the container ssh mesh.

Each node's container gets a client key and a host key generated ON that node (private keys never leave
it); only public keys travel, into every container's authorized_keys and pinned known_hosts ([ip]:port).
"""

from __future__ import annotations

import posixpath

from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.plan.container import node_home, state_dir
from sparkctl.probes import MPI_PROBE, probe_source
from sparkctl.tasks.netplan_files import unified_diff
from sparkctl.transport.base import q
from sparkctl.transport.hostkeys import host_key_name

SECTION = "@@sparkctl-section@@"
CLIENT_KEY = "id_ed25519"
HOST_KEY = "ssh_host_ed25519_key"
SSHD_WAIT_S = 30.0
#: concurrent ssh tries one container sshd may receive from all its peers together (sshd's MaxStartups is 10)
PROBES_PER_SSHD = 8


def node_state_dir(ctx) -> str:
    """sparkctl's state dir on this node (the same path the container spec mounts)."""
    return state_dir(ctx.inventory, node_home(ctx.inventory, ctx.node, ctx.facts()))


def hf_cache_dir(ctx) -> str:
    """The host side of the HF cache mount, as the container spec has it."""
    return ctx.plan().nodes[ctx.name].container.mounts[0][0].rstrip("/")


def split_sections(stdout: str) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith(SECTION):
            current = line[len(SECTION):].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {k: "\n".join(v) + ("\n" if v else "") for k, v in out.items()}


def section(name: str) -> str:
    return f"printf '%s\\n' {q(SECTION + name)}"


class ContainerStateTask(Task):
    name = "container.state"
    phase = "container"
    needs = ("preflight.node",)
    description = "write the files the container mounts: entrypoint, container keys, run dir, MPI probe"
    checks = ("in ~/.local/state/sparkctl/<cluster>/: entrypoint.sh and run/mpi_probe.py match sparkctl's "
              "versions; container-ssh/ (mode 700) holds the container's client key and host key")
    changes = ("writes entrypoint.sh and the probe (atomic), creates run/ and container-ssh/, generates the keys "
               "with ssh-keygen on the node (private keys never leave it)")

    def _files(self, ctx) -> dict[str, str]:
        return {"entrypoint.sh": ctx.plan().entrypoint, f"run/{MPI_PROBE}": probe_source()}

    def check(self, ctx) -> list[Change]:
        base = node_state_dir(ctx)
        keys = posixpath.join(base, "container-ssh")
        lines = [f"S={q(base)}"]
        for rel in self._files(ctx):
            lines += [section("file " + rel), f'cat "$S"/{q(rel)} 2>/dev/null']
        lines += [section("have"),
                  f'[ -d {q(hf_cache_dir(ctx))} ] && echo hf_cache',
                  f'[ -d {q(hf_cache_dir(ctx))} ] && [ ! -w {q(hf_cache_dir(ctx))} ] && echo hf_cache_not_writable',
                  '[ -d "$S"/run ] && echo run',
                  '[ "$(stat -c %a "$S"/container-ssh 2>/dev/null)" = 700 ] && echo keydir',
                  f'[ -s {q(keys)}/{CLIENT_KEY} ] && [ -s {q(keys)}/{CLIENT_KEY}.pub ] && echo client',
                  f'[ -s {q(keys)}/{HOST_KEY} ] && [ -s {q(keys)}/{HOST_KEY}.pub ] && echo hostkey', "true"]
        sections = split_sections(ctx.must("\n".join(lines), "reading sparkctl's state dir").stdout)
        have = set(sections.get("have", "").split())
        if "hf_cache_not_writable" in have:
            # typically made by an earlier `docker run -v` (NVIDIA's procedure): docker creates it owned by root
            user = getattr(ctx.node, "user", None) or ctx.inventory.user
            raise TaskFailed(f"the HF cache {hf_cache_dir(ctx)} on {ctx.name} is not writable by {user}",
                             hint=f"sudo chown -R {user}: {hf_cache_dir(ctx)}")
        changes = []
        for rel, content in self._files(ctx).items():
            current = sections.get("file " + rel, "")
            if current != content:
                path = posixpath.join(base, rel)
                changes.append(Change(f"{'update' if current else 'write'} {path}",
                                      diff=unified_diff(path, current or None, content),
                                      payload=("file", path, content)))
        if "run" not in have or "keydir" not in have:
            changes.append(Change(f"create {base}/run and {base}/container-ssh (mode 700)", payload=("dirs",)))
        if "hf_cache" not in have:
            changes.append(Change(f"create the HF cache {hf_cache_dir(ctx)} (docker would create it owned by root)",
                                  payload=("dirs",)))
        if "client" not in have:
            changes.append(Change("generate the container's client key container-ssh/id_ed25519",
                                  payload=("key", CLIENT_KEY)))
        if "hostkey" not in have:
            changes.append(Change("generate the container's ssh host key container-ssh/ssh_host_ed25519_key",
                                  payload=("key", HOST_KEY)))
        return changes

    def apply(self, ctx, changes) -> None:
        base = node_state_dir(ctx)
        keys = posixpath.join(base, "container-ssh")
        cluster = ctx.inventory.cluster.name
        lines = [f"mkdir -p {q(hf_cache_dir(ctx))}",
                 f"install -d -m 700 {q(base)} {q(keys)}", f"install -d -m 755 {q(base + '/run')}",
                 f"chmod 700 {q(keys)}"]
        for change in changes:
            if change.payload[0] == "key":
                key = posixpath.join(keys, change.payload[1])
                comment = f"sparkctl-container-{cluster}@{ctx.name}"
                lines.append(f"rm -f {q(key)} {q(key + '.pub')} && "
                             f"ssh-keygen -q -t ed25519 -N '' -C {q(comment)} -f {q(key)}")
        ctx.must(" && ".join(lines), "preparing sparkctl's state dir")
        for change in changes:
            if change.payload[0] == "file":
                ctx.transport.put(change.payload[1], change.payload[2], mode=0o644)


def desired_ssh_files(ctx, pubs: dict[str, tuple[str, str]]) -> dict[str, str]:
    """authorized_keys and known_hosts every container must hold. pubs: node -> (client pub, host pub)."""
    plan = ctx.plan()
    port = ctx.inventory.container.ssh_port
    authorized, known = [], []
    for node in ctx.inventory.nodes:
        if node.name not in pubs:
            continue
        client, host = pubs[node.name]
        authorized.append(client)
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

    def _read(self, ctx) -> dict[str, dict[str, str]]:
        """ONE round trip per node, all nodes at once: wait (on the node) for the container sshd, read the key
        files on the node and in the container, and already try ssh to every peer from the container. The ssh
        verdicts count only when every file turns out right; they change nothing either way."""
        from sparkctl.tasks.mpi import CONTAINER_MARKER, MPIRUN_TIMEOUT, HostfileTask, hostfile_reads

        container = ctx.inventory.container.name
        probes = container_ssh_probes(ctx)
        # mpi.hostfile runs next and reads the hostfiles and `mpirun hostname` (after the ssh tries, in the same
        # docker exec): handed over, they save it a round trip and a docker exec per node.
        mpi_reads = hostfile_reads(ctx)
        scripts = {}
        for name, node in ctx.nodes.items():
            keys = posixpath.join(node_state_dir(node), "container-ssh")
            inside = "; ".join(f"{section('in ' + f)}; cat /root/.ssh/{f} 2>/dev/null" for f in
                               ("authorized_keys", "known_hosts"))
            if probes.get(name):
                # the ssh tries run alongside mpirun (read-only both); their verdicts are printed after it
                inside += (f'\n_o=$(mktemp 2>/dev/null || echo /tmp/sparkctl-ssh.$$)\n( {probes[name]}\n) >"$_o" 2>&1 &'
                           f"\n{section('mpi in')}; {mpi_reads[name][1]}"
                           f'\nwait; {section("ssh")}; cat "$_o"; rm -f "$_o"')
            else:
                inside += f"\n{section('mpi in')}; {mpi_reads[name][1]}"
            scripts[name] = "\n".join([
                sshd_wait_script(ctx), section("sshd"), 'printf "%s\\n" "$st"',
                section("client"), f"cat {q(keys)}/{CLIENT_KEY}.pub",
                section("host"), f"cat {q(keys)}/{HOST_KEY}.pub",
                section("node authorized_keys"), f"cat {q(keys)}/authorized_keys 2>/dev/null",
                section("node known_hosts"), f"cat {q(keys)}/known_hosts 2>/dev/null",
                section("mpi node"), mpi_reads[name][0],
                f'if [ "$st" = listening ]; then docker exec {q(container)} sh -c {q(inside)} 2>/dev/null; fi',
                "true"])
        out = {}
        for name, result in ctx.run_on_all(scripts, timeout=SSHD_WAIT_S + MPIRUN_TIMEOUT + 60).items():
            out[name] = split_sections(result.stdout)
        if all("mpi in" in files for files in out.values()):
            ctx.hand_over(HostfileTask.name, {n: f.get("mpi node", "") + CONTAINER_MARKER + "\n" + f["mpi in"]
                                              for n, f in out.items()})
        not_listening = {n: f.get("sshd", "").strip() for n, f in out.items() if f.get("sshd", "").strip()
                         != "listening"}
        if not_listening:
            raise sshd_not_listening(ctx, not_listening)
        for name, files in out.items():
            if not files.get("client", "").strip() or not files.get("host", "").strip():
                raise TaskFailed(f"{name}: the container keys are missing in {node_state_dir(ctx.nodes[name])}",
                                 hint="rerun bootstrap (container.state generates them)")
        return out

    def check(self, ctx) -> list[Change]:
        files = self._read(ctx)
        pubs = {n: (f["client"].strip(), f["host"].strip()) for n, f in files.items()}
        want = desired_ssh_files(ctx, pubs)
        changes = []
        for node, have in files.items():
            for fname, content in want.items():
                for where, key in (("node", f"node {fname}"), ("container", f"in {fname}")):
                    current = have.get(key, "")
                    if current.strip() != content.strip():
                        label = (f"{node}: container-ssh/{fname}" if where == "node"
                                 else f"{node}: /root/.ssh/{fname} in the container")
                        changes.append(Change(f"update {label}", diff=unified_diff(label, current or None, content),
                                              payload=(node, where, fname, content)))
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

    def apply(self, ctx, changes) -> None:
        container = ctx.inventory.container.name
        for node, where, fname, content in (c.payload for c in changes):
            nctx = ctx.nodes[node]
            if where == "node":
                nctx.transport.put(posixpath.join(node_state_dir(nctx), "container-ssh", fname), content, mode=0o600)
            else:
                result = nctx.transport.exec_in(
                    container, f"umask 077 && mkdir -p /root/.ssh && cat > /root/.ssh/{fname}.sparkctl && "
                    f"mv -f /root/.ssh/{fname}.sparkctl /root/.ssh/{fname}", input=content, timeout=30)
                if not result.ok:
                    raise TaskFailed(f"writing /root/.ssh/{fname} in {container} on {node} failed",
                                     details=(result.stderr or result.stdout).strip().splitlines()[-3:])


def sshd_wait_script(ctx, timeout: float = SSHD_WAIT_S) -> str:
    """Shell that polls ON the node until the container sshd listens (mpirun before that fails with
    `Connection refused`), the container stops running, or the timeout; leaves `listening`, the container's
    status or `absent` in $st."""
    port = int(ctx.inventory.container.ssh_port)
    container = q(ctx.inventory.container.name)
    tries = max(1, int(timeout / 0.2))
    return (f"n=0; while :; do if ss -ltnH 'sport = :{port}' | grep -q .; then st=listening; break; fi; "
            f"st=$(docker inspect --format '{{{{.State.Status}}}}' {container} 2>/dev/null || echo absent); "
            f'[ "$st" = running ] || break; n=$((n+1)); [ "$n" -ge {tries} ] && break; sleep 0.2; done')


def sshd_not_listening(ctx, status: dict[str, str]) -> TaskFailed:
    port = int(ctx.inventory.container.ssh_port)
    container = ctx.inventory.container.name
    return TaskFailed(
        f"the container sshd does not listen on port {port} on {', '.join(status)}",
        hint=f"docker logs {container} on those nodes (a process holding port {port} makes the container exit)",
        details=[f"{n}: container {st or 'unknown'}" for n, st in status.items()])


def wait_for_sshd(ctx, timeout: float = SSHD_WAIT_S) -> None:
    """Until the container sshd listens on every node (one round trip per node; the node polls)."""
    script = sshd_wait_script(ctx, timeout) + '; printf "%s\\n" "$st"'
    results = ctx.run_on_all(dict.fromkeys(ctx.nodes, script), timeout=timeout + 20)
    status = {n: r.stdout.strip() for n, r in results.items() if r.stdout.strip() != "listening"}
    if status:
        raise sshd_not_listening(ctx, status)


def container_ssh_probes(ctx) -> dict[str, str]:
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


def verify_container_ssh(ctx) -> list[str]:
    """ssh from every container to every peer address on a subnet it shares; failures as lines."""
    container = ctx.inventory.container.name
    scripts = {n: f"docker exec {q(container)} sh -c {q(probe)} 2>&1"
               for n, probe in container_ssh_probes(ctx).items()}
    return ssh_failures({n: r.stdout for n, r in ctx.run_on_all(scripts, timeout=60).items()})
