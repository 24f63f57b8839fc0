#!/usr/bin/env bash
# Spindle's main job on its embedded default: builds the `spindle` binary, brings up a
# local cluster (a monitor and three storage daemons on 127.0.0.1, data under
# ./spindle-data or $SPINDLE_DIR), runs a short object workload against it (figures
# beside Ceph's), then serves a block image over NBD and drives it with fio (a random
# write pass and a crc32c-verified pass). The cluster and the NBD server keep running
# afterwards: `kill $(cat $SPINDLE_DIR/nbd.pid); spindle down` stops them.
#
# Environment: SPINDLE_DIR (cluster directory), SPINDLE_BENCH_SECONDS (object bench,
# default 10), SPINDLE_NBD_PORT (default 10809), SPINDLE_IMAGE (default disk0),
# SPINDLE_IMAGE_SIZE (default 1G), SPINDLE_FIO_SECONDS (default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --quiet -p spindle
export SPINDLE_DIR="${SPINDLE_DIR:-$PWD/spindle-data}"
spindle=./target/release/spindle
if [ -n "${CARGO_TARGET_DIR:-}" ]; then spindle="$CARGO_TARGET_DIR/release/spindle"; fi
port="${SPINDLE_NBD_PORT:-10809}"
image="${SPINDLE_IMAGE:-disk0}"
size="${SPINDLE_IMAGE_SIZE:-1G}"
fio_seconds="${SPINDLE_FIO_SECONDS:-5}"
uri="nbd://127.0.0.1:$port/$image"

"$spindle" up
"$spindle" bench objects --seconds "${SPINDLE_BENCH_SECONDS:-10}" "$@"

echo
echo "== block image $image ($size) over NBD on 127.0.0.1:$port"
if ! "$spindle" image info "$image" >/dev/null 2>&1; then
    "$spindle" image create "$image" --size "$size"
fi

# Replace a previous NBD server of this cluster (only the one whose pid we recorded).
pidfile="$SPINDLE_DIR/nbd.pid"
if [ -f "$pidfile" ]; then
    old="$(cat "$pidfile")"
    if [ -n "$old" ] && grep -q "spindle" "/proc/$old/cmdline" 2>/dev/null; then
        kill "$old" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$pidfile"
fi
# setsid: the server outlives this script (and a Ctrl-C of it).
setsid "$spindle" nbd --listen "127.0.0.1:$port" >"$SPINDLE_DIR/nbd.log" 2>&1 </dev/null &
echo $! >"$pidfile"
for _ in $(seq 100); do
    grep -q "serving on" "$SPINDLE_DIR/nbd.log" 2>/dev/null && break
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "spindle nbd failed to start:" >&2; cat "$SPINDLE_DIR/nbd.log" >&2; exit 1
    fi
    sleep 0.1
done
grep -q "serving on" "$SPINDLE_DIR/nbd.log" || { echo "spindle nbd did not start" >&2; exit 1; }
nbdinfo --list "nbd://127.0.0.1:$port" | grep -E "^export=|export-size:" || true

echo
echo "== fio: 4k random writes, iodepth 16, ${fio_seconds}s"
out="$(fio --name=quick --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=16 \
    --runtime="$fio_seconds" --time_based --norandommap --randrepeat=0)"
grep -E "IOPS=| clat \(usec\)|clat percentiles| 99.00th" <<<"$out" || echo "$out"
echo "== fio: 64 MiB of 4k..512k random writes, crc32c-verified read-back"
out="$(fio --name=verify --ioengine=nbd --uri="$uri" --rw=randwrite --bsrange=4k-512k \
    --size=64m --iodepth=16 --verify=crc32c --verify_state_save=0)"
grep -E "IOPS=|err=" <<<"$out" || echo "$out"

echo
echo "The cluster and the NBD server are still running (data in $SPINDLE_DIR). Try:"
echo "  export SPINDLE_DIR=$SPINDLE_DIR PATH=$(dirname "$(realpath "$spindle")"):\$PATH"
echo "  spindle status; spindle put hello /etc/hostname; spindle get hello -"
echo "  spindle image ls; spindle image create vm1 --size 10G   # served at once as nbd://127.0.0.1:$port/vm1"
echo "  nbdinfo $uri"
echo "  qemu-img info $uri"
echo "  fio --name=t --ioengine=nbd --uri=$uri --rw=randread --bs=4k --iodepth=16 --runtime=10 --time_based"
echo "  spindle bench fio --quick          # fio matrix vs Ceph RBD and nbdkit memory"
echo "  kill \$(cat $pidfile); spindle down"
