"""Run the gateway: gRPC and REST listeners on one event loop, TLS, and a graceful stop.

Shutdown follows what a load balancer needs: on SIGTERM readiness turns false and the
health service reports NOT_SERVING, new requests are refused with UNAVAILABLE / 503 (the
listeners stay open so clients get an answer, not a reset), queued and in-flight requests
finish within the grace period, then the listeners close and the models unload.

A worker of a pool (``serving.pool``) listens on ports its siblings share and only once its
models are loaded: until then the kernel gives its connections to the others.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import signal
import ssl
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from tensorflow_serving.apis import (
    model_service_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2,
    prediction_service_pb2_grpc,
)

from serving.admin import AdminApi, AdminAuth
from serving.config import GatewayConfig, ServerTLS
from serving.errors import StartupError
from serving.feedback import FeedbackStore
from serving.feedback_relay import sibling_route
from serving.gateway import Gateway
from serving.grpc_api import FeedbackService, ModelService, PredictionService
from serving.health import Health
from serving.pool_worker import ALIVE_PATH, PoolWorker
from serving.rest_api import build_app

logger = logging.getLogger(__name__)

# Seconds the listeners get to finish answering after the drain (responses being written).
CLOSE_GRACE_S = 1.0


def grpc_credentials(tls: ServerTLS) -> grpc.ServerCredentials:
    """Server TLS for gRPC; with ``client_ca`` clients must present a certificate it signed."""
    client_ca = _read(tls.client_ca) if tls.client_ca else None
    return grpc.ssl_server_credentials(
        [(_read(tls.key), _read(tls.cert))],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def ssl_context(tls: ServerTLS) -> ssl.SSLContext:
    """Server TLS for REST, with the same mutual-TLS rule as gRPC."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert, tls.key)
        if tls.client_ca is not None:
            context.load_verify_locations(cafile=tls.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(f"tls: cannot load certificates: {exc}") from None
    return context


# A certificate this close to its end is still served, with a warning at start-up.
EXPIRY_WARNING = datetime.timedelta(days=14)


def check_server_tls(tls: ServerTLS, now: datetime.datetime | None = None) -> None:
    """Refuse, before anything binds, a certificate clients would refuse or that cannot
    serve: unreadable files, a certificate outside its validity dates, a key that is not
    the certificate's. gRPC would bind and then fail its handshakes (clients see
    UNAVAILABLE) or hide the reason behind "failed to bind"; this says what is wrong."""
    now = now or datetime.datetime.now(datetime.UTC)
    cert_pem, key_pem = _read(tls.cert), _read(tls.key)
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
    except ImportError:  # without it OpenSSL still checks the pair (ssl_context)
        ssl_context(tls)
        return
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise StartupError(f"tls.cert {tls.cert}: not a PEM certificate ({exc})") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise StartupError(
            f"tls.key {tls.key}: the key is encrypted; the gateway needs it unencrypted"
        ) from None
    except Exception as exc:  # ValueError, or UnsupportedAlgorithm (which is not one)
        raise StartupError(f"tls.key {tls.key}: not a PEM private key ({exc})") from None
    if _public_key_der(key.public_key()) != _public_key_der(certificate.public_key()):
        raise StartupError(
            f"tls.key {tls.key} does not belong to tls.cert {tls.cert} (its public key is "
            "another): give the key the certificate was issued for"
        )
    starts, ends = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    subject = certificate.subject.rfc4514_string() or "(no subject)"
    if now > ends:
        raise StartupError(
            f"tls.cert {tls.cert} ({subject}) expired on {ends:%Y-%m-%d %H:%M:%S} UTC: "
            "clients would refuse it; renew the certificate"
        )
    if now < starts:
        raise StartupError(
            f"tls.cert {tls.cert} ({subject}) is not valid before "
            f"{starts:%Y-%m-%d %H:%M:%S} UTC (check this machine's clock)"
        )
    if ends - now < EXPIRY_WARNING:
        logger.warning(
            "tls.cert %s (%s) expires on %s UTC", tls.cert, subject, f"{ends:%Y-%m-%d %H:%M:%S}"
        )
    if tls.client_ca is not None:
        try:
            x509.load_pem_x509_certificates(_read(tls.client_ca))
        except ValueError as exc:
            raise StartupError(
                f"tls.client_ca {tls.client_ca}: not a PEM certificate ({exc})"
            ) from None
    ssl_context(tls)  # what OpenSSL itself refuses (an unsupported key, say)


def _public_key_der(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise StartupError(f"tls: cannot read {path}: {exc}") from None


def private_app(feedback: FeedbackStore) -> web.Application:
    """A pool worker's private socket: what its siblings (labels) and its supervisor (is
    the event loop still turning?) ask it."""

    async def alive(_request: web.Request) -> web.Response:
        return web.Response(text="alive")

    app = web.Application()
    app.add_routes([web.get(ALIVE_PATH, alive), sibling_route(feedback)])
    return app


class GatewayServer:
    """The gateway with its gRPC and REST listeners (``start``, then ``shutdown``)."""

    def __init__(
        self,
        model_root: str | Path,
        config: GatewayConfig | None = None,
        *,
        host: str = "0.0.0.0",
        grpc_port: int = 8500,
        rest_port: int = 8501,
        pool: PoolWorker | None = None,
    ) -> None:
        self.config = config or GatewayConfig()
        self.pool = pool
        self.model_root = Path(model_root)
        self.host = host
        self.grpc_port = grpc_port
        self.rest_port = rest_port
        self.gateway: Gateway | None = None
        self._grpc: grpc.aio.Server | None = None
        self._rest: web.AppRunner | None = None
        self._private: web.AppRunner | None = None

    async def start(self) -> None:
        """Bind both listeners, then start loading models (``/readyz`` says when done); a
        worker of a pool loads first, then binds."""
        if not self.model_root.is_dir():
            raise StartupError(f"--model-root {self.model_root}: not a directory")
        if self.config.tls is not None:
            check_server_tls(self.config.tls)
        auth = AdminAuth(self.config.admin_token())
        self.gateway = Gateway(self.model_root, self.config, health=Health(), pool=self.pool)
        try:
            if self.pool is None:
                await self._start_grpc(self.gateway, auth)
                await self._start_rest(self.gateway, auth)
                await self.gateway.start()
            else:
                await self.gateway.start()
                await self.gateway.wait_loaded()
                await self._start_grpc(self.gateway, auth)
                await self._start_rest(self.gateway, auth)
                await self._start_private_socket(self.pool, self.gateway)
                self.pool.announce_ready()
        except BaseException:
            await self.close()
            raise
        scheme = "https" if self.config.tls else "http"
        logger.info(
            "serving %s: gRPC on %s:%d, REST on %s://%s:%d",
            self.model_root, self.host, self.grpc_port, scheme, self.host, self.rest_port,
        )  # fmt: skip

    async def _start_grpc(self, gateway: Gateway, auth: AdminAuth) -> None:
        size = self.config.max_message_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", size),
                ("grpc.max_send_message_length", size),
                # Two gateways must not share a port silently; a pool's workers do (its
                # supervisor holds the ports so that nothing else can).
                ("grpc.so_reuseport", int(self.pool is not None)),
            ]
        )
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            PredictionService(gateway), server
        )
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(
            ModelService(gateway, auth.check), server
        )
        server.add_generic_rpc_handlers((FeedbackService(gateway).handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(gateway.health.servicer, server)
        reflection.enable_server_reflection(
            [
                prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"].full_name,
                model_service_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name,
                health.SERVICE_NAME,
                reflection.SERVICE_NAME,
            ],
            server,
        )
        address = f"{self.host}:{self.grpc_port}"
        try:
            if self.config.tls is not None:
                port = server.add_secure_port(address, grpc_credentials(self.config.tls))
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise StartupError(f"gRPC: cannot listen on {address}: {exc}") from None
        if port == 0:
            raise StartupError(f"gRPC: cannot listen on {address}")
        self.grpc_port = port
        self._grpc = server
        await server.start()

    async def _start_rest(self, gateway: Gateway, auth: AdminAuth) -> None:
        app = build_app(gateway, max_body_bytes=self.config.max_message_bytes)
        AdminApi(gateway, auth).add_routes(app)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._rest = runner
        tls = ssl_context(self.config.tls) if self.config.tls is not None else None
        site = web.TCPSite(
            runner, self.host, self.rest_port, ssl_context=tls, reuse_port=self.pool is not None
        )
        try:
            await site.start()
        except OSError as exc:
            raise StartupError(
                f"REST: cannot listen on {self.host}:{self.rest_port}: {exc}"
            ) from None
        self.rest_port = runner.addresses[0][1]

    async def _start_private_socket(self, pool: PoolWorker, gateway: Gateway) -> None:
        """Where the pool's other workers ask this one about its answers (labels), and its
        supervisor whether it is alive."""
        runner = web.AppRunner(private_app(gateway.feedback), access_log=None, handle_signals=False)
        await runner.setup()
        self._private = runner
        pool.socket_path.parent.mkdir(parents=True, exist_ok=True)
        pool.socket_path.unlink(missing_ok=True)  # a dead predecessor's
        await web.UnixSite(runner, str(pool.socket_path)).start()

    def sync_shared(self) -> None:
        if self.gateway is not None:
            self.gateway.sync_shared()

    async def shutdown(self) -> bool:
        """Drain within the grace period, then close; False if requests had to be cut."""
        assert self.gateway is not None
        drained = await self.gateway.drain(self.config.grace_period_s)
        if not drained:
            logger.warning(
                "grace period of %.1f s over with requests still in flight; stopping anyway",
                self.config.grace_period_s,
            )
        await self.close()
        return drained

    async def close(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(CLOSE_GRACE_S)
            self._grpc = None
        for runner in (self._rest, self._private):
            if runner is not None:
                await runner.cleanup()
        self._rest = self._private = None
        if self.gateway is not None:
            await self.gateway.stop()


async def serve(server: GatewayServer) -> int:
    """Run until SIGTERM or SIGINT, then shut down gracefully; the process exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if server.pool is not None:  # the supervisor saw the disk or the routing change
        loop.add_signal_handler(signal.SIGHUP, server.sync_shared)
    await server.start()
    await stop.wait()
    logger.info("shutting down: draining requests for up to %.1f s", server.config.grace_period_s)
    await server.shutdown()
    logger.info("stopped")
    return 0
