#!/usr/bin/env bash
# Installs what Spindle's build, tests and benchmarks need on a fresh Debian 12 machine.
# Idempotent: does nothing when everything is present. Needs root (or sudo) to install.
set -euo pipefail

# Debian packages and a file each one provides (checked before installing).
declare -A PACKAGES=(
  [ceph-base]=/usr/bin/crushtool        # CRUSH oracle for tests and the CRUSH benchmark
  [libisal2]=/usr/lib/x86_64-linux-gnu/libisal.so.2   # ISA-L, the EC benchmark's anchor
  [fio]=/usr/bin/fio                                   # the I/O engine benchmark's anchor; fio nbd engine tests
  [libnbd-bin]=/usr/bin/nbdinfo                        # NBD tests: nbdinfo, nbdcopy
  [qemu-utils]=/usr/bin/qemu-img                       # NBD tests: qemu-img, qemu-io
  [nbdkit]=/usr/bin/nbdkit                            # NBD ceiling for `spindle bench fio`
  [gcc]=/usr/bin/gcc                                   # the linker, and mimalloc's C sources (global allocator)
  [iproute2]=/usr/sbin/ip                              # tests/netns.rs: hosts as network namespaces
  [prometheus]=/usr/bin/promtool                       # tests/metrics.rs: `promtool check metrics` on every endpoint
  [chromium]=/usr/bin/chromium                         # tests/dashboard.rs: the dashboard in a real browser
  [nodejs]=/usr/bin/node                               # tests/dashboard.rs: Playwright drives Chromium
  [npm]=/usr/bin/npm                                   # tests/dashboard.rs: installs playwright-core
  [clang]=/usr/bin/clang                               # tests of spindle-prog: programs compiled with clang -target bpf
  [faketime]=/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1  # tests/health.rs: a monitor with a skewed clock
)

missing=()
for pkg in "${!PACKAGES[@]}"; do
  if [ "$pkg" = libisal2 ] && [ "$(uname -m)" != x86_64 ]; then
    continue
  fi
  [ -e "${PACKAGES[$pkg]}" ] || missing+=("$pkg")
done

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo (Rust toolchain) not found; install Rust first (rustup or Debian's cargo)" >&2
  exit 1
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
  elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "setup: need root to install ${missing[*]} (run as root or install them yourself)" >&2
    exit 1
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  for pkg in "${missing[@]}"; do
    if [ ! -e "${PACKAGES[$pkg]}" ]; then
      echo "setup: $pkg installed but ${PACKAGES[$pkg]} is still missing" >&2
      exit 1
    fi
  done
fi

# Python packages, in a virtual environment in .venv so the system's Python stays as it is:
# the SSB benchmark and its tests (`spindle bench ssb`, tests/ssb.rs: DuckDB on Parquet files
# is the reference answer; the bench finds .venv, or set SPINDLE_PYTHON), and the Python
# package in python/ (maturin builds it; zarr, pytest and hypothesis test it).
PY_PACKAGES=(duckdb==2.0.1 pyarrow==26.0.1 numpy==2.4.6 maturin==1.16.0 zarr==3.1.6
  pytest==9.2.0 pytest-asyncio==1.5.0 hypothesis==6.170.17 dask[array]==2026.8.0
  distributed==2026.8.0 xarray==2026.9.0)
VENV="$(cd "$(dirname "$0")/.." && pwd)/.venv"
if ! "$VENV/bin/python" -c 'import duckdb, pyarrow, numpy, zarr, pytest, pytest_asyncio, hypothesis, dask.array, distributed, xarray' >/dev/null 2>&1 \
    || [ ! -x "$VENV/bin/maturin" ]; then
  echo "setup: installing Python packages into $VENV: ${PY_PACKAGES[*]}"
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv
    python3 -m venv "$VENV"
  fi
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  "$VENV/bin/python" -c 'import duckdb, pyarrow, numpy, zarr, pytest, pytest_asyncio, hypothesis, dask.array, distributed, xarray'
fi
