# syntax=docker/dockerfile:1
# The training image for the Kubernetes Jobs in deploy/k8s/training/: `python -m train` and
# `python -m export`, as the tests run them, on a slim Python base, as a non-root user.
#
# Typical usage, from the repository root (the build context; BuildKit reads the ignore file
# beside this one, train.Dockerfile.dockerignore, instead of the root .dockerignore):
#   docker build -f deploy/k8s/train.Dockerfile -t cifar-train:0.1.0 .
#   docker build -f deploy/k8s/train.Dockerfile --build-arg EXTRAS=gpu,export -t cifar-train:0.1.0-gpu .
#
# EXTRAS are pyproject.toml extras, installed from their locks (requirements/EXTRA.txt). The
# default, tpu,export, has TensorFlow (the tensorflow backend and tf.data), JAX with libtpu (the jax
# backend, on TPUs and on CPUs) and the exporter; gpu,export swaps libtpu for JAX's CUDA wheels. No
# data set and no run is part of the image: they live on the shared volume mounted at /work.

ARG PYTHON_VERSION=3.11

# --- build: install the package and its training extras into a virtual environment -------------
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG EXTRAS=tpu,export
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY requirements ./requirements
COPY pyproject.toml README.md ./
COPY contract ./contract
COPY train ./train
COPY export ./export
# The locked versions of every extra in EXTRAS (requirements/EXTRA.txt, README "Updating the lock":
# they agree on every version they share), each file checked against its hash; then the project
# alone, resolving nothing. "./" is spelled so hadolint sees a local path, not a package from an index.
RUN IFS=, && for extra in ${EXTRAS}; do echo "-r requirements/${extra}.txt"; done > extras.txt \
    && pip install --no-cache-dir --require-hashes -r extras.txt \
    && pip install --no-cache-dir --no-deps --no-build-isolation "./[${EXTRAS}]"

# --- runtime: the virtual environment and a non-root user ---------------------------------------
FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --no-create-home --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
# HOME and the caches point at /tmp: the Jobs run with a read-only root filesystem and a writable /tmp.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib \
    KERAS_HOME=/tmp/keras
WORKDIR /work
USER 10001:10001
CMD ["python", "-m", "train", "--help"]
