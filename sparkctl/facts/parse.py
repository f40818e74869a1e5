"""Parsers: one gather-script section's text in, typed values out. Pure; they raise on garbage."""

from __future__ import annotations

import base64
import json
import re
import shlex
from dataclasses import dataclass, field

from sparkctl.facts.model import Address, ContainerInfo, Interface, NetplanFile, RoceDevice, Route
from sparkctl.secrets import mask_env


def parse_key_values(text: str) -> dict[str, str]:
    """os-release / dgx-release: KEY=value lines, values possibly shell-quoted."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, raw = line.partition("=")
        try:
            parts = shlex.split(raw)
            values[key.strip()] = parts[0] if parts else ""
        except ValueError:
            values[key.strip()] = raw.strip().strip("\"'")
    return values


#: `id`'s fields; a name may hold a space (a directory service's "domain users"), never a parenthesis
_ID_FIELD = re.compile(r"\b(uid|gid|euid|egid|groups)=((?:\d+(?:\([^)]*\))?,?)+)")
_ID_ENTRY = re.compile(r"(\d+)(?:\(([^)]*)\))?")


def parse_id(text: str) -> tuple[str, int, list[str]]:
    """The `id` section: `id`'s line (`uid=N(name) gid=N(name) [euid=..] [egid=..] groups=N(name),...`) and $EUID,
    into the user's name, uid and group names as `id -un` and `id -Gn` print them; or, as older versions of the
    facts printed them, those three lines."""
    lines = text.splitlines()
    if len(lines) < 2:
        raise ValueError(f"expected user, uid and groups, got {len(lines)} lines")
    if not lines[0].startswith("uid="):
        groups = lines[2].split() if len(lines) > 2 else []
        return lines[0].strip(), int(lines[1]), groups
    fields = {key: [(int(m[1]), m[2] or m[1]) for m in _ID_ENTRY.finditer(value)]
              for key, value in _ID_FIELD.findall(lines[0])}
    if not fields.get("uid") or not fields.get("gid"):
        raise ValueError(f"not an id line: {lines[0]!r}")
    user = (fields.get("euid") or fields["uid"])[0][1]
    # `id -Gn`'s order (coreutils id.c print_group_list): the real group, the effective one where it differs, then
    # the others as the process has them
    first = [fields["gid"][0], *fields.get("egid", [])]
    rest = [g for g in fields.get("groups", []) if g[0] not in {gid for gid, _name in first}]
    return user, int(lines[1]), [name for _gid, name in first + rest]


def parse_ip_addr(text: str) -> dict[str, Interface]:
    """`ip -j -d addr show`: interfaces with MTU, operstate, flags and addresses."""
    interfaces: dict[str, Interface] = {}
    for link in json.loads(text):
        name = link["ifname"]
        addresses = [Address(ip=a["local"], prefixlen=int(a["prefixlen"]), family=a["family"],
                             scope=a.get("scope", "global"))
                     for a in link.get("addr_info", [])
                     if "local" in a and a.get("family") in ("inet", "inet6")]
        flags = list(link.get("flags", []))
        interfaces[name] = Interface(
            name=name, mtu=int(link.get("mtu", 0)), operstate=str(link.get("operstate", "UNKNOWN")),
            carrier=("LOWER_UP" in flags) if "UP" in flags else None,
            mac=link.get("address"), addresses=addresses, flags=flags)
    return interfaces


def parse_name_values(text: str) -> dict[str, str]:
    """`name value` lines; a missing value (unreadable sysfs file) is the empty string."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        if name:
            values[name] = value.strip()
    return values


def parse_carriers(text: str) -> dict[str, bool | None]:
    return {name: (value == "1") if value in ("0", "1") else None
            for name, value in parse_name_values(text).items()}


def parse_routes(text: str) -> list[Route]:
    """`ip -4 -o route show`: destination, gateway and device of each route (other attributes dropped)."""
    routes = []
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        fields = {words[i]: words[i + 1] for i in range(1, len(words) - 1) if words[i] in ("via", "dev")}
        routes.append(Route(words[0], fields.get("via"), fields.get("dev")))
    return routes


def parse_named_files(text: str) -> dict[str, str]:
    """`<path> <base64 content>` lines -> {path: content}."""
    out = {}
    for line in text.splitlines():
        path, _, encoded = line.strip().partition(" ")
        if path:
            out[path] = base64.b64decode(encoded).decode("utf-8", "replace")
    return out


def parse_ipv4_conf(text: str) -> dict[str, str]:
    """`ip_forward 0`, `conf/eth0/forwarding 1`, `conf/eth0/rp_filter 2` -> {"ip_forward": "0",
    "eth0.forwarding": "1", "eth0.rp_filter": "2"}."""
    out = {}
    for line in text.splitlines():
        path, _, value = line.strip().partition(" ")
        if path.startswith("conf/"):
            _, iface, key = path.split("/", 2)
            out[f"{iface}.{key}"] = value.strip()
        elif path:
            out[path] = value.strip()
    return out


def parse_speeds(text: str) -> dict[str, int]:
    """sysfs speed (Mb/s; -1 or unreadable when down) overridden by ethtool's `200000Mb/s` where present."""
    sysfs: dict[str, int] = {}
    ethtool: dict[str, int] = {}
    for line in text.splitlines():
        source, _, rest = line.strip().partition(" ")
        name, _, value = rest.partition(" ")
        m = re.match(r"^(\d+)", value.strip())
        if m and int(m.group(1)) > 0:
            (ethtool if source == "ethtool" else sysfs)[name] = int(m.group(1))
    return {**sysfs, **ethtool}


_IBDEV2NETDEV = re.compile(
    r"^(?P<dev>\S+)\s+port\s+(?P<port>\d+)\s+==>\s+(?P<netdev>\S+)\s+\((?P<state>\w+)\)")


def parse_ibdev2netdev(text: str) -> list[RoceDevice]:
    devices = []
    for line in text.splitlines():
        m = _IBDEV2NETDEV.match(line.strip())
        if m:
            devices.append(RoceDevice(device=m["dev"], port=int(m["port"]), netdev=m["netdev"],
                                      up=m["state"].lower() == "up"))
    return devices


def parse_ssh_connection(text: str) -> str | None:
    """$SSH_CONNECTION is `client_ip client_port server_ip server_port`: the node side is the 3rd field."""
    fields = text.split()
    return fields[2] if len(fields) >= 4 else None


def parse_netplan(text: str) -> list[NetplanFile]:
    """fact_netplan's lines: `MODE text PATH` and the file's lines after it (each after `|`, `~` before a last line
    without its newline), `MODE b64:BASE64 PATH`, or `MODE - PATH` (unreadable)."""
    files: list[NetplanFile] = []
    lines: list[str] | None = None  # the text file being read
    for line in text.split("\n"):  # only \n ends a line: a \r is the file's own
        if lines is not None and line[:1] in ("|", "~"):
            lines.append(line[1:] + ("\n" if line[0] == "|" else ""))
            continue
        if lines is not None:
            files[-1].content, lines = "".join(lines), None
        if not line.strip():
            continue
        mode, content, path = line.split(" ", 2)
        decoded = None
        if content.startswith("b64:"):
            decoded = base64.b64decode(content[4:]).decode("utf-8", "replace")
        files.append(NetplanFile(path=path, content=decoded, mode=int(mode, 8) if mode != "-" else None))
        if content == "text":
            lines = []
    if lines is not None:
        files[-1].content = "".join(lines)
    return files


def _container_from_inspect(name: str, item: dict) -> ContainerInfo:
    state = item.get("State") or {}
    config = item.get("Config") or {}
    env: dict[str, str] = {}
    for entry in config.get("Env") or []:
        key, _, value = entry.partition("=")
        env[key] = value
    # secret-named values never leave the parser: facts end up in events and bundles
    env = mask_env(env)
    return ContainerInfo(
        name=name, exists=True, running=bool(state.get("Running")), status=str(state.get("Status", "")),
        image=config.get("Image") or item.get("ImageName"), image_id=docker_image_id(item.get("Image")),
        labels=dict(config.get("Labels") or {}), env=env, mounts=list(item.get("Mounts") or []),
        restart_count=int(item.get("RestartCount") or 0), started_at=_started_at(state.get("StartedAt")),
        id=str(item.get("Id") or "") or None, restart_policy=_restart_policy(item), pid=_pid(state.get("Pid")))


def _pid(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _restart_policy(item: dict) -> str | None:
    """HostConfig.RestartPolicy.Name: docker writes "no" for none, podman "" (None: not reported at all)."""
    policy = (item.get("HostConfig") or {}).get("RestartPolicy")
    if not isinstance(policy, dict) or "Name" not in policy:
        return None
    return str(policy.get("Name") or "no")


def _started_at(value: str | None) -> str | None:
    # Docker and podman print the zero time for a container that never started.
    return None if not value or value.startswith("0001-01-01") else value


_NO_SUCH = re.compile(r"no such (container|object|image)", re.I)
# docker could not be asked at all: the socket refused us (not in the docker group) or no daemon answers
_UNREACHABLE = re.compile(r"permission denied.*(daemon socket|docker\.sock)|docker\.sock.*permission denied|"
                          r"cannot connect to the docker daemon|is the docker daemon running", re.I)


@dataclass
class DockerAnswer:
    """What one `docker inspect` of the containers and images said (the gather script's `docker` section)."""

    reached: bool                       # docker answered (denied or down: False)
    error: str | None                   # why not reached, or what it said besides "no such object"
    containers: dict[str, ContainerInfo]
    images: dict[str, str | None]
    #: by reference: the registry's digest of the image (RepoDigests; None for one built or loaded locally)
    digests: dict[str, str | None] = field(default_factory=dict)
    #: the names of the containers carrying the asked label (the Engine API's list; None: not listed)
    labelled: list[str] | None = None


def _stderr_lines(text: str) -> list[str]:
    return [line[5:].strip() for line in text.splitlines() if line.startswith("#err ") and line[5:].strip()]


def _inspected_items(text: str) -> list[dict] | None:
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#err "))
    try:
        items = json.loads(body) if body.strip() else None
    except ValueError:
        return None
    return items if isinstance(items, list) else None


def _image_names(ref: str) -> set[str]:
    """The spellings of an image reference docker and podman report (docker.io/library/ added or not)."""
    names = {ref}
    if "/" not in ref.split(":")[0].split("@")[0]:
        names |= {f"docker.io/library/{ref}", f"library/{ref}"}
    elif ref.count("/") == 1 and "." not in ref.split("/")[0] and ":" not in ref.split("/")[0]:
        names.add(f"docker.io/{ref}")
    return names


def parse_docker_answer(text: str, names: list[str], refs: list[str]) -> DockerAnswer:
    """The `docker` section: containers by name (a name docker did not return does not exist, unless it said
    why it could not tell: then "unknown"), images by reference (their id, None when absent)."""
    stderr = _stderr_lines(text)
    unreachable = [line for line in stderr if _UNREACHABLE.search(line)]
    items = _inspected_items(text)
    if unreachable or items is None:
        error = (unreachable or [line for line in stderr if not _NO_SUCH.search(line)] or
                 ["docker inspect printed nothing"])[-1]
        return DockerAnswer(False, error, {n: ContainerInfo(n, exists=False, status="unknown") for n in names},
                            dict.fromkeys(refs))
    other = [line for line in stderr if not _NO_SUCH.search(line)]
    found: dict[str, dict] = {}
    images: list[dict] = []
    for item in items:
        if isinstance(item, dict) and "State" in item:
            found[str(item.get("Name", "")).lstrip("/")] = item
            found.setdefault(str(item.get("Id", "")), item)
        elif isinstance(item, dict):
            images.append(item)
    containers = {}
    for name in names:
        if name in found:
            containers[name] = _container_from_inspect(name, found[name])
        elif other:  # not "absent": docker failed to say
            containers[name] = ContainerInfo(name, exists=False, status="unknown",
                                             error=f"docker inspect failed: {other[-1]}")
        else:
            containers[name] = ContainerInfo(name, exists=False)
    image_ids: dict[str, str | None] = {}
    digests: dict[str, str | None] = {}
    for ref in refs:
        spellings = _image_names(ref)
        match = next((i for i in images if spellings & set(i.get("RepoTags") or []) or
                      any(d.split("@")[-1] == ref.split("@")[-1] for d in i.get("RepoDigests") or [] if "@" in ref)),
                     None)
        if match is None and len(images) == 1 and len(refs) == 1:
            match = images[0]  # inspected by the one reference asked
        image_ids[ref] = docker_image_id(match.get("Id")) if match is not None else None
        digests[ref] = _repo_digest(match, ref) if match is not None else None
    return DockerAnswer(True, other[-1] if other else None, containers, image_ids, digests)


#: what fact_docker_api prints first: the Engine API answered, each answer's body followed by its `#http CODE` line
API_MARK = "#api\n"


def parse_docker_api(text: str, names: list[str], refs: list[str], *, listed: bool) -> DockerAnswer:
    """The `docker` section as the Engine API answered it (templates/facts.sh fact_docker_api): the labelled list
    when `listed`, then each container, then each image, in the order of sections.api_paths; 200 is the object,
    404 is "no such container/image". Answers missing or not JSON: ValueError (the section is unreadable)."""
    answers: list[tuple[str, str]] = []
    body: list[str] = []
    for line in text[len(API_MARK):].splitlines():
        if line.startswith("#http "):
            answers.append((line[6:].strip(), "\n".join(body)))
            body = []
        else:
            body.append(line)
    wanted = int(listed) + len(names) + len(refs)
    if len(answers) != wanted:
        raise ValueError(f"the Engine API gave {len(answers)} answers to {wanted} asks")
    decoded = [(code, json.loads(body_text) if code == "200" else None) for code, body_text in answers]
    labelled = None
    if listed:
        listing = decoded.pop(0)[1]
        if not isinstance(listing, list):
            raise ValueError("the Engine API's container list is not a list")
        labelled = [name for c in listing if isinstance(c, dict) and (name := _container_name(c.get("Names")))]
    containers = {name: (_container_from_inspect(name, item) if isinstance(item, dict) else
                         ContainerInfo(name, exists=False))
                  for name, (_code, item) in zip(names, decoded[:len(names)], strict=True)}
    images: dict[str, str | None] = {}
    digests: dict[str, str | None] = {}
    for ref, (_code, image) in zip(refs, decoded[len(names):], strict=True):
        found = image if isinstance(image, dict) else None
        images[ref] = docker_image_id(found.get("Id")) if found is not None else None
        digests[ref] = _repo_digest(found, ref) if found is not None else None
    return DockerAnswer(True, None, containers, images, digests, labelled)


def _container_name(names: object) -> str | None:
    """A listed container's own name: the one `/name` of its Names (the others, `/other/alias`, are the names legacy
    links gave it in other containers; the CLI's {{.Names}} leaves them out too)."""
    listed = names if isinstance(names, list) else []
    own = [n[1:] for n in listed if isinstance(n, str) and n.count("/") == 1 and n.startswith("/")]
    return own[0] if own and own[0] else None


def docker_image_id(value: object) -> str | None:
    """An image id as docker writes it (`sha256:<hex>`); podman's CLI writes the bare hex of the same id."""
    if not value:
        return None
    text = str(value)
    return f"sha256:{text}" if re.fullmatch(r"[0-9a-f]{64}", text) else text


def _repo_digest(image: dict, ref: str) -> str | None:
    """The registry digest (`sha256:...`) the image was pulled by: RepoDigests' entry of the reference's own
    repository where there is one, else its first."""
    found = [str(d) for d in image.get("RepoDigests") or [] if "@" in str(d)]
    repo = ref.split("@")[0].rsplit(":", 1)[0] if ":" in ref.split("/")[-1] else ref.split("@")[0]
    own = [d for d in found if d.split("@")[0] in _image_names(repo)]
    chosen = own or found
    return chosen[0].split("@", 1)[1] if chosen else None


def parse_docker_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "docker info failed"


_SS_PROCESS = re.compile(r'users:\(\("(?P<name>[^"]+)"')


def parse_ss_listening(text: str) -> dict[int, str | None]:
    """`ss -ltnpH`: port -> first process name seen (names only show with enough privilege)."""
    ports: dict[int, str | None] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        local = fields[3]
        port = int(local.rsplit(":", 1)[1])
        m = _SS_PROCESS.search(line)
        if ports.get(port) is None:
            ports[port] = m["name"] if m else None
    return ports


def parse_ss_addresses(text: str) -> dict[int, list[str]]:
    """`ss -ltnH`: port -> the local addresses listening on it (`*` and `0.0.0.0` mean every address)."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        address, _, port = fields[3].rpartition(":")
        if port.isdigit():
            address = address.strip("[]").split("%", 1)[0]
            out.setdefault(int(port), [])
            if address not in out[int(port)]:
                out[int(port)].append(address)
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if rest.split():
            values[key.strip()] = int(rest.split()[0])
    return values


def parse_hf_cache(text: str) -> tuple[str, int | None, dict[str, str]]:
    """(the cache's path, its free bytes, repo folder -> the commit model.pin pinned it at)."""
    lines = text.splitlines()
    path = lines[0] if lines else ""
    free = None
    pins = {}
    for line in lines[1:]:
        if line.strip().isdigit():  # df's number (after its header line)
            free = int(line)
            continue
        kind, _, rest = line.partition("\t")
        folder, _, pin = rest.partition("\t")
        commit = pin.partition("\t")[0]
        if kind == "pin" and len(commit) == 40 and all(c in "0123456789abcdef" for c in commit):
            pins[folder] = commit
    return path, free, pins


def parse_time(text: str) -> float:
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        return float(value.split(".")[0])  # a date without %N prints the letter N


def _firewall_blocks(text: str) -> dict[str, str]:
    blocks: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line in ("#ufw", "#nft", "#iptables"):
            current = line[1:]
            blocks[current] = []
        elif current:
            blocks[current].append(line)
    return {name: "\n".join(lines) for name, lines in blocks.items()}


def _nft_input_summary(ruleset: str) -> str | None:
    chain_hook = policy = None
    rules = 0
    blocking = False
    for raw in ruleset.splitlines():
        line = raw.strip()
        if line.startswith("chain "):
            chain_hook, policy, rules, blocking = None, None, 0, False
        elif line.startswith("type ") and " hook " in line:
            chain_hook = line.split(" hook ")[1].split()[0]
            m = re.search(r"policy (\w+)", line)
            policy = m.group(1) if m else "accept"
        elif line == "}":
            if chain_hook == "input" and (policy == "drop" or blocking):
                return f"nftables: {rules} rules in input (policy {policy})"
            chain_hook = None
        elif chain_hook and line:
            rules += 1
            blocking = blocking or bool(re.search(r"\b(drop|reject)\b", line))
    return None


def _iptables_input_summary(rules: str) -> str | None:
    policy = next((line.split()[2] for line in rules.splitlines() if line.startswith("-P INPUT ")), None)
    appended = [line for line in rules.splitlines() if line.startswith("-A INPUT")]
    blocking = any(re.search(r"-j (DROP|REJECT)\b", line) for line in appended)
    if policy in ("DROP", "REJECT") or blocking:
        return f"iptables: INPUT policy {policy}, {len(appended)} rules"
    return None


#: sparkctl's own table (plan/firewall.py TABLE), as `nft list` prints its first line
OWN_TABLE_LINE = "table inet sparkctl {"


def own_table(ruleset: str) -> str | None:
    """sparkctl's table as `nft list` printed it: from its first line to the `}` that closes it; "" when the
    ruleset holds none; None when the ruleset could not be read."""
    lines = ruleset.splitlines()
    if any("Operation not permitted" in line or "Permission denied" in line for line in lines[:3]):
        return None
    if OWN_TABLE_LINE not in lines:
        return ""
    start = lines.index(OWN_TABLE_LINE)
    end = next((i for i in range(start + 1, len(lines)) if lines[i] == "}"), len(lines) - 1)
    return "\n".join(lines[start:end + 1]) + "\n"


def without_own_table(ruleset: str) -> str:
    table = own_table(ruleset)
    return ruleset.replace(table.rstrip("\n"), "") if table else ruleset


def parse_own_firewall(text: str) -> str | None:
    """sparkctl's table from the firewall section's `nft list ruleset` (None: nft absent or not readable)."""
    blocks = _firewall_blocks(text)
    return own_table(blocks["nft"]) if "nft" in blocks else None


def parse_firewall(text: str) -> str | None:
    """A one-line summary of what filters inbound traffic, or None when nothing does (or we cannot tell).
    sparkctl's own table is not counted: it is planned to let in what the cluster needs."""
    blocks = _firewall_blocks(text)
    if re.search(r"^Status: active", blocks.get("ufw", ""), re.M):
        return "ufw active"
    if "nft" in blocks and (summary := _nft_input_summary(without_own_table(blocks["nft"]))):
        return summary
    if "iptables" in blocks:
        return _iptables_input_summary(blocks["iptables"])
    return None


def parse_guards(text: str) -> list[str] | None:
    """Pending netplan revert guards (their ids); None when they could not be read (sudo needs a password)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines == ["#unreadable"]:
        return None
    return [line for line in lines if line.isdigit()]


def listening_on(ss_output: str, port: int) -> set[str]:
    """The local addresses listening on `port` in `ss -ltnH` output (IPv6 without brackets)."""
    found = set()
    for line in ss_output.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            address, _, got = fields[3].rpartition(":")
            if got == str(port):
                found.add(address.strip("[]").split("%")[0])
    return found


def parse_marked_files(text: str) -> tuple[dict[str, str], str]:
    """`#file <path>` then its content, for each file that exists, then `#enabled` and what follows: ({path: text},
    the rest)."""
    files: dict[str, list[str]] = {}
    tail: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("#file /"):
            current = files.setdefault(line[len("#file "):], [])
        elif line == "#enabled":
            current = tail
        elif current is not None:
            current.append(line)
    return {path: "\n".join(lines) + "\n" for path, lines in files.items()}, "\n".join(tail)
