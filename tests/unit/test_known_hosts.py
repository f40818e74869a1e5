"""known_hosts as sparkctl gives it to each connection: the same answers as paramiko's own loading, read once."""

from __future__ import annotations

import paramiko

from sparkctl.transport import hostkeys


def _keys(n: int) -> list[str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    out = []
    for _ in range(n):
        public = ed25519.Ed25519PrivateKey.generate().public_key()
        out.append(public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode())
    return out


def test_each_host_gets_the_key_paramiko_itself_would_compare_against(tmp_path):
    a, b, c, d = _keys(4)
    path = tmp_path / "known_hosts"
    path.write_text("\n".join([
        "# a comment",
        f"10.0.0.1 {a}",
        f"10.0.0.1 {b}",                         # the same host and type again: the first one counts
        f"10.0.0.2,[10.0.0.3]:2222 {c}",
        f"{paramiko.HostKeys.hash_host('10.0.0.4')} {d}",
        "10.0.0.5 ssh-unknown AAAA",              # a key type paramiko cannot read: skipped
        "",
    ]))
    ours, theirs = paramiko.SSHClient(), paramiko.SSHClient()
    hostkeys.load_known_hosts(ours, str(path))
    theirs.load_host_keys(str(path))
    for host in ("10.0.0.1", "10.0.0.2", "[10.0.0.3]:2222", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.9"):
        mine, paramikos = ours.get_host_keys().lookup(host), theirs.get_host_keys().lookup(host)
        assert (dict(mine) if mine else None) == (dict(paramikos) if paramikos else None), host
    assert ours.get_host_keys().lookup("10.0.0.1")["ssh-ed25519"].get_base64() == a.split()[1]


def test_the_file_is_parsed_once_per_content_and_again_once_edited(tmp_path, monkeypatch):
    a, b = _keys(2)
    path = tmp_path / "known_hosts"
    path.write_text(f"10.0.0.1 {a}\n")
    parsed = []
    real = paramiko.hostkeys.HostKeyEntry.from_line
    monkeypatch.setattr(paramiko.hostkeys.HostKeyEntry, "from_line",
                        staticmethod(lambda line, lineno=None: parsed.append(line) or real(line, lineno)))
    for _ in range(3):
        hostkeys.load_known_hosts(paramiko.SSHClient(), str(path))
    assert len(parsed) == 1
    path.write_text(f"10.0.0.1 {b}\n")  # same size, same inode, maybe the same mtime: still seen
    client = paramiko.SSHClient()
    hostkeys.load_known_hosts(client, str(path))
    assert len(parsed) == 2 and client.get_host_keys().lookup("10.0.0.1")["ssh-ed25519"].get_base64() == b.split()[1]
