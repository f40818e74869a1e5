"""The one home of secrets: one mask, whole-token matching for short secrets, credential shapes, the sources, logs."""

from __future__ import annotations

import io
import logging

import pytest

from sparkctl.cli.main import configure_logging
from sparkctl.secrets import (
    MASK,
    SecretUnreadable,
    forget_secrets,
    is_secret_name,
    looks_like_credential,
    mask_config_lines,
    mask_credentials,
    mask_env,
    provide_secret,
    redact,
    redact_known,
    redacted,
    register_secret,
    scrub,
    secret_from_env,
    secrets_in_yaml,
)

TOKEN = "hf_RealLengthToken0123456789abcdefXYZ"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    forget_secrets()
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN_FILE", raising=False)
    yield
    forget_secrets()


def test_a_short_secret_is_masked_only_where_it_stands_alone():
    """HF_TOKEN=lab, as the README suggests for the lab, must not eat the lab's paths."""
    register_secret("lab")
    for text in (".sparkctl-lab/inventory.yaml", "/home/nvidia/.local/state/sparkctl/lab-b66c/run", "label",
                 "collaborate", "lab.yaml"):
        assert redact_known(text) == text
    assert redact_known("token lab given") == f"token {MASK} given"
    assert redact_known("HF_TOKEN=lab") == f"HF_TOKEN={MASK}"
    assert redact_known('{"token": "lab"}') == f'{{"token": "{MASK}"}}'


def test_a_real_length_token_is_masked_wherever_it_appears():
    register_secret(TOKEN + "\n")  # read from a file: the bare value is masked too
    for text in (TOKEN, f"x{TOKEN}y", f"https://user:{TOKEN}@host/p", f"--token={TOKEN}.", f"/tmp/{TOKEN}/file"):
        assert TOKEN not in redact_known(text) and MASK in redact_known(text)
    assert redacted({"a": [f"t {TOKEN}"], "b": 3}) == {"a": [f"t {MASK}"], "b": 3}


def test_the_longest_secret_is_masked_whole():
    assert redact("abcdefghij-123456", ["abcdefghij", "abcdefghij-123456"]) == MASK


def test_credential_shapes_and_secret_names():
    assert looks_like_credential(TOKEN) and looks_like_credential("nvapi-AbCdEfGhIjKlMnOpQrSt")
    assert looks_like_credential("ghp_" + "a" * 36) and looks_like_credential("--env=HF_TOKEN=x")
    assert not looks_like_credential("nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12")
    assert not looks_like_credential("-e HF_TOKEN")  # passes a variable's name, not a value
    assert is_secret_name("HF_TOKEN") and is_secret_name("auth.password") and is_secret_name("api-key")
    assert not is_secret_name("NCCL_IB_HCA")
    assert mask_credentials(f"got {TOKEN} and Bearer abcdefghijklmnopqrstu") == f"got {MASK} and Bearer {MASK}"


def test_scrub_masks_values_of_secret_keys_however_quoted():
    text = 'HF_TOKEN=abc123 "api_key": "zzz999" password: hunter22 \\"psk\\": \\"wifi-pass\\"'
    out = scrub(text)
    for value in ("abc123", "zzz999", "hunter22", "wifi-pass"):
        assert value not in out
    assert out.count(MASK) == 4 and '"api_key": "' in out


def test_config_lines_env_and_yaml_values():
    netplan = "wifis:\n  w:\n    access-points:\n      home:\n        auth:\n          password: \"correct horse\"\n"
    assert "correct horse" not in mask_config_lines(netplan) and MASK in mask_config_lines(netplan)
    assert mask_config_lines(None) is None
    assert mask_env({"HF_TOKEN": TOKEN, "PATH": "/bin"}) == {"HF_TOKEN": MASK, "PATH": "/bin"}
    assert "correct horse" in secrets_in_yaml(netplan) and secrets_in_yaml("{bad") == set()


def test_the_token_comes_from_the_variable_its_file_or_the_prompt(tmp_path, monkeypatch):
    assert secret_from_env("HF_TOKEN") is None
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("HF_TOKEN_FILE", str(token_file))
    assert secret_from_env("HF_TOKEN") == TOKEN and redact_known(TOKEN) == MASK
    monkeypatch.setenv("HF_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(SecretUnreadable, match="HF_TOKEN_FILE"):
        secret_from_env("HF_TOKEN")
    monkeypatch.delenv("HF_TOKEN_FILE")
    provide_secret("HF_TOKEN", "hf_Typed0123456789abcdefghij")
    assert secret_from_env("HF_TOKEN") == "hf_Typed0123456789abcdefghij"
    monkeypatch.setenv("HF_TOKEN", "hf_FromTheEnvironment0123456789")
    assert secret_from_env("HF_TOKEN") == "hf_FromTheEnvironment0123456789"


def test_logs_pass_through_the_redacting_handler(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    register_secret(TOKEN)
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        configure_logging(debug=True)
        logging.getLogger("sparkctl.transport").debug("sent %s", f"hf download --token {TOKEN}")
        logging.getLogger("paramiko").debug("never shown: another library's debug line")
        configure_logging(debug=False)
        logging.getLogger("sparkctl.transport").debug("not shown without --debug")
        logging.getLogger("paramiko").warning("a warning with %s", TOKEN)
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
    text = stream.getvalue()
    assert TOKEN not in text and text.count(MASK) == 2
    assert "sent hf download" in text and "never shown" not in text and "not shown" not in text


def test_the_logging_handler_masks_credential_shapes_and_tracebacks_too():
    import io
    import logging

    from sparkctl.secrets import MASK, forget_secrets, redacting_handler, register_secret

    stream = io.StringIO()
    logger = logging.getLogger("sparkctl.test_redaction")
    handler = redacting_handler(stream, logging.DEBUG)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    register_secret("registered-secret-value")
    try:
        logger.debug("pasted %s", "hf_" + "Z" * 30)
        try:
            raise ValueError("registered-secret-value and ghp_" + "a" * 30)
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
        forget_secrets()
    text = stream.getvalue()
    assert "ZZZZ" not in text and "registered-secret-value" not in text and "ghp_aaaa" not in text, text
    assert MASK in text and "Traceback" in text


def test_debug_tracebacks_and_error_lines_pass_the_redaction(capsys):
    from sparkctl.cli import main
    from sparkctl.errors import BadInput

    token = "hf_" + "T" * 30
    try:
        raise BadInput(f"cannot use {token}", hint=f"not {token}", details=[token])
    except BadInput as exc:
        main._print_traceback()
        main._print_error(exc)
    err = capsys.readouterr().err
    assert "Traceback" in err and "cannot use" in err and token not in err, err
