# syntax=docker/dockerfile:1
# The serving image: the Flask front end in serve/, under gunicorn, on a slim Python base. No
# TensorFlow: the model runs in LiteRT (SERVE_RUNTIME=litert, or litert-int8), and the TF Serving
# backends speak gRPC through the protos vendored in tfs_protos.
#
# Typical usage (docs/deploy.md has the rest):
#   docker build -t cifar-serve .
#   docker run --rm -p 8000:8000 -v "$PWD/models:/models:ro" cifar-serve        # model at run time
#   docker build --build-arg MODEL_SRC=models -t cifar-serve:baked .            # model in the image
#
# Proxy mode, the layout for clients it does not control (compose.yaml and deploy/k8s run it): a
# second container from this image, sharing the first's network, runs nginx on 8080 in front of
# gunicorn on 127.0.0.1:8000:
#   nginx -p /tmp/ -c /etc/nginx/serve.conf -e stderr -g 'daemon off;'
#
# The model is never part of the install: it comes in at /models, as TF Serving's image expects,
# either as a volume at run time or copied from MODEL_SRC (a folder in the build context) at build
# time. The default MODEL_SRC is a folder holding only a README, so a plain build copies no model.

ARG PYTHON_VERSION=3.11
# Any Debian bookworm image whose `python` is CPython ${PYTHON_VERSION} with venv. CI has no registry
# to pull from: scripts/container_check.sh builds a stand-in with debootstrap (Debian's python3 3.11)
# under its own name and passes it here, so no local image poses as Docker Hub's.
ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim-bookworm
# The lock of the `serve` extra (no TensorFlow); requirements/savedmodel.txt for SERVE_RUNTIME=savedmodel.
ARG LOCK=requirements/serve.txt

# --- build: the locked `serve` dependencies and the package into a virtual environment ----------
FROM ${BASE_IMAGE} AS build
ARG LOCK
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# The exact versions and hashes first (README: "Updating the lock"), in a layer of their own that a
# code change does not rebuild. Every file comes from PyPI and must match its hash.
COPY ${LOCK} ./requirements.txt
RUN pip install --no-cache-dir --require-hashes -r requirements.txt
# Then the project alone, resolving nothing: only what the install needs, the project metadata
# (README.md is its readme) and the packages the server imports (contract, the vendored TF Serving
# protos, serve); tests/deploy/test_deploy.py checks that serve/ imports nothing else. "./" is spelled so hadolint
# sees a local path, not an unpinned package from an index.
COPY pyproject.toml README.md ./
COPY contract ./contract
COPY tfs_protos ./tfs_protos
COPY serve ./serve
RUN pip install --no-cache-dir --no-deps --no-build-isolation "./"

# --- runtime: the virtual environment, nginx, a non-root user, the model at /models ------------
FROM ${BASE_IMAGE} AS runtime
ARG MODEL_SRC=deploy/no-model
# nginx for the proxy mode: a second container from this image, in front of gunicorn, reads every
# request body before gunicorn's threads see it (deploy/nginx/nginx.conf says why). Debian's
# bookworm package; its Debian revision is left free so that security updates install.
# apt-get clean drops the downloaded packages and apt's two package caches (pkgcache.bin and
# srcpkgcache.bin, 39 MB each), which Docker Hub's Debian images never write (their docker-clean
# setting) but a plain Debian base does.
RUN apt-get update \
    && apt-get install -y --no-install-recommends "nginx=1.22.1-*" \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/nginx/nginx.conf /etc/nginx/serve.conf
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --no-create-home --shell /usr/sbin/nologin app \
    && mkdir -p /models /tmp/prometheus \
    && chown app:app /tmp/prometheus
COPY --from=build /opt/venv /opt/venv
# 0755: exported files may be private to their owner on the build host, and the server runs as app.
COPY --chmod=0755 ${MODEL_SRC} /models/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MODEL_NAME=cifar10 \
    MODEL_BASE_PATH=/models \
    SERVE_BACKEND=local \
    SERVE_RUNTIME=litert \
    PORT=8000 \
    MALLOC_ARENA_MAX=2 \
    PROMETHEUS_MULTIPROC_DIR=/tmp/prometheus
WORKDIR /srv
USER 10001:10001
EXPOSE 8000 8080
# Liveness only (/readyz is for load balancers): slim images have no curl, so Python asks.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8000'), timeout=4)"]
CMD ["gunicorn", "-c", "python:serve.gunicorn_conf", "serve:create_app()"]
