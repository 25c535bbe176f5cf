"""TLS settings are checked before the gateway binds: an expired certificate or a key
that is not the certificate's stops it with a message saying so (exit 2 from the CLI)."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from serving.config import GatewayConfig, ServerTLS
from serving.server import GatewayServer, StartupError, check_server_tls
from slipway.cli import main

pytestmark = pytest.mark.timeout(300)

NOW = datetime.datetime.now(datetime.UTC)


def write_pair(
    directory: Path,
    name: str,
    *,
    starts: datetime.datetime = NOW - datetime.timedelta(hours=1),
    ends: datetime.datetime = NOW + datetime.timedelta(days=30),
) -> tuple[Path, Path]:
    """A self-signed certificate for ``localhost`` and its key, made now."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(starts)
        .not_valid_after(ends)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def start(model_root: Path, tls: ServerTLS) -> None:
    server = GatewayServer(
        model_root, GatewayConfig(tls=tls), host="127.0.0.1", grpc_port=0, rest_port=0
    )

    async def run() -> None:
        try:
            await server.start()
        finally:
            await server.close()

    asyncio.run(run())


def test_a_good_pair_passes(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, "good")
    check_server_tls(ServerTLS(cert=cert, key=key))


def test_an_expired_certificate_stops_the_start(tmp_path: Path) -> None:
    cert, key = write_pair(
        tmp_path,
        "old",
        starts=NOW - datetime.timedelta(days=60),
        ends=NOW - datetime.timedelta(days=1),
    )
    with pytest.raises(StartupError, match=r"expired on \d{4}-\d\d-\d\d .*renew"):
        start(tmp_path, ServerTLS(cert=cert, key=key))


def test_a_certificate_not_yet_valid_stops_the_start(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, "early", starts=NOW + datetime.timedelta(days=2))
    with pytest.raises(StartupError, match="not valid before .*clock"):
        check_server_tls(ServerTLS(cert=cert, key=key))


def test_a_key_of_another_certificate_is_named_as_such_not_as_a_bind_failure(
    tmp_path: Path,
) -> None:
    cert, _ = write_pair(tmp_path, "one")
    _, other_key = write_pair(tmp_path, "two")
    with pytest.raises(StartupError) as error:
        start(tmp_path, ServerTLS(cert=cert, key=other_key))
    assert "does not belong to tls.cert" in str(error.value)
    assert "bind" not in str(error.value)


def test_files_that_are_not_pem_are_named(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, "good")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(StartupError, match="tls.cert .*not a PEM certificate"):
        check_server_tls(ServerTLS(cert=junk, key=key))
    with pytest.raises(StartupError, match="tls.key .*not a PEM private key"):
        check_server_tls(ServerTLS(cert=cert, key=junk))
    with pytest.raises(StartupError, match="tls.client_ca .*not a PEM certificate"):
        check_server_tls(ServerTLS(cert=cert, key=key, client_ca=junk))


def test_the_cli_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cert, key = write_pair(
        tmp_path,
        "old",
        starts=NOW - datetime.timedelta(days=60),
        ends=NOW - datetime.timedelta(days=1),
    )
    config = tmp_path / "gateway.yaml"
    config.write_text(f"tls:\n  cert: {cert.name}\n  key: {key.name}\n")
    models = tmp_path / "models"
    models.mkdir()
    code = main(
        [
            "serve", "--model-root", str(models), "--config", str(config),
            "--host", "127.0.0.1", "--grpc-port", "0", "--rest-port", "0",
        ]
    )  # fmt: skip
    stderr = capsys.readouterr().err
    assert code == 2, stderr[-2000:]
    assert "expired on" in stderr
    assert "Traceback" not in stderr
