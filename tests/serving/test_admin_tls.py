"""The admin API's bearer token, the shared routing file, TLS / mutual TLS and size limits.

Certificates come from a throwaway CA made for the module with ``cryptography``.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from tensorflow_serving.apis import (
    model_management_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)

from serving.admin import AdminAuth
from serving.config import GatewayConfig, load_config
from serving.errors import PermissionDenied, Unauthenticated
from serving.routing import ModelRouting, RoutingConfig, load_routing, write_routing
from tests.support.gateways import GatewayThread
from tests.support.grpc_requests import predict_request
from tests.support.serving_models import ServingModel
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

TOKEN = "correct-horse-battery-staple"
MAX_MESSAGE_BYTES = 256 * 1024


# -- certificates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _issue(
    directory: Path,
    name: str,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    server: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    issuer_name = _name(name) if issuer is None else issuer[0].subject
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is not None:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    certificate = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    (directory / f"{name}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    _write_key(directory / f"{name}.key", key)
    return certificate, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = _issue(directory, "ca", None)
    _issue(directory, "server", ca, server=True)
    _issue(directory, "client", ca)
    return Pki(
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
        directory / "client.pem",
        directory / "client.key",
    )


# -- gateways -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, serving_model: ServingModel) -> Path:
    root = tmp_path_factory.mktemp("admin") / "models"
    for version in (1, 2):
        serving_model.publish(root, version)
    return root


@pytest.fixture(scope="module")
def secure(
    root: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayThread]:
    """mTLS on both APIs, an admin token, a shared routing file and a small message limit."""
    base = tmp_path_factory.mktemp("secure")
    (base / "gateway.yaml").write_text(
        json.dumps(
            {
                "routing_file": "routing.yaml",
                "max_message_bytes": MAX_MESSAGE_BYTES,
                "version_policy": {"kind": "all"},
                "tls": {
                    "cert": str(pki.server_cert),
                    "key": str(pki.server_key),
                    "client_ca": str(pki.ca),
                },
                "admin": {"token_file": "token"},
            }
        )
    )
    (base / "token").write_text(TOKEN + "\n")
    with GatewayThread(root, load_config(base / "gateway.yaml")) as thread:
        yield thread


@pytest.fixture(scope="module")
def plain(root: Path) -> Iterator[GatewayThread]:
    """No admin token configured: the admin API does not exist."""
    with GatewayThread(root, GatewayConfig()) as thread:
        yield thread


def client_context(pki: Pki, *, certificate: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca)
    if certificate:
        context.load_cert_chain(pki.client_cert, pki.client_key)
    return context


def https(
    server: GatewayThread,
    pki: Pki,
    method: str,
    path: str,
    body: Any = None,
    token: str | None = TOKEN,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        server.rest_url + path, data=data, method=method, headers=headers
    )
    context = client_context(pki) if server.rest_url.startswith("https") else None
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def secure_channel(server: GatewayThread, pki: Pki, *, certificate: bool = True) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        pki.ca.read_bytes(),
        pki.client_key.read_bytes() if certificate else None,
        pki.client_cert.read_bytes() if certificate else None,
    )
    return grpc.secure_channel(server.grpc_target, credentials)


def reload_request(**labels: int) -> model_management_pb2.ReloadConfigRequest:
    request = model_management_pb2.ReloadConfigRequest()
    entry = request.config.model_config_list.config.add(name="digits")
    for name, version in labels.items():
        entry.version_labels[name] = version
    return request


# -- the token ------------------------------------------------------------------------------


def test_tokens_are_checked_with_the_right_errors() -> None:
    auth = AdminAuth("abc")
    auth.check("Bearer abc")
    auth.check("bearer  abc ")
    with pytest.raises(Unauthenticated):
        auth.check(None)
    with pytest.raises(Unauthenticated):
        auth.check("Basic abc")
    with pytest.raises(PermissionDenied):
        auth.check("Bearer abd")
    with pytest.raises(PermissionDenied, match="disabled"):
        AdminAuth(None).check("Bearer abc")


def test_admin_api_needs_the_token(secure, pki) -> None:
    assert https(secure, pki, "GET", "/admin/routing", token=None)[0] == 401
    status, body = https(secure, pki, "GET", "/admin/routing", token="guess")
    assert status == 403 and "not valid" in body["error"]
    assert https(secure, pki, "GET", "/admin/routing") == (200, {"models": {}})


def test_admin_api_is_off_without_a_token(plain, pki) -> None:
    status, body = https(plain, pki, "GET", "/admin/routing")
    assert status == 404 and "error" in body
    with grpc.insecure_channel(plain.grpc_target) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.HandleReloadConfigRequest(reload_request(stable=1), timeout=10)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_grpc_reload_needs_the_token(secure, pki) -> None:
    with secure_channel(secure, pki) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        for metadata, code in [
            ((), grpc.StatusCode.UNAUTHENTICATED),
            ((("authorization", "Bearer guess"),), grpc.StatusCode.PERMISSION_DENIED),
        ]:
            with pytest.raises(grpc.RpcError) as caught:
                stub.HandleReloadConfigRequest(
                    reload_request(stable=1), metadata=metadata, timeout=10
                )
            assert caught.value.code() == code
        response = stub.HandleReloadConfigRequest(
            reload_request(stable=1, canary=2),
            metadata=(("authorization", f"Bearer {TOKEN}"),),
            timeout=10,
        )
        assert response.status.error_code == 0


# -- routing through the admin API and the shared file --------------------------------------


def test_admin_routing_is_written_to_the_shared_file_and_applied(secure, pki) -> None:
    routing = {"labels": {"stable": 1, "canary": 2}, "canary_weight": 0.25, "failover": True}
    status, body = https(secure, pki, "PUT", "/admin/routing/digits", routing)
    assert status == 200 and body["canary_weight"] == 0.25
    on_disk = load_routing(secure.server.config.routing_file)
    assert on_disk.for_model("digits").labels == {"stable": 1, "canary": 2}
    assert https(secure, pki, "GET", "/admin/routing/digits")[1]["failover"] is True
    with secure_channel(secure, pki) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(predict_request(label="canary"), timeout=10)
    assert response.model_spec.version.value == 2
    status, body = https(secure, pki, "PUT", "/admin/routing/digits", {"canary_weight": 0.5})
    assert status == 400 and "canary" in body["error"]
    status, body = https(secure, pki, "PUT", "/admin/routing/nope", {})
    assert status == 404


def test_a_routing_file_written_by_another_replica_is_picked_up(secure, pki) -> None:
    path = secure.server.config.routing_file
    write_routing(path, RoutingConfig(models={"digits": ModelRouting(labels={"stable": 2})}))
    wait_until(
        lambda: secure.gateway.routing_config().for_model("digits").labels == {"stable": 2},
        "the routing file change to be picked up",
    )
    assert https(secure, pki, "POST", "/admin/reload")[0] == 200


def test_batching_can_be_changed_at_run_time(secure, pki) -> None:
    status, body = https(secure, pki, "GET", "/admin/batching/digits")
    assert status == 200 and body["max_batch_size"] == 32
    update = {**body, "max_batch_size": 8, "allowed_batch_sizes": [4, 8]}
    assert https(secure, pki, "PUT", "/admin/batching/digits", update)[0] == 200
    assert https(secure, pki, "GET", "/admin/batching/digits")[1]["allowed_batch_sizes"] == [4, 8]
    status, body = https(secure, pki, "PUT", "/admin/batching/digits", {"max_batch_size": 0})
    assert status == 400 and "max_batch_size" in body["error"]


# -- TLS ----------------------------------------------------------------------------------------


def test_mutual_tls_admits_clients_with_a_certificate_only(secure, pki) -> None:
    with secure_channel(secure, pki) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert stub.Predict(predict_request(), timeout=10).outputs
    with secure_channel(secure, pki, certificate=False) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(predict_request(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(secure.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError):
            stub.Predict(predict_request(), timeout=10)
    assert https(secure, pki, "GET", "/v1/models/digits")[0] == 200
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(
            secure.rest_url + "/v1/models/digits",
            timeout=10,
            context=client_context(pki, certificate=False),
        ).read()


# -- size limits --------------------------------------------------------------------------------


def test_messages_over_the_size_limit_are_refused(secure, pki) -> None:
    rows = MAX_MESSAGE_BYTES // (64 * 4) + 1
    with secure_channel(secure, pki) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(predict_request(rows=rows), timeout=10)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    status, body = https(
        secure, pki, "POST", "/v1/models/digits:predict", raw=b" " * (MAX_MESSAGE_BYTES + 1)
    )
    assert status == 413 and "error" in body
