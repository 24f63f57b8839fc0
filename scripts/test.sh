#!/usr/bin/env bash
# Runs Spindle's whole test suite: installs what the tests need, then formatting, lints
# and every test of the workspace. Fails loudly; no test skips because a tool is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

# Reference data (CRUSH and EC vectors) lives in the sibling shared/ folder.
export SPINDLE_SHARED_DIR="${SPINDLE_SHARED_DIR:-$(cd .. && pwd)/shared}"
if [ ! -d "$SPINDLE_SHARED_DIR/crush/vectors/public" ]; then
  echo "test: reference data not found at $SPINDLE_SHARED_DIR (set SPINDLE_SHARED_DIR)" >&2
  exit 1
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
mkdir -p target
cargo test --workspace --no-run -q
# The test clusters' daemons refuse writes once their file system is 95 % full (the full
# ratio, as Ceph's). Say so before the tests run rather than through a failed write.
used_pct=$(df --output=pcent target | tail -1 | tr -dc '0-9')
if [ "${used_pct:-0}" -ge 90 ]; then
  echo "test: the file system holding target/ is ${used_pct}% full; the test clusters refuse" \
    "writes at 95%: free some space (e.g. cargo clean in old checkouts)" >&2
  exit 1
fi
cargo test --workspace 2>&1 | tee target/test-output.txt
awk '/^test result:/ { for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f; if (p == 0) exit 1 }' target/test-output.txt

# The Python package (python/): its Rust side formatted and linted like the rest, then built
# into .venv with maturin and tested with pytest against real clusters started with the
# binary built above. Every skipped test is reported (-rs) and fails the run.
echo "== python package"
cargo fmt --manifest-path python/Cargo.toml -- --check
PYO3_PYTHON="$PWD/.venv/bin/python" cargo clippy --manifest-path python/Cargo.toml -- -D warnings
(cd python && VIRTUAL_ENV="$PWD/../.venv" PATH="$PWD/../.venv/bin:$PATH" maturin develop -q)
SPINDLE_BIN="$PWD/target/debug/spindle" .venv/bin/python -m pytest python/tests -q -rs \
  -p no:cacheprovider 2>&1 | tee target/python-test-output.txt
if grep -Eq '[0-9]+ skipped' target/python-test-output.txt; then
  echo "test: Python tests were skipped (see above); none may be" >&2
  exit 1
fi
