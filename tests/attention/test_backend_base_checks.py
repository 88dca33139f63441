"""Backend input checks (check_inputs): each check no other test reaches names the backend and
the bad value; the base class names itself and refuses stateful decoding."""

import pytest
import torch

from graded.attention.backends.base import AttentionBackend, check_inputs


def _qkv(q=(1, 2, 3, 4), k=(1, 2, 5, 4), v=(1, 2, 5, 4)):
    return torch.zeros(q), torch.zeros(k), torch.zeros(v)


def test_inputs_must_be_floating_tensors():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"toy backend: k must be a Tensor, got list"):
        check_inputs("toy", q, [[0.0]], v, None, None, 0.0)
    with pytest.raises(TypeError, match=r"toy backend: v must be floating point, got torch.int64"):
        check_inputs("toy", q, k, v.long(), None, None, 0.0)


def test_shapes_must_agree():
    with pytest.raises(ValueError, match=r"toy backend: q \(1, 2, 3, 4\), k \(1, 2, 5, 4\), "
                                         r"v \(1, 2, 6, 4\) must agree"):
        check_inputs("toy", *_qkv(v=(1, 2, 6, 4)), None, None, 0.0)
    with pytest.raises(ValueError, match=r"toy backend: q and k head dims differ \(4 vs 3\)"):
        check_inputs("toy", *_qkv(k=(1, 2, 5, 3)), None, None, 0.0)


def test_an_attn_mask_that_does_not_broadcast_is_named():
    mask = torch.ones(3, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"toy backend: attn_mask of shape \(3, 3\) does not "
                                         r"broadcast to \(B, H, Tq, Tk\) = \(1, 2, 3, 5\)"):
        check_inputs("toy", *_qkv(), None, mask, 0.0)


class _Toy(AttentionBackend):
    name = "toy"

    def forward(self, q, k, v, **kwargs):
        return v


def test_the_base_backend_names_itself_and_keeps_no_decoding_state():
    toy = _Toy()
    assert repr(toy) == "_Toy(name='toy')"
    with pytest.raises(NotImplementedError, match=r"toy backend keeps no decoding state"):
        toy.decode(*_qkv(), None)
