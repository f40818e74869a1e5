"""Hostile and careless inventories: every one is refused with `file:line: field: what (fix)`, exit 2, no
traceback, no secret echoed, in bounded memory, before any node is touched; legitimate values stay accepted.

Hand-written cases for each class of attack, then property-based fuzzing (hypothesis) over the inventory model.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import tracemalloc
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkctl.cli.main import cli
from sparkctl.errors import InventoryError
from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster

TOKEN = "hf_HostileToken0123456789abcdefXYZ"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
GITHUB = "ghp_" + "a1B2c3D4e5" * 4
PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----"
SECRETS = (TOKEN, AWS_KEY, GITHUB, PRIVATE_KEY)
BASE = {"user": "nvidia", "nodes": [{"name": "spark1", "host": "10.0.0.11"}, {"name": "spark2", "host": "10.0.0.12"}]}
#: a refusal names the file, the line (when the file parsed), the field, what is wrong and what to do
PROBLEM = re.compile(r"^(?P<file>[^:\n]+?)(?::(?P<line>\d+))?: (?:(?P<field>[^\s:]+|top level): )?[^\n]+\([^\n]+\)$")
MEMORY_LIMIT = 200 << 20


def with_(**sections) -> str:
    document = dict(BASE)
    document.update(sections)
    return yaml.safe_dump(document, sort_keys=False)


def node(i: int) -> dict:
    return {"name": f"s{i}", "host": f"10.1.{i // 250}.{i % 250 + 1}"}


def alias_bomb(levels: int = 7) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


CASES = {
    # injection into node files and argv positions
    "env value with a quote and a newline": with_(container={"env": {"X": 'a"\nPermitRootLogin yes'}}),
    "netplan file with a newline": with_(fabric={"netplan_file": "/etc/netplan/40.yaml\nrm -rf /"}),
    "netplan file outside /etc/netplan": with_(fabric={"netplan_file": "/etc/netplan/../passwd.yaml"}),
    "image that is an option": with_(container={"image": "--privileged"}),
    "model that is an option": with_(serve={"model": "--help", "decoding": "none"}),
    "draft with ..": with_(serve={"model": "a/b", "draft": "../../etc", "decoding": "eagle3"}),
    "hf_cache at /": with_(container={"hf_cache": "/"}),
    "hf_cache at /etc": with_(container={"hf_cache": "/etc"}),
    "hf_cache that is two mounts": with_(container={"hf_cache": "/data:/etc"}),
    "hf_cache with ..": with_(container={"hf_cache": "~/../../etc"}),
    "hf_cache with a $": with_(container={"hf_cache": "/data/$(reboot)"}),
    "hf_cache with a backtick": with_(container={"hf_cache": "/data/`id`"}),
    "hf_cache with a space": with_(container={"hf_cache": "/data/hf cache"}),
    "hf_cache at /var (holds /var/lib)": with_(container={"hf_cache": "/var"}),
    "hf_cache at /usr/local": with_(container={"hf_cache": "/usr/local"}),
    "hf_cache at /home": with_(container={"hf_cache": "/home"}),
    "hf_cache at a home": with_(container={"hf_cache": "/home/nvidia"}),
    "hf_cache at ~": with_(container={"hf_cache": "~"}),
    "hf_cache at ~/.ssh": with_(container={"hf_cache": "~/.ssh"}),
    "env key that is sparkctl's own (sshd on every interface)": with_(container={"env": {"SPARKCTL_SSHD_LISTEN": ""}}),
    "env key that is sparkctl's own, any case": with_(container={"env": {"sparkctl_sshd_listen": "0.0.0.0"}}),
    "docker arg with a newline": with_(container={"docker_args": ["--shm-size=1g\n--privileged"]}),
    "host that is an option": with_(nodes=[{"name": "a", "host": "-oProxyCommand=touch /tmp/x"}]),
    "host with a shell": with_(nodes=[{"name": "a", "host": "h;reboot"}]),
    "user with a space": with_(user="nvidia; reboot"),
    "identity file with a newline": with_(ssh={"identity_file": "~/.ssh/id\nx"}),
    # secrets on the screen
    "token as the image": with_(container={"image": TOKEN}),
    "token as the model": with_(serve={"model": TOKEN, "decoding": "none"}),
    "token as the user": with_(user=TOKEN),
    "token in serve.config": with_(serve={"preset": "qwen3-235b-eagle3", "config": {"x": {"y": TOKEN}}}),
    "token as a host": with_(nodes=[{"name": "a", "host": TOKEN}]),
    "aws key in env": with_(container={"env": {"NOTHING_SECRET": AWS_KEY}}),
    "github token as a docker arg": with_(container={"docker_args": [f"--label=x={GITHUB}"]}),
    "private key in env": with_(container={"env": {"K": PRIVATE_KEY}}),
    # tracebacks before
    "preset null and an empty model": with_(serve={"preset": None, "model": ""}),
    "speculative_config a number": with_(serve={"preset": "qwen3-235b-eagle3", "config": {"speculative_config": 5}}),
    "cuda_graph_config a number": with_(serve={"preset": "qwen3-235b-eagle3", "config": {"cuda_graph_config": 5}}),
    "ring of 130": with_(nodes=[node(i) for i in range(130)], fabric={"topology": "ring"}),
    "switch of 260": with_(nodes=[node(i) for i in range(260)], fabric={"topology": "switch"}),
    "nested 400 deep": "user: nvidia\nnodes: [{name: a, host: h}]\nserve: {config: " + "{a: " * 400 + "1"
                       + "}" * 400 + "}\n",
    # YAML values their tag cannot construct: a clean refusal at their line, the value never repeated
    "invalid date": "user: nvidia\nnodes: [{name: a, host: h}]\ncluster: {name: 2024-02-30}\n",
    "!!int of letters": "user: nvidia\nnodes: [{name: a, host: h, port: !!int abc}]\n",
    "!!bool maybe": "user: nvidia\nnodes: [{name: a, host: h, local: !!bool maybe}]\n",
    "!!float of letters": "user: nvidia\nnodes: [{name: a, host: h}]\nssh: {connect_timeout: !!float soon}\n",
    "5000-digit int": "user: nvidia\nnodes: [{name: a, host: h, port: " + "1" * 5000 + "}]\n",
    "4000-digit hex int where text goes": "user: nvidia\nnodes: [{name: a, host: h}]\ncontainer: {env: {X: 0x"
                                          + "f" * 4000 + "}}\n",
    "!!int of a token": f"user: nvidia\nnodes: [{{name: a, host: h}}]\nx: !!int {TOKEN}\n",
    "alias named like a token": f"user: *{TOKEN}\nnodes: [{{name: a, host: h}}]\n",
    "tag named like a token": f"user: !{TOKEN} x\nnodes: [{{name: a, host: h}}]\n",
    # inputs that exhaust the machine
    "a 1 MiB value": "user: nvidia\nnodes: [{name: a, host: h}]\nserve: {config: {x: '" + "y" * 1_000_000 + "'}}\n",
    "4 900 unknown config keys": "user: nvidia\nnodes: [{name: a, host: h}]\nserve:\n  config:\n"
                                 + "".join(f"    k{i}: '{'v' * 180}'\n" for i in range(4900)),
    "alias bomb": alias_bomb(),
    "alias loop": "a: &a [*a]\nuser: nvidia\n",
    "alias loop through an anchor named like a token": f"a: &{TOKEN} [*{TOKEN}]\nuser: nvidia\n",
    # wrong but passing before
    "ssh_port true": with_(container={"ssh_port": True}),
    "connect_timeout inf": "user: nvidia\nnodes: [{name: a, host: h}]\nssh: {connect_timeout: .inf}\n",
    "connect_timeout nan": "user: nvidia\nnodes: [{name: a, host: h}]\nssh: {connect_timeout: .nan}\n",
    "serve port = container ssh port": with_(container={"ssh_port": 8355}, serve={"preset": "qwen3-235b-eagle3",
                                                                                  "port": 8355}),
    "container ssh port = the preset's serve port": with_(container={"ssh_port": 8355},
                                                          serve={"preset": "qwen3-235b-eagle3"}),
    "container ssh port = the default serve port": with_(container={"ssh_port": 8355}, serve={}),
    "container ssh port = host sshd": with_(container={"ssh_port": 22}),
    "fabric.port true": with_(fabric={"port": True}),
    "local as the string 'yes'": with_(nodes=[{"name": "a", "host": "h", "local": "yes"}]),
    "use_ssh_config as the number 1": with_(ssh={"use_ssh_config": 1}),
    "connect_timeout a string": "user: nvidia\nnodes: [{name: a, host: h}]\nssh: {connect_timeout: '10'}\n",
    "connect_timeout a millisecond": "user: nvidia\nnodes: [{name: a, host: h}]\nssh: {connect_timeout: 0.001}\n",
    "ready_timeout of a second": with_(serve={"ready_timeout": 1}),
    "env value of 5000 characters": with_(container={"env": {"X": "a" * 5000}}),
    "multicast subnets": with_(fabric={"subnets": ["224.0.0.0/24", "192.168.1.0/24"]}),
    "loopback subnets": with_(fabric={"subnets": ["127.0.0.0/24", "192.168.1.0/24"]}),
    "link-local subnets": with_(fabric={"subnets": ["169.254.1.0/24", "192.168.1.0/24"]}),
    "reserved subnets": with_(fabric={"subnets": ["240.0.0.0/24", "192.168.1.0/24"]}),
    "public subnets": with_(fabric={"subnets": ["8.8.8.0/24", "192.168.1.0/24"]}),
    "300-character cluster name": with_(cluster={"name": "a" * 300}),
    "too many env entries": with_(container={"env": {f"V{i}": "1" for i in range(300)}}),
}


@pytest.fixture
def write(tmp_path):
    def make(name: str, text: str) -> Path:
        path = tmp_path / f"{re.sub(r'[^a-z0-9]+', '-', name.lower())}.yaml"
        path.write_text(text)
        return path
    return make


def refused(args: list[str], tmp_path: Path) -> tuple[list[str], int]:
    """Run sparkctl in-process; (stderr lines, peak bytes allocated)."""
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"), "SPARKCTL_DEBUG": ""}
    tracemalloc.start()
    try:
        result = CliRunner().invoke(cli, args, env=env)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 2, result.output
    text = result.stdout + result.stderr
    assert "Traceback" not in text and not any(s in text for s in SECRETS), text
    return result.stderr.splitlines(), peak


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_hostile_inventory_is_refused_cleanly_before_any_node(name, write, tmp_path):
    path = write(name, CASES[name])
    lines, peak = refused(["cluster", "bootstrap", str(path)], tmp_path)
    assert lines[-1].endswith("in the inventory; nothing was changed"), lines
    for line in lines[:-1]:
        found = PROBLEM.match(line)
        assert found and found["file"] == str(path), line
    assert peak < MEMORY_LIMIT, f"{peak >> 20} MiB"
    assert not (tmp_path / "state").exists(), "a run started (its journal exists): a node may have been touched"


@pytest.mark.parametrize("number", ["0x" + "f" * 4000, "-0b" + "1" * 400, "1_" * 120 + "1", "9" * 101])
def test_a_number_longer_than_any_field_needs_is_refused_at_its_line_whatever_its_spelling(number, tmp_path):
    """int() reads hex, octal and binary of any length, and pydantic then cannot even print the number it refuses
    (Python's 4300-digit limit): the source refuses it at construction, where it knows the line."""
    path = tmp_path / "inv.yaml"
    path.write_text(f"user: nvidia\nnodes: [{{name: a, host: h}}]\ncontainer:\n  env:\n    X: {number}\n")
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    assert err.value.problems == [f"{path}:5: container.env.X: cannot be read as a whole number"
                                  f"{' of at most 100 digits' if len(number) > 100 else ''} (correct it, or "
                                  "quote it to make it text)"]


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "big", "directory", "loop"])
def test_files_that_are_not_inventories_are_refused_at_once(special, tmp_path):
    path = tmp_path / special
    if special == "fifo":
        os.mkfifo(path)  # nothing writes: reading it would wait forever
    elif special == "big":
        path.write_text("# padding\n" * 200_000)
    elif special == "directory":
        path.mkdir()
    elif special == "loop":
        path.symlink_to(path)
    lines, peak = refused(["inventory", "validate", special if special == "/dev/zero" else str(path)], tmp_path)
    assert len(lines) == 2 and "(" in lines[0] and peak < MEMORY_LIMIT


def test_password_and_token_files_are_bounded_too(write, tmp_path, monkeypatch):
    path = write("ok", with_())
    lines, _ = refused(["cluster", "bootstrap", str(path), "--become-password-file", "/dev/zero"], tmp_path)
    assert lines[0] == ("sparkctl: error: --become-password-file /dev/zero: cannot read it: is a character device, "
                        "not a regular file")
    from sparkctl.secrets import SecretUnreadable, secret_from_env

    monkeypatch.setenv("HF_TOKEN_FILE", "/dev/zero")
    with pytest.raises(SecretUnreadable, match="character device"):
        secret_from_env("HF_TOKEN")


def test_a_credential_variable_of_another_service_is_warned_about(write):
    inventory = load_inventory(write("aws", with_(serve={"hf_token_env": "AWS_SECRET_ACCESS_KEY"})))
    (warning,) = inventory.warnings
    assert "serve.hf_token_env: AWS_SECRET_ACCESS_KEY names a credential of AWS" in warning


LEGITIMATE = {
    "private registry with a port and digest": {"container": {"image": "registry.local:5000/team/trtllm@sha256:"
                                                                       + "a" * 64}},
    "docker hub short name": {"container": {"image": "ubuntu:24.04"}},
    "hf cache on a data disk": {"container": {"hf_cache": "/data/hf-cache"}},
    "hf cache under a home": {"container": {"hf_cache": "/home/nvidia/.cache/huggingface"}},
    "hf cache under /var/cache": {"container": {"hf_cache": "/var/cache/huggingface"}},
    "ipv6 host and ssh alias": {"nodes": [{"name": "a", "host": "fd00::11"}, {"name": "b", "host": "spark-2.lan"}]},
    "env with spaces and equals": {"container": {"env": {"NCCL_DEBUG_SUBSYS": "INIT,NET", "X": "a b=c"}}},
    "docker args": {"container": {"docker_args": ["--shm-size=16g", "-e", "NCCL_DEBUG"]}},
    "model ids with dots and underscores": {"serve": {"model": "meta-llama/Llama-3.3-70B-Instruct",
                                                      "draft": "nvidia/Llama_3.1.8B", "decoding": "draft-target"}},
    "container ssh port 8355 without serving": {"container": {"ssh_port": 8355}},
    "carrier-grade subnets": {"fabric": {"subnets": ["100.64.0.0/24", "100.64.1.0/24"]}},
    "a /8 judged, not enumerated": {"fabric": {"subnets": ["10.128.0.0/9", "172.16.0.0/12"]}},
}


@pytest.mark.parametrize("name", sorted(LEGITIMATE))
def test_legitimate_values_stay_accepted_and_plan(name, write):
    inventory = load_inventory(write(name, with_(**LEGITIMATE[name])))
    plan = plan_cluster(inventory)
    for node_plan in plan.nodes.values():
        assert not any("\n" in arg for arg in node_plan.container.run_argv())


# --- property-based -------------------------------------------------------------------------------------------

HOSTILE_TEXT = st.sampled_from(["", "-x", "--help", "..", "../..", "/", "/etc", "a:b", "a,b", "a\nb", "a\x00b",
                                "$(reboot)", "`id`", "a'b\"c", "a\\b", TOKEN, AWS_KEY, " ", "\t", "é", "~root",
                                "a" * 300, "192.168.0.0/16", "0.0.0.0/0", "-1", "1e309"])
LEAVES = st.one_of(HOSTILE_TEXT, st.text(max_size=20), st.integers(min_value=-2**70, max_value=2**70),
                   st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none())
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)
FIELDS = [("user",), ("cluster", "name"), ("nodes", 0, "host"), ("nodes", 1, "name"), ("nodes", 0, "user"),
          ("nodes", 0, "port"), ("nodes", 1, "fabric"), ("nodes",), ("ssh", "port"), ("ssh", "connect_timeout"),
          ("ssh", "identity_file"), ("fabric", "topology"), ("fabric", "subnets"), ("fabric", "mtu"),
          ("fabric", "netplan_file"), ("fabric", "port"), ("container", "image"), ("container", "hf_cache"),
          ("container", "env"), ("container", "docker_args"), ("container", "ssh_port"), ("container", "name"),
          ("serve", "preset"), ("serve", "model"), ("serve", "draft"), ("serve", "config"), ("serve", "tp_size"),
          ("serve", "port"), ("serve", "hf_token_env"), ("serve", "decoding"), ("unknown",)]


def _set(document: dict, where: tuple, value) -> dict:
    """document with the value at `where`, where the path still exists (earlier changes may have replaced it)."""
    target = document
    for part in where[:-1]:
        if isinstance(target, dict) and isinstance(part, str):
            target = target.setdefault(part, {})
        elif isinstance(target, list) and isinstance(part, int) and part < len(target):
            target = target[part]
        else:
            return document
    last = where[-1]
    in_mapping = isinstance(target, dict) and isinstance(last, str)
    in_list = isinstance(target, list) and isinstance(last, int) and last < len(target)
    if in_mapping or in_list:
        target[last] = value
    return document


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@pytest.mark.slow
@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS), VALUES), min_size=1, max_size=4))
def test_fuzzed_inventories_load_or_are_refused_never_crash(changes, tmp_path):
    document = {"user": "nvidia", "nodes": [{"name": "spark1", "host": "10.0.0.11"},
                                            {"name": "spark2", "host": "10.0.0.12"}]}
    for where, value in changes:
        _set(document, where, value)
    try:
        text = yaml.safe_dump(document, allow_unicode=True)
    except yaml.YAMLError:
        return
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    try:
        inventory = load_inventory(path)
    except InventoryError as err:
        assert not any(s in str(err) for s in SECRETS)
        assert all(PROBLEM.match(line) for line in err.problems), err.problems
        return
    # accepted: every value that reaches a node renders safely
    plan = plan_cluster(inventory)
    for node_plan in plan.nodes.values():
        argv = node_plan.container.run_argv()
        assert not any(c in arg for arg in argv for c in "\n\r\x00")
        assert shlex.split(shlex.join(argv)) == argv


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_fuzzed_bytes_never_crash_the_loader(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("bytes") / "inv.yaml"
    path.write_bytes(data)
    with contextlib.suppress(InventoryError):
        load_inventory(path)


def test_a_file_with_thousands_of_problems_prints_the_first_50_and_counts_the_rest(write, tmp_path):
    path = write("many", CASES["4 900 unknown config keys"])
    lines, _ = refused(["inventory", "validate", str(path)], tmp_path)
    assert len(lines) == 52, lines[-3:]
    assert lines[-2] == f"{path}: and 4850 more problems (fix the ones above, then validate again)"
    assert all(PROBLEM.match(line) for line in lines[:-1])


def test_a_bad_yaml_value_is_placed_at_its_line_and_field_without_repeating_it(write):
    path = write("tok", f"user: nvidia\nnodes:\n  - name: a\n    host: h\n    port: !!int {TOKEN}\n")
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    assert err.value.problems == [f"{path}:5: nodes[0].port: cannot be read as a whole number (correct it, or "
                                  "quote it to make it text)"]


@pytest.mark.parametrize("target", ["/dev/full", "/proc/version"])
def test_an_output_file_that_cannot_be_written_is_bad_input(target, tmp_path):
    if not os.path.exists(target):
        pytest.skip(f"no {target} here")
    result = CliRunner().invoke(cli, ["playbooks", "-o", target], env={"SPARKCTL_DEBUG": ""})
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [f"sparkctl: error: --output {target}: cannot write it: "
                                          + ("No space left on device" if target == "/dev/full"
                                             else "Input/output error")]


# YAML written by hand, not by yaml.safe_dump (which quotes what would not read back): dates, tags, huge numbers,
# aliases and tags named like tokens, in the positions of real fields.
RAW_SCALARS = st.one_of(
    st.sampled_from(["2024-02-30", "2024-13-01", "2024-02-29 25:61:00", "!!int abc", "!!bool maybe", "!!float x",
                     "!!timestamp 2024-99-99", "!!null x", "!!binary '###'", "!!int 0x" + "f" * 5000, "1" * 5000,
                     "-" + "9" * 4400, f"!!int {TOKEN}", f"*{TOKEN}", f"!{TOKEN} x", f"!!str {TOKEN}", ".inf",
                     ".nan", "0o777", "1_000", "0b101", "~", "!!set {a}", "!!omap [a: 1]", "!!pairs [a: 1]",
                     "&a x", "'2024-02-30'", "true", "22", "nvidia", "10.0.0.11", "[1, 2]", "{a: 1}"]),
    st.from_regex(r"\A[0-9]{1,5}(-[0-9]{1,3}){0,2}\Z"),
)
RAW_TEMPLATE = ("user: {user}\nnodes:\n  - name: spark1\n    host: {host}\n    port: {port}\n"
                "  - {{name: spark2, host: 10.0.0.12, local: {local}}}\ncluster: {{name: {cluster}}}\n"
                "ssh: {{connect_timeout: {timeout}}}\ncontainer: {{ssh_port: {ssh_port}, env: {{X: {env}}}}}\n")
RAW_FIELDS = ("user", "host", "port", "local", "cluster", "timeout", "ssh_port", "env")


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({name: RAW_SCALARS for name in RAW_FIELDS}))
def test_fuzzed_raw_yaml_scalars_load_or_are_refused_never_crash(tmp_path_factory, values):
    path = tmp_path_factory.mktemp("raw") / "inv.yaml"
    path.write_text(RAW_TEMPLATE.format(**values))
    try:
        load_inventory(path)
    except InventoryError as err:
        assert not any(s in str(err) for s in SECRETS), err.problems
        assert all(PROBLEM.match(line) for line in err.problems), err.problems


def test_key_and_known_hosts_files_are_judged_before_anything_connects(write, tmp_path):
    """paramiko reads them whole: /dev/zero or a FIFO would exhaust memory or hang (MemoryError before)."""
    fifo = tmp_path / "kh"
    os.mkfifo(fifo)
    big = tmp_path / "big_key"
    big.write_bytes(b"x" * (65 << 10))
    path = write("keys", "user: nvidia\nnodes:\n  - {name: a, host: h, identity_file: /dev/zero}\n"
                         f"  - {{name: b, host: i, identity_file: {big}}}\nssh: {{known_hosts: {fifo}}}\n")
    lines, peak = refused(["cluster", "bootstrap", str(path)], tmp_path)
    assert lines[:-1] == [
        f"{path}:3: nodes[0].identity_file: /dev/zero is a character device, not a regular file (name a private key "
        "here)",
        f"{path}:4: nodes[1].identity_file: {big} is larger than 64 KiB (name a private key here)",
        f"{path}:5: ssh.known_hosts: {fifo} is a FIFO (named pipe), not a regular file (name a known_hosts file "
        "here)"]
    assert peak < MEMORY_LIMIT


def test_a_refused_subnet_names_every_range_that_is_accepted(write):
    with pytest.raises(InventoryError) as err:
        load_inventory(write("public", with_(fabric={"subnets": ["8.8.8.0/24", "192.168.1.0/24"]})))
    assert "10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or 100.64.0.0/10" in str(err.value)


@pytest.mark.parametrize("text, where", [
    ("user: nvidia\nnodes: [{name: a, host: h}]\nserve: {config: {x: '" + "y" * 70_000 + "'}}\n",
     ":3: serve.config.x: a value is longer than 65536 characters"),
    ("user: nvidia\ncontainer:\n  env:\n    A: [" + ",".join(["1"] * 10_001) + "]\n",
     ":4: container.env.A[9995]: expands to more than 10000 values"),
    ("user: nvidia\nnodes:\n  - name: a\n    fabric: " + "[" * 40 + "]" * 40 + "\n",
     ":4: nodes[0].fabric[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]"
     ": nested more than 32 levels deep"),
])
def test_refusals_of_the_file_s_shape_name_the_field_they_met(write, text, where):
    path = write("shape", text)
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    (problem,) = err.value.problems
    assert problem.startswith(f"{path}{where}"), problem
    assert PROBLEM.match(problem)
