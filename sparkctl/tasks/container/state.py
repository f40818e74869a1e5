"""container.state: the files the container mounts, on every node: its entrypoint, its ssh keys (made on the
node: private keys never leave it), the run dir and the MPI probe."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from typing import Literal

from sparkctl.plan.mpi import MPI_PROBE, probe_source
from sparkctl.plan.paths import CONTAINER_CLIENT_KEY, CONTAINER_HOST_KEY
from sparkctl.rules.serving import without_mpi
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.task import Change, Task, TaskFailed
from sparkctl.tasks.container.ssh import (
    CONTAINER_READ,
    carries_tries,
    container_files_as_root,
    mesh_read_script,
    mesh_read_timeout,
)
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.keygen import keygen_line
from sparkctl.tasks.mpi.reads import runs_mpirun
from sparkctl.transport.base import q, text_of
from sparkctl.transport.framing import Framing

CLIENT_KEY = CONTAINER_CLIENT_KEY
HOST_KEY = CONTAINER_HOST_KEY
#: what TensorRT-LLM's mpirun world left in the state dir, which a vLLM or SGLang cluster has no use for (the mesh's
#: keys, the entrypoint that starts its sshd, the MPI probe and the hostfile's copy): removed when it switches
MPI_LEFTOVERS = ("container-ssh", "entrypoint.sh", f"run/{MPI_PROBE}", "run/openmpi-hostfile")
#: the name the container's files read as root go by among the reads ahead (container_files_as_root)
ROOT_READ = "container.state:inside"


@dataclass(frozen=True)
class StateStep:
    """What one change of container.state does."""

    kind: Literal["file", "dirs", "key", "retire"]
    target: str = ""   # the file written, the key generated (its name in container-ssh/)
    content: str = ""


class ContainerStateTask(Task[NodeContext, StateStep]):
    name = "container.state"
    phase = "container"
    needs = ("preflight.node", "preflight.cluster")
    description = "write the files the container mounts: entrypoint, container keys, run dir, MPI probe"
    checks = ("in ~/.local/state/sparkctl/<cluster>/: entrypoint.sh and run/mpi_probe.py match sparkctl's "
              "versions; container-ssh/ (mode 700) holds the container's client key and host key (the same read "
              "takes what container.ssh checks; on a rerun it is read ahead with the node's facts and counts only if "
              "its script is the same and nothing changed since: a no-op container phase needs no round trip)")
    changes = ("writes entrypoint.sh and the probe (atomic), creates run/ and container-ssh/, generates the keys "
               "with ssh-keygen on the node (private keys never leave it); when vLLM or SGLang serves, only run/ and "
               "the HF cache (no sshd, mesh or MPI probe in its container), and what TensorRT-LLM's world left there "
               "(container-ssh/, entrypoint.sh, the probe, the hostfile's copy) is removed")

    def _files(self, ctx: NodeContext) -> dict[str, str]:
        if without_mpi(ctx.inventory):
            return {}  # the container needs no entrypoint of sparkctl's, and no MPI probe runs in it
        return {"entrypoint.sh": ctx.plan().entrypoint, f"run/{MPI_PROBE}": probe_source()}

    def check(self, ctx: NodeContext) -> list[Change[StateStep]]:
        base = ctx.state_dir()
        keys = posixpath.join(base, "container-ssh")
        hf_cache = ctx.hf_cache_dir()
        framing = Framing()
        mesh = without_mpi(ctx.inventory) is None
        lines = [f"S={q(base)}"]
        lines += [framing.section(f"file:{rel}", text_of(f'"$S"/{q(rel)}')) for rel in self._files(ctx)]
        key_checks = [
            'stat -c keydir:%a "$S"/container-ssh 2>/dev/null',
            f'[ -s {q(keys)}/{CLIENT_KEY} ] && [ -s {q(keys)}/{CLIENT_KEY}.pub ] && echo client',
            f'[ -s {q(keys)}/{HOST_KEY} ] && [ -s {q(keys)}/{HOST_KEY}.pub ] && echo hostkey'] if mesh else []
        leftovers = [] if mesh else [f'[ -e "$S"/{q(rel)} ] && echo left:{rel}' for rel in MPI_LEFTOVERS]
        lines.append(framing.section("have", "\n".join([
            *leftovers,
            f'[ -d {q(hf_cache)} ] && echo hf_cache',
            f'[ -d {q(hf_cache)} ] && [ ! -w {q(hf_cache)} ] && echo hf_cache_not_writable',
            '[ -d "$S"/run ] && echo run', *key_checks, "true"])))
        # container.ssh's read of this node rides along (the phase is one round trip per node on a no-op); it
        # counts there only if nothing changed in between (container.run starting or recreating the container)
        try:
            carried = mesh_read_script(ctx.cluster, ctx.name, framing, sshd_wait=0) if mesh else ""
            timeout = mesh_read_timeout(ctx.cluster) if mesh else 60.0
        except TaskFailed:
            carried, timeout = "", 60.0  # no plan yet: container.ssh says why when it runs
        # a carried read that runs mpirun or tries the container pairs (no proof on record yet) is not one for the
        # next run to read ahead: that run will have the proofs (this run's verify.fabric and container.ssh record
        # them), so what is kept for it is the read as it will render it then, without either
        script, timeout = "\n".join([*lines, carried]), max(60.0, timeout)
        # the container's own files, read as root beside the next run's facts where the node allows it: what is
        # kept for that run is then the read without them
        as_root = container_files_as_root(ctx.cluster, ctx.name, framing) if carried else None
        if carried and (runs_mpirun(ctx.cluster, ctx.name) or carries_tries(ctx.cluster, ctx.name)):
            result = ctx.run(script, timeout=timeout)
            later = mesh_read_script(ctx.cluster, ctx.name, framing, sshd_wait=0, mpirun=False, tries=False,
                                     container_files=as_root is None)
            ctx.remember(self.name, "\n".join([*lines, later]), framing, timeout=timeout)
            if as_root is not None:
                ctx.remember(ROOT_READ, as_root, framing, root=True)
            inside = None  # this run's own read has them
        else:
            lean = "" if as_root is None else "\n".join(
                [*lines, mesh_read_script(ctx.cluster, ctx.name, framing, sshd_wait=0, container_files=False)])
            result, inside = ctx.read_beside_root(self.name, script, framing, lean=lean, timeout=timeout,
                                                  root=None if as_root is None else (ROOT_READ, as_root))
        ctx.raise_unless_ok(result, "reading sparkctl's state dir")
        found = framing.split(result.stdout)
        if inside is not None:
            found.update(framing.split(inside))
        if carried and "sshd" in found:
            ctx.cluster.hand_over(CONTAINER_READ.at(ctx.name), found)
        sections = Framing.texts_of(found)
        have = set(sections.get("have", "").split())
        if "keydir:700" in have:  # the keys' dir is there, 0700
            have.add("keydir")
        if "hf_cache_not_writable" in have:
            # typically made by an earlier `docker run -v` (NVIDIA's procedure): docker creates it owned by root
            raise TaskFailed(f"the HF cache {hf_cache} on {ctx.name} is not writable by {ctx.user}",
                             hint=f"sudo chown -R {shlex.quote(ctx.user + ':')} {shlex.quote(hf_cache)}")
        changes = []
        for rel, content in self._files(ctx).items():
            current = sections.get(f"file:{rel}", "")
            if current != content:
                path = posixpath.join(base, rel)
                changes.append(Change(f"{'update' if current else 'write'} {path}",
                                      diff=unified_diff(path, current or None, content),
                                      payload=StateStep("file", path, content)))
        left = [w.partition(":")[2] for w in sorted(have) if w.startswith("left:")]
        if left:
            changes.append(Change(f"remove what TensorRT-LLM's mpirun left in {base} ({ctx.inventory.engine().label}'s "
                                  f"containers run no sshd or mpirun): {', '.join(left)}", payload=StateStep("retire")))
        if "run" not in have or (mesh and "keydir" not in have):
            changes.append(Change(f"create {base}/run" + (f" and {base}/container-ssh (mode 700)" if mesh else ""),
                                  payload=StateStep("dirs")))
        if "hf_cache" not in have:
            changes.append(Change(f"create the HF cache {hf_cache} (docker would create it owned by root)",
                                  payload=StateStep("dirs")))
        if mesh and "client" not in have:
            changes.append(Change("generate the container's client key container-ssh/id_ed25519",
                                  payload=StateStep("key", CLIENT_KEY)))
        if mesh and "hostkey" not in have:
            changes.append(Change("generate the container's ssh host key container-ssh/ssh_host_ed25519_key",
                                  payload=StateStep("key", HOST_KEY)))
        return changes

    def apply(self, ctx: NodeContext, changes: list[Change[StateStep]]) -> None:
        base = ctx.state_dir()
        keys = posixpath.join(base, "container-ssh")
        cluster = ctx.inventory.cluster.name
        lines = [f"mkdir -p {q(ctx.hf_cache_dir())}", f"install -d -m 700 {q(base)}",
                 f"install -d -m 755 {q(base + '/run')}"]
        if without_mpi(ctx.inventory) is None:
            lines += [f"install -d -m 700 {q(keys)}", f"chmod 700 {q(keys)}"]
        steps = [c.carried() for c in changes]
        if any(step.kind == "retire" for step in steps):
            lines.append("rm -rf " + " ".join(f"{q(base)}/{q(rel)}" for rel in MPI_LEFTOVERS))
        for step in steps:
            if step.kind == "key":
                key = posixpath.join(keys, step.target)
                comment = f"sparkctl-container-{cluster}@{ctx.name}"
                lines.append(keygen_line(q(key), comment))
        ctx.must(" && ".join(lines), "preparing sparkctl's state dir")
        for step in steps:
            if step.kind == "file":
                ctx.transport.put(step.target, step.content, mode=0o644)
