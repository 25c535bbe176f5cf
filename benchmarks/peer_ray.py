"""Ray Serve serving the benchmark's SavedModel, for ``benchmarks.serving_peers``:
``python -m benchmarks.peer_ray --model-dir DIR --port P --temp-dir T`` run with ``.venv-peers``.

The process is the Ray driver: it starts a local Ray cluster (session files under
``--temp-dir``, so nothing lands in the machine's shared ``/tmp/ray``), deploys one replica
that batches requests with ``@serve.batch`` and serves HTTP on 127.0.0.1. On SIGTERM it
shuts Serve and the cluster down, so no Ray process outlives it. The route takes and
answers TF Serving's row format (``{"instances": [[...]]}`` -> ``{"predictions": [[...]]}``),
which is what a user would put in front of a TensorFlow model on Ray Serve.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

import numpy as np
import ray
from ray import serve
from starlette.requests import Request


@serve.deployment(num_replicas=1)
class SavedModelDeployment:
    """One replica holding the SavedModel's ``serving_default``; concurrent requests meet
    in ``predict``, which runs one TensorFlow call per batch."""

    def __init__(self, model_dir: str, max_batch_size: int, batch_wait_timeout_s: float) -> None:
        import tensorflow as tf

        self._tf = tf
        self._function = tf.saved_model.load(model_dir).signatures["serving_default"]
        self._output = next(iter(self._function.structured_outputs))
        self.predict.set_max_batch_size(max_batch_size)
        self.predict.set_batch_wait_timeout_s(batch_wait_timeout_s)

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)  # set again in __init__
    async def predict(self, rows: list[np.ndarray]) -> list[list[Any]]:
        batch = np.concatenate(rows)
        scores = self._function(features=self._tf.constant(batch))[self._output].numpy()
        answers, start = [], 0
        for row in rows:
            answers.append(scores[start : start + len(row)].tolist())
            start += len(row)
        return answers

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        rows = np.asarray(body["instances"], dtype=np.float32)
        return {"predictions": await self.predict(rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer_ray", description=__doc__)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--temp-dir", required=True)
    parser.add_argument("--route", required=True)
    parser.add_argument("--max-batch-size", type=int, required=True)
    parser.add_argument("--batch-wait-timeout-s", type=float, required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ray.init(
        _temp_dir=args.temp_dir,
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        # Enough requests in the replica at once to fill a batch (Serve's default is 5).
        deployment = SavedModelDeployment.options(max_ongoing_requests=2 * args.max_batch_size)
        app = deployment.bind(args.model_dir, args.max_batch_size, args.batch_wait_timeout_s)
        serve.run(app, name="mlp", route_prefix=args.route)
        print("ready", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
