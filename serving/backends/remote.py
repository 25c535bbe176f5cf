"""Forward batches to a TensorFlow Serving model server over ``PredictionService``.

The gateway then adds batching, routing and metrics in front of servers that already
run the model. Calls spread round-robin over a small pool of channels (one HTTP/2
connection caps concurrent streams and funnels through one socket), each call carries
the caller's remaining deadline, and the server's status code comes back as the
matching ``ServingError`` so clients see the same failure a direct call would give.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import grpc
import numpy as np
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.backends.base import check_deadline, find_signature
from serving.errors import Internal, InvalidArgument, ServingError, Unavailable
from serving.signature import Signature
from serving.tensors import numpy_to_tensor_proto, tensor_proto_to_numpy

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


class RemoteBackend:
    """A model on a remote TensorFlow Serving (or another Slipway gateway).

    ``version`` pins a version number, a string pins a version label, None follows the
    server's latest. TLS is used when ``tls`` is set or any certificate is given
    (``private_key`` + ``certificate_chain`` present a client certificate for mTLS).
    """

    def __init__(
        self,
        target: str,
        model_name: str,
        version: int | str | None = None,
        *,
        pool_size: int = 4,
        tls: bool = False,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        server_name_override: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        metadata_timeout: float = 10.0,
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size}")
        if isinstance(version, bool) or (isinstance(version, int) and version < 0):
            raise ValueError(f"version must be a non-negative integer or a label, got {version!r}")
        self.target = target
        self.model_name = model_name
        self.version = version
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            # Without a local pool, channels to one target share a connection.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        credentials = None
        if tls or root_certificates or private_key or certificate_chain:
            credentials = grpc.ssl_channel_credentials(
                root_certificates, private_key, certificate_chain
            )
            if server_name_override:
                options.append(("grpc.ssl_target_name_override", server_name_override))
        self._channels = [
            grpc.secure_channel(target, credentials, options)
            if credentials is not None
            else grpc.insecure_channel(target, options)
            for _ in range(pool_size)
        ]
        self._stubs = [prediction_service_pb2_grpc.PredictionServiceStub(c) for c in self._channels]
        self._next = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        try:
            self.signatures: dict[str, Signature] = self._fetch_signatures(metadata_timeout)
        except BaseException:
            self.close()
            raise

    def _stub(self) -> prediction_service_pb2_grpc.PredictionServiceStub:
        with self._lock:
            if self._closed:
                raise Unavailable(f"{self.target}: the backend has been closed")
            return self._stubs[next(self._next) % len(self._stubs)]

    def _model_spec(self, spec: Any, signature_name: str = "") -> None:
        spec.name = self.model_name
        if isinstance(self.version, int):
            spec.version.value = self.version
        elif isinstance(self.version, str):
            spec.version_label = self.version
        if signature_name:
            spec.signature_name = signature_name

    def _fetch_signatures(self, timeout: float) -> dict[str, Signature]:
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        self._model_spec(request.model_spec)
        response = self._call("GetModelMetadata", request, timeout)
        definitions = get_model_metadata_pb2.SignatureDefMap()
        if "signature_def" not in response.metadata or not response.metadata[
            "signature_def"
        ].Unpack(definitions):
            raise Internal(f"{self.target}: GetModelMetadata returned no signature_def")
        return {
            key: Signature.from_proto(key, definition)
            for key, definition in definitions.signature_def.items()
            if not key.startswith("__")  # e.g. __saved_model_init_op, not callable
        }

    def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        try:
            return getattr(self._stub(), method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
            details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
            raise ServingError.for_code(code, f"{self.target}: {details or code.name}") from None

    def run(
        self, signature_name: str, inputs: dict[str, np.ndarray], timeout: float | None = None
    ) -> dict[str, np.ndarray]:
        find_signature(self.signatures, signature_name)
        check_deadline(timeout)
        request = predict_pb2.PredictRequest()
        self._model_spec(request.model_spec, signature_name)
        for name, array in inputs.items():
            request.inputs[name].CopyFrom(numpy_to_tensor_proto(array))
        response = self._call("Predict", request, timeout)
        try:
            return {
                name: tensor_proto_to_numpy(proto, name, kind="output")
                for name, proto in response.outputs.items()
            }
        except InvalidArgument as exc:
            raise Internal(f"{self.target}: malformed response: {exc.message}") from None

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for channel in self._channels:
            channel.close()
