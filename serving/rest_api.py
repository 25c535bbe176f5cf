"""TensorFlow Serving's REST API on aiohttp, plus ``/metrics``, ``/healthz`` and ``/readyz``.

Paths, bodies and answers are TF Serving's (``/v1/models/{m}[/versions/{v}|/labels/{l}]``,
``…/metadata``, ``…:predict|:classify|:regress``), so its REST clients work unchanged.
Every failure is ``{"error": "…"}`` with the HTTP status of its gRPC code, including the
ones aiohttp raises itself (unknown path, body over the size limit).

A client sets a deadline with the ``X-Request-Timeout-Ms`` header (milliseconds), the REST
counterpart of a gRPC deadline. Every response carries ``X-Request-Id``: the client's own
(checked) when it sent one, else a new one. ``POST /v1/models/{m}/feedback`` takes labels
for answered requests (see ``serving.feedback``).
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
from aiohttp import web
from google.protobuf import json_format
from tensorflow.core.example.example_pb2 import Example
from tensorflow.core.example.feature_pb2 import Feature

from serving.errors import InvalidArgument, NotFound, ServingError
from serving.gateway import Gateway
from serving.grpc_api import SIGNATURE_DEF_FIELD, model_status_response, signature_def_map
from serving.request_id import new_request_id, request_id_of
from serving.signature import DEFAULT_SIGNATURE, Signature
from serving.tensors import decode_b64, is_b64, json_to_inputs, outputs_to_predictions

logger = logging.getLogger(__name__)

TIMEOUT_HEADER = "X-Request-Timeout-Ms"
REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID_KEY = web.RequestKey("request_id", str)

_MODEL_PATH = re.compile(
    r"^/v1/models/(?P<model>[^/:]+)"
    r"(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
    r"(?:/(?P<resource>metadata|feedback)|:(?P<verb>[A-Za-z]+))?$"
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as ``{"error": …}`` with a meaningful status; none is a crash."""
    try:
        return await handler(request)
    except ServingError as exc:
        return json_error(exc.http_status, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return json_error(
            exc.status, exc.text if exc.text and exc.text != exc.reason else exc.reason
        )
    except Exception:
        logger.exception("%s %s failed", request.method, request.path)
        return json_error(500, "internal error")


@web.middleware
async def request_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give the request its id (``request[REQUEST_ID_KEY]``) and every response the header;
    an unusable client id is answered 400, still with an id of the gateway's."""
    try:
        request_id = request_id_of(request.headers)  # case-insensitive, like HTTP
    except InvalidArgument as exc:
        response: web.StreamResponse = json_error(exc.http_status, exc.message)
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


async def read_json(request: web.Request) -> dict[str, Any]:
    body = await request.read()
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
        raise InvalidArgument(f"'signature_name' must be a string, got {name!r}")
    return name or DEFAULT_SIGNATURE


# --------------------------------------------------------------------------- tf.Example


def json_to_feature(value: Any, where: str) -> Feature:
    """A tf.train.Feature from a JSON value, typed as TF Serving's REST API types it:
    integers -> int64_list, any float -> float_list, strings and ``{"b64"}`` -> bytes_list."""
    values = value if isinstance(value, list) else [value]
    feature = Feature()
    if all(isinstance(item, str) or is_b64(item) for item in values) and values:
        feature.bytes_list.value.extend(
            decode_b64(item, where) if is_b64(item) else item.encode("utf-8") for item in values
        )
    elif all(isinstance(item, int) and not isinstance(item, bool) for item in values):
        if any(not -(2**63) <= item < 2**63 for item in values):
            raise InvalidArgument(f"{where}: integer out of range for int64")
        feature.int64_list.value.extend(values)
    elif all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in values):
        feature.float_list.value.extend(float(item) for item in values)
    else:
        raise InvalidArgument(
            f"{where}: expected a number, a string, {{'b64': ...}} or a flat list of one of them"
        )
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


# --------------------------------------------------------------------------- handlers


class RestApi:
    """Handlers for TF Serving's paths and the probes."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_route("*", "/v1/models/{tail:.*}", self.models)

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

    async def models(self, request: web.Request) -> web.Response:
        match = _MODEL_PATH.match(request.path)
        if match is None:
            raise NotFound(f"no such path: {request.path}")
        model, label, verb = match["model"], match["label"], match["verb"]
        version = None
        if match["version"] is not None:
            if not match["version"].isdigit():
                raise InvalidArgument(
                    f"version must be a non-negative integer, got {match['version']!r}"
                )
            version = int(match["version"])
        if match["resource"] == "feedback":
            return await self._feedback(request, model, version, label)
        if verb is None:
            if request.method != "GET":
                raise web.HTTPMethodNotAllowed(request.method, ["GET"])
            if match["resource"] == "metadata":
                return await self._metadata(model, version, label)
            return self._status(model, version, label)
        if request.method != "POST":
            raise web.HTTPMethodNotAllowed(request.method, ["POST"])
        if verb == "predict":
            return await self._predict(request, model, version, label)
        if verb in ("classify", "regress"):
            return await self._infer(request, verb, model, version, label)
        raise NotFound(f"unknown method :{verb}; expected :predict, :classify or :regress")

    def _status(self, model: str, version: int | None, label: str | None) -> web.Response:
        response = model_status_response(self._gateway.status(model, version, label))
        return web.json_response(
            json_format.MessageToDict(
                response,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            )
        )

    async def _metadata(self, model: str, version: int | None, label: str | None) -> web.Response:
        metadata = await self._gateway.metadata(model, version, label)
        signatures = json_format.MessageToDict(
            signature_def_map(metadata), preserving_proto_field_name=True
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

    async def _predict(
        self, request: web.Request, model: str, version: int | None, label: str | None
    ) -> web.Response:
        body = await read_json(request)
        row_format = True

        def decode(signature: Signature) -> dict[str, np.ndarray]:
            nonlocal row_format
            inputs, row_format = json_to_inputs(body, signature)
            return inputs

        result = await self._gateway.predict(
            model,
            version,
            label,
            signature_name_of(body),
            decode,
            deadline=deadline_of(request),
            headers=headers_of(request),
            api="rest",
            request_id=request[REQUEST_ID_KEY],
        )
        return web.json_response(outputs_to_predictions(result.outputs, row_format))

    async def _infer(
        self, request: web.Request, verb: str, model: str, version: int | None, label: str | None
    ) -> web.Response:
        body = await read_json(request)
        examples, context = examples_of(body)
        call = self._gateway.classify if verb == "classify" else self._gateway.regress
        result = await call(
            model,
            version,
            label,
            signature_name_of(body),
            examples,
            context,
            deadline=deadline_of(request),
            headers=headers_of(request),
            api="rest",
            request_id=request[REQUEST_ID_KEY],
        )
        if verb == "classify":
            results: list[Any] = [[list(pair) for pair in row] for row in result.classes]
        else:
            results = result.values
        return web.json_response({"results": results})

    async def _feedback(
        self, request: web.Request, model: str, version: int | None, label: str | None
    ) -> web.Response:
        if request.method != "POST":
            raise web.HTTPMethodNotAllowed(request.method, ["POST"])
        if version is not None or label is not None:
            raise InvalidArgument(
                "feedback names the model only (POST /v1/models/{model}/feedback): the "
                "request id says which version answered"
            )
        return web.json_response(self._gateway.feedback.submit(model, await read_json(request)))


def build_app(gateway: Gateway, *, max_body_bytes: int) -> web.Application:
    """The REST application; ``max_body_bytes`` bounds request bodies (413 beyond)."""
    app = web.Application(middlewares=[request_ids, errors_as_json], client_max_size=max_body_bytes)
    RestApi(gateway).add_routes(app)
    return app
