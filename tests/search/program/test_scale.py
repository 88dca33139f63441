"""Evaluations on a dask.distributed LocalCluster of two workers."""

import pytest

from graded.search.program.database import DatabaseConfig
from graded.search.program.engine import SearchConfig, run_search
from graded.search.program.offline import OfflineProposer
from graded.search.program.problem import get_problem

pytest.importorskip("dask.distributed")


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_search_runs_on_a_local_dask_cluster(tmp_path):
    from graded.search.program.scale import dask_executor

    executor, client = dask_executor("local", workers=2)
    try:
        assert len(client.scheduler_info()["workers"]) == 2
        config = SearchConfig(budget=6, workers=2, seed=0,
                              database=DatabaseConfig(islands=2))
        result = run_search(get_problem("cap-set", n=3), OfflineProposer(seed=0), config,
                            out=tmp_path / "dask", executor=executor)
    finally:
        client.close()
    assert result.evaluations == 6
    assert result.best.score >= 8.0  # the initial program's cap set, {0,1}^3
