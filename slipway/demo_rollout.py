"""The canary part of the demo: a good version promoted, a failing one and a less accurate
one rolled back.

A real gateway (``slipway serve`` in a child process) serves a model repository holding
the demo's trained model as version 1, an identical copy as version 2 (the good canary),
a wrapper of it as version 3 that fails one request in five (the bad canary) and one as
version 4 that answers as fast and without errors but gives the wrong class for 40 % of
inputs (the less accurate canary), while a background client sends steady traffic of
held-out test digits and posts each true label back by request id a moment later, as
labels arrive in production. ``slipway canary start`` then rolls out version 2 to
promotion and versions 3 and 4 to their rollbacks (4 on live accuracy), judged on the
gateway's own ``/metrics``, and the timelines of all three are drawn.

The building blocks (faulty versions, request payloads, steady client load with label
feedback, a gateway configuration for rollouts) are what the rollout benchmark and the
rollout integration tests use too.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.rule import Rule

from serving.process import GatewayProcess
from slipway.feedback_client import DelayedFeedback, FeedbackCounts, KeepAlive, Label

MODEL = "digits"
TOKEN_ENV = "SLIPWAY_ADMIN_TOKEN"
SERVING_SIGNATURE = "serving_default"

console = Console()


# ---------------------------------------------------------------------------------------
# A deliberately bad version


def publish_faulty_version(
    source: Path,
    model_root: Path,
    model: str,
    version: int,
    *,
    error_percent: float = 0.0,
    delay_ms: float = 0.0,
    swap_percent: float = 0.0,
) -> Path:
    """Publish ``source`` (a SavedModel) wrapped to misbehave as ``model_root/model/version``.

    The wrapper has the same ``serving_default`` inputs and outputs and answers the same,
    except that a request fails (INVALID_ARGUMENT from an assertion) when a hash of its
    input values falls in the lowest ``error_percent`` of 100 buckets, so the same inputs
    always fail and varied inputs fail about that often; every call first sleeps
    ``delay_ms`` (a tf.data sleep, which holds no CPU while it waits); and a row whose hash
    falls in the lowest ``swap_percent`` buckets has its class scores rotated by one class,
    so it is answered as fast and without an error, but with the wrong class: accuracy
    drops by about ``swap_percent`` points of what the source gets right.
    """
    import tensorflow as tf

    from contracts.model_manifest import write_model_manifest
    from contracts.model_repository import publish_version

    loaded = tf.saved_model.load(str(source))
    inner = loaded.signatures[SERVING_SIGNATURE]
    specs = inner.structured_input_signature[1]
    names = sorted(specs)

    class Faulty(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = loaded  # tracked, so the source's variables are saved with it

        @tf.function(
            input_signature=[tf.TensorSpec(specs[n].shape, specs[n].dtype, name=n) for n in names]
        )
        def serve(self, *tensors: tf.Tensor) -> dict[str, tf.Tensor]:
            outputs = inner(**dict(zip(names, tensors, strict=True)))
            guards = []
            if error_percent > 0 or swap_percent > 0:
                bucket = tf.strings.to_hash_bucket_fast(_row_keys(tf, tensors), 100)
            if swap_percent > 0:
                swapped = bucket < tf.cast(swap_percent, tf.int64)
                outputs = {name: _swap_classes(tf, t, swapped) for name, t in outputs.items()}
            if error_percent > 0:
                guards.append(
                    tf.debugging.assert_greater_equal(
                        bucket,
                        tf.cast(error_percent, tf.int64),
                        message=f"injected fault: this version fails {error_percent:g}% of inputs",
                    )
                )
            if delay_ms > 0:
                guards.append(_sleep(tf, int(delay_ms * 1000)))
            with tf.control_dependencies(guards):
                return {name: tf.identity(tensor) for name, tensor in outputs.items()}

    module = Faulty()
    manifest_path = source / "slipway.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else None

    def write(directory: Path) -> None:
        tf.saved_model.save(module, str(directory), signatures={SERVING_SIGNATURE: module.serve})
        if manifest is not None:
            kept = {
                key: manifest[key] for key in ("name", "signature", "labels") if key in manifest
            }
            kept["name"] = model
            kept["fault"] = {
                "error_percent": error_percent, "delay_ms": delay_ms, "swap_percent": swap_percent
            }  # fmt: skip
            write_model_manifest(directory, kept)

    return publish_version(model_root, model, write, version=version)[1]


def _row_keys(tf: Any, tensors: Sequence[Any]) -> Any:
    """One string per row made of every input's values, for a per-request fault decision."""
    parts = []
    for tensor in tensors:
        if tensor.dtype == tf.string:
            flat = tf.reshape(tensor, [tf.shape(tensor)[0], -1])
        else:
            numbers = tf.reshape(tf.cast(tensor, tf.float64), [tf.shape(tensor)[0], -1])
            flat = tf.strings.as_string(numbers, precision=4)
        parts.append(tf.strings.reduce_join(flat, axis=1, separator=","))
    return tf.strings.reduce_join(tf.stack(parts, axis=1), axis=1, separator="|")


def _swap_classes(tf: Any, output: Any, swapped: Any) -> Any:
    """``output`` with the class scores of the ``swapped`` rows rotated by one class (the
    top class becomes the next one), if it holds class scores (floats, [rows, classes]
    with two classes or more); any other output unchanged."""
    classes = output.shape[-1] if output.shape.rank == 2 else None
    if not output.dtype.is_floating or classes is None or classes < 2:
        return output
    return tf.where(swapped[:, tf.newaxis], tf.roll(output, shift=1, axis=1), output)


def _sleep(tf: Any, microseconds: int) -> Any:
    """A graph op that waits about ``microseconds``: a one-element dataset through
    SleepDataset, reduced. Reading it sleeps twice (before the element and before the end
    of the sequence), hence half the time each."""
    one = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64))
    slept = tf.raw_ops.SleepDataset(
        input_dataset=tf.data.experimental.to_variant(one),
        sleep_microseconds=microseconds // 2,
        output_types=[tf.int64],
        output_shapes=[[]],
    )
    dataset = tf.data.experimental.from_variant(slept, tf.TensorSpec([], tf.int64))
    return dataset.reduce(tf.constant(0, tf.int64), lambda total, value: total + value)


def publish_copy(source: Path, model_root: Path, model: str, version: int) -> Path:
    """Publish an unchanged copy of a version directory (its slipway.json re-stamped)."""
    from contracts.model_repository import publish_version

    def write(directory: Path) -> None:
        shutil.copytree(source, directory, dirs_exist_ok=True)

    return publish_version(model_root, model, write, version=version)[1]


# ---------------------------------------------------------------------------------------
# Client load


def request_pool(signature: Mapping[str, Any], count: int = 200, seed: int = 0) -> list[dict]:
    """``count`` distinct REST rows (``instances`` elements) for a slipway.json signature:
    normal floats, small non-negative integers, shaped as the inputs without their batch
    dimension (a free dimension gets length 1)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        row = {}
        for name, spec in signature["inputs"].items():
            shape = [1 if size in (-1, None) else size for size in spec["shape"][1:]]
            dtype = np.dtype(spec["dtype"])
            if dtype.kind == "f":
                value: np.ndarray = rng.normal(size=shape).astype(dtype)
            elif dtype.kind in "iu":
                value = rng.integers(0, 5, size=shape).astype(dtype)
            else:
                raise ValueError(f"input {name!r}: no generated values for dtype {dtype}")
            row[name] = value.tolist()
        rows.append(row)
    return rows


def digits_pool(dataset: Path) -> tuple[list[dict], list[int]]:
    """REST rows and true labels: every example of the demo digits dataset's test split,
    which training never saw, so live accuracy is the held-out accuracy."""
    from slipway.demo_serving import digits_batch

    images, labels = digits_batch(dataset, count=1_000_000)
    rows = [{"image": {"b64": base64.b64encode(image).decode()}} for image in images]
    return rows, [int(label) for label in labels]


@dataclass
class LoadCounts:
    """What the clients saw: requests sent, answered OK, and failed (by HTTP status; 0 for
    a connection error), with the monotonic time of each failure; and, for labelled
    traffic, what became of the labels sent back as feedback."""

    sent: int = 0
    ok: int = 0
    errors: int = 0
    statuses: Counter = field(default_factory=Counter)
    error_times: list[float] = field(default_factory=list)
    feedback: FeedbackCounts = field(default_factory=FeedbackCounts)


class ClientLoad:
    """Steady ``:predict`` traffic from background threads over keep-alive connections.

    ``rate`` requests per second in total, paced (a thread that falls behind skips ahead
    rather than bursting), spread round-robin over ``urls``, cycling through ``pool``.
    With ``labels`` (the true label of each pool row) every answered request's label is
    posted back to the gateway that answered, by the answer's ``X-Request-Id``,
    ``feedback_delay`` seconds later, so the gateways count each version's live accuracy.
    """

    def __init__(
        self,
        urls: Sequence[str],
        model: str,
        pool: Sequence[Mapping[str, Any]],
        *,
        rate: float = 50.0,
        threads: int = 4,
        timeout: float = 10.0,
        labels: Sequence[Label] | None = None,
        feedback_delay: float = 0.0,
    ) -> None:
        if not pool:
            raise ValueError("the request pool is empty")
        if labels is not None and len(labels) != len(pool):
            raise ValueError(f"{len(labels)} labels for a pool of {len(pool)} rows")
        self.urls = list(urls)
        self.path = f"/v1/models/{urllib.parse.quote(model, safe='')}:predict"
        self.bodies = [json.dumps({"instances": [row]}).encode() for row in pool]
        self.labels = None if labels is None else list(labels)
        self.feedback = DelayedFeedback(model, delay=feedback_delay, timeout=timeout)
        self.rate = rate
        self.timeout = timeout
        self._threads = [
            threading.Thread(target=self._client, args=(index, threads), daemon=True)
            for index in range(threads)
        ]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._counts = LoadCounts()

    def counts(self) -> LoadCounts:
        with self._lock:
            return LoadCounts(
                self._counts.sent,
                self._counts.ok,
                self._counts.errors,
                Counter(self._counts.statuses),
                list(self._counts.error_times),
                self.feedback.counts(),
            )

    def start(self) -> ClientLoad:
        if self.labels is not None:
            self.feedback.start()
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> LoadCounts:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 5)
        self.feedback.stop()
        return self.counts()

    def __enter__(self) -> ClientLoad:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _client(self, index: int, threads: int) -> None:
        period = threads / self.rate
        client = KeepAlive(self.timeout)
        sent = 0
        next_at = time.monotonic() + index * period / threads
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            url = self.urls[(index + sent) % len(self.urls)]
            row = (index + sent * threads) % len(self.bodies)
            status, headers, _ = client.post(url, self.path, self.bodies[row])
            sent += 1
            if status == 200 and self.labels is not None and headers is not None:
                request_id = headers.get("X-Request-Id")
                if request_id:
                    self.feedback.add(url, request_id, self.labels[row])
            with self._lock:
                self._counts.sent += 1
                self._counts.statuses[status] += 1
                if status == 200:
                    self._counts.ok += 1
                else:
                    self._counts.errors += 1
                    self._counts.error_times.append(time.monotonic())
            next_at = max(next_at + period, time.monotonic())
        client.close()


# ---------------------------------------------------------------------------------------
# A gateway process


def write_gateway_config(directory: Path, *, routing: Mapping[str, Any]) -> Path:
    """A gateway.yaml for rollouts: admin API on (token from $SLIPWAY_ADMIN_TOKEN), a
    routing file beside it holding ``routing``, every version loaded, and batching off so
    that each request runs (and fails) on its own."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "routing.yaml").write_text(yaml.safe_dump({"models": dict(routing)}))
    config = {
        "routing_file": "routing.yaml",
        "version_policy": {"kind": "all"},
        "batching": {"enabled": False},
        "poll_interval_s": 0.5,
        "admin": {"token_env": TOKEN_ENV},
        "grace_period_s": 2.0,
    }
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------------
# The story


# Latency is held to an absolute p99 only: on a machine busy with other work, a canary
# taking all the traffic at 100 % can be several times slower than stable was at 50 %.
# At 10 % of the client's 40 requests/s a 10 s window holds about 35 labels, so the
# accuracy check usually decides at the first step, and at the next one at the latest.
ANALYSIS = {
    "window": "10s",
    "min_requests": 20,
    "checks": {
        "error_rate": {"max_increase_points": 1.0, "max": 0.05},
        "latency_p99": {"max_ratio": None, "max_added_ms": None, "max_ms": 1000},
        "accuracy": {"max_decrease_points": 5.0, "min_labels": 20},
    },
}
RATE = 40  # requests per second from the demo's client
SWAP_PERCENT = 40  # the less accurate canary's share of inputs answered with the wrong class
FEEDBACK_DELAY_S = 1.0  # how long after its answer each true label comes back


def slipway(*argv: str) -> int:
    """Run a slipway command in this process, printed first so it can be repeated."""
    import shlex

    from slipway.cli import main

    console.print(f"[bold cyan]$ slipway {shlex.join(argv)}[/]")
    return main(list(argv))


def rollout_story(workdir: Path, model_version_dir: Path, dataset: Path) -> None:
    """Promote a copy of ``model_version_dir``, roll back a version failing 20 %, and roll
    back one that answers fast and without errors but with the wrong class for 40 % of its
    inputs, caught by live accuracy from the labels the client sends back."""
    console.print(Rule("Canary rollouts"))
    base = workdir / "rollout"
    shutil.rmtree(base, ignore_errors=True)
    root = base / "models"
    publish_copy(model_version_dir, root, MODEL, 1)
    publish_copy(model_version_dir, root, MODEL, 2)
    publish_faulty_version(model_version_dir, root, MODEL, 3, error_percent=20)
    publish_faulty_version(model_version_dir, root, MODEL, 4, swap_percent=SWAP_PERCENT)
    console.print(f"model repository {root}: version 1 (stable), 2 (a copy: good canary), "
                  "3 (fails 20% of requests: bad canary), 4 (wrong class for "
                  f"{SWAP_PERCENT}% of inputs: less accurate canary)")  # fmt: skip
    config = write_gateway_config(base, routing={MODEL: {"labels": {"stable": 1}}})
    analysis = base / "analysis.yaml"
    analysis.write_text(yaml.safe_dump(ANALYSIS, sort_keys=False))
    os.environ.setdefault(TOKEN_ENV, secrets.token_hex(16))
    pool, labels = digits_pool(dataset)
    state_dir = base / "state"
    timelines = {name: base / f"timeline-{name}.png" for name in ("good", "bad", "less-accurate")}
    with (
        GatewayProcess(root, config=config, log_path=base / "gateway.log") as gateway,
        ClientLoad(
            [gateway.rest_url], MODEL, pool, rate=RATE, labels=labels,
            feedback_delay=FEEDBACK_DELAY_S,
        ) as load,
    ):  # fmt: skip
        console.print(
            f"gateway at {gateway.rest_url}; a client sends {RATE} requests/s of the "
            f"{len(pool)} held-out test digits and posts each true label back by its request "
            f"id {FEEDBACK_DELAY_S:g} s after the answer"
        )
        common = [
            "--gateway", gateway.rest_url, "--steps", "10,50,100", "--bake", "4s",
            "--interval", "2s", "--analysis", str(analysis), "--state-dir", str(state_dir),
        ]  # fmt: skip

        def history(name: str) -> None:
            slipway("canary", "history", MODEL, "--timeline", str(timelines[name]),
                    "--state-dir", str(state_dir))  # fmt: skip

        if slipway("canary", "start", MODEL, "--version", "2", *common) != 0:
            raise SystemExit("demo step failed: the good canary was not promoted")
        history("good")
        before = load.counts()
        code = slipway("canary", "start", MODEL, "--version", "3", "--failover", *common)
        if code != 1:
            raise SystemExit("demo step failed: the bad canary was not rolled back")
        during = load.counts()
        history("bad")
        slipway("canary", "history", MODEL, "--state-dir", str(state_dir))
        console.print(
            f"clients sent {during.sent - before.sent} requests while version 3 was live and "
            f"saw {during.errors - before.errors} errors: failover retried its failures on stable"
        )
        before = load.counts()
        code = slipway("canary", "start", MODEL, "--version", "4", *common)
        failure = accuracy_failure(state_dir)
        if code != 1 or failure is None:
            raise SystemExit("demo step failed: the less accurate canary was not rolled back")
        during = load.counts()
        history("less-accurate")
    console.print(
        f"clients sent {during.sent - before.sent} requests while version 4 was live and saw "
        f"{during.errors - before.errors} errors, yet the labels they sent back showed "
        f"{failure}: rolled back on accuracy"
    )
    console.print(f"timelines: {', '.join(str(path) for path in timelines.values())}")


def accuracy_failure(state_dir: Path) -> str | None:
    """How the last rollout failed its accuracy check, if it was rolled back on it."""
    from ops.events import EventLog
    from ops.state import Phase, StateStore

    store = StateStore(state_dir)
    state = store.load(MODEL)
    if state is None or state.phase is not Phase.ROLLED_BACK:
        return None
    for event in reversed(EventLog(store.events_path(MODEL)).read()):
        if event.rollout != state.id or event.kind != "analysis" or event.numbers is None:
            continue
        for check in event.checks:
            if check["name"] == "accuracy" and check["passed"] is False:
                canary, stable = event.numbers["canary"], event.numbers["stable"]
                return (
                    f"its live accuracy at {event.weight:.0%} of traffic was "
                    f"{check['canary']:.0%} on {canary['labelled']:.0f} labels against "
                    f"stable's {check['stable']:.0%} on {stable['labelled']:.0f}"
                )
    return None
