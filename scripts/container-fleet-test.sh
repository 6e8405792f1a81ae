#!/usr/bin/env bash
# The docker-simulated fleet (Dockerfile + compose.yaml), built and run with podman, end to end:
#   1. a local Debian bookworm base image made by debootstrap and `podman import`
#      (localhost/edgegrove-base:bookworm; built once, then reused: no registry is needed),
#   2. the Edgegrove image built on it with `podman build --pull=never`,
#   3. the compose fleet (broker, dashboard, 7 installed devices) up under a project name of its
#      own; one job submitted from the host with `edgegrove job submit` (the operator's key and
#      login copied out of the broker's volume, where the broker made them on its first start),
#   4. scripts/container_fleet_watch.py on the dashboard's REST API: every device training the
#      job, >= 30 rounds with identical model hashes; one device killed (compose kill) and
#      started again (compose start); it must resume the job and rejoin with the fleet's hash,
#   5. `edgegrove job stop` and `edgegrove job fetch` from the host: the trained model
#      (model.npz, model.tflite) comes back,
#   6. everything of the project torn down (containers, network, volume), pass or fail, and
#      checked to be gone.
# Run from a clone after `scripts/setup.sh --dev` (podman, runc, debootstrap, podman-compose).
# Settings (environment):
#   EDGEGROVE_BASE_IMAGE      the base tag (default localhost/edgegrove-base:bookworm)
#   EDGEGROVE_REBUILD_BASE=1  make the base again even if the tag exists
#   EDGEGROVE_CTEST_PROJECT   the compose project name (default: unique per run)
#   EDGEGROVE_ROUNDS_TARGET   rounds the fleet must reach before the kill (default 30)
#   EDGEGROVE_CTEST_TIMEOUT   seconds allowed for each phase of the watch (default 900)
#   CONTAINERS_CONF           podman's configuration; when unset, one is written that suits
#                             hosts like this one (runc, cgroupfs, no default ulimits)
# It prints `container-fleet-test: summary {json}` (stdout) and exits 0 on success.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

say() { echo "container-fleet-test: $*" >&2; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

base_image=${EDGEGROVE_BASE_IMAGE:-localhost/edgegrove-base:bookworm}
image_tag=localhost/edgegrove:latest
project=${EDGEGROVE_CTEST_PROJECT:-edgegrove-ctest-$(date +%s)-$$-$RANDOM}
label="io.podman.compose.project=$project"
cache_dir=${XDG_CACHE_HOME:-$HOME/.cache}/edgegrove
# Keep these in step with the Dockerfile: a base that has them needs no apt during the build.
base_packages=python3,python3-venv,mosquitto,ca-certificates,iproute2,iptables
mirror=${EDGEGROVE_DEBIAN_MIRROR:-http://deb.debian.org/debian}

for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { say "$tool is missing: run scripts/setup.sh --dev"; exit 2; }
done
if [ -x .venv/bin/podman-compose ]; then compose_bin=$repo/.venv/bin/podman-compose
elif command -v podman-compose >/dev/null; then compose_bin=$(command -v podman-compose)
else say "podman-compose is missing: run scripts/setup.sh --dev"; exit 2; fi
py=python3
[ -x .venv/bin/python ] && py=$repo/.venv/bin/python

work=$(mktemp -d "${TMPDIR:-/tmp}/edgegrove-ctest.XXXXXX")
if [ -z "${CONTAINERS_CONF:-}" ]; then
  # crun refuses this kind of host's hybrid cgroups and rlimits; runc with cgroupfs runs.
  cat > "$work/containers.conf" <<'EOF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  export CONTAINERS_CONF=$work/containers.conf
fi

compose() { "$compose_bin" -p "$project" -f "$repo/compose.yaml" "$@"; }

count_left() {
  local c n v p
  c=$(podman ps -a -q --filter "label=$label" | wc -l)
  p=$(podman pod ps -q --filter "label=$label" | wc -l)
  n=$(podman network ls -q --filter "label=$label" | wc -l)
  v=$(podman volume ls -q --filter "label=$label" | wc -l)
  echo "containers $c, pods $p, networks $n, volumes $v"
  [ "$c$p$n$v" = "0000" ]
}

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ "$rc" -ne 0 ] && [ -n "$(podman ps -a -q --filter "label=$label")" ]; then
    say "failed (exit $rc): the last lines of every container's log"
    for name in $(podman ps -a --filter "label=$label" --format '{{.Names}}'); do
      echo "----- $name" >&2
      podman logs --tail 15 "$name" 2>&1 | sed 's/^/  /' >&2
    done
  fi
  say "tearing down project $project"
  compose down -v -t 2 >"$work/down.log" 2>&1 || cat "$work/down.log" >&2
  # Whatever compose left of this project (and only of this project: its label) goes too.
  podman ps -a -q --filter "label=$label" | xargs -r podman rm -f -t 0 >/dev/null
  podman pod ps -q --filter "label=$label" | xargs -r podman pod rm -f >/dev/null
  podman network ls -q --filter "label=$label" | xargs -r podman network rm -f >/dev/null
  podman volume ls -q --filter "label=$label" | xargs -r podman volume rm -f >/dev/null
  local left
  if left=$(count_left); then
    say "nothing left behind: $left"
  else
    say "LEFT BEHIND: $left"
    [ "$rc" -eq 0 ] && rc=1
  fi
  rm -rf "$work"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- 1. the base image (cached as a podman image tag) ------------------------------------------
make_base() {
  mkdir -p "$cache_dir"
  # One builder at a time on this machine; a second one finds the tag made by the first.
  exec 9>"$cache_dir/base.lock"
  flock 9
  if [ "${EDGEGROVE_REBUILD_BASE:-0}" != 1 ] && podman image exists "$base_image"; then
    exec 9>&-; return; fi
  local t0 root
  t0=$(now)
  root=$work/rootfs
  say "making the base $base_image with debootstrap (bookworm: $base_packages) from $mirror"
  debootstrap --variant=minbase --include="$base_packages" bookworm "$root" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; return 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import \
    --change 'CMD ["/bin/bash"]' --change "LABEL io.edgegrove.base-packages=$base_packages" \
    - "$base_image" >/dev/null
  rm -rf "$root"
  exec 9>&-
  say "base made in $(since "$t0") s"
}
base_label() {
  podman image inspect -f '{{index .Config.Labels "io.edgegrove.base-packages"}}' "$base_image" \
    2>/dev/null || true
}
if [ "$(base_label)" != "$base_packages" ]; then
  # Missing, or made with another package list: made (again).
  podman image exists "$base_image" && EDGEGROVE_REBUILD_BASE=1
  make_base
elif [ "${EDGEGROVE_REBUILD_BASE:-0}" = 1 ]; then
  make_base
else
  say "base $base_image is cached (EDGEGROVE_REBUILD_BASE=1 makes it again)"
fi

# ---- 2. the Edgegrove image ---------------------------------------------------------------------
# pip inside the build uses this host's package index and CA bundle (a mirror, a proxy's CA).
index=${PIP_INDEX_URL:-$(python3 -m pip config get global.index-url 2>/dev/null || true)}
case "$index" in http://*|https://*) ;; *) index="" ;; esac
cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
[ -n "$cert" ] && [ -f "$cert" ] || cert=/etc/ssl/certs/ca-certificates.crt
build_args=(--pull=never --network host --layers --build-arg "BASE=$base_image"
            --build-arg "PIP_INDEX=$index" --iidfile "$work/iid" -t "$image_tag")
[ -f "$cert" ] && build_args+=(--secret "id=pip_cert,src=$cert")
t0=$(now)
say "building $image_tag on $base_image"
if ! podman build "${build_args[@]}" . >"$work/build.log" 2>&1; then
  tail -40 "$work/build.log" >&2; say "image build failed"; exit 1
fi
image_id=$(cat "$work/iid")
build_seconds=$(since "$t0")
say "image built in $build_seconds s: $image_tag ${image_id:7:12}"
# Earlier builds of the tag, now untagged, go: only images labelled as ours, only dangling ones,
# only those older than an hour (a concurrent run may be about to use its own), never one in
# use (podman rmi refuses).
podman images -q --filter dangling=true --filter label=io.edgegrove.image=edgegrove \
  --filter until=1h | xargs -r -n 1 podman rmi >/dev/null 2>&1 || true

# ---- 3. the fleet --------------------------------------------------------------------------------
free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
EDGEGROVE_IMAGE=$image_id
EDGEGROVE_DASHBOARD_PORT=$(free_port)
EDGEGROVE_BROKER_PORT=$(free_port)
export EDGEGROVE_IMAGE EDGEGROVE_DASHBOARD_PORT EDGEGROVE_BROKER_PORT
say "compose project $project: dashboard on 127.0.0.1:$EDGEGROVE_DASHBOARD_PORT, broker on :$EDGEGROVE_BROKER_PORT"
t0=$(now)
if ! compose up -d --no-build >"$work/up.log" 2>&1; then
  tail -30 "$work/up.log" >&2; say "compose up failed"; exit 1
fi
n_containers=$(podman ps -a -q --filter "label=$label" | wc -l)
images=$(podman ps -a --filter "label=$label" --format '{{.Image}}' | sort -u)
n_images=$(printf '%s\n' "$images" | grep -c .)
say "compose up in $(since "$t0") s: $n_containers containers, $n_images image ($images)"
[ "$n_images" = 1 ] || { say "every service must run the one Edgegrove image"; exit 1; }

# ---- 4. one job from the host ----------------------------------------------------------------------
broker_url=mqtt://127.0.0.1:$EDGEGROVE_BROKER_PORT
broker_container=$(podman ps -q --filter "label=$label" --filter "label=com.docker.compose.service=mosquitto")
ops=$work/operator
mkdir -p "$ops" && chmod 700 "$ops"
from_broker() {  # a file the broker wrote into its volume on its first start
  local i
  for i in $(seq 1 240); do
    if podman exec "$broker_container" test -s "/config/$1"; then
      podman exec "$broker_container" cat "/config/$1" > "$ops/$1" && chmod 600 "$ops/$1" && return 0
    fi
    sleep 0.5
  done
  say "the broker never wrote /config/$1"; return 1
}
from_broker credentials.json
from_broker operator.key
printf '%s\n' 'name = "demo"' 'model = "mlp"' 'data = "mnist"' 'min_devices = 7' \
  '[stop]' 'rounds = 0  # until `edgegrove job stop`' \
  '[options]' 'eval_every = 20' 'join_grace = 600  # seven containers on a loaded host: all of them' \
  > "$ops/job.toml"
operator=(--broker "$broker_url" --credentials "$ops/credentials.json")
eg() { "$py" -m edgegrove.cli "$@"; }
idle_devices() {
  eg devices "${operator[@]}" --json 2>/dev/null | "$py" -c \
    'import json, sys; print(sum(d.get("state") == "idle" for d in json.load(sys.stdin)))' 2>/dev/null || echo 0
}
t0=$(now)
n=0
for i in $(seq 1 300); do  # until all 7 devices have enrolled and published their records
  n=$(idle_devices)
  [ "$n" = 7 ] && break
  sleep 1
done
say "$n devices enrolled and idle after $(since "$t0") s"
[ "$n" = 7 ] || { say "not every device came up"; exit 1; }
eg job submit "$ops/job.toml" --key "$ops/operator.key" "${operator[@]}" >&2 || { say "job submit failed"; exit 1; }

# ---- 5. watch, kill, restart, rejoin --------------------------------------------------------------
"$py" scripts/container_fleet_watch.py \
  --url "http://127.0.0.1:$EDGEGROVE_DASHBOARD_PORT" \
  --compose "$compose_bin -p $project -f $repo/compose.yaml" \
  --agents 7 --rounds "${EDGEGROVE_ROUNDS_TARGET:-30}" --kill 3 --service-prefix device- \
  --timeout "${EDGEGROVE_CTEST_TIMEOUT:-900}" \
  --extra "build_seconds=$build_seconds" --extra "image=${image_id:7:12}" --extra "project=$project" \
  --extra "containers=$n_containers" --extra "images=$n_images"

# ---- 6. stop the job, fetch the trained model --------------------------------------------------------
eg job stop demo --key "$ops/operator.key" "${operator[@]}" >&2 || { say "job stop failed"; exit 1; }
eg job fetch demo -o "$work/model" --wait 120 --json "${operator[@]}" > "$work/fetch.json" \
  || { say "job fetch failed"; exit 1; }
for f in model.npz model.tflite; do
  [ -s "$work/model/$f" ] || { say "job fetch wrote no $f"; exit 1; }
done
echo "container-fleet-test: model $(tail -n 1 "$work/fetch.json")"
