"""LocalTransport against the real machine: subprocess, bash, coreutils timeout, sudo as root."""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

import pytest

from sparkctl.secrets import MASK, RedactingFilter, forget_secrets, redact, redact_known, register_secret
from sparkctl.transport.connect import NodeAddress, connect_all
from sparkctl.transport.local import LocalTransport
from sparkctl.transport.shell import SAFE_PATH, RemoteFileError
from sparkctl.transport.sudo import SudoMode, refusal_message

IS_ROOT = os.geteuid() == 0


@pytest.fixture
def local():
    return LocalTransport("spark1")


def test_run_returns_output_and_exit_code_without_raising(local):
    result = local.run("echo out; echo err >&2; exit 7")
    assert (result.exit_code, result.stdout, result.stderr, result.ok) == (7, "out\n", "err\n", False)
    assert result.command == "echo out; echo err >&2; exit 7"
    assert local.round_trips == 1


def test_command_reaches_bash_unchanged(local):
    hostile = "printf '%s|' \"it's\" 'a \"b\"' $((1+2)) '$(touch /nonexistent)' ; echo"
    assert local.run(hostile).stdout == "it's|a \"b\"|3|$(touch /nonexistent)|\n"


def test_path_and_locale_are_predictable(local):
    assert local.run('echo "$PATH $LC_ALL"').stdout.strip() == f"{SAFE_PATH} C"


def test_stdin_is_closed_unless_input_given(local):
    started = time.monotonic()
    result = local.run("cat", timeout=5)
    assert result.ok and result.stdout == ""
    assert time.monotonic() - started < 2
    assert local.run("wc -c", input="hello\nworld").stdout.strip() == "11"


def test_timeout_is_enforced_and_kills_the_command(local):
    started = time.monotonic()
    result = local.run("sleep 23.5 & echo $!; wait", timeout=0.5)
    assert result.timed_out and result.exit_code == 124 and not result.ok
    assert "timed out after 0.5s" in result.stderr
    assert time.monotonic() - started < 3
    child = int(result.stdout.split()[0])
    time.sleep(0.2)
    stat_file = Path(f"/proc/{child}/stat")
    assert not stat_file.exists() or stat_file.read_text().split()[2] == "Z"


def test_put_is_atomic_with_mode_and_leaves_no_temp(local, tmp_path):
    target = tmp_path / "hostfile"
    target.write_text("old\n")
    local.put(str(target), "10.0.0.1\n10.0.0.2\n", mode=0o600)
    assert target.read_text() == "10.0.0.1\n10.0.0.2\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    local.put(str(target), b"\x00bin", mode=0o755)
    assert target.read_bytes() == b"\x00bin" and stat.S_IMODE(target.stat().st_mode) == 0o755
    assert os.listdir(tmp_path) == ["hostfile"]


def test_put_fails_clearly_when_parent_is_missing(local, tmp_path):
    with pytest.raises(RemoteFileError, match="parent directory .*missing.* does not exist"):
        local.put(str(tmp_path / "missing" / "f"), "x")


def test_read_returns_content_or_none(local, tmp_path):
    (tmp_path / "f").write_text("content ü\n")
    assert local.read(str(tmp_path / "f")) == "content ü\n"
    assert local.read(str(tmp_path / "absent")) is None
    assert local.read(str(tmp_path / "absent"), sudo=True) is None


@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_put_with_owner_and_sudo(local, tmp_path):
    for sudo in (False, True):
        target = tmp_path / f"owned-{sudo}"
        local.put(str(target), "secret\n", mode=0o640, owner="nobody:nogroup", sudo=sudo)
        info = target.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode), target.read_text()) == (65534, 0o640, "secret\n")
    assert sorted(os.listdir(tmp_path)) == ["owned-False", "owned-True"]
    with pytest.raises(RemoteFileError, match="parent directory"):
        local.put(str(tmp_path / "no" / "f"), "x", sudo=True)


@pytest.mark.skipif(not IS_ROOT, reason="as root, sudo is not needed")
def test_sudo_as_root_runs_without_sudo(local):
    assert local.sudo_mode() is SudoMode.ROOT
    assert local.run("id -u", sudo=True).stdout.strip() == "0"


def test_sudo_refusal_message_says_what_to_do():
    assert refusal_message(SudoMode.NONE, "spark2", "nvidia") == (
        "sudo: a password is required on spark2 (run with --ask-become-pass, "
        "or allow passwordless sudo for nvidia)")


def fake_container_cli(tmp_path):
    cli = tmp_path / "fake-docker"
    cli.write_text('#!/bin/sh\nprintf "argv=%s\\n" "$*"\nprintf "token=[%s]\\n" "$HF_TOKEN"\n'
                   'printf "stdin=[%s]\\n" "$(cat)"\n')
    cli.chmod(0o755)
    return str(cli)


def test_exec_in_keeps_env_values_out_of_argv(local, tmp_path):
    local.container_cli = fake_container_cli(tmp_path)
    token = "hf_abc 'quoted'\nline2"
    result = local.exec_in("trtllm-multinode", "echo $HF_TOKEN", env={"HF_TOKEN": token}, input="payload")
    assert result.ok, result.stderr
    argv = result.stdout.splitlines()[0]
    assert argv == "argv=exec -i -e HF_TOKEN trtllm-multinode sh -c echo $HF_TOKEN"
    assert "hf_abc" not in argv
    assert f"token=[{token}]" in result.stdout and "stdin=[payload]" in result.stdout
    assert result.command == "echo $HF_TOKEN"
    no_input = local.exec_in("c1", "true")
    assert no_input.stdout.startswith("argv=exec c1 sh -c true\n")
    with pytest.raises(ValueError):
        local.exec_in("c1", "true", env={"BAD NAME": "x"})


def test_redaction_and_registry():
    forget_secrets()
    assert redact("token=abc123 and abc", ["abc123", "abc"]) == f"token={MASK} and {MASK}"
    assert redact_known("nothing registered") == "nothing registered"
    register_secret("s3cr3t-pass\n")
    assert redact_known("sudo -S s3cr3t-pass") == f"sudo -S {MASK}"
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "password is %s", ("s3cr3t-pass",), None)
    RedactingFilter().filter(record)
    assert record.getMessage() == f"password is {MASK}"
    forget_secrets()


def test_connect_all_returns_connected_and_unreachable_apart():
    from tests.sshd_server import free_port

    specs = [NodeAddress("head", local=True),
             NodeAddress("spark9", host="127.0.0.1", user="nvidia", port=free_port())]
    connected, unreachable = connect_all(specs, forks=2, use_ssh_config=False, connect_timeout=2,
                                         known_hosts_path="/nonexistent/known_hosts")
    assert list(connected) == ["head"] and isinstance(connected["head"], LocalTransport)
    assert unreachable["spark9"].message == f"spark9 (127.0.0.1): connection refused on port {specs[1].port}"
