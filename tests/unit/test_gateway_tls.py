"""serve.tls: the user's certificate judged before anything connects (as a client would judge it), the gateway's
HTTPS on the endpoint's addresses with plain HTTP kept to the head's loopback, the files sent 0600 and judged by
their hash, the key masked everywhere, and sparkctl's clients checking the certificate against the name clients use
(from this machine, and from the head's container). The HTTPS is the machine's real NGINX (scripts/test installs
it)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sparkctl.doctor.diagnose import run_checks
from sparkctl.doctor.probes import SERVED_NO_TLS
from sparkctl.errors import InventoryError, SparkctlError
from sparkctl.inventory import tls_files as tls_reader
from sparkctl.inventory.loader import load_inventory
from sparkctl.inventory.sections import TlsSettings
from sparkctl.inventory.tls_files import TlsUnreadable, tls_files
from sparkctl.knowledge.certificates import leaf_fingerprint
from sparkctl.knowledge.serve_client import EndpointError, HttpFetch, NodeFetch, ServeClient, Tls
from sparkctl.plan.gateway import (
    CERTIFICATE_NAME,
    CONFIG_DIR_IN_CONTAINER,
    GATEWAY_CONTAINER,
    KEY_NAME,
    ROUTER_NAME,
    GatewayModel,
    gateway_spec,
)
from sparkctl.plan.serve import endpoint, endpoint_fetch, endpoint_tls
from sparkctl.runs import serve_ops
from sparkctl.secrets import MASK, forget_secrets, redact_known
from sparkctl.shipped import shipped_text
from sparkctl.taskgraph.task import Change, TaskFailed
from sparkctl.tasks.serve import api_key as keys
from sparkctl.tasks.serve.gateway import ServeGatewayTask
from sparkctl.transport.base import CommandResult
from tests.certificates_kit import issue
from tests.taskkit import framed, inspected, make_kit, sha256sum_lines, spark_facts
from tests.unit.doctor_snapshot_kit import healthy_snapshot
from tests.unit.fake_endpoint import FakeEndpoint

NGINX = "/usr/sbin/nginx"
HEAD = "127.0.0.2"   # the head's "management address" here: a loopback address of its own, beside 127.0.0.1
PAIR = """\
user: nvidia
cluster: {{name: duo}}
nodes: [{{name: spark1, host: {head}}}, {{name: spark2, host: 10.0.0.12}}]
serve:
  preset: qwen3-235b-eagle3
  tls:
{tls}
"""


@pytest.fixture(autouse=True)
def own_state(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("SPARKCTL_API_KEY", raising=False)
    yield
    forget_secrets()


def write(tmp_path: Path, tls: dict, head: str = HEAD) -> Path:
    lines = "\n".join(f"    {k}: {v}" for k, v in tls.items())
    path = tmp_path / "inv.yaml"
    path.write_text(PAIR.format(head=head, tls=lines))
    return path


def tls_of(issued, **more) -> dict:
    return {"certificate": str(issued.certificate), "key": str(issued.key), "ca": str(issued.ca), **more}


def refusal(path: Path) -> str:
    with pytest.raises(InventoryError) as refused:
        load_inventory(path)
    (line,) = refused.value.problems
    return line


# --- the certificate judged before anything connects ----------------------------------------------------------------

def test_a_certificate_a_client_accepts_for_the_head_s_address_loads_quietly(tmp_path):
    issued = issue(tmp_path / "pki", [HEAD])
    inv = load_inventory(write(tmp_path, tls_of(issued)))
    assert inv.serve.tls is not None and inv.warnings == []
    assert endpoint(inv) == f"https://{HEAD}:8355"


def test_a_name_clients_use_is_checked_and_the_endpoint_is_named_by_it(tmp_path):
    issued = issue(tmp_path / "pki", ["spark.lab.example"])
    inv = load_inventory(write(tmp_path, tls_of(issued, name="spark.lab.example")))
    assert endpoint(inv) == "https://spark.lab.example:8355"
    fetch = endpoint_fetch(inv, None)
    assert (fetch.host, fetch.tls) == (HEAD, Tls("spark.lab.example", issued.ca.read_text()))  # connects to the head


def test_a_certificate_for_another_name_is_refused_at_its_line_saying_what_it_names(tmp_path):
    issued = issue(tmp_path / "pki", ["10.9.9.9", "elsewhere.example"])
    line = refusal(write(tmp_path, tls_of(issued)))
    assert line.startswith(f"{tmp_path / 'inv.yaml'}:7: serve.tls.certificate: a client that trusts serve.tls.ca "
                           f"and asks for {HEAD} refuses it")
    assert "mismatch" in line and "it names elsewhere.example, 10.9.9.9" in line


def test_a_certificate_no_root_of_this_machine_signed_is_refused_without_a_ca(tmp_path):
    issued = issue(tmp_path / "pki", [HEAD])
    tls = tls_of(issued)
    del tls["ca"]
    line = refusal(write(tmp_path, tls))
    assert "trusts this machine's system roots" in line and "local issuer" in line


def test_a_key_of_another_certificate_an_encrypted_key_and_files_that_are_not_pem_are_refused(tmp_path):
    issued = issue(tmp_path / "pki", [HEAD])
    other = issue(tmp_path / "other", [HEAD], prefix="other")
    assert "the key is not the certificate's" in refusal(write(tmp_path, tls_of(issued, key=str(other.key))))
    locked = issue(tmp_path / "locked", [HEAD], encrypted=True, prefix="locked")
    line = refusal(write(tmp_path, tls_of(locked)))
    assert "serve.tls.key" in line and "is encrypted" in line
    text = tmp_path / "notes.txt"
    text.write_text("not a certificate\n")
    assert "holds no PEM certificate" in refusal(write(tmp_path, tls_of(issued, certificate=str(text))))
    assert "file not found" in refusal(write(tmp_path, tls_of(issued, ca=str(tmp_path / "nope.pem"))))
    with pytest.raises(InventoryError) as refused:
        load_inventory(write(tmp_path, tls_of(issued, key=str(issued.certificate))))
    assert "holds no PEM private key" in str(refused.value)


def test_an_old_or_ending_certificate_is_a_warning_not_a_refusal(tmp_path):
    # an old certificate must not stop `cluster down` or `doctor` (which says it too)
    ended = issue(tmp_path / "ended", [HEAD], days=-1, started_days_ago=30, prefix="ended")
    (warning,) = load_inventory(write(tmp_path, tls_of(ended))).warnings
    assert "serve.tls.certificate" in warning and "ended on" in warning and "clients refuse" in warning
    ending = issue(tmp_path / "ending", [HEAD], days=5, prefix="ending")
    (warning,) = load_inventory(write(tmp_path, tls_of(ending))).warnings
    assert "in 5 days" in warning or "in 4 days" in warning


def test_a_key_others_may_read_is_warned_about(tmp_path):
    issued = issue(tmp_path / "pki", [HEAD])
    issued.key.chmod(0o644)
    (warning,) = load_inventory(write(tmp_path, tls_of(issued))).warnings
    assert "serve.tls.key" in warning and "mode 644" in warning and "chmod 600" in warning


def test_an_ended_ca_is_refused_not_taken_for_an_old_server_certificate(tmp_path):
    issued = issue(tmp_path / "pki", [HEAD], ca_days=-1)
    line = refusal(write(tmp_path, tls_of(issued)))
    assert "serve.tls.certificate: a client that trusts serve.tls.ca" in line and "expired" in line


def test_a_ca_bundle_with_comments_that_are_not_ascii_is_read(tmp_path):
    issued = issue(tmp_path / "pki", [HEAD])
    bundle = tmp_path / "bundle.pem"
    # as certifi's cacert.pem writes its issuers
    bundle.write_bytes("# Issuer: CN=Főtanúsítvány\n".encode() + issued.ca.read_bytes())
    inv = load_inventory(write(tmp_path, tls_of(issued, ca=str(bundle))))
    assert inv.warnings == []
    assert tls_files(inv.serve.tls).ca == issued.ca.read_text()  # the certificates alone, ASCII


def test_a_certificate_file_that_holds_its_key_too_is_refused(tmp_path):
    issued = issue(tmp_path / "pki", [HEAD])
    both = tmp_path / "both.pem"
    both.write_bytes(issued.certificate.read_bytes() + issued.key.read_bytes())
    line = refusal(write(tmp_path, tls_of(issued, certificate=str(both))))
    assert "serve.tls.certificate" in line and "holds a private key" in line and "serve.tls.key" in line
    assert not any(key_line in line for key_line in issued.key_lines())


# --- the gateway's files ---------------------------------------------------------------------------------------------

def test_https_on_the_endpoint_s_addresses_plain_http_on_the_head_s_loopback(tmp_path):
    inv = load_inventory(write(tmp_path, tls_of(issue(tmp_path / "pki", [HEAD]))))
    config = gateway_spec(inv, spark_facts("spark1", session_ip=HEAD), "/st").config("k" * 43)
    assert f"listen {HEAD}:8355 ssl;" in config and "listen 127.0.0.1:8355;" in config
    assert f"ssl_certificate {CONFIG_DIR_IN_CONTAINER}/{CERTIFICATE_NAME};" in config
    assert f"ssl_certificate_key {CONFIG_DIR_IN_CONTAINER}/{KEY_NAME};" in config
    assert "BEGIN" not in config  # the files, never their content


def gateway_kit(tmp_path, inv, config_hash: str, tls_hash: str = ""):
    kit = make_kit(inv, {n.name: spark_facts(n.name, session_ip=HEAD if n.name == "spark1" else None)
                         for n in inv.nodes})
    spec = gateway_spec(inv, kit.node("spark1").facts(), kit.node("spark1").state_dir())
    kit.transport("spark1").respond(r"sha256sum", framed(lambda: [
        ("config", config_hash), *([("tls", tls_hash)] if spec.tls else []),
        ("listening", f"LISTEN 0 511 {HEAD}:8355 0.0.0.0:*\nLISTEN 0 511 127.0.0.1:8355 0.0.0.0:*")]))
    inspected(kit, "spark1", GATEWAY_CONTAINER, f"true {spec.spec_hash()} unless-stopped")
    return kit, spec


def test_the_certificate_and_key_are_judged_by_their_hash_and_a_renewed_one_is_written_again(tmp_path):
    issued = issue(tmp_path / "pki", [HEAD])
    inv = load_inventory(write(tmp_path, tls_of(issued)))
    key = keys.api_key(inv, create=True)
    kit, spec = gateway_kit(tmp_path, inv, "", "")
    config = sha256sum_lines(spec.config(key), spec.router())
    files = sha256sum_lines(issued.certificate.read_text(), issued.key.read_text())
    kit, _ = gateway_kit(tmp_path, inv, config, files)
    # the gateway as planned (the figures collector is serve.collector's)
    assert ServeGatewayTask().check(kit.cluster) == []
    script = next(c.target for c in kit.transport("spark1").calls if "sha256sum" in c.target)
    assert f"/{CERTIFICATE_NAME}" in script and f"/{KEY_NAME}" in script
    renewed = issue(tmp_path / "pki", [HEAD])  # the same paths, a new certificate and key
    kit, _ = gateway_kit(tmp_path, inv, config, files)
    (change,) = [c for c in ServeGatewayTask().check(kit.cluster) if c.payload == "config"]
    assert change.summary.startswith(f"write serve.tls's certificate (CN={HEAD}, until ")
    transport = kit.transport("spark1")
    transport.respond(r"ss -ltnH", f"LISTEN 0 511 {HEAD}:8355 0.0.0.0:*\nLISTEN 0 511 127.0.0.1:8355 0.0.0.0:*\n")
    ServeGatewayTask().apply(kit.cluster, [change])
    puts = {c.target.rsplit("/", 1)[-1]: c.content for c in transport.calls if c.kind == "put"}
    assert puts[KEY_NAME] == renewed.key.read_text() and puts[CERTIFICATE_NAME] == renewed.certificate.read_text()
    commands = [c.target for c in transport.calls if c.kind == "run"]
    # NGINX tests the new files before it is asked to reload (a refused reload keeps the old ones, and says so)
    tested = commands.index("docker exec sparkctl-gateway nginx -t -c /etc/sparkctl-gateway/nginx.conf 2>&1")
    assert commands[tested + 1].endswith("-s reload")


def test_files_nginx_refuses_fail_the_task_before_any_reload(tmp_path):
    issued = issue(tmp_path / "pki", [HEAD])
    inv = load_inventory(write(tmp_path, tls_of(issued)))
    keys.api_key(inv, create=True)
    kit, _ = gateway_kit(tmp_path, inv, "", "")
    transport = kit.transport("spark1")
    transport.respond(r"nginx -t", "nginx: [emerg] cannot load certificate\n", exit_code=1)
    with pytest.raises(TaskFailed) as failed:
        ServeGatewayTask().apply(kit.cluster, [Change("write the config", payload="config")])
    assert "refuses the gateway's new files" in failed.value.message
    assert list(failed.value.details) == ["nginx: [emerg] cannot load certificate"]
    assert not any("-s reload" in c.target for c in transport.calls if c.kind == "run")


def test_applying_sends_the_files_0600_on_stdin_and_masks_the_key_everywhere(tmp_path):
    issued = issue(tmp_path / "pki", [HEAD])
    inv = load_inventory(write(tmp_path, tls_of(issued)))
    keys.api_key(inv, create=True)
    kit, spec = gateway_kit(tmp_path, inv, "")
    transport = kit.transport("spark1")
    transport.respond(r"ss -ltnH", f"LISTEN 0 511 {HEAD}:8355 0.0.0.0:*\nLISTEN 0 511 127.0.0.1:8355 0.0.0.0:*\n")
    transport.respond(r"nginx -t", "nginx: configuration file test is successful\n")
    ServeGatewayTask().apply(kit.cluster, [Change("write the config", payload="config")])
    puts = {c.target.rsplit("/", 1)[-1]: c for c in transport.calls if c.kind == "put"}
    assert puts[KEY_NAME].content == issued.key.read_text() and puts[KEY_NAME].mode == 0o600
    assert puts[CERTIFICATE_NAME].content == issued.certificate.read_text()
    commands = " ".join(c.target for c in transport.calls if c.kind == "run")
    assert not any(line in commands for line in issued.key_lines())
    for line in issued.key_lines():
        assert redact_known(f"a log line: {line}") == f"a log line: {MASK}"


def test_turning_tls_off_removes_the_files_from_the_head(tmp_path):
    inv = load_inventory(write(tmp_path, tls_of(issue(tmp_path / "pki", [HEAD]))))
    plain = inv.model_copy(update={"serve": inv.serve.model_copy(update={"tls": None})})
    keys.api_key(plain, create=True)
    kit, spec = gateway_kit(tmp_path, plain, "")
    transport = kit.transport("spark1")
    transport.respond(r"ss -ltnH", f"LISTEN 0 511 {HEAD}:8355 0.0.0.0:*\nLISTEN 0 511 127.0.0.1:8355 0.0.0.0:*\n")
    ServeGatewayTask().apply(kit.cluster, [Change("write the config", payload="config")])
    assert any(c.target.startswith("rm -f ") and KEY_NAME in c.target for c in transport.calls if c.kind == "run")


# --- on the real NGINX: HTTPS verified, plain HTTP refused ----------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if not Path(NGINX).exists():
        pytest.skip("nginx is installed by scripts/test")
    folder = tmp_path_factory.mktemp("tls-gateway")
    issued = issue(folder / "pki", [HEAD, "spark.lab.example"])
    engine = FakeEndpoint()
    inv_path = folder / "inv.yaml"
    inv_path.write_text(PAIR.format(head=HEAD, tls="\n".join(f"    {k}: {v}" for k, v in tls_of(issued).items())))
    inv = load_inventory(inv_path)
    spec = gateway_spec(inv, spark_facts("spark1", session_ip=HEAD), str(folder))
    spec = replace(spec, port=_free_port(), metrics_port=None,
                   models=(GatewayModel(spec.models[0].names, (("127.0.0.1", engine.port),)),))
    config = spec.config("k" * 43)
    for name in (ROUTER_NAME, CERTIFICATE_NAME, KEY_NAME):
        config = config.replace(f"{CONFIG_DIR_IN_CONTAINER}/{name}", str(folder / "gateway" / name))
    config = config.replace("/tmp/sparkctl-gateway", str(folder / "run"))
    os.makedirs(folder / "gateway", exist_ok=True)
    (folder / "gateway" / "nginx.conf").write_text(config)
    (folder / "gateway" / ROUTER_NAME).write_text(spec.router())
    (folder / "gateway" / CERTIFICATE_NAME).write_bytes(issued.certificate.read_bytes())
    (folder / "gateway" / KEY_NAME).write_bytes(issued.key.read_bytes())
    nginx = subprocess.Popen([NGINX, "-c", str(folder / "gateway" / "nginx.conf"), "-e", "stderr", "-g",
                              "daemon off;"], stderr=subprocess.PIPE, text=True)
    try:
        _wait(spec.port, nginx)
        yield {"port": spec.port, "issued": issued, "engine": engine, "key": "k" * 43}
    finally:
        nginx.terminate()
        nginx.wait(30)
        engine.close()


def _free_port() -> int:
    """Free on every address: NGINX takes it on HEAD and on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _wait(port: int, nginx: subprocess.Popen) -> None:
    for _ in range(300):
        if nginx.poll() is not None:
            raise AssertionError(f"nginx ended: {nginx.stderr.read() if nginx.stderr else ''}")
        try:
            socket.create_connection((HEAD, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nginx does not listen on {port}")


def test_a_client_that_trusts_the_ca_is_served_over_https_by_address_or_by_name(served):
    port, issued, key = served["port"], served["issued"], served["key"]
    by_address = ServeClient(HttpFetch(f"https://{HEAD}:{port}", key, tls=Tls(HEAD, issued.ca.read_text())))
    assert by_address.health() == 200 and by_address.chat("hi", max_tokens=8).text == "hello from the sparks"
    by_name = ServeClient(HttpFetch(f"https://spark.lab.example:{port}", key, tls=Tls("spark.lab.example",
                                                                                        issued.ca.read_text()),
                                    address=HEAD))
    assert by_name.models() == ["nvidia/Qwen3-235B-A22B-FP4"]
    assert "".join(by_name.stream_chat("hi", max_tokens=8).text) == "hello from the sparks"


def test_plain_http_to_the_endpoint_s_address_is_refused_and_the_head_s_loopback_stays_plain(served):
    port = served["port"]
    connection = http.client.HTTPConnection(HEAD, port, timeout=10)
    connection.request("GET", "/v1/models", headers={"Authorization": f"Bearer {served['key']}"})
    response = connection.getresponse()
    assert response.status == 400 and b"plain HTTP request was sent to HTTPS port" in response.read()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/health")
    assert connection.getresponse().status == 200


def test_a_client_that_does_not_trust_it_or_asks_another_name_is_refused(served, tmp_path):
    port, issued = served["port"], served["issued"]
    stranger = issue(tmp_path / "stranger", [HEAD], prefix="stranger")
    for tls, reason in ((Tls(HEAD, stranger.ca.read_text()), "unable to get local issuer certificate"),
                        (Tls("other.example", issued.ca.read_text()), "Hostname mismatch"),
                        (Tls(HEAD), "unable to get local issuer certificate")):
        status, why, refused = ServeClient(HttpFetch(f"https://{HEAD}:{port}", tls=tls)).reach()
        assert status == 0 and refused and "the endpoint's certificate is refused: " + reason in why, why
    # nothing listening is not a refused certificate
    status, why, refused = ServeClient(HttpFetch(f"https://{HEAD}:{_free_port()}", tls=Tls(HEAD))).reach()
    assert status == 0 and not refused and "refused" in why.lower()


class HereTransport:
    """The head's container shares the host's network: exec_in runs here."""

    node = "spark1"

    def __init__(self):
        self.inputs: list[str] = []

    def exec_in(self, container, cmd, *, timeout=60.0, input=None, env=None):
        self.inputs.append(input or "")
        proc = subprocess.run(["sh", "-c", cmd], input=input or "", capture_output=True, text=True,
                              timeout=timeout, env={"PATH": "/usr/bin:/bin"})
        return CommandResult(cmd, proc.returncode, proc.stdout, proc.stderr)


def test_the_smoke_test_s_client_on_the_head_checks_the_certificate_too(served, tmp_path):
    port, issued, key = served["port"], served["issued"], served["key"]
    transport = HereTransport()
    client = ServeClient(NodeFetch(transport, "c", port, host=HEAD, api_key=key, tls=Tls("spark.lab.example",
                                                                                       issued.ca.read_text())))
    assert client.base_url == f"https://{HEAD}:{port} on spark1"
    reply, before, after = client.chat_between_metrics("hi", max_tokens=8)
    assert reply.text == "hello from the sparks"
    sent = json.loads(transport.inputs[-1])
    assert sent["tls"] == {"name": "spark.lab.example", "ca": issued.ca.read_text()}
    stranger = issue(tmp_path / "stranger", [HEAD], prefix="stranger")
    refused = ServeClient(NodeFetch(transport, "c", port, host=HEAD, tls=Tls(HEAD, stranger.ca.read_text())))
    with pytest.raises(EndpointError, match="certificate") as raised:
        refused.models()
    assert raised.value.certificate


# --- doctor: the certificate the gateway serves -----------------------------------------------------------------------

def tls_snapshot(tmp_path, served: Path | None, **issued_as):
    """A healthy serving pair whose inventory names serve.tls (its certificate as `issued_as` makes it) and whose
    head serves `served` (None: the inventory's own)."""
    issued = issue(tmp_path / "pki", ["10.0.0.11"], **issued_as)
    snapshot = healthy_snapshot()
    inv = snapshot.inventory
    tls = TlsSettings(certificate=str(issued.certificate), key=str(issued.key), ca=str(issued.ca))
    snapshot.inventory = inv.model_copy(update={"serve": inv.serve.model_copy(update={"tls": tls})})
    snapshot.tls_certificate = issued.certificate.read_text()
    head = snapshot.probes["spark1"]
    snapshot.probes["spark1"] = replace(head, gateway="running", served_certificate=(
        served or issued.certificate).read_text())
    return snapshot, issued


def tls_findings(snapshot) -> list:
    return [f for f in run_checks(snapshot).findings if f.id.startswith("serve.tls")]


def test_doctor_is_quiet_about_a_served_certificate_that_is_the_inventory_s_and_not_ending(tmp_path):
    snapshot, _ = tls_snapshot(tmp_path, None)
    assert tls_findings(snapshot) == []


def test_doctor_warns_of_a_certificate_ending_within_14_days_and_errs_on_an_ended_one(tmp_path):
    snapshot, _ = tls_snapshot(tmp_path / "a", None, days=9)
    (ending,) = tls_findings(snapshot)
    assert (ending.id, ending.severity, ending.node) == ("serve.tls_ending", "warning", "spark1")
    assert "in 9 days" in ending.summary or "in 8 days" in ending.summary
    assert "renew it" in ending.fix and "--only serve.gateway" in ending.fix
    snapshot, _ = tls_snapshot(tmp_path / "b", None, days=-2, started_days_ago=60)
    (ended,) = tls_findings(snapshot)
    assert (ended.id, ended.severity) == ("serve.tls_ending", "error") and "clients refuse" in ended.evidence


def test_doctor_finds_the_gateway_serving_another_certificate_or_none_and_bootstrap_repairs_it(tmp_path):
    older = issue(tmp_path / "older", ["spark1.old.example"], prefix="older")
    snapshot, _ = tls_snapshot(tmp_path, older.certificate)
    (stale,) = tls_findings(snapshot)
    assert (stale.id, stale.severity) == ("serve.tls_stale", "error")
    assert "shows CN=spark1.old.example, until" in stale.evidence and stale.fix.endswith("--only serve.gateway")
    assert stale.type.tasks == ("serve",)
    # no TLS at all where the gateway should speak it (a config from before serve.tls)
    head = snapshot.probes["spark1"]
    snapshot.probes["spark1"] = replace(head, served_certificate="no TLS: SSLError: [SSL] record layer failure")
    (stale,) = tls_findings(snapshot)
    assert stale.id == "serve.tls_stale" and "shows no TLS: SSLError" in stale.evidence


def test_doctor_s_probe_reads_the_certificate_the_gateway_really_shows(served):
    port, issued = served["port"], served["issued"]
    program = shipped_text("served-certificate.py")
    shown = subprocess.run(["python3", "-c", program, HEAD, str(port), SERVED_NO_TLS],
                           capture_output=True, text=True, timeout=30).stdout
    assert leaf_fingerprint(shown.encode()) == leaf_fingerprint(issued.certificate.read_bytes())
    plain = subprocess.run(["python3", "-c", program, "127.0.0.1", str(port), SERVED_NO_TLS],
                           capture_output=True, text=True, timeout=30).stdout
    assert plain.startswith(f"{SERVED_NO_TLS} SSLError"), plain


def test_chat_from_here_stops_at_a_refused_certificate_rather_than_go_round_it(served, tmp_path, monkeypatch):
    port, issued = served["port"], served["issued"]
    monkeypatch.setenv("SPARKCTL_API_KEY", served["key"])
    path = tmp_path / "inv.yaml"
    path.write_text(PAIR.format(head=HEAD, tls="\n".join(f"    {k}: {v}" for k, v in tls_of(issued).items()))
                    .replace("  tls:", f"  port: {port}\n  tls:"))
    inv = load_inventory(path)
    with serve_ops.endpoint_client(inv, timeout=10) as client:
        assert client.streams and client.models() == ["nvidia/Qwen3-235B-A22B-FP4"]  # straight from here
    stranger = issue(tmp_path / "stranger", [HEAD], prefix="stranger")
    trusting_another = inv.model_copy(update={"serve": inv.serve.model_copy(update={"tls": inv.serve.tls.model_copy(
        update={"ca": str(stranger.ca)})})})
    with pytest.raises(SparkctlError) as refused, serve_ops.endpoint_client(trusting_another, timeout=10):
        pass
    assert "the endpoint's certificate is refused: unable to get local issuer certificate" in refused.value.message
    assert "serve.tls.ca" in refused.value.hint


def test_serve_tls_s_files_are_judged_once_per_content_and_a_renewed_certificate_is_new_content(tmp_path, monkeypatch):
    issued = issue(tmp_path / "pki", [HEAD])
    inv = load_inventory(write(tmp_path, tls_of(issued)))
    judged = []
    real = tls_reader._judge
    monkeypatch.setattr(tls_reader, "_judge", lambda tls, raw: judged.append(raw) or real(tls, raw))
    first = tls_files(inv.serve.tls)
    assert tls_files(inv.serve.tls) is first and endpoint_tls(inv) == Tls(HEAD, issued.ca.read_text())
    assert len(judged) <= 1  # the loader may have judged this content already
    renewed = issue(tmp_path / "renewed", [HEAD])
    issued.certificate.write_bytes(renewed.certificate.read_bytes())
    issued.key.write_bytes(renewed.key.read_bytes())
    assert tls_files(inv.serve.tls).certificates == renewed.certificate.read_text()
    forget_secrets()
    tls_files(inv.serve.tls)  # given out again, the key is a secret again
    assert MASK in redact_known(renewed.key.read_text().splitlines()[1])


def test_serve_tls_s_files_gone_after_load_fail_the_task_with_what_to_do(tmp_path):
    issued = issue(tmp_path / "pki", [HEAD])
    inv = load_inventory(write(tmp_path, tls_of(issued)))
    issued.key.unlink()
    with pytest.raises(TlsUnreadable, match=r"serve\.tls: key: .*server\.key") as raised:
        tls_files(inv.serve.tls)
    assert "inventory validate" in (raised.value.hint or "")
