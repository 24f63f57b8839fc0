"""`python -m spindle.bench` (also `spindle bench zarr`): Zarr arrays on Spindle beside
zarr's LocalStore on the same disk, in one run.

- Writing and reading a float32 array (default 4 GiB) in 1 MiB and 64 KiB chunks,
  uncompressed, with SpindleStore on a 3-way replicated pool and with LocalStore in a
  directory of the same file system; the page cache is dropped before each read when
  this process may (root), for both alike.
- A whole-array sum pushed down to the daemons (`spindle.zarr.reduce`) against reading
  the array and summing it here.

Prints a table, or with --json one object {"bench": "zarr", "results": [...]} whose
results carry name, unit, spindle, reference, reference_value and ratio (> 1: Spindle
better), the convention of every `spindle bench`. Targets (issue #24): reads at least 0.8x
LocalStore; the pushed-down sum moves at least 100x fewer bytes and runs at least 3x
faster than read-and-sum.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import zarr

from .zarr import SpindleStore, reduce

BLOCK_BYTES = 256 << 20


def _say(line: str) -> None:
    print(f"bench zarr: {line}", file=sys.stderr, flush=True)


def _drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _result(name, unit, spindle, reference, reference_value, higher_is_better):
    if higher_is_better:
        ratio = spindle / reference_value if reference_value > 0 else float("inf")
    else:
        ratio = reference_value / spindle if spindle > 0 else float("inf")
    return dict(
        name=name, unit=unit, spindle=spindle, reference=reference,
        reference_value=reference_value, ratio=ratio,
    )


def _write(a, block: np.ndarray, total: int) -> float:
    n = block.size
    t = time.perf_counter()
    for i in range(0, total, n):
        a[i : i + min(n, total - i)] = block[: min(n, total - i)]
    return time.perf_counter() - t


def _read(a, total: int, n: int) -> tuple[float, float]:
    t = time.perf_counter()
    s = 0.0
    for i in range(0, total, n):
        s += float(a[i : i + min(n, total - i)].sum(dtype=np.float64))
    return time.perf_counter() - t, s


async def _delete_all(c, names: list[str]) -> None:
    gate = asyncio.Semaphore(128)

    async def one(name: str) -> None:
        async with gate:
            await c.delete_async("default", name, missing_ok=True)

    await asyncio.gather(*(one(n) for n in names))


def run(dir: str, size_bytes: int, chunk_sizes: list[int], scratch: str) -> list[dict]:
    zarr.config.set({"async.concurrency": 64})
    rng = np.random.default_rng(24)
    block = rng.standard_normal(min(size_bytes, BLOCK_BYTES) // 4).astype("float32")
    total = size_bytes // 4
    results = []
    dropped = None
    for chunk_bytes in chunk_sizes:
        chunk = chunk_bytes // 4
        label = f"{size_bytes / (1 << 30):g} GiB float32 in {chunk_bytes >> 10} KiB chunks"
        local_dir = os.path.join(scratch, f"local-{chunk_bytes}")
        stores = {
            "spindle": SpindleStore(pool="default", prefix=f"bench/{chunk_bytes}", dir=dir),
            "local": zarr.storage.LocalStore(local_dir),
        }
        arrays = {
            k: zarr.create_array(store=s, shape=(total,), chunks=(chunk,), dtype="float32",
                                 compressors=None, overwrite=True)
            for k, s in stores.items()
        }
        secs = {}
        for k, a in arrays.items():
            secs[("write", k)] = _write(a, block, total)
            _say(f"{label}: {k} write {size_bytes / secs[('write', k)] / 1e6:.0f} MB/s")
        sums = {}
        for k, a in arrays.items():
            dropped = _drop_caches()
            secs[("read", k)], sums[k] = _read(a, total, block.size)
            _say(f"{label}: {k} read {size_bytes / secs[('read', k)] / 1e6:.0f} MB/s"
                 f" (page cache dropped: {dropped})")
        if not np.isclose(sums["spindle"], sums["local"], rtol=1e-9):
            raise SystemExit(f"the arrays differ: sum {sums['spindle']} vs {sums['local']}")
        for op in ("write", "read"):
            results.append(_result(
                f"{label}: {op} (SpindleStore, 3 copies)", "MB/s",
                size_bytes / secs[(op, "spindle")] / 1e6,
                "zarr LocalStore, same disk", size_bytes / secs[(op, "local")] / 1e6, True,
            ))
        # Pushed down against read-and-sum, on Spindle.
        _drop_caches()
        t = time.perf_counter()
        r = reduce(arrays["spindle"])
        pushed_s = time.perf_counter() - t
        if not np.isclose(r["sum"], sums["local"], rtol=1e-9):
            raise SystemExit(f"the pushed-down sum {r['sum']} differs from {sums['local']}")
        _say(f"{label}: sum pushed down {pushed_s:.3f} s ({r['pushed_down']} chunks, "
             f"{r['bytes_received']} bytes back); read-and-sum {secs[('read', 'spindle')]:.3f} s")
        results.append(_result(
            f"{label}: whole-array sum pushed down", "s", pushed_s,
            "read and sum in Python", secs[("read", "spindle")], False,
        ))
        results.append(_result(
            f"{label}: bytes the sum moved to the client", "bytes", float(r["bytes_received"]),
            "read and sum in Python", float(size_bytes), False,
        ))
        shutil.rmtree(local_dir, ignore_errors=True)
        # Free the cluster's space for the next size.
        c = stores["spindle"].client
        asyncio.run(_delete_all(c, [n for n, _ in c.list("default", f"bench/{chunk_bytes}/")]))
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m spindle.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=os.environ.get("SPINDLE_DIR", "./spindle-data"),
                   help="the embedded cluster to use (its pool 'default')")
    p.add_argument("--size-gib", type=float, default=4.0)
    p.add_argument("--chunk-kib", default="1024,64", help="chunk sizes, comma-separated")
    p.add_argument("--scratch", default=None, help="directory for the LocalStore arrays")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    size = int(a.size_gib * (1 << 30)) // 4 * 4
    chunks = [int(c) << 10 for c in a.chunk_kib.split(",")]
    scratch = a.scratch or tempfile.mkdtemp(prefix="spindle-bench-zarr-")
    try:
        results = run(a.dir, size, chunks, scratch)
    finally:
        if a.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
    if a.json:
        print(json.dumps({"bench": "zarr", "results": results}))
    else:
        w = max(len(r["name"]) for r in results)
        rw = max(len(r["reference"]) for r in results)
        print(f"{'name':<{w}}  {'spindle':>14}  {'reference':<{rw}}  {'ref value':>14}  {'ratio':>7}  unit")
        for r in results:
            print(f"{r['name']:<{w}}  {r['spindle']:>14.3f}  {r['reference']:<{rw}}  "
                  f"{r['reference_value']:>14.3f}  {r['ratio']:>7.2f}  {r['unit']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
