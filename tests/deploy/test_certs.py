"""Credentials for TLS + SuperNode authentication: CA, SuperLink certificate, node keys."""

import ipaddress
import socket
import ssl
import stat
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dq_flower.deploy.certs import (
    create_ca,
    create_credentials,
    create_node_keys,
    create_server_certificate,
    load_credentials,
)


def _san(cert_path):
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (set(ext.get_values_for_type(x509.DNSName)),
            {str(ip) for ip in ext.get_values_for_type(x509.IPAddress)})


def test_credentials_are_complete_and_private_keys_private(tmp_path):
    creds = create_credentials(tmp_path, num_nodes=3)
    assert [k.private_key.name for k in creds.nodes] == ["node-0", "node-1", "node-2"]
    for path in (creds.ca_key, creds.server_key, *(k.private_key for k in creds.nodes)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    ca = x509.load_pem_x509_certificate(creds.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(creds.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the signature does not check
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert _san(creds.server_cert) == ({"localhost"}, {"127.0.0.1"})
    assert load_credentials(tmp_path) == creds


def test_node_keys_are_p384_openssh_as_flower_reads_them(tmp_path):
    from flwr.cli.supernode.register import try_load_public_key

    keys = create_node_keys(tmp_path, "edge-7")
    private = serialization.load_ssh_private_key(keys.private_key.read_bytes(), None)
    public = serialization.load_ssh_public_key(keys.public_key.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert isinstance(private.curve, ec.SECP384R1)
    assert public.public_numbers() == private.public_key().public_numbers()
    assert keys.public_key.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert try_load_public_key(keys.public_key)  # what `flwr supernode register` runs


def test_server_certificate_for_lan_names(tmp_path):
    ca_cert, ca_key = create_ca(tmp_path)
    cert, _ = create_server_certificate(tmp_path, ca_cert, ca_key,
                                        hosts=["superlink.lan", "192.168.1.20", "::1"])
    dns, ips = _san(cert)
    assert dns == {"superlink.lan"}
    assert ips == {"192.168.1.20", str(ipaddress.ip_address("::1"))}


def test_tls_handshake_with_the_ca(tmp_path):
    creds = create_credentials(tmp_path, num_nodes=0)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(creds.server_cert, creds.server_key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    errors = []

    def serve():
        for _ in range(2):
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except ssl.SSLError as exc:  # the client rejects: recorded, not raised
                errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_ctx = ssl.create_default_context(cafile=str(creds.ca_cert))
    for name in ("127.0.0.1", "localhost"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                client_ctx.wrap_socket(raw, server_hostname=name) as tls:
            assert tls.recv(2) == b"ok"
    thread.join(10)
    listener.close()
    assert not errors


def test_refuses_to_overwrite_and_checks_arguments(tmp_path):
    create_credentials(tmp_path, num_nodes=1)
    before = (tmp_path / "ca.key").read_bytes()
    with pytest.raises(FileExistsError):
        create_credentials(tmp_path, num_nodes=1)
    assert (tmp_path / "ca.key").read_bytes() == before
    create_credentials(tmp_path, num_nodes=1, overwrite=True)
    assert (tmp_path / "ca.key").read_bytes() != before
    with pytest.raises(ValueError):
        create_ca(tmp_path / "x", days=0)
    with pytest.raises(ValueError):
        create_server_certificate(tmp_path, tmp_path / "ca.crt", tmp_path / "ca.key", hosts=[])
    with pytest.raises(ValueError):
        create_node_keys(tmp_path, "../evil")
    with pytest.raises(FileNotFoundError):
        load_credentials(tmp_path / "empty")


def test_cli_certs(tmp_path, capsys):
    from dq_flower.cli import main

    out = tmp_path / "creds"
    assert main(["deploy", "certs", "--out", str(out), "--nodes", "2",
                 "--host", "10.0.0.5", "--host", "superlink.lan"]) == 0
    creds = load_credentials(out)
    assert len(creds.nodes) == 2
    # loopback is always added: the SuperLink's helper connects through 127.0.0.1
    assert _san(creds.server_cert) == ({"superlink.lan", "localhost"}, {"10.0.0.5", "127.0.0.1"})
    assert "register it" in capsys.readouterr().out
    assert main(["deploy", "certs", "--out", str(out)]) == 2  # exists: refused, one line
    assert "exists" in capsys.readouterr().err
