#!/usr/bin/env bash
# Spindle's main job on its embedded default: builds the `spindle` binary, brings up a
# local cluster (a monitor and three storage daemons on 127.0.0.1, data under
# ./spindle-data or $SPINDLE_DIR), and runs a short object workload against it, printing
# the figures beside Ceph's. The cluster keeps running afterwards: `spindle down` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --quiet -p spindle
export SPINDLE_DIR="${SPINDLE_DIR:-$PWD/spindle-data}"
./target/release/spindle up
./target/release/spindle bench objects --seconds "${SPINDLE_BENCH_SECONDS:-10}" "$@"
echo
echo "The cluster is still running (data in $SPINDLE_DIR). Try:"
echo "  export SPINDLE_DIR=$SPINDLE_DIR PATH=$PWD/target/release:\$PATH"
echo "  spindle status; spindle put hello /etc/hostname; spindle get hello -; spindle down"
