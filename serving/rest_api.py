"""TensorFlow Serving's REST API on aiohttp, plus ``/metrics``, ``/healthz`` and ``/readyz``.

Paths, bodies and answers are TF Serving's (``/v1/models/{m}[/versions/{v}|/labels/{l}]``,
``…/metadata``, ``…:predict|:classify|:regress``), so its REST clients work unchanged.
Every failure is ``{"error": "…"}`` with the HTTP status of its gRPC code, including the
ones aiohttp raises itself (unknown path, body over the size limit).

A client sets a deadline with the ``X-Request-Timeout-Ms`` header (milliseconds), the REST
counterpart of a gRPC deadline. Every response carries ``X-Request-Id``: the client's own
(checked) when it sent one, else a new one. ``POST /v1/models/{m}/feedback`` takes labels
for answered requests (see ``serving.feedback``).

A URL that is not one of these paths with its method (``GET …:predict``, ``/version/1``,
``/v1/models``, an unknown verb, a version that is not an int64 in ASCII digits) is
answered 400 "Malformed request", as TF Serving answers it.

Bodies run on the event loop that also serves gRPC, and ``json.loads`` holds the GIL for
its whole run (seconds for tens of MiB), so a thread would not help: a body of
``LARGE_BODY_BYTES`` or more is parsed and decoded into arrays in a worker process
(``BodyWorkers``), and only arrays, cheap to copy, come back; large answers are encoded
there too. A client hanging up is logged at debug level and counted in
``slipway_gateway_client_disconnects_total``, never as a server error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import math
import multiprocessing
import re
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import grpc
import numpy as np
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from google.protobuf import json_format
from tensorflow.core.example.example_pb2 import Example
from tensorflow.core.example.feature_pb2 import Feature

from serving.errors import ClientDisconnected, InvalidArgument, ServingError, echo, shorten
from serving.gateway import Gateway
from serving.grpc_api import SIGNATURE_DEF_FIELD, model_status_response, signature_def_map
from serving.request_id import new_request_id, request_id_of
from serving.signature import DEFAULT_SIGNATURE, Signature
from serving.tensors import (
    decode_b64,
    float32_json_value,
    is_b64,
    json_to_inputs,
    outputs_to_predictions,
)

logger = logging.getLogger(__name__)

TIMEOUT_HEADER = "X-Request-Timeout-Ms"
REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID_KEY = web.RequestKey("request_id", str)

GATEWAY_KEY = web.AppKey("gateway", Gateway)

_MODEL_PATH = re.compile(
    r"/v1/models/(?P<model>[^/:]+)"
    r"(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
    r"(?:/(?P<resource>metadata|feedback)|:(?P<verb>[^/:]*))?"
)
# A version is a non-negative int64 written in ASCII digits (``\d`` would take any
# Unicode digit: ``١`` or ``²``).
_VERSION = re.compile(r"[0-9]+")
MAX_VERSION = 2**63 - 1
VERBS = ("predict", "classify", "regress")

# Bodies from this size on are parsed in a worker process (see the module docstring);
# smaller ones parse on the loop in well under a millisecond per 10 KiB.
LARGE_BODY_BYTES = 128 * 1024
# Answers with more output values than this are encoded in a worker process too.
LARGE_ANSWER_VALUES = 64 * 1024
# Examples turned back into protos per turn of the event loop.
EXAMPLES_PER_TURN = 2000

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def malformed(request: web.Request, reason: str) -> InvalidArgument:
    """TF Serving's answer to a URL or method that is not one of its API's."""
    return InvalidArgument(f"Malformed request: {request.method} {shorten(request.path)}: {reason}")


def _client_message(request: web.Request, message: str) -> str:
    gateway = request.app.get(GATEWAY_KEY)
    return gateway.client_message(message) if gateway is not None else message


def _disconnected(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _count_disconnect(request: web.Request, stage: str) -> None:
    gateway = request.app.get(GATEWAY_KEY)
    if gateway is not None:
        gateway.metrics.observe_disconnect(stage)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as ``{"error": …}`` with a meaningful status; none is a crash.

    Messages pass ``Gateway.client_message`` (no server paths, short echoes). A client
    that hung up is not a server error: a debug line and a count, and an answer (499)
    that only the access log sees.
    """
    try:
        return await handler(request)
    except ClientDisconnected as exc:
        logger.debug("%s %s: %s", request.method, shorten(request.path), exc.message)
        _count_disconnect(request, "body")
        return json_error(exc.http_status, exc.message)
    except ServingError as exc:
        return json_error(exc.http_status, _client_message(request, exc.message))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        text = exc.text if exc.text and exc.text != exc.reason else exc.reason
        return json_error(exc.status, _client_message(request, text or ""))
    except (ConnectionError, HttpProcessingError) as exc:
        if not _disconnected(request):
            logger.exception("%s %s failed", request.method, shorten(request.path))
            return json_error(500, "internal error")
        logger.debug(
            "%s %s: the client closed the connection (%s)",
            request.method, shorten(request.path), type(exc).__name__,
        )  # fmt: skip
        _count_disconnect(request, "handling")
        return json_error(499, "the client closed the connection")
    except Exception:
        logger.exception("%s %s failed", request.method, shorten(request.path))
        return json_error(500, "internal error")


@web.middleware
async def request_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give the request its id (``request[REQUEST_ID_KEY]``) and every response the header;
    an unusable client id is answered 400, still with an id of the gateway's."""
    try:
        request_id = request_id_of(request.headers)  # case-insensitive, like HTTP
    except InvalidArgument as exc:
        response: web.StreamResponse = json_error(
            exc.http_status, _client_message(request, exc.message)
        )
        request_id = new_request_id()
    else:
        request[REQUEST_ID_KEY] = request_id
        response = await handler(request)
    response.headers[REQUEST_ID_HEADER] = request_id
    return response


def deadline_of(request: web.Request) -> float | None:
    """The request's deadline (``time.monotonic()``) from its timeout header, if any."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        milliseconds = float(raw)
    except ValueError:
        milliseconds = math.nan
    if not math.isfinite(milliseconds) or milliseconds < 0:
        raise InvalidArgument(f"{TIMEOUT_HEADER}: expected a number of milliseconds, got {raw!r}")
    return time.monotonic() + milliseconds / 1000


def headers_of(request: web.Request) -> dict[str, str]:
    return {key.lower(): value for key, value in request.headers.items()}


async def read_body(request: web.Request) -> bytes:
    """The whole request body; ``ClientDisconnected`` if the client left while sending it."""
    try:
        return await request.read()
    except (ConnectionError, HttpProcessingError) as exc:
        if isinstance(exc, ConnectionError) or _disconnected(request):
            raise ClientDisconnected(
                "the client closed the connection while sending the request body"
            ) from None
        raise InvalidArgument(f"the request body could not be read: {exc.message}") from None


def parse_json(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object (runs on the loop or in a worker process)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def signature_name_of(body: Mapping[str, Any]) -> str:
    name = body.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(name, str):
        raise InvalidArgument(f"'signature_name' must be a string, got {echo(name)}")
    return name or DEFAULT_SIGNATURE


# --------------------------------------------------------------------------- tf.Example


def json_to_feature(value: Any, where: str) -> Feature:
    """A tf.train.Feature from a JSON value, typed as TF Serving's REST API types it:
    numbers -> int64_list when the first is an integer (a later fraction is refused), else
    float_list; strings and ``{"b64"}`` -> bytes_list."""
    values = value if isinstance(value, list) else [value]
    feature = Feature()
    if not values:
        return feature
    if all(isinstance(item, str) or is_b64(item) for item in values):
        feature.bytes_list.value.extend(
            decode_b64(item, where) if is_b64(item) else item.encode("utf-8") for item in values
        )
    elif not all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in values):
        raise InvalidArgument(
            f"{where}: expected a number, a string, {{'b64': ...}} or a flat list of one of them"
        )
    elif isinstance(values[0], int):
        # As TF Serving: the first number types the feature, and an int64 feature takes
        # no fractions ([10, 10.0] is refused; [10.0, 10] is a float feature).
        if not all(isinstance(item, int) for item in values):
            raise InvalidArgument(f"Unexpected element type in {where} expecting type: int64")
        if any(not -(2**63) <= item < 2**63 for item in values):
            raise InvalidArgument(f"{where}: integer out of range for int64")
        feature.int64_list.value.extend(values)
    else:
        feature.float_list.value.extend(float(item) for item in values)
    return feature


def json_to_example(features: Any, where: str) -> Example:
    if not isinstance(features, dict):
        raise InvalidArgument(f"{where}: expected an object of features")
    example = Example()
    for name, value in features.items():
        example.features.feature[name].CopyFrom(
            json_to_feature(value, f"{where}: feature {name!r}")
        )
    return example


def examples_of(body: Mapping[str, Any]) -> tuple[list[Example], Example | None]:
    examples = body.get("examples")
    if not isinstance(examples, list) or not examples:
        raise InvalidArgument("'examples' must be a non-empty list of objects")
    context = body.get("context")
    return (
        [json_to_example(item, f"examples[{index}]") for index, item in enumerate(examples)],
        None if context is None else json_to_example(context, "context"),
    )


# --------------------------------------------------------------------------- worker process

# Each function below runs in a worker process: arguments and results cross as pickles,
# so they take bytes, signatures and arrays (cheap to copy) and never return the parsed
# JSON itself (unpickling millions of Python floats would stall the loop as long as
# parsing them did). Errors cross as ``ServingError`` subclasses.


class _Failed(tuple[str, str]):
    """A ``ServingError`` crossing back from a worker as its code name and message (an
    exception class with a constructor of its own might not survive pickling)."""

    @classmethod
    def of(cls, error: ServingError) -> _Failed:
        return cls((error.code.name, error.message))

    def error(self) -> ServingError:
        return ServingError.for_code(grpc.StatusCode[self[0]], self[1])


def _in_worker(function: Callable[..., T], *args: Any) -> T | _Failed:
    try:
        return function(*args)
    except ServingError as exc:
        return _Failed.of(exc)


PreparedInputs = tuple[dict[str, np.ndarray], bool] | _Failed


def _prepare_predict(
    body: bytes, candidates: Mapping[str, list[Signature]]
) -> tuple[str, list[tuple[Signature, PreparedInputs]]]:
    """Parse a ``:predict`` body and decode it for each signature it may be routed to."""
    data = parse_json(body)
    name = signature_name_of(data)
    decoded: list[tuple[Signature, PreparedInputs]] = []
    for signature in candidates.get(name, ()):
        try:
            decoded.append((signature, json_to_inputs(data, signature)))
        except ServingError as exc:
            decoded.append((signature, _Failed.of(exc)))
    return name, decoded


def _decode_predict(body: bytes, signature: Signature) -> tuple[dict[str, np.ndarray], bool]:
    """Decode a ``:predict`` body for a signature ``_prepare_predict`` did not know."""
    return json_to_inputs(parse_json(body), signature)


def _prepare_examples(body: bytes) -> tuple[str, list[bytes], bytes | None]:
    """Parse a ``:classify``/``:regress`` body into serialized tf.Examples."""
    data = parse_json(body)
    name = signature_name_of(data)
    examples, context = examples_of(data)
    return (
        name,
        [example.SerializeToString() for example in examples],
        None if context is None else context.SerializeToString(),
    )


def _encode_predictions(outputs: Mapping[str, np.ndarray], row_format: bool) -> bytes:
    return json.dumps(outputs_to_predictions(outputs, row_format)).encode()


def _worker_started() -> None:
    # The gateway handles Ctrl-C and SIGTERM and closes the pool; its workers stay quiet.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class BodyWorkers:
    """A small pool of worker processes for large bodies, started on first use.

    Processes are spawned (never forked from a process running gRPC and TensorFlow
    threads). A pool whose worker died (killed for memory, say) is replaced; if the
    replacement breaks too, the call runs on a thread so that the request is still
    answered, if slowly for the loop.
    """

    def __init__(self, workers: int | None = None) -> None:
        # One by default: a worker imports TensorFlow's protos (about 650 MiB resident),
        # and bodies this large are rare; what matters is that none parses on the loop.
        self._workers = workers or 1
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self._workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_started,
            )
        return self._pool

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        result: T | _Failed
        for _attempt in range(2):
            try:
                result = await loop.run_in_executor(self._executor(), _in_worker, function, *args)
                break
            except BrokenProcessPool:
                logger.warning("a REST body worker process died; starting a new pool")
                self._discard()
        else:
            result = await asyncio.to_thread(_in_worker, function, *args)
        if isinstance(result, _Failed):
            raise result.error()
        return result

    def _discard(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        self._discard()


# --------------------------------------------------------------------------- handlers


class RestApi:
    """Handlers for TF Serving's paths and the probes."""

    def __init__(self, gateway: Gateway, workers: BodyWorkers | None = None) -> None:
        self._gateway = gateway
        self.workers = workers or BodyWorkers()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_route("*", "/v1/models/{tail:.*}", self.models)
        # Everything else under /v1 (``/v1/models`` itself included) is TF Serving's 400.
        app.router.add_route("*", "/v1", self.unknown_path)
        app.router.add_route("*", "/v1/{tail:.*}", self.unknown_path)

    async def metrics(self, request: web.Request) -> web.Response:
        body, content_type = self._gateway.metrics.render(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        health = self._gateway.health
        if health.ready:
            return web.json_response({"status": "ready", "models": health.models()})
        status = "draining" if health.draining else "loading"
        return web.json_response({"status": status, "models": health.models()}, status=503)

    async def unknown_path(self, request: web.Request) -> web.Response:
        if request.path.rstrip("/") == "/v1/models":
            raise malformed(request, "missing model name (/v1/models/{model}…)")
        raise malformed(request, "not a path of the /v1/models API")

    async def models(self, request: web.Request) -> web.Response:
        match = _MODEL_PATH.fullmatch(request.path)
        if match is None:
            raise malformed(
                request,
                "expected /v1/models/{model}[/versions/{version}|/labels/{label}]"
                "[/metadata|:predict|:classify|:regress]",
            )
        model, label, verb, resource = (
            match["model"],
            match["label"],
            match["verb"],
            match["resource"],
        )
        version = None
        if match["version"] is not None:
            version = self._version(request, match["version"])
        if resource == "feedback":
            self._expect(request, "POST")
            return await self._feedback(request, model, version, label)
        if verb is None:
            self._expect(request, "GET")
            if resource == "metadata":
                return await self._metadata(model, version, label)
            return self._status(model, version, label)
        if verb not in VERBS:
            raise malformed(
                request,
                f"unknown method :{shorten(verb)}; expected :predict, :classify or :regress",
            )
        self._expect(request, "POST")
        if verb == "predict":
            return await self._predict(request, model, version, label)
        return await self._infer(request, verb, model, version, label)

    @staticmethod
    def _version(request: web.Request, text: str) -> int:
        if _VERSION.fullmatch(text) is None:
            raise malformed(
                request, f"the version must be a non-negative integer, got {echo(text)}"
            )
        if len(text) > 19 or int(text) > MAX_VERSION:
            raise malformed(
                request, f"the version must be an integer of at most {MAX_VERSION} (int64)"
            )
        return int(text)

    @staticmethod
    def _expect(request: web.Request, method: str) -> None:
        if request.method != method:
            raise malformed(request, f"this path takes {method}")

    def _status(self, model: str, version: int | None, label: str | None) -> web.Response:
        response = model_status_response(
            self._gateway.status(model, version, label),
            functools.partial(self._gateway.client_message, log=False),
        )
        return web.json_response(
            json_format.MessageToDict(
                response,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            )
        )

    async def _metadata(self, model: str, version: int | None, label: str | None) -> web.Response:
        metadata = await self._gateway.metadata(model, version, label)
        # As TF Serving prints it: fields at their defaults too ("name": "",
        # "unknown_rank": false), int64 dims as strings, dtypes by enum name.
        signatures = json_format.MessageToDict(
            signature_def_map(metadata),
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
        return web.json_response(
            {
                "model_spec": {
                    "name": metadata.model,
                    "signature_name": "",
                    "version": str(metadata.version),
                },
                "metadata": {SIGNATURE_DEF_FIELD: signatures},
            }
        )

    async def _json(self, request: web.Request) -> dict[str, Any]:
        """The body as a JSON object, parsed off the loop when it is large."""
        body = await read_body(request)
        if len(body) < LARGE_BODY_BYTES:
            return parse_json(body)
        return await self.workers.run(parse_json, body)

    async def _predict(
        self, request: web.Request, model: str, version: int | None, label: str | None
    ) -> web.Response:
        body = await read_body(request)
        row_format = True
        decode: Callable[[Signature], Any]
        if len(body) < LARGE_BODY_BYTES:
            data = parse_json(body)
            signature_name = signature_name_of(data)

            def decode(signature: Signature) -> dict[str, np.ndarray]:
                nonlocal row_format
                inputs, row_format = json_to_inputs(data, signature)
                return inputs

        else:
            candidates = self._gateway.candidate_signatures(model, version, label)
            signature_name, prepared = await self.workers.run(_prepare_predict, body, candidates)

            async def decode(signature: Signature) -> dict[str, np.ndarray]:
                nonlocal row_format
                result: PreparedInputs | None = next(
                    (decoded for known, decoded in prepared if known == signature), None
                )
                if result is None:  # a version that appeared after the body was parsed
                    result = await self.workers.run(_decode_predict, body, signature)
                if isinstance(result, _Failed):
                    raise result.error()
                inputs, row_format = result
                return inputs

        result = await self._gateway.predict(
            model,
            version,
            label,
            signature_name,
            decode,
            deadline=deadline_of(request),
            headers=headers_of(request),
            api="rest",
            request_id=request[REQUEST_ID_KEY],
        )
        if sum(array.size for array in result.outputs.values()) < LARGE_ANSWER_VALUES:
            return web.json_response(outputs_to_predictions(result.outputs, row_format))
        encoded = await self.workers.run(_encode_predictions, dict(result.outputs), row_format)
        return web.Response(body=encoded, content_type="application/json")

    async def _infer(
        self, request: web.Request, verb: str, model: str, version: int | None, label: str | None
    ) -> web.Response:
        body = await read_body(request)
        if len(body) < LARGE_BODY_BYTES:
            data = parse_json(body)
            signature_name = signature_name_of(data)
            examples, context = examples_of(data)
        else:
            signature_name, serialized, serialized_context = await self.workers.run(
                _prepare_examples, body
            )
            examples = []
            for start in range(0, len(serialized), EXAMPLES_PER_TURN):
                examples.extend(
                    map(Example.FromString, serialized[start : start + EXAMPLES_PER_TURN])
                )
                await asyncio.sleep(0)
            context = None if serialized_context is None else Example.FromString(serialized_context)
        call = self._gateway.classify if verb == "classify" else self._gateway.regress
        result = await call(
            model,
            version,
            label,
            signature_name,
            examples,
            context,
            deadline=deadline_of(request),
            headers=headers_of(request),
            api="rest",
            request_id=request[REQUEST_ID_KEY],
        )
        # Scores and values are the float fields of TF Serving's result protos, printed
        # as float32 (``2.1``, not ``2.0999999046325684``); an unnamed class is "".
        if verb == "classify":
            results: list[Any] = [
                [[label, float32_json_value(score)] for label, score in row]
                for row in result.classes
            ]
        else:
            results = [float32_json_value(value) for value in result.values]
        return web.json_response({"results": results})

    async def _feedback(
        self, request: web.Request, model: str, version: int | None, label: str | None
    ) -> web.Response:
        if version is not None or label is not None:
            raise InvalidArgument(
                "feedback names the model only (POST /v1/models/{model}/feedback): the "
                "request id says which version answered"
            )
        body = await self._json(request)
        return web.json_response(await self._gateway.submit_feedback(model, body))


def build_app(
    gateway: Gateway, *, max_body_bytes: int, workers: BodyWorkers | None = None
) -> web.Application:
    """The REST application; ``max_body_bytes`` bounds request bodies (413 beyond).

    Large bodies are parsed by ``workers`` (a pool of its own when None, closed with the
    application)."""
    app = web.Application(middlewares=[request_ids, errors_as_json], client_max_size=max_body_bytes)
    app[GATEWAY_KEY] = gateway
    api = RestApi(gateway, workers)
    api.add_routes(app)

    async def close_workers(_app: web.Application) -> None:
        api.workers.close()

    app.on_cleanup.append(close_workers)
    return app
