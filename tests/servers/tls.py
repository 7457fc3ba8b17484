"""TLS certificates for test servers: a CA, a server certificate for 127.0.0.1/localhost and a client certificate."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kvstatus.demo.server import LOOPBACK, RedisServerError, tail

__all__ = ["TLSFiles", "make_tls_files"]


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a TLS server: CA, server cert/key and optional client cert/key."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path | None = None
    client_key: Path | None = None

    def redis_kwargs(self, *, client_cert: bool = True) -> dict[str, object]:
        """Keyword arguments for ``redis.Redis`` to connect to a server using these files."""
        kwargs: dict[str, object] = {"ssl": True, "ssl_ca_certs": str(self.ca)}
        if client_cert and self.client_cert is not None and self.client_key is not None:
            kwargs["ssl_certfile"] = str(self.client_cert)
            kwargs["ssl_keyfile"] = str(self.client_key)
        return kwargs


def make_tls_files(directory: str | os.PathLike[str]) -> TLSFiles:
    """Write a CA, a server cert for 127.0.0.1/localhost and a client cert into ``directory``.

    Uses ``trustme`` when importable, else the ``openssl`` command line tool.
    """
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    try:
        import trustme  # noqa: F401
    except ImportError:
        return _make_tls_files_openssl(target)
    return _make_tls_files_trustme(target)


def _tls_paths(directory: Path) -> tuple[Path, Path, Path, Path, Path]:
    """CA cert, server cert, server key, client cert, client key."""
    names = ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")
    ca, cert, key, client_cert, client_key = (directory / name for name in names)
    return ca, cert, key, client_cert, client_key


def _make_tls_files_trustme(directory: Path) -> TLSFiles:
    import trustme

    ca_path, cert, key, client_cert, client_key = _tls_paths(directory)
    ca = trustme.CA(organization_name="kvstatus test CA")
    server = ca.issue_cert(LOOPBACK, "localhost")
    client = ca.issue_cert("kvstatus-client@example.invalid", common_name="kvstatus-client")
    ca.cert_pem.write_to_path(str(ca_path))
    server.cert_chain_pems[0].write_to_path(str(cert))
    server.private_key_pem.write_to_path(str(key))
    client.cert_chain_pems[0].write_to_path(str(client_cert))
    client.private_key_pem.write_to_path(str(client_key))
    return TLSFiles(ca_path, cert, key, client_cert, client_key)


def _make_tls_files_openssl(directory: Path) -> TLSFiles:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RedisServerError("neither trustme nor the openssl command is available")
    ca, cert, key, client_cert, client_key = _tls_paths(directory)
    ca_key = directory / "ca.key"
    _run_openssl(
        openssl,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-sha256",
        "-days",
        "3650",
        "-subj",
        "/CN=kvstatus test CA",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-addext",
        "subjectKeyIdentifier=hash",
    )
    _openssl_issue(
        openssl,
        directory,
        "server",
        "/CN=localhost",
        cert,
        key,
        ca_key,
        ca,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    _openssl_issue(
        openssl,
        directory,
        "client",
        "/CN=kvstatus-client",
        client_cert,
        client_key,
        ca_key,
        ca,
        "extendedKeyUsage=clientAuth\n",
    )
    return TLSFiles(ca, cert, key, client_cert, client_key)


def _openssl_issue(
    openssl: str,
    directory: Path,
    name: str,
    subject: str,
    cert: Path,
    key: Path,
    ca_key: Path,
    ca_cert: Path,
    extensions: str,
) -> None:
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n" + extensions
    )
    _run_openssl(
        openssl,
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-sha256",
        "-subj",
        subject,
        "-keyout",
        str(key),
        "-out",
        str(csr),
    )
    _run_openssl(
        openssl,
        "x509",
        "-req",
        "-sha256",
        "-days",
        "3650",
        "-in",
        str(csr),
        "-CA",
        str(ca_cert),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-extfile",
        str(ext),
        "-out",
        str(cert),
    )


def _run_openssl(openssl: str, *args: str) -> None:
    result = subprocess.run([openssl, *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RedisServerError(f"openssl {args[0]} failed:\n{tail(result.stderr)}")
