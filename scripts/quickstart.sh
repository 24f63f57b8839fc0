#!/usr/bin/env bash
# Spindle's main job on its embedded default: builds the `spindle` binary and maps the
# bundled example CRUSH map (2 racks x 3 hosts x 3 devices, ssd/hdd classes) through
# its rules, printing where 10,000 placement inputs land. No configuration needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --quiet -p spindle
./target/release/spindle crush test "$@"
