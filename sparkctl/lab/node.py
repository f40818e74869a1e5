"""One simulated Spark: its files on the machine, its init script, its cgroup, its PID 1.

A node is `ip netns exec <ns> unshare --mount --uts --ipc --pid --cgroup --fork` running a small shell
init that builds the node's filesystem view and then execs the machine's real systemd (docs/architecture.md, the lab).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sparkctl.lab.naming import NODE_USER
from sparkctl.lab.renderer import DEFAULT_RENDERER, Renderer, renderer_spec
from sparkctl.lab.state import process_is_alive

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Where a node sees its own directory: a path the node's other mounts never shadow, whatever DIR is.
NODE_DIR_MOUNT = "/var/lib/sparkctl-lab/node-root"
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EXEC_ENV = [f"PATH={NODE_PATH}", "HOME=/root", "USER=root", "LOGNAME=root", "LANG=C.UTF-8", "TERM=dumb"]


@dataclass(frozen=True)
class NodePaths:
    """The node's files on the machine, under DIR/nodes/<name>/."""

    base: Path

    etc_upper = property(lambda self: self.base / "etc-upper")
    etc_work = property(lambda self: self.base / "etc-work")
    home_upper = property(lambda self: self.base / "home-upper")
    home_work = property(lambda self: self.base / "home-work")
    root_home = property(lambda self: self.base / "root")
    run = property(lambda self: self.base / "run")
    tmp = property(lambda self: self.base / "tmp")
    # a real Spark has its own /var/tmp, kept across reboots; the machine's, shared by every node, left systemd's
    # PrivateTmp= units (systemd-hostnamed) failing at boot on some nodes of a 16-node lab ("degraded")
    var_tmp = property(lambda self: self.base / "var-tmp")
    containers = property(lambda self: self.base / "containers")
    # a real Spark has its own /var/lib; tools keep node state there (the machine's is shared otherwise)
    var_lib_sparkctl = property(lambda self: self.base / "var-lib-sparkctl")
    # the node's own /var/lib/<name> for a daemon that keeps state there (NetworkManager)
    var_lib = property(lambda self: self.base / "var-lib")
    console = property(lambda self: self.base / "console")
    bin = property(lambda self: self.base / "bin")
    init_script = property(lambda self: self.base / "init.sh")
    console_log = property(lambda self: self.base / "console.log")

    def upper_for(self, path: str) -> Path | None:
        """The machine path holding a node file written since boot, without the node running."""
        mapping = {"/etc": self.etc_upper, "/home": self.home_upper, "/root": self.root_home,
                   "/run": self.run, "/tmp": self.tmp, "/var/tmp": self.var_tmp,
                   "/var/lib/containers": self.containers,
                   "/var/lib/sparkctl": self.var_lib_sparkctl,
                   "/usr/local/bin": self.bin}
        for prefix, host_dir in mapping.items():
            if path == prefix or path.startswith(prefix + "/"):
                return host_dir / path[len(prefix):].lstrip("/")
        return None


# --- cgroups -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CgroupMount:
    mountpoint: str  # relative to /sys/fs/cgroup, e.g. "cpu" or "unified"
    fstype: str  # cgroup | cgroup2
    options: str  # e.g. "cpu", "none,name=systemd"


def machine_cgroup_mounts(mountinfo: str | None = None) -> list[CgroupMount]:
    """The machine's cgroup hierarchies, to be mounted the same way inside every node."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    mounts = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mountpoint = fields[4]
        if not mountpoint.startswith(str(CGROUP_ROOT) + "/"):
            continue
        opts = [o for o in tail[2].split(",") if o not in ("rw", "ro")]
        if tail[0] == "cgroup" and all(o.startswith("name=") for o in opts):
            opts.insert(0, "none")
        mounts.append(CgroupMount(mountpoint[len(str(CGROUP_ROOT)) + 1:], tail[0], ",".join(opts)))
    return mounts


def create_cgroup(relative: str, mounts: list[CgroupMount]) -> list[Path]:
    """mkdir the cgroup in every hierarchy; cpuset needs cpus/mems copied down before it takes tasks."""
    procs_files = []
    for mount in mounts:
        hierarchy = CGROUP_ROOT / mount.mountpoint
        current = hierarchy
        for part in relative.split("/"):
            parent, current = current, current / part
            current.mkdir(exist_ok=True)
            if "cpuset" in mount.options.split(","):
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    if not (current / knob).read_text().strip():
                        (current / knob).write_text((parent / knob).read_text())
        procs_files.append(current / "cgroup.procs")
    return procs_files


def remove_cgroup(relative: str, mounts: list[CgroupMount]) -> list[str]:
    """rmdir depth-first; returns what could not be removed (still holding processes)."""
    left = []
    for mount in mounts:
        top = CGROUP_ROOT / mount.mountpoint / relative
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                left.append(dirpath)
    return left


# --- init ----------------------------------------------------------------------------------------------
def render_init_script(paths: NodePaths, hostname: str, mounts: list[CgroupMount], init: str,
                       renderer: Renderer | None = None) -> str:
    renderer = renderer or renderer_spec(DEFAULT_RENDERER)
    d, user = NODE_DIR_MOUNT, NODE_USER
    lines = [
        "#!/bin/sh",
        "# PID 1 of a lab node until it execs systemd; written by sparkctl lab.",
        "set -eu",
        "mount -t proc proc /proc",
        f"mkdir -p {d} && mount --bind {shlex.quote(str(paths.base))} {d}",
        "mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup",
    ]
    for m in mounts:
        target = f"/sys/fs/cgroup/{m.mountpoint}"
        opts = f" -o {m.options}" if m.options else ""
        lines.append(f"mkdir -p {target} && mount -t {m.fstype}{opts} {m.fstype} {target}")
    lines += [
        # podman's cgroupfs manager puts conmon in a cgroup of every enabled v1 controller (/proc/cgroups), also
        # those the machine never mounted (net_cls, perf_event ...): on the machine that is a plain directory, but
        # a node's systemd remounts /sys/fs/cgroup read-only, and podman then warns "Failed to add conmon to
        # cgroupfs sandbox cgroup" on every docker run and exec, into sparkctl's output. A small tmpfs of their own
        # keeps them writable, as they are on the machine.
        "for c in $(awk 'NR > 1 && $2 == 0 && $4 == 1 { print $1 }' /proc/cgroups); do",
        '  [ -e "/sys/fs/cgroup/$c" ] || { mkdir -p "/sys/fs/cgroup/$c" && mount -t tmpfs -o mode=755 "$c" '
        '"/sys/fs/cgroup/$c"; } || true',
        "done",
        # read-only /sys puts networkd in container mode and NetworkManager off udev: neither waits for udev
        # (there is none in a netns; sparkctl/lab/renderer.py)
        "mount -o remount,ro /sys",
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={d}/etc-upper,workdir={d}/etc-work /etc",
        f"mount -t overlay overlay -o lowerdir=/home,upperdir={d}/home-upper,workdir={d}/home-work /home",
        f"mount --bind {d}/root /root",
        f"mount --bind {d}/run /run",
        f"mount --bind {d}/tmp /tmp",
        f"mount --bind {d}/var-tmp /var/tmp",
        f"mkdir -p /var/lib/containers && mount --bind {d}/containers /var/lib/containers",
        f"mkdir -p /var/lib/sparkctl && mount --bind {d}/var-lib-sparkctl /var/lib/sparkctl",
        f"mount --bind {d}/bin /usr/local/bin",
        *(f"mkdir -p /var/lib/{name} && mount --bind {d}/var-lib/{name} /var/lib/{name}"
          for name in renderer.own_var_lib),
        "mount -t tmpfs -o mode=1777 shm /dev/shm",
        "mount -t tmpfs -o mode=755 log /var/log",
        # systemd in a container writes to /dev/console and chowns it to root:tty 0620: a file of the node's
        # own, never the machine's /dev/null (which would then refuse writes from everyone but root)
        f"mount --bind {d}/console /dev/console",
        f"hostname {hostname}",
        # the machine's host keys are dropped once, at the first boot; the node's own are kept across reboots
        f"if [ ! -e {d}/etc-upper/ssh/ssh_host_ed25519_key ]; then rm -f /etc/ssh/ssh_host_*; ssh-keygen -q -A; fi",
        "getent group docker >/dev/null || groupadd -r docker",
        f"if ! id {user} >/dev/null 2>&1; then",
        # uid 1000 like DGX OS's first user, unless the machine already gave it away
        "  if getent passwd 1000 >/dev/null || getent group 1000 >/dev/null;",
        f"  then useradd -m -s /bin/bash {user}",
        f"  else useradd -m -u 1000 -s /bin/bash {user}; fi",
        "fi",
        f"usermod -aG docker {user}",
        f"install -d -m 700 -o {user} -g {user} /home/{user}/.ssh",
        # the lab's key at the first boot; after that the file is the node's (sparkctl adds the cluster's keys)
        f"[ -e /home/{user}/.ssh/authorized_keys ] || "
        f"install -m 600 -o {user} -g {user} {d}/authorized_keys /home/{user}/.ssh/authorized_keys",
        "echo booting > /run/lab/init",
    ]
    if init == "systemd":
        lines.append(f"exec env -i container=lab PATH={NODE_PATH} /lib/systemd/systemd")
    else:
        lines += [
            # the fallback: no service manager, the three daemons the lab needs started by hand
            "mkdir -p /run/systemd /run/dbus /run/sshd",
            "dbus-daemon --system --fork",
            "netplan generate",
            f"{renderer.fallback_daemon} &",
            "/usr/sbin/sshd",
            "/usr/local/bin/dockerd &",
            "trap 'exit 0' TERM INT",
            "while :; do sleep 3600 & wait $!; done",
        ]
    return "\n".join(lines) + "\n"


JOIN_CGROUP = 'for f in $NODE_CGROUP_PROCS; do echo $$ > "$f"; done; exec "$@"'


def launch_argv(netns: str, paths: NodePaths) -> list[str]:
    """Join the node cgroup BEFORE entering the netns: `ip netns exec` remounts /sys and hides it."""
    node = ["ip", "netns", "exec", netns, "unshare", "--mount", "--uts", "--ipc", "--pid", "--cgroup",
            "--fork", "--propagation", "private", "--", "/bin/sh", str(paths.init_script)]
    return ["/bin/sh", "-c", JOIN_CGROUP, "sh", *node]


def start(netns: str, paths: NodePaths, procs_files: list[Path]) -> subprocess.Popen:
    env = {"PATH": NODE_PATH, "NODE_CGROUP_PROCS": " ".join(map(str, procs_files))}
    with open(paths.console_log, "ab") as console:
        return subprocess.Popen(launch_argv(netns, paths), stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)


def child_pid(pid: int) -> int | None:
    """The node's PID 1 as the machine sees it: the child `unshare --fork` made."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return None
    return int(children[0]) if children else None


def exec_argv(pid: int, argv: list[str] | str, procs_files: list[Path] | None = None) -> list[str]:
    """root on the node, in all its namespaces, with a clean environment."""
    command = ["/bin/sh", "-c", argv] if isinstance(argv, str) else list(argv)
    inner = ["nsenter", "-t", str(pid), "-a", "--", "env", "-i", *EXEC_ENV, *command]
    if not procs_files:
        return inner
    # join the node's cgroup, so what the command leaves running (a container's conmon) belongs to the node
    return ["/bin/sh", "-c", JOIN_CGROUP, "sh", *inner]


def node_exec(pid: int, argv: list[str] | str, *, check: bool = False, input: str | None = None,
              timeout: float | None = 120, procs_files: list[Path] | None = None,
              capture: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if procs_files:
        env["NODE_CGROUP_PROCS"] = " ".join(map(str, procs_files))
    return subprocess.run(exec_argv(pid, argv, procs_files), input=input, capture_output=capture, text=True,
                          check=check, timeout=timeout, env=env)


def is_running(pid: int | None, starttime: int | None = None) -> bool:
    return pid is not None and process_is_alive(pid, starttime)


def copy_skel(target: Path) -> None:
    """A FRESH /root: the machine's own /root would leak its dotfiles (a pyenv python3 without mpi4py)."""
    target.mkdir(parents=True, exist_ok=True)
    target.chmod(0o700)
    skel = Path("/etc/skel")
    if skel.is_dir():
        shutil.copytree(skel, target, dirs_exist_ok=True, symlinks=True)
