"""The facts' one ask of docker: the Engine API over docker's socket (one curl), or the `docker` CLI where the API
cannot be the CLI's daemon or does not answer each path plainly. The node side runs for real: templates/facts.sh's
functions under bash, real curl, an Engine API stand-in on /run/docker.sock in a mount namespace of the test's own
(root only), a `docker` stand-in on PATH that says it was asked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from sparkctl.facts import parse
from sparkctl.facts.sections import FactsRequest, api_paths
from sparkctl.shipped import shipped_text

FIXTURES = Path(__file__).parent.parent / "fixtures" / "facts"
LABEL = "sparkctl.cluster=lab-8187"
IMAGE = "localhost/sparkctl-lab-trtllm-1e0894a45e8b:1.3.0rc12"

#: answers by path: 200 with a body, 404, or what a broken daemon says (500)
API = textwrap.dedent("""\
    import json, os, socketserver, sys, time
    from http.server import BaseHTTPRequestHandler
    ANSWERS = json.loads(sys.argv[2])
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            code, body = ANSWERS.get(self.path, [404, {"message": "no such object"}])
            if code == 0:  # a daemon that does not answer
                time.sleep(60)
            data = (json.dumps(body) + "\\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def log_message(self, *args):
            pass
    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True
    server = Server(sys.argv[1], Handler)
    os.chmod(sys.argv[1], 0o660)
    open(sys.argv[1] + ".ready", "w").close()
    server.serve_forever()
    """)

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("curl"),
                                reason="a mount namespace of its own (root), unshare and curl")


def as_job(call: str) -> str:
    """`call` as the facts run a background section: a job of its own (its command may take its place), then
    printed, its exit status taken, by _held (sparkctl/facts/script.py)."""
    return (f'_D=$(mktemp -d); _FP=(); _PJ=; declare -A _FN=(); _print() {{ cat "$1"; }}\n'
            f'{{ _JOB=1\n{call}\n}} >"$_D/docker" 2>/dev/null & _FP+=("$!"); _FN[docker]=$!\n'
            f'_held docker {call}; r=$_rc; rm -rf "$_D"; (exit "$r")')


def ask(tmp_path: Path, answers: dict[str, tuple[int, object]], call: str, env: dict[str, str] | None = None,
        job: bool = False) -> str:
    """Run `call` after templates/facts.sh, in a mount namespace whose /run holds the API stand-in's socket; `job`:
    as a background section (as_job)."""
    if job:
        call, _, after = call.partition("; ")
        call = as_job(call) + (f"; {after}" if after else "")
    (tmp_path / "api.py").write_text(API)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text('#!/bin/sh\necho "CLI $*"\n')
    docker.chmod(0o755)
    (tmp_path / "facts.sh").write_text(shipped_text("facts.sh"))
    script = textwrap.dedent(f"""\
        mount -t tmpfs tmpfs /run || exit 99
        python3 {tmp_path}/api.py /run/docker.sock {_sh(json.dumps(answers))} &
        for _ in $(seq 100); do [ -e /run/docker.sock.ready ] && break; sleep 0.05; done
        . {tmp_path}/facts.sh
        {call}
        kill %1
        """)
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", script],
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), **(env or {})},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 99, result.stderr
    return result.stdout


def _sh(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def call_for(request: FactsRequest) -> str:
    paths = api_paths(request)
    return " ".join(["fact_docker", str(len(paths)), *(_sh(p) for p in paths), *request.container_names,
                     *request.image_refs])


REQUEST = FactsRequest(("trtllm-multinode", "sparkctl-gateway"), (IMAGE,), label=LABEL)
CONTAINER = {"Id": "c1", "Name": "/trtllm-multinode", "State": {"Status": "running", "Running": True, "Pid": 7},
             "Config": {"Image": IMAGE, "Labels": {"sparkctl.cluster": "lab-8187"}}, "Image": "sha256:" + "a" * 64}
ANSWERS = {api_paths(REQUEST)[0]: (200, [{"Names": ["/trtllm-multinode"]}, {"Names": ["/vllm-old"]}]),
           "/containers/trtllm-multinode/json": (200, CONTAINER),
           f"/images/{IMAGE}/json": (200, {"Id": "sha256:" + "a" * 64, "RepoTags": [IMAGE]})}


@needs_root
@pytest.mark.parametrize("job", [False, True], ids=["in order", "as a job"])
def test_the_engine_api_answers_every_ask_in_one_curl(tmp_path, job):
    out = ask(tmp_path, ANSWERS, call_for(REQUEST), job=job)
    assert out.startswith(parse.API_MARK) and "CLI" not in out
    answer = parse.parse_docker_api(out, list(REQUEST.container_names), list(REQUEST.image_refs), listed=True)
    assert answer.reached and answer.labelled == ["trtllm-multinode", "vllm-old"]
    engine, gateway = answer.containers["trtllm-multinode"], answer.containers["sparkctl-gateway"]
    assert engine.exists and engine.running and engine.pid == 7 and engine.image_id == "sha256:" + "a" * 64
    assert not gateway.exists and gateway.status == "absent"  # its 404
    assert answer.images[IMAGE] == engine.image_id


@needs_root
@pytest.mark.parametrize("job", [False, True], ids=["in order", "as a job"])
@pytest.mark.parametrize("why", ["DOCKER_HOST", "DOCKER_CONTEXT", "a context in the CLI's config", "a 500"])
def test_the_cli_answers_where_the_api_may_not_be_its_daemon_or_did_not_answer_plainly(tmp_path, why, job):
    answers, env = dict(ANSWERS), {}
    if why == "a 500":
        answers[f"/images/{IMAGE}/json"] = (500, {"message": "layer not known"})
    elif why == "a context in the CLI's config":
        (tmp_path / ".docker").mkdir()
        (tmp_path / ".docker" / "config.json").write_text('{\n  "auths": {},\n  "currentContext": "rootless"\n}\n')
    else:
        env[why] = "unix:///run/user/1000/docker.sock" if why == "DOCKER_HOST" else "rootless"
    out = ask(tmp_path, answers, call_for(REQUEST), env, job=job)
    assert out == f"CLI inspect trtllm-multinode sparkctl-gateway {IMAGE}\n"


@needs_root
@pytest.mark.parametrize("job", [False, True], ids=["in order", "as a job"])
def test_a_404_that_is_not_no_such_object_is_not_an_absence(tmp_path, job):
    """docker answers an unknown route (an older daemon, a proxy on the socket) 404 "page not found": that says
    nothing of the container, so the CLI is asked."""
    answers = dict(ANSWERS)
    answers["/containers/trtllm-multinode/json"] = (404, {"message": "page not found"})
    assert ask(tmp_path, answers, call_for(REQUEST), job=job) == (
        f"CLI inspect trtllm-multinode sparkctl-gateway {IMAGE}\n")


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("job", [False, True], ids=["in order", "as a job"])
def test_a_daemon_that_does_not_answer_is_slow_and_not_asked_again_by_the_cli(tmp_path, job):
    """curl's 15 s bound per transfer, and the first one cut ends the others (--fail-early): a hung dockerd costs the
    facts 15 s, not 15 s per path and the CLI's 15 s after them; 124 reads as DOCKER_SLOW."""
    answers = {path: (0, None) for path in api_paths(REQUEST)}
    out = ask(tmp_path, answers, call_for(REQUEST) + "; echo rc=$?", job=job)
    assert out == "rc=124\n"


@needs_root
def test_the_default_context_is_the_sockets_daemon(tmp_path):
    (tmp_path / ".docker").mkdir()
    (tmp_path / ".docker" / "config.json").write_text('{"currentContext": "default"}')
    assert ask(tmp_path, ANSWERS, call_for(REQUEST)).startswith(parse.API_MARK)


def test_the_api_answers_of_a_lab_worker_podman_compat():
    """Real answers (fixtures/facts/README.md): podman 4.3's Engine API, as fact_docker_api printed them."""
    answer = parse.parse_docker_api((FIXTURES / "docker-api.podman-compat.txt").read_text(),
                                    ["trtllm-multinode", "sparkctl-gateway"], [IMAGE, "nvcr.io/nvidia/nope:1"],
                                    listed=True)
    assert answer.reached and answer.error is None and answer.labelled == ["trtllm-multinode"]
    engine = answer.containers["trtllm-multinode"]
    assert engine.exists and engine.running and engine.pid and engine.id and engine.image == IMAGE
    assert engine.restart_policy == "unless-stopped" and engine.labels["sparkctl.cluster"] == "lab-8187"
    assert engine.image_id == answer.images[IMAGE] and engine.image_id.startswith("sha256:")
    assert not answer.containers["sparkctl-gateway"].exists
    assert answer.images["nvcr.io/nvidia/nope:1"] is None


def test_answers_that_do_not_match_the_asks_are_unreadable():
    text = (FIXTURES / "docker-api.podman-compat.txt").read_text()
    with pytest.raises(ValueError, match="5 answers to 4 asks"):
        parse.parse_docker_api(text, ["trtllm-multinode"], [IMAGE, "nvcr.io/nvidia/nope:1"], listed=True)


def test_the_paths_are_quoted_for_a_url():
    paths = api_paths(FactsRequest(("c",), ("nvcr.io/nvidia/x:1@sha256:" + "b" * 64,), label="a=b c"))
    assert paths == ['/containers/json?all=1&filters=%7B%22label%22%3A%20%5B%22a%3Db%20c%22%5D%7D',
                     "/containers/c/json", f"/images/nvcr.io/nvidia/x:1@sha256:{'b' * 64}/json"]


def test_a_listed_container_is_known_by_its_own_name_only():
    listing = [{"Names": ["/web", "/proxy/web"]}, {"Names": ["/db"]}, {"Names": []}, {"Names": ["/a/alias"]}, {}]
    text = f"#api\n{json.dumps(listing)}\n#http 200\n"
    assert parse.parse_docker_api(text, [], [], listed=True).labelled == ["web", "db"]


def test_a_deployment_kept_from_podmans_cli_is_the_same_image():
    from sparkctl.plan.deployment import Deployment

    record = {"image": IMAGE, "image_id": "a" * 64, "digest": None, "engine": "trtllm", "model": "m",
              "fingerprint": "f", "inputs": {}}
    assert Deployment.of(record).image_id == "sha256:" + "a" * 64
    assert Deployment.of({**record, "image_id": None}).image_id is None
