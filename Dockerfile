# syntax=docker/dockerfile:1
# One image for every Settle process; the command picks which:
#   docker run IMAGE core api --host 0.0.0.0 --port 8000
#   docker run IMAGE notifier worker
#   docker run IMAGE db upgrade
# compose.yaml runs each of them. Versions come from constraints.txt (the lock file).

# --- build: wheels that have no binary for this platform compile here ---------------
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

RUN python -m venv /opt/settle
ENV PATH=/opt/settle/bin:$PATH

WORKDIR /src
# The lock file first: the dependency layer stays cached while only code changes.
COPY constraints.txt pyproject.toml ./
COPY services ./services
COPY shared ./shared
RUN pip install -c constraints.txt .

# --- runtime -------------------------------------------------------------------------
FROM python:3.11-slim

ENV PATH=/opt/settle/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SETTLE_DATA_DIR=/var/lib/settle

RUN groupadd --system --gid 10001 settle \
    && useradd --system --uid 10001 --gid settle --home-dir /var/lib/settle \
        --shell /usr/sbin/nologin settle \
    && install -d -o settle -g settle -m 0750 /var/lib/settle

COPY --from=build /opt/settle /opt/settle

USER settle:settle
WORKDIR /var/lib/settle

# core's API listens on 8000 and the notifier's on 8001 (as compose.yaml runs them).
EXPOSE 8000 8001

# No HEALTHCHECK here: the same image runs APIs and workers, so each service declares
# its own in compose.yaml (the APIs: an HTTP GET with the image's Python; no curl needed).
# gunicorn and the workers stop cleanly on SIGTERM; run with an init (compose: init: true)
# so signals reach them and zombies are reaped.
STOPSIGNAL SIGTERM
ENTRYPOINT ["settle"]
CMD ["--help"]
