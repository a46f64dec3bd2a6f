"""Azurite (Azure Blob emulator, from npm) on 127.0.0.1 over HTTPS, for ``az://`` tests.

Why HTTPS and a private certificate bundle: the streamer's released Azure backend
builds its URL as ``https://<account>.<AZURE_STORAGE_ENDPOINT_SUFFIX>`` (a connection
string is compiled in only for its own Azurite builds) and its statically linked curl
trusts only ``/etc/ssl/certs/ca-certificates.crt``. So Azurite serves TLS with a
certificate made here for ``*.blob.localhost`` (curl resolves ``*.localhost`` to the
loopback itself), and a load that reaches the streamer runs in a child process with a
mount namespace of its own where that file is the system bundle plus this certificate
(:func:`namespace_command`); nothing outside the child changes.

Azurite is installed with npm into a cache folder on first use (:func:`azurite_blob`),
so a fresh clone needs only ``npm`` on the path; a machine without it skips the tests.
"""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.helpers.s3_server import free_port

__all__ = ["ACCOUNT", "ACCOUNT_KEY", "AZURITE_VERSION", "Azurite", "azurite_blob", "namespace_command"]

AZURITE_VERSION = "3.35.0"
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's documented development account and key (public, accepted by every Azurite)."""
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _cache() -> Path:
    root = os.environ.get("LOADER_TEST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "loader-tests")
    return Path(root) / f"azurite-{AZURITE_VERSION}"


def azurite_blob() -> Path | None:
    """The ``azurite-blob`` program, installed with npm on first use; ``None`` without npm."""
    program = _cache() / "node_modules" / ".bin" / "azurite-blob"
    if program.exists():
        return program
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return None
    _cache().mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if "NODE_EXTRA_CA_CERTS" not in env and SYSTEM_BUNDLE.is_file():
        # tox passes only a few variables: without the system's CA bundle, npm behind a TLS-inspecting proxy
        # cannot reach its registry (node trusts its own built-in roots only)
        env["NODE_EXTRA_CA_CERTS"] = str(SYSTEM_BUNDLE)
    done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(_cache()),
                           f"azurite@{AZURITE_VERSION}"], capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"npm install azurite@{AZURITE_VERSION} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return program


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for ``*.blob.localhost`` and 127.0.0.1, and its key (PEM files)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{ACCOUNT}.blob.localhost")])
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.DNSName(f"{ACCOUNT}.blob.localhost"), x509.DNSName("*.blob.localhost"),
             x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class Azurite:
    """``azurite-blob`` on a free port of 127.0.0.1, in memory, over HTTPS with a certificate of its own."""

    def __init__(self, program: Path, folder: Path) -> None:
        self.port = free_port()
        self.cert, key = _certificate(folder)
        self.bundle = folder / "bundle.pem"
        system = SYSTEM_BUNDLE.read_bytes() if SYSTEM_BUNDLE.is_file() else b""
        self.bundle.write_bytes(system + b"\n" + self.cert.read_bytes())
        self._process = subprocess.Popen(
            [str(program), "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--cert", str(self.cert),
             "--key", str(key), "--loose", "--skipApiVersionCheck", "--inMemoryPersistence", "--disableTelemetry",
             "--silent"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"azurite-blob did not listen on 127.0.0.1:{self.port} within 30 s")

    def environment(self, key: str = ACCOUNT_KEY) -> dict[str, str]:
        """What points the plugin's Azure client and the streamer's backend at this server."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": key,
            "AZURE_STORAGE_ENDPOINT_SUFFIX": f"blob.localhost:{self.port}",
            "AZURE_STORAGE_CONNECTION_STRING": (
                f"DefaultEndpointsProtocol=https;AccountName={ACCOUNT};AccountKey={key};"
                f"BlobEndpoint=https://127.0.0.1:{self.port}/{ACCOUNT};"),
            "REQUESTS_CA_BUNDLE": str(self.bundle),
        }

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def namespace_command(bundle: Path, argv: list[str]) -> list[str] | None:
    """``argv`` run in a mount namespace where the system CA bundle is ``bundle``; ``None`` where none can be made."""
    unshare = shutil.which("unshare")
    if unshare is None or not SYSTEM_BUNDLE.is_file():
        return None
    probe = subprocess.run([unshare, "--mount", "--map-root-user", "mount", "--bind", str(bundle), str(SYSTEM_BUNDLE)],
                           capture_output=True)
    if probe.returncode != 0:
        return None
    script = 'mount --bind "$0" "$1" && shift && exec "$@"'
    return [unshare, "--mount", "--map-root-user", "sh", "-c", script, str(bundle), str(SYSTEM_BUNDLE), *argv]
