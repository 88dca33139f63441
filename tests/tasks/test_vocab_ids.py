"""A task vocabulary decodes integer ids only: ``int(3.7)`` is 3, another token, so a float
or boolean id used to decode silently to a wrong sequence."""

import numpy as np
import pytest
import torch

from graded.tasks import get_task


@pytest.mark.parametrize("bad", [3.7, 3.0, True])
def test_a_task_vocabulary_refuses_an_id_that_is_not_an_int(bad):
    vocab = get_task("dyck").vocab
    with pytest.raises(TypeError, match=rf"token id {bad!r} at position 1 is not an int"):
        vocab.decode([vocab.id("("), bad])
    with pytest.raises(TypeError, match=r"token id 3\.0 at position 0 is not an int"):
        vocab.decode(torch.tensor([3.0]))


def test_a_task_vocabulary_decodes_ids_of_every_integer_type_to_the_same_tokens():
    vocab = get_task("dyck", k=2).vocab
    ids = vocab.encode("<bos> ( [ ] ) <eos>")
    expected = ["<bos>", "(", "[", "]", ")", "<eos>"]
    for same in (ids, torch.tensor(ids), np.array(ids), [np.int32(i) for i in ids]):
        assert vocab.decode(same) == expected
