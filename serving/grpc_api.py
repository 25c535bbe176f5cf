"""TensorFlow Serving's gRPC API on ``grpc.aio``: PredictionService and ModelService.

The messages and service names are TF Serving's own (``tensorflow_serving.apis``), so a
stock client stub works unchanged. Every handler is a thin translation: protos in,
``Gateway`` call, protos out. A ``ServingError`` becomes the matching gRPC status with its
message; anything else is logged and answered INTERNAL, so a bad request can never take
the server down. Every answer, error or not, carries its request id in the trailing
metadata (``x-request-id``), leaving TF Serving's response messages as they are (trailing
metadata goes out with the status: it needs no send of its own, and errors carry it too).

``slipway.serving.FeedbackService/SendFeedback`` takes labels for answered requests. It
has no .proto of its own: request and response are ``google.protobuf.Struct`` holding
the REST feedback body plus ``"model"`` (see ``serving.feedback``), so any gRPC client
can call it with the well-known types it already has.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
import numpy as np
from google.protobuf import json_format, struct_pb2
from google.protobuf.message import Message
from tensorflow.core.example.example_pb2 import Example
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    input_pb2,
    model_management_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from serving.errors import InvalidArgument, ServingError
from serving.gateway import ClassifyResult, Gateway, ModelMetadata, RegressResult
from serving.inference_results import classification_proto, regression_proto
from serving.repository import VersionStatus
from serving.request_id import HEADER as REQUEST_ID_KEY
from serving.request_id import new_request_id, request_id_of
from serving.signature import DEFAULT_SIGNATURE, Signature
from serving.tensors import numpy_to_tensor_proto, protos_to_inputs

logger = logging.getLogger(__name__)

# The method names MultiInference tasks give (those of TF Serving's signature kinds).
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
SIGNATURE_DEF_FIELD = "signature_def"
AUTHORIZATION_KEY = "authorization"
FEEDBACK_SERVICE = "slipway.serving.FeedbackService"
FEEDBACK_METHOD = "SendFeedback"

ResponseT = TypeVar("ResponseT", bound=Message)


def _answers_errors(
    handler: Callable[[Any, Any, grpc.aio.ServicerContext, str], Awaitable[ResponseT]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[ResponseT]]:
    """Give the handler its request id and send it back; turn exceptions into gRPC
    statuses: ServingError keeps its code, others are INTERNAL."""

    @functools.wraps(handler)
    async def wrapped(self: Any, request: Any, context: grpc.aio.ServicerContext) -> ResponseT:
        try:
            request_id = request_id_of(metadata_of(context))
        except InvalidArgument as exc:
            await context.abort(
                exc.code,
                self._gateway.client_message(exc.message),
                _request_id_metadata(new_request_id()),
            )
        context.set_trailing_metadata(_request_id_metadata(request_id))
        try:
            return await handler(self, request, context, request_id)
        except ServingError as exc:
            error = exc
        except Exception:
            logger.exception("%s failed", handler.__name__)
            error = ServingError(grpc.StatusCode.INTERNAL, "internal error")
        message = self._gateway.client_message(error.message)
        await context.abort(error.code, message, _request_id_metadata(request_id))

    return wrapped


def _request_id_metadata(request_id: str) -> tuple[tuple[str, str], ...]:
    return ((REQUEST_ID_KEY, request_id),)


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The client's deadline as a ``time.monotonic()`` value (None: the client set none)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def metadata_of(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """Invocation metadata as a dict of lower-case keys to text values (binary keys dropped)."""
    return {
        key.lower(): value
        for key, value in (context.invocation_metadata() or ())
        if isinstance(value, str)
    }


def version_of(spec: model_pb2.ModelSpec) -> tuple[int | None, str | None]:
    """The version or label a ModelSpec names (both None: let the router choose)."""
    version = spec.version.value if spec.HasField("version") else None
    label = spec.version_label or None
    if version is not None and label is not None:
        raise InvalidArgument("model_spec: give a version or a version_label, not both")
    return version, label


def fill_spec(spec: model_pb2.ModelSpec, model: str, version: int, signature: str) -> None:
    spec.name = model
    spec.version.value = version
    spec.signature_name = signature


def examples_of(input_proto: input_pb2.Input) -> tuple[Sequence[Example], Example | None]:
    """The examples of a Classify/Regress ``Input`` and its shared context, if any."""
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        return input_proto.example_list.examples, None
    if kind == "example_list_with_context":
        listed = input_proto.example_list_with_context
        return listed.examples, listed.context
    raise InvalidArgument("input: expected example_list or example_list_with_context")


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """``tensorflow.serving.PredictionService``."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    @_answers_errors
    async def Predict(
        self,
        request: predict_pb2.PredictRequest,
        context: grpc.aio.ServicerContext,
        request_id: str,
    ) -> predict_pb2.PredictResponse:
        spec = request.model_spec
        version, label = version_of(spec)
        protos = request.inputs

        max_bytes = self._gateway.config.max_message_bytes

        def decode(signature: Signature) -> dict[str, np.ndarray]:
            return protos_to_inputs(protos, signature, max_bytes=max_bytes)

        result = await self._gateway.predict(
            spec.name,
            version,
            label,
            spec.signature_name or DEFAULT_SIGNATURE,
            decode,
            deadline=deadline_of(context),
            headers=metadata_of(context),
            output_filter=tuple(request.output_filter),
            api="grpc",
            request_id=request_id,
        )
        response = predict_pb2.PredictResponse()
        fill_spec(response.model_spec, result.model, result.version, result.signature_name)
        for name, array in result.outputs.items():
            response.outputs[name].CopyFrom(numpy_to_tensor_proto(array))
        return response

    @_answers_errors
    async def Classify(
        self,
        request: classification_pb2.ClassificationRequest,
        context: grpc.aio.ServicerContext,
        request_id: str,
    ) -> classification_pb2.ClassificationResponse:
        result = await self._infer(
            CLASSIFY_METHOD, request.model_spec, request.input, context, request_id
        )
        response = classification_pb2.ClassificationResponse()
        fill_spec(response.model_spec, result.model, result.version, result.signature_name)
        response.result.CopyFrom(classification_proto(result.classes))
        return response

    @_answers_errors
    async def Regress(
        self,
        request: regression_pb2.RegressionRequest,
        context: grpc.aio.ServicerContext,
        request_id: str,
    ) -> regression_pb2.RegressionResponse:
        result = await self._infer(
            REGRESS_METHOD, request.model_spec, request.input, context, request_id
        )
        response = regression_pb2.RegressionResponse()
        fill_spec(response.model_spec, result.model, result.version, result.signature_name)
        response.result.CopyFrom(regression_proto(result.values))
        return response

    @_answers_errors
    async def MultiInference(
        self,
        request: inference_pb2.MultiInferenceRequest,
        context: grpc.aio.ServicerContext,
        request_id: str,
    ) -> inference_pb2.MultiInferenceResponse:
        if not request.tasks:
            raise InvalidArgument("MultiInferenceRequest: no tasks")
        names = {task.model_spec.name for task in request.tasks}
        if len(names) != 1:
            raise InvalidArgument("MultiInferenceRequest: all tasks must name the same model")
        signatures = [task.model_spec.signature_name or DEFAULT_SIGNATURE for task in request.tasks]
        if len(set(signatures)) != len(signatures):
            raise InvalidArgument("MultiInferenceRequest: each task needs its own signature")
        response = inference_pb2.MultiInferenceResponse()
        for task in request.tasks:
            if task.method_name not in (CLASSIFY_METHOD, REGRESS_METHOD):
                raise InvalidArgument(
                    f"task method_name: expected {CLASSIFY_METHOD} or {REGRESS_METHOD}, "
                    f"got {task.method_name!r}"
                )
            result = await self._infer(
                task.method_name, task.model_spec, request.input, context, request_id
            )
            entry = response.results.add()
            fill_spec(entry.model_spec, result.model, result.version, result.signature_name)
            if isinstance(result, ClassifyResult):
                entry.classification_result.CopyFrom(classification_proto(result.classes))
            else:
                entry.regression_result.CopyFrom(regression_proto(result.values))
        return response

    async def _infer(
        self,
        method: str,
        spec: model_pb2.ModelSpec,
        input_proto: input_pb2.Input,
        context: grpc.aio.ServicerContext,
        request_id: str,
    ) -> ClassifyResult | RegressResult:
        version, label = version_of(spec)
        examples, example_context = examples_of(input_proto)
        call = self._gateway.classify if method == CLASSIFY_METHOD else self._gateway.regress
        return await call(
            spec.name,
            version,
            label,
            spec.signature_name or DEFAULT_SIGNATURE,
            examples,
            example_context,
            deadline=deadline_of(context),
            headers=metadata_of(context),
            api="grpc",
            request_id=request_id,
        )

    @_answers_errors
    async def GetModelMetadata(
        self,
        request: get_model_metadata_pb2.GetModelMetadataRequest,
        context: grpc.aio.ServicerContext,
        _request_id: str,
    ) -> get_model_metadata_pb2.GetModelMetadataResponse:
        fields = list(request.metadata_field)
        if not fields:
            raise InvalidArgument("GetModelMetadataRequest must name at least one metadata_field")
        for field in fields:
            if field != SIGNATURE_DEF_FIELD:
                raise InvalidArgument(
                    f"metadata field {field!r} is not supported; use {SIGNATURE_DEF_FIELD!r}"
                )
        version, label = version_of(request.model_spec)
        metadata = await self._gateway.metadata(request.model_spec.name, version, label)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = metadata.model
        response.model_spec.version.value = metadata.version
        response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_def_map(metadata))
        return response


def signature_def_map(metadata: ModelMetadata) -> get_model_metadata_pb2.SignatureDefMap:
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    for name, signature in metadata.signatures.items():
        signature_map.signature_def[name].CopyFrom(signature.to_proto())
    return signature_map


def model_status_response(
    statuses: Sequence[VersionStatus],
    client_message: Callable[[str], str] | None = None,
) -> get_model_status_pb2.GetModelStatusResponse:
    """``GetModelStatus``'s answer; ``client_message`` cleans error messages for clients
    (a load error names files under the model root)."""
    response = get_model_status_pb2.GetModelStatusResponse()
    for status in statuses:
        entry = response.model_version_status.add(version=status.version, state=int(status.state))
        entry.status.error_code = status.error_code
        message = status.error_message
        entry.status.error_message = client_message(message) if client_message else message
    return response


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """``tensorflow.serving.ModelService``: version status and version labels.

    ``HandleReloadConfigRequest`` changes routing, so it is an admin call: it needs the
    admin bearer token in the ``authorization`` metadata, like the REST admin API.
    """

    def __init__(self, gateway: Gateway, authorize: Callable[[str | None], None]) -> None:
        self._gateway = gateway
        self._authorize = authorize

    @_answers_errors
    async def GetModelStatus(
        self,
        request: get_model_status_pb2.GetModelStatusRequest,
        context: grpc.aio.ServicerContext,
        _request_id: str,
    ) -> get_model_status_pb2.GetModelStatusResponse:
        version, label = version_of(request.model_spec)
        return model_status_response(
            self._gateway.status(request.model_spec.name, version, label),
            functools.partial(self._gateway.client_message, log=False),
        )

    @_answers_errors
    async def HandleReloadConfigRequest(
        self,
        request: model_management_pb2.ReloadConfigRequest,
        context: grpc.aio.ServicerContext,
        _request_id: str,
    ) -> model_management_pb2.ReloadConfigResponse:
        self._authorize(metadata_of(context).get(AUTHORIZATION_KEY))
        if request.config.WhichOneof("config") != "model_config_list":
            raise InvalidArgument("ReloadConfigRequest: only model_config_list is supported")
        labels: Mapping[str, dict[str, int]] = {
            model.name: dict(model.version_labels)
            for model in request.config.model_config_list.config
        }
        await self._gateway.set_version_labels(labels)
        response = model_management_pb2.ReloadConfigResponse()
        response.status.error_code = 0
        return response


class FeedbackService:
    """``slipway.serving.FeedbackService/SendFeedback`` on a generic handler (Struct in
    and out, see the module docstring)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    @_answers_errors
    async def SendFeedback(
        self, request: struct_pb2.Struct, context: grpc.aio.ServicerContext, _request_id: str
    ) -> struct_pb2.Struct:
        body = json_format.MessageToDict(request)
        model = body.pop("model", None)
        if not isinstance(model, str) or not model:
            raise InvalidArgument("'model': expected the name of the model that answered")
        response = struct_pb2.Struct()
        response.update(await self._gateway.submit_feedback(model, body))
        return response

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            FEEDBACK_SERVICE,
            {
                FEEDBACK_METHOD: grpc.unary_unary_rpc_method_handler(
                    self.SendFeedback,
                    request_deserializer=struct_pb2.Struct.FromString,
                    response_serializer=struct_pb2.Struct.SerializeToString,
                )
            },
        )
