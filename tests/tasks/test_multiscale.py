"""Multi-scale signals: spectral tokens, the slow component target, shifts."""

import cmath
import math

import pytest
import torch

from graded.tasks import MultiScaleSignals


def naive_inverse(tokens, length):
    """Real signal from tokens k = 1..T/2 holding (2/T)·DFT_k, by an explicit sum."""
    out = []
    for t in range(length):
        v = 0.0
        for k, (re, im) in enumerate(tokens, start=1):
            z = complex(re, im) * length / 2
            weight = 0.5 if k == length // 2 else 1.0  # the Nyquist term appears once
            v += weight * 2 * (z * cmath.exp(2j * math.pi * k * t / length)).real / length
        out.append(v)
    return out


def test_slow_component_is_the_low_band_of_the_spectrum():
    task = MultiScaleSignals(length=32, bands=((1, 2), (5, 7), (10, 14)), noise=0.0,
                             num_points=8)
    data = task.generate(5, seed=0)
    for tokens, target in zip(data.inputs.tolist(), data.targets.tolist()):
        low = [tok if k <= 2 else (0.0, 0.0) for k, tok in enumerate(tokens, start=1)]
        slow = naive_inverse(low, 32)
        assert [slow[i] for i in range(0, 32, 4)] == pytest.approx(target, abs=1e-5)


def test_time_representation_is_the_sum_of_components():
    task = MultiScaleSignals(length=32, bands=((1, 2), (6, 8)), noise=0.0, num_points=32,
                             representation="time", patch=4)
    data = task.generate(4, seed=1)
    signal = data.inputs.reshape(4, 32)
    fast = signal - data.targets
    spectrum = torch.fft.rfft(fast.double(), dim=-1).abs()
    assert float(spectrum[:, :6].max()) < 1e-3 * float(spectrum.max())


def test_amplitude_target_is_the_slow_modulus():
    task = MultiScaleSignals(noise=0.0, target="amplitude")
    data = task.generate(6, seed=2)
    moduli = torch.linalg.vector_norm(data.inputs[:, :2], dim=-1)  # band (1, 2)
    assert torch.allclose(moduli.max(-1).values, data.targets[:, 0], atol=1e-5)


@pytest.mark.parametrize("representation", ["spectral", "time"])
def test_relabelling_shifts_signal_and_target_together(representation):
    task = MultiScaleSignals(length=32, bands=((1, 2), (5, 8)), noise=0.0, num_points=8,
                             representation=representation, patch=4)
    data = task.generate(6, seed=3)
    moved = task.relabel(data, seed=4)
    if representation == "spectral":
        signals = torch.tensor([naive_inverse(x, 32) for x in moved.inputs.tolist()])
        before = torch.tensor([naive_inverse(x, 32) for x in data.inputs.tolist()])
    else:
        signals, before = moved.inputs.reshape(6, 32), data.inputs.reshape(6, 32)
    for i in range(6):
        shift = next(m for m in range(0, 32, 4)
                     if torch.allclose(torch.roll(before[i], m), signals[i], atol=1e-4))
        assert torch.allclose(torch.roll(data.targets[i], shift // 4), moved.targets[i])


def test_grades_are_inverse_wavenumbers():
    task = MultiScaleSignals(length=16, bands=((1, 2), (4, 7)))
    assert task.grades == pytest.approx([1 / k for k in range(1, 9)])
    with pytest.raises(ValueError, match="bands"):
        MultiScaleSignals(length=16, bands=((1, 9),))


def test_a_unit_sine_has_modulus_one_at_its_wavenumber_and_nyquist_is_refused():
    """The spectral tokens are (2/T)·DFT_k: a sine of amplitude A and any phase has modulus A
    at token k for every allowed k; at k = T/2 it would be A·2|sin φ| (a sine sampled there is
    sin φ·(−1)^t), so that band is refused, naming the limit."""
    task = MultiScaleSignals(length=16, bands=((1, 7),))
    t = torch.arange(16, dtype=torch.float64)
    for k in range(1, 8):
        for phase in (0.0, 0.7, 2.0):
            tokens = task.represent((2.5 * torch.sin(2 * math.pi * k * t / 16 + phase))[None])
            moduli = torch.linalg.vector_norm(tokens[0].double(), dim=-1)
            assert float(moduli[k - 1]) == pytest.approx(2.5, abs=1e-5)
    with pytest.raises(ValueError, match=r"high < length/2 = 8, got \(\(1, 8\),\)"):
        MultiScaleSignals(length=16, bands=((1, 8),))
