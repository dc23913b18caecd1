"""A per-cluster TLS identity for the Dask clusters hpo starts.

A Dask scheduler without TLS runs any function sent to it as the cluster's
owner, for anyone who can reach its port. Each cluster gets its own
self-signed certificate (its own CA) and key; the scheduler, the workers and
the study's client all present it and accept nothing else (mutual TLS).

- A batch job's cluster spans nodes: its identity is written into the job's
  folder, readable by the owner only (:func:`write_identity`), and found
  through Dask's configuration, which the batch script sets in the
  environment (:func:`dask_environment`).
- The embedded cluster of ``hpo run --engine dask`` lives in the master's
  process and its children: its identity stays in memory
  (:func:`in_memory_security`), never on disk.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from hpo.errors import UsageError

if TYPE_CHECKING:
    from distributed.security import Security

__all__ = ["CERT_FILE", "KEY_FILE", "write_identity", "dask_environment", "in_memory_security",
           "self_signed", "check_available"]

CERT_FILE, KEY_FILE = "tls-cert.pem", "tls-key.pem"
_VALID_DAYS = 30  # outlives any walltime; a new job makes a new one


def write_identity(folder: Path) -> tuple[Path, Path]:
    """Write a new self-signed certificate and its key into ``folder``, mode 0600.

    Returns the certificate and key paths. The certificate is its own CA:
    a peer is trusted only if it holds this job's key.
    """
    cert, key = self_signed()
    folder = Path(folder)
    paths = folder / CERT_FILE, folder / KEY_FILE
    for path, data in zip(paths, (cert, key)):
        path.unlink(missing_ok=True)  # a leftover of a requeued job: replaced, never reused
        # Created 0600 in one call: the key is never readable by others, even briefly.
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(data)
    return paths


def dask_environment(folder: str) -> dict[str, str]:
    """Dask configuration, as environment variables, that makes every
    scheduler, worker and client of the job speak TLS with the identity
    :func:`write_identity` wrote into ``folder``."""
    cert, key = f"{folder}/{CERT_FILE}", f"{folder}/{KEY_FILE}"
    env = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
           "DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME": "tls",
           "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": cert}
    for role in ("SCHEDULER", "WORKER", "CLIENT"):
        env[f"DASK_DISTRIBUTED__COMM__TLS__{role}__CERT"] = cert
        env[f"DASK_DISTRIBUTED__COMM__TLS__{role}__KEY"] = key
    return env


def in_memory_security() -> Security:
    """A Dask ``Security`` for a cluster started from this process: a new
    identity held in memory only, presented by the scheduler, the workers
    and the client (mutual TLS), with encryption required. The embedded
    cluster's worker processes receive it from their nanny through a pipe."""
    from distributed.security import Security

    cert, key = (pem.decode() for pem in self_signed())
    roles = {f"tls_{role}_{part}": pem for role in ("scheduler", "worker", "client")
             for part, pem in (("cert", cert), ("key", key))}
    return Security(require_encryption=True, tls_ca_file=cert, **roles)


def check_available() -> None:
    """Raise UsageError when the cryptography package (which makes the certificate) is missing."""
    if importlib.util.find_spec("cryptography") is None:
        raise UsageError("hpo's Dask clusters (embedded, or a batch job's) need the cryptography "
                         "package for their TLS certificate.\n  fix: pip install cryptography (in "
                         "the environment the study runs; for a batch job, the one --python names)")


def self_signed() -> tuple[bytes, bytes]:
    """A PEM certificate (CA:TRUE, signed by its own key) and the PEM key."""
    check_available()
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hpo-dask-job")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))  # nodes' clocks differ a little
            .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("hpo-dask-job")]), critical=False)
            # Key identifiers: OpenSSL's strict verification (Python 3.13+) wants them on a CA.
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem
