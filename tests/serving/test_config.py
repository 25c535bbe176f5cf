"""gateway.yaml: defaults, every section, relative paths, and errors that name file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.yaml_config import ConfigError
from serving.batching import BatchingConfig
from serving.config import (
    DEFAULT_MAX_MESSAGE_BYTES,
    GatewayConfig,
    LocalBackend,
    RemoteBackend,
    load_config,
    with_prediction_log,
)
from serving.repository import VersionPolicy

FULL = """\
routing_file: routing.yaml
strict: true
poll_interval_s: 0.5
grace_period_s: 5
max_message_bytes: 1048576
version_policy: {kind: latest, num_versions: 2}
batching: {max_batch_size: 16, batch_timeout_micros: 500}
models:
  digits:
    version_policy: {kind: specific, versions: [3, 1]}
    batching: {max_batch_size: 8, allowed_batch_sizes: [4, 8]}
  remote-digits:
    backend:
      kind: remote
      target: serving.internal:8500
      model_name: digits
      label: stable
      tls: {ca: certs/ca.pem}
tls: {cert: certs/server.pem, key: certs/server.key, client_ca: /etc/ca.pem}
admin: {token_file: secrets/token}
prediction_log: {directory: logs, sample: 0.1, max_file_bytes: 1024}
feedback: {max_requests: 10, ttl_s: 60}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    return path


def test_no_file_and_an_empty_file_give_the_defaults(tmp_path: Path) -> None:
    assert load_config(None) == GatewayConfig()
    config = load_config(write(tmp_path, ""))
    assert config.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES == 64 * 1024 * 1024
    assert config.batching == BatchingConfig()
    assert config.admin_token() is None
    assert config.model("anything").backend == LocalBackend()


def test_every_section_is_read_and_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL))
    assert config.routing_file == tmp_path / "routing.yaml"
    assert config.strict is True
    assert config.policy_for("digits") == VersionPolicy("specific", versions=(1, 3))
    assert config.policy_for("other") == VersionPolicy("latest", num_versions=2)
    assert config.batching_for("digits").allowed_batch_sizes == [4, 8]
    assert config.batching_for("other").max_batch_size == 16
    remote = config.model("remote-digits").backend
    assert isinstance(remote, RemoteBackend)
    assert (remote.target, remote.model_name, remote.label) == (
        "serving.internal:8500",
        "digits",
        "stable",
    )
    assert remote.tls is not None and remote.tls.ca == tmp_path / "certs/ca.pem"
    assert config.tls is not None
    assert config.tls.cert == tmp_path / "certs/server.pem"
    assert config.tls.client_ca == Path("/etc/ca.pem")
    assert config.admin.token_file == tmp_path / "secrets/token"
    assert config.prediction_log.directory == tmp_path / "logs"
    assert (config.prediction_log.sample, config.prediction_log.max_file_bytes) == (0.1, 1024)
    assert (config.feedback.max_requests, config.feedback.ttl_s) == (10, 60)


def test_the_admin_token_comes_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("  from-file\n")
    assert load_config(write(tmp_path, "admin: {token_file: token}")).admin_token() == "from-file"
    config = load_config(write(tmp_path, "admin: {token_env: GATEWAY_TOKEN}"))
    monkeypatch.delenv("GATEWAY_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="GATEWAY_TOKEN is not set"):
        config.admin_token()
    monkeypatch.setenv("GATEWAY_TOKEN", "from-env")
    assert config.admin_token() == "from-env"
    (tmp_path / "token").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        load_config(write(tmp_path, "admin: {token_file: token}")).admin_token()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("strict: true\nbatching:\n  max_batch_size: lots\n", ":3: batching.max_batch_size:"),
        ("models:\n  digits:\n    colour: red\n", ":3: models.digits.colour: unknown key"),
        (
            "models:\n  m:\n    backend: {kind: remote}\n",
            ":3: models.m.backend.target: required key is missing",
        ),
        ("models:\n  m:\n    backend: {kind: cloud}\n", ":3: models.m.backend:"),
        ("tls:\n  cert: a.pem\n", ":1: tls.key: required key is missing"),
        ("admin: {token_env: A, token_file: b}\n", ":1: admin: give token_env or token_file"),
        ("max_message_bytes: 0\n", ":1: max_message_bytes: Input should be greater than 0, got 0"),
        (
            "version_policy: {kind: newest}\n",
            ":1: version_policy.kind: expected one of 'latest', 'all' or 'specific', got 'newest'",
        ),
        ("batching: [1, 2]\n", ":1: batching:"),
        (
            "pool: {probe_interval_s: 5, unresponsive_after_s: 6}\n",
            ":1: pool: unresponsive_after_s must allow at least two probes",
        ),
        ("- a list\n", ":1: <root>: expected mapping, got list"),
        ("batching: {max_batch_size: 4\n", "invalid YAML"),
    ],
)
def test_errors_name_the_file_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(str(path))
    assert message in str(caught.value)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")


def test_prediction_log_flags_override_the_file_and_need_a_directory(tmp_path: Path) -> None:
    config = with_prediction_log(GatewayConfig(), tmp_path / "logs", 0.25)
    assert config.prediction_log.directory == tmp_path / "logs"
    assert config.prediction_log.sample == 0.25
    assert with_prediction_log(config, None, None) == config
    with pytest.raises(ConfigError, match="--prediction-log-sample.*needs a directory"):
        with_prediction_log(GatewayConfig(), None, 0.5)
