"""Demo chapter: serve the model repository and call it as any TF Serving client would.

The gateway runs as a real ``slipway serve`` process; it is called with the stock
``tensorflow_serving.apis`` gRPC stubs and with curl against the REST API.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
from rich.console import Console

from serving.process import GatewayProcess

console = Console()


def digits_batch(dataset: Path, count: int = 3) -> tuple[list[bytes], np.ndarray]:
    """A few test images as PNG files, as a client has them, and their labels."""
    from research.data.input_pipeline import make_dataset

    test = make_dataset(dataset, "test", batch_size=count, shuffle=False, raw=True)
    features, labels = next(iter(test))
    return features["image"].numpy().tolist(), labels.numpy()


def call_with_grpc(target: str, model: str, images: list[bytes]) -> np.ndarray:
    """Predict with TensorFlow Serving's own client stubs, unmodified."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_default"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(images))
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(request, timeout=10)
    return tf.make_ndarray(response.outputs["label"])


def call_with_curl(rest_url: str, model: str, images: list[bytes]) -> dict:
    """The REST API as TF Serving documents it: binary inputs as ``{"b64": ...}``."""
    instances = [{"image": {"b64": base64.b64encode(image).decode()}} for image in images]
    body = json.dumps({"instances": instances})
    command = [
        "curl", "-s", "-X", "POST", f"{rest_url}/v1/models/{model}:predict",
        "-H", "Content-Type: application/json", "-d", body,
    ]  # fmt: skip
    console.print(f"[bold cyan]$ curl -s -X POST {rest_url}/v1/models/{model}:predict -d '…'[/]")
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    return json.loads(result.stdout)


def serving_story(workdir: Path, dataset: Path) -> None:
    console.print(f"[bold cyan]$ slipway serve --model-root {workdir / 'models'}[/]")
    images, labels = digits_batch(dataset)
    with GatewayProcess(workdir / "models", log_path=workdir / "gateway.log") as gateway:
        scores = call_with_grpc(gateway.grpc_target, "digits", images)
        console.print(
            f"gRPC PredictionService/Predict (tensorflow_serving.apis): predicted "
            f"{scores.argmax(-1).tolist()}, true {labels.tolist()}"
        )
        if shutil.which("curl"):
            predictions = call_with_curl(gateway.rest_url, "digits", images)["predictions"]
            console.print(f"REST :predict: predicted {[int(np.argmax(p)) for p in predictions]}")
        status = gateway.http_status("/v1/models/digits")
        console.print(f"GET /v1/models/digits -> HTTP {status}")
