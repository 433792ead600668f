"""Credentials for a TLS deployment with SuperNode authentication (``cryptography``).

A self-signed CA (``ca.crt``, ``ca.key``), the SuperLink's certificate signed by it
(``server.crt``, ``server.key``) and one ECDSA P-384 OpenSSH key pair per SuperNode
(``node-K``, ``node-K.pub``). Private keys get mode ``0o600``; existing files are only
replaced with ``overwrite=True``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["DEFAULT_HOSTS", "Credentials", "NodeKeys", "create_ca", "create_credentials",
           "create_node_keys", "create_server_certificate", "load_credentials"]

#: Names the SuperLink certificate is valid for when none are given (loopback).
DEFAULT_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost")

_CURVE = ec.SECP384R1
_HASH = hashes.SHA384


@dataclass(frozen=True)
class NodeKeys:
    """One SuperNode's authentication key pair (OpenSSH format, ECDSA P-384)."""

    private_key: Path
    public_key: Path


@dataclass(frozen=True)
class Credentials:
    """Paths of everything :func:`create_credentials` writes."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    nodes: tuple[NodeKeys, ...]


def _write(path: Path, data: bytes, *, private: bool, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True (--force) to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    if private:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(path, 0o600)
    else:
        path.write_bytes(data)


def _private_bytes(key: ec.EllipticCurvePrivateKey, fmt: serialization.PrivateFormat) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             days: int) -> x509.CertificateBuilder:
    """A certificate for ``key``'s public key, ``subject`` by ``issuer``, valid ``days``."""
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    now = dt.datetime.now(dt.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days)))


def _write_pair(out: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey,
                overwrite: bool) -> tuple[Path, Path]:
    """Write ``<stem>.key`` (private) then ``<stem>.crt`` into ``out``; return both paths."""
    cert_path, key_path = out / f"{stem}.crt", out / f"{stem}.key"
    _write(key_path, _private_bytes(key, serialization.PrivateFormat.PKCS8), private=True,
           overwrite=overwrite)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), private=False,
           overwrite=overwrite)
    return cert_path, key_path


def create_ca(out_dir: str | Path, *, common_name: str = "dq-flower CA", days: int = 365,
              overwrite: bool = False) -> tuple[Path, Path]:
    """Create a self-signed CA; return ``(ca.crt, ca.key)`` paths in ``out_dir``."""
    key = ec.generate_private_key(_CURVE())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = x509.KeyUsage(digital_signature=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          key_cert_sign=True, crl_sign=True, encipher_only=False,
                          decipher_only=False)
    cert = (_builder(name, name, key, days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, _HASH()))
    return _write_pair(Path(out_dir), "ca", cert, key, overwrite)


def create_server_certificate(out_dir: str | Path, ca_cert: str | Path, ca_key: str | Path, *,
                              hosts: Sequence[str] = DEFAULT_HOSTS, days: int = 365,
                              overwrite: bool = False) -> tuple[Path, Path]:
    """Create the SuperLink's certificate signed by the CA; return ``(server.crt, server.key)``.

    ``hosts``: every name or IP address SuperNodes and ``flwr`` reach the SuperLink at
    (the certificate's subject alternative names).
    """
    if not hosts:
        raise ValueError("hosts must name at least one host name or IP address")
    out = Path(out_dir)
    ca = x509.load_pem_x509_certificate(Path(ca_cert).read_bytes())
    ca_private = serialization.load_pem_private_key(Path(ca_key).read_bytes(), password=None)
    if not isinstance(ca_private, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_key} is not an EC private key")
    key = ec.generate_private_key(_CURVE())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_private.public_key())
    cert = (_builder(subject, ca.subject, key, days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_san(hosts), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(authority, critical=False)
            .sign(ca_private, _HASH()))
    return _write_pair(out, "server", cert, key, overwrite)


def create_node_keys(out_dir: str | Path, name: str, *, overwrite: bool = False) -> NodeKeys:
    """Create one SuperNode's ECDSA P-384 key pair: ``<name>`` and ``<name>.pub`` (OpenSSH)."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"invalid key name {name!r}")
    out = Path(out_dir)
    key = ec.generate_private_key(_CURVE())
    private = _private_bytes(key, serialization.PrivateFormat.OpenSSH)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    keys = NodeKeys(out / name, out / f"{name}.pub")
    _write(keys.private_key, private, private=True, overwrite=overwrite)
    _write(keys.public_key, public + f" {name}\n".encode(), private=False, overwrite=overwrite)
    return keys


def create_credentials(out_dir: str | Path, *, num_nodes: int = 2,
                       hosts: Sequence[str] = DEFAULT_HOSTS, days: int = 365,
                       overwrite: bool = False, include_loopback: bool = True) -> Credentials:
    """Create the CA, the SuperLink certificate and key pairs ``node-0`` ... ``node-{N-1}``.

    With ``include_loopback`` the certificate is valid for loopback too: the SuperLink's
    ``flower-superexec`` connects through it when the SuperLink listens on ``0.0.0.0``.
    """
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
    names = list(dict.fromkeys([*hosts, *(DEFAULT_HOSTS if include_loopback else ())]))
    out = Path(out_dir)
    ca_cert, ca_key = create_ca(out, days=days, overwrite=overwrite)
    server_cert, server_key = create_server_certificate(out, ca_cert, ca_key, hosts=names,
                                                        days=days, overwrite=overwrite)
    nodes = tuple(create_node_keys(out, f"node-{k}", overwrite=overwrite)
                  for k in range(num_nodes))
    return Credentials(ca_cert, ca_key, server_cert, server_key, nodes)


def load_credentials(out_dir: str | Path) -> Credentials:
    """Paths of credentials previously written by :func:`create_credentials` in ``out_dir``."""
    out = Path(out_dir)
    paths = [out / "ca.crt", out / "ca.key", out / "server.crt", out / "server.key"]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"missing credentials: {', '.join(missing)}")
    nodes = []
    k = 0
    while (out / f"node-{k}").is_file() and (out / f"node-{k}.pub").is_file():
        nodes.append(NodeKeys(out / f"node-{k}", out / f"node-{k}.pub"))
        k += 1
    return Credentials(paths[0], paths[1], paths[2], paths[3], tuple(nodes))
