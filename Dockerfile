# The image ops/deploy/kubernetes runs: `slipway serve` for the gateway, `slipway train`
# for TFJob workers. Built with `make image`.
#
# Two stages: the first runs the same `make install` as a developer's machine (a .venv with
# the project and exactly the dependencies uv.lock pins, without the test and docs tools); the
# second copies that tree into a clean base and runs as an unprivileged user, with no compiler
# or apt cache. PYTHONDONTWRITEBYTECODE: that user cannot write into /app, so no process tries.

FROM python:3.11-slim-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml uv.lock Makefile README.md ./
COPY slipway ./slipway
COPY contracts ./contracts
COPY research ./research
COPY training ./training
COPY compression ./compression
COPY serving ./serving
COPY ops ./ops
# `make install` compiles the whole venv to bytecode and the image keeps it: a pod that
# imported TensorFlow from source would spend about 15 s of CPU before it could serve, and
# its user cannot write bytecode for a module first imported later.
RUN make install PYTHON=python3.11 INSTALL_EXTRAS= BYTECODE=all

FROM python:3.11-slim-bookworm
RUN groupadd --gid 10001 slipway \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin slipway
WORKDIR /app
COPY --from=build /app /app
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TF_CPP_MIN_LOG_LEVEL=2
USER 10001:10001
# gRPC (TensorFlow Serving's PredictionService) and REST, as in TensorFlow Serving.
EXPOSE 8500 8501
ENTRYPOINT ["slipway"]
CMD ["--help"]
