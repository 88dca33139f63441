"""When no ListOps tree fits the length range, the advice follows what the rejections were:
raising max_depth or max_args cannot help trees that are already too long."""

import pytest

from graded.tasks import get_task


def test_trees_too_long_get_advice_to_make_them_smaller():
    # lists nearly everywhere (value_p 0.9), 10 arguments, 6 levels: every tree overflows 200
    task = get_task("listops", max_length=200, max_args=10, max_depth=6, value_p=0.9,
                    max_tries=50)
    with pytest.raises(ValueError, match=r"50 too long, 0 too short.*raise max_length\) or "
                                         r"lower max_depth, max_args or value_p") as err:
        task.generate(1)
    assert "raise max_depth" not in str(err.value)


def test_trees_too_short_get_advice_to_make_them_larger():
    # one level of at most 3 digits: at most 5 tokens, never 60
    task = get_task("listops", min_length=60, max_length=64, max_depth=1, max_args=3,
                    max_tries=20)
    with pytest.raises(ValueError, match=r"0 too long, 20 too short.*lower min_length.*raise "
                                         r"max_depth, max_args or value_p"):
        task.generate(1)
