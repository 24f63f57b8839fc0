"""What the users of chunked arrays scale out with: Dask worker processes reading a
SpindleStore (each unpickles the store and connects on its own), and xarray."""

from __future__ import annotations

import numpy as np
import numpy.testing as npt
import zarr

from spindle.zarr import SpindleStore


def test_dask_distributed_workers_reduce_an_array(cluster):
    import dask.array as da
    from dask.distributed import Client as DaskClient, LocalCluster

    store = SpindleStore(pool="default", prefix="dask/a", dir=str(cluster.dir))
    data = np.random.default_rng(11).standard_normal((512, 384)).astype("float64")
    a = zarr.create_array(store=store, shape=data.shape, chunks=(64, 64), dtype="float64", overwrite=True)
    a[...] = data
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc:
        with DaskClient(lc) as dc:
            x = da.from_zarr(SpindleStore(pool="default", prefix="dask/a", dir=str(cluster.dir), read_only=True))
            total, biggest = dc.compute([x.sum(), x.max()], sync=True)
            # The chunks were read by both worker processes, each through its own client.
            pids = dc.run(lambda: __import__("os").getpid())
            assert len(set(pids.values())) == 2
    npt.assert_allclose(total, data.sum(), rtol=1e-12)
    assert biggest == data.max()


def test_xarray_open_zarr(cluster):
    import xarray as xr
    store = SpindleStore(pool="default", prefix="xarray/ds", dir=str(cluster.dir))
    temp = np.arange(24, dtype="float32").reshape(4, 6)
    ds = xr.Dataset({"temp": (("y", "x"), temp)}, coords={"x": np.arange(6), "y": np.arange(4)})
    ds.to_zarr(store, mode="w", zarr_format=3, consolidated=False)
    back = xr.open_zarr(SpindleStore(pool="default", prefix="xarray/ds", dir=str(cluster.dir)), consolidated=False)
    npt.assert_array_equal(back["temp"].values, temp)
    npt.assert_array_equal(back["x"].values, np.arange(6))
