"""The gateway in front of the engine (plan/gateway.py, tasks/serve/gateway.py) and the endpoint's API key on
the controller (tasks/serve/api_key.py). The real NGINX answering 401 and 200 is proven in the lab
(tests/lab/test_bootstrap_serve.py)."""

from __future__ import annotations

import os
import stat

import pytest

from sparkctl.inventory.sections import DEFAULT_GATEWAY_IMAGE
from sparkctl.lab.image import GATEWAY_IMAGE
from sparkctl.plan.gateway import GATEWAY_CONTAINER, ListenUnknown, gateway_spec, listen_addresses
from sparkctl.plan.render import UnsafeValue
from sparkctl.plan.trtllm import launch_argv
from sparkctl.secrets import MASK, forget_secrets, redact_known
from sparkctl.taskgraph.task import Change, TaskFailed
from sparkctl.tasks.serve import api_key as keys
from sparkctl.tasks.serve.gateway import ServeGatewayTask
from tests.taskkit import framed, inspected, inventory_from_yaml, make_kit, sha256sum_lines, spark_facts

KEY = "k3y-0f-the-endpoint_AbCdEfGhIjKlMnOpQrStUvWxYz012"
PAIR = """
user: nvidia
cluster: {{name: duo}}
nodes: [{{name: spark1, host: 10.0.0.11}}, {{name: spark2, host: 10.0.0.12}}]
serve:
  preset: qwen3-235b-eagle3
  {extra}
"""


@pytest.fixture(autouse=True)
def own_state(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("SPARKCTL_API_KEY", raising=False)
    monkeypatch.delenv("SPARKCTL_API_KEY_FILE", raising=False)
    yield
    forget_secrets()


def pair(tmp_path, extra: str = "", preset: str = "qwen3-235b-eagle3"):
    return inventory_from_yaml(PAIR.replace("qwen3-235b-eagle3", preset).format(extra=extra), tmp_path)


# --- where it answers ---------------------------------------------------------------------------------------

def test_the_endpoint_answers_on_the_head_s_management_address_by_default(tmp_path):
    inv = pair(tmp_path)
    assert listen_addresses(inv, spark_facts("spark1", session_ip="10.0.0.11")) == ["10.0.0.11"]
    # sparkctl on the head itself reached it on loopback, where the engine answers: the management port's address
    facts = spark_facts("spark1", session_ip="10.0.0.11")
    facts.session_ip = "127.0.0.1"
    assert listen_addresses(inv, facts) == ["10.0.0.11"]
    with pytest.raises(ListenUnknown):
        listen_addresses(inv, None)


def test_all_is_every_address_of_the_head_but_loopback_and_link_local(tmp_path):
    inv = pair(tmp_path, "listen: all")
    facts = spark_facts("spark1", addresses={"enp1s0f1np1": ["192.168.100.10/24", "fe80::1/64"],
                                             "lo": ["127.0.0.1/8", "::1/128"], "wlP9s9": ["2001:db8::5/64"]})
    assert listen_addresses(inv, facts) == ["10.0.0.11", "192.168.100.10", "2001:db8::5"]
    assert listen_addresses(pair(tmp_path, "listen: [10.0.0.99]"), facts) == ["10.0.0.99"]


def test_the_engine_listens_on_the_head_s_loopback_only_at_its_own_port(tmp_path):
    argv = launch_argv(pair(tmp_path))
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and "0.0.0.0" not in argv
    assert argv[argv.index("--port") + 1] == "18355"
    assert launch_argv(pair(tmp_path, "engine_port: 9000"))[-3] == "9000"


# --- the config -------------------------------------------------------------------------------------------------

def test_the_config_checks_the_key_on_every_path_but_health_and_streams_unbuffered(tmp_path):
    spec = gateway_spec(pair(tmp_path, "listen: [10.0.0.11, '2001:db8::5']"), spark_facts("spark1"), "/st")
    config = spec.config(KEY)
    assert f'if ($http_authorization != "Bearer {KEY}")' in config and "listen 10.0.0.11:8355;" in config
    assert "listen [2001:db8::5]:8355;" in config and "0.0.0.0" not in config
    assert "server 127.0.0.1:18355;" in config and "proxy_buffering off;" in config
    assert "listen 127.0.0.1:8355;" in config  # the head's own clients, with the key too
    health = config.index("location = /health")
    assert "http_authorization" not in config[health:config.index("location", health + 1)]
    assert 'proxy_set_header Authorization "";' in config  # the engine never sees the key
    assert spec.config_path == "/st/gateway/nginx.conf"
    # TensorRT-LLM's /metrics is the collector's, behind the same key
    metrics = config[config.index("location = /metrics"):config.index("location /", health + 1)]
    assert f'if ($http_authorization != "Bearer {KEY}")' in metrics and "proxy_pass http://127.0.0.1:18356;" in metrics


def test_an_open_endpoint_has_no_key_check(tmp_path):
    spec = gateway_spec(pair(tmp_path, "auth: none"), spark_facts("spark1"), "/st")
    config = spec.config(None)
    assert "http_authorization" not in config and "Bearer" not in config and "listen 10.0.0.11:8355;" in config


@pytest.mark.parametrize("key", ['abc"; deny all; #', "short", "-" * 20 + " x", "a$b" * 8])
def test_a_key_that_is_not_a_bearer_token_is_never_rendered(tmp_path, key):
    spec = gateway_spec(pair(tmp_path), spark_facts("spark1"), "/st")
    with pytest.raises(UnsafeValue):
        spec.config(key)


def test_the_gateway_runs_from_its_own_spec_and_comes_back_with_the_node(tmp_path):
    spec = gateway_spec(pair(tmp_path), spark_facts("spark1"), "/st")
    argv = spec.run_argv()
    assert argv[:5] == ["docker", "run", "-d", "--name", GATEWAY_CONTAINER]
    assert argv[argv.index("--restart") + 1] == "unless-stopped" and argv[argv.index("--network") + 1] == "host"
    assert "/st/gateway:/etc/sparkctl-gateway:ro" in argv  # the folder: a new file is what a reload reads
    assert argv[-6:] == [DEFAULT_GATEWAY_IMAGE, "nginx", "-c", "/etc/sparkctl-gateway/nginx.conf", "-g", "daemon off;"]
    assert KEY not in " ".join(argv)


def test_the_lab_names_its_image_as_the_product_s_default_gateway():
    assert GATEWAY_IMAGE == DEFAULT_GATEWAY_IMAGE


# --- the key ------------------------------------------------------------------------------------------------

def test_a_key_is_made_once_kept_0600_and_masked_everywhere(tmp_path):
    inv = pair(tmp_path)
    assert keys.api_key(inv) is None
    made = keys.api_key(inv, create=True)
    assert len(made) >= 43 and keys.KEY_RE.match(made)  # 32 random bytes
    path = keys.key_path("duo")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert keys.api_key(inv, create=True) == made
    assert redact_known(f"Authorization: Bearer {made}") == f"Authorization: Bearer {MASK}"
    assert keys.new_key("duo") != made and keys.api_key(inv) != made


def test_a_key_from_the_environment_or_its_file_wins(tmp_path, monkeypatch):
    inv = pair(tmp_path)
    keys.new_key("duo")
    monkeypatch.setenv("SPARKCTL_API_KEY", KEY)
    assert keys.api_key(inv) == KEY and keys.key_source(inv) == "$SPARKCTL_API_KEY"
    monkeypatch.delenv("SPARKCTL_API_KEY")
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    monkeypatch.setenv("SPARKCTL_API_KEY_FILE", str(key_file))
    assert keys.api_key(inv) == KEY
    monkeypatch.setenv("SPARKCTL_API_KEY", 'not a "token"')
    with pytest.raises(TaskFailed) as refused:
        keys.api_key(inv)
    assert "not a bearer token" in refused.value.message and "token\"" not in refused.value.message


def test_a_stored_key_readable_by_others_is_made_private_again(tmp_path):
    keys.new_key("duo")
    path = keys.key_path("duo")
    os.chmod(path, 0o644)
    keys.api_key(pair(tmp_path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_open_endpoint_has_no_key(tmp_path):
    assert keys.api_key(pair(tmp_path, "auth: none"), create=True) is None
    assert not keys.key_path("duo").exists()


# --- serve.gateway ----------------------------------------------------------------------------------------------

def gateway_kit(tmp_path, *, config_hash: str = "", container: str = "", listening: str = "",
                preset: str = "qwen3-235b-eagle3"):
    inv = pair(tmp_path, preset=preset)
    kit = make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})
    kit.transport("spark1").respond(r"sha256sum", framed(lambda: [("config", config_hash), ("listening", listening)]))
    inspected(kit, "spark1", GATEWAY_CONTAINER, container)
    return kit


def test_a_first_run_makes_the_key_writes_the_config_and_runs_the_gateway_without_showing_the_key(tmp_path):
    kit = gateway_kit(tmp_path)
    changes = ServeGatewayTask().check(kit.cluster)
    assert [c.payload for c in changes] == ["key", "config", "create"]
    assert all(c.node == "spark1" for c in changes)
    assert MASK in changes[1].diff and "listen 10.0.0.11:8355;" in changes[1].diff
    assert not keys.key_path("duo").exists()  # a check changes nothing, here either


def test_a_gateway_as_planned_is_left_alone_and_a_missing_address_is_reloaded(tmp_path):
    key = keys.api_key(pair(tmp_path), create=True)
    kit = gateway_kit(tmp_path)
    spec = gateway_spec(kit.cluster.inventory, spark_facts("spark1"), kit.node("spark1").state_dir())
    # the config and the router, as `sha256sum nginx.conf router.js` reads them
    digest = sha256sum_lines(spec.config(key), spec.router())
    running = f"true {spec.spec_hash()} unless-stopped"
    kit = gateway_kit(tmp_path, config_hash=digest, container=running,
                      listening="LISTEN 0 511 10.0.0.11:8355 0.0.0.0:*\nLISTEN 0 511 127.0.0.1:8355 0.0.0.0:*")
    assert ServeGatewayTask().check(kit.cluster) == []
    kit = gateway_kit(tmp_path, config_hash=digest, container=running,
                      listening="LISTEN 0 2048 127.0.0.1:8355 0.0.0.0:*")
    assert [c.payload for c in ServeGatewayTask().check(kit.cluster)] == ["reload"]
    kit = gateway_kit(tmp_path, config_hash=digest, container=f"true {spec.spec_hash()} no")
    assert [c.payload for c in ServeGatewayTask().check(kit.cluster)] == ["create"]
    kit = gateway_kit(tmp_path, config_hash=sha256sum_lines("another config", spec.router()), container=running,
                      listening="LISTEN 0 511 10.0.0.11:8355 0.0.0.0:*\nLISTEN 0 511 127.0.0.1:8355 0.0.0.0:*")
    assert [c.payload for c in ServeGatewayTask().check(kit.cluster)] == ["config"]


def test_applying_puts_the_config_0600_never_in_argv_and_reloads_in_place(tmp_path):
    key = keys.api_key(pair(tmp_path), create=True)
    kit = gateway_kit(tmp_path)
    transport = kit.transport("spark1")
    transport.respond(r"ss -ltnH", "LISTEN 0 511 10.0.0.11:8355 0.0.0.0:*\nLISTEN 0 511 127.0.0.1:8355 0.0.0.0:*\n")
    ServeGatewayTask().apply(kit.cluster, [Change("write the config", payload="config")])
    puts = [c for c in transport.calls if c.kind == "put"]
    assert [(p.target.rsplit("/", 1)[-1], p.mode) for p in puts] == [("router.js", 0o600), ("nginx.conf", 0o600)]
    assert key in puts[1].content and key not in puts[0].content
    commands = [c.target for c in transport.calls if c.kind == "run"]
    # NGINX's own reload, in the container (a `docker kill` would count as a stop by hand: down after a reboot)
    assert "docker exec sparkctl-gateway nginx -c /etc/sparkctl-gateway/nginx.conf -s reload" in commands
    assert not any(key in c for c in commands)


def test_an_open_endpoint_s_gateway_converges_without_a_key(tmp_path):
    inv = pair(tmp_path, "auth: none")
    spec = gateway_spec(inv, spark_facts("spark1"), "/home/nvidia/.local/state/sparkctl/duo")
    digest = sha256sum_lines(spec.config(None), spec.router())
    kit = make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})
    inspected(kit, "spark1", GATEWAY_CONTAINER, f"true {spec.spec_hash()} unless-stopped")
    kit.transport("spark1").respond(r"sha256sum", framed([
        ("config", digest),
        ("listening", "LISTEN 0 511 10.0.0.11:8355 0.0.0.0:*\nLISTEN 0 511 127.0.0.1:8355 0.0.0.0:*")]))
    assert ServeGatewayTask().check(kit.cluster) == []
    assert not keys.key_path("duo").exists()


