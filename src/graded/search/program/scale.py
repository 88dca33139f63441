"""Evaluations beyond one machine: a ``dask.distributed`` client as a ``concurrent.futures``
executor (optional extra: ``pip install graded[dask]``)."""

from __future__ import annotations

from typing import Any

__all__ = ["dask_executor"]


def dask_executor(address: str, workers: int = 2) -> tuple[Any, Any]:
    """(executor, client) for the scheduler at ``address``; ``"local"`` starts a
    ``LocalCluster`` of ``workers`` single-threaded worker processes. Close the client when
    done (closing it also stops a local cluster)."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError as e:
        raise ValueError("--dask needs dask.distributed: pip install 'graded[dask]'") from e
    if address == "local":
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=None)
        client = Client(cluster)
        client._graded_cluster = cluster
    else:
        client = Client(address)
    return client.get_executor(pure=False), client
