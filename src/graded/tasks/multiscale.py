"""Multi-scale signals: recover the slow component of a sum of oscillations (000 §8.2 ii).

A signal of length T is x(t) = Σ_s A_s sin(2π k_s t / T + φ_s) + noise, one component per scale
band: the wavenumber k_s is uniform in ``bands[s]``, the amplitude A_s uniform in
``amplitude_range`` and the phase uniform. Band 0 is the slow component. 000 §8.2 grades
turbulence-like data by inverse frequency to emphasise low-wavenumber structure; here the grade
of wavenumber k is 1/k.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from graded.checks import check_choice, check_float, check_int
from graded.tasks.base import Task, TaskDataset, check_numbers, check_seed

REPRESENTATIONS = ("spectral", "time")
TARGETS = ("component", "amplitude")


@dataclasses.dataclass
class MultiScaleSignals(Task):
    """Predict the slow component of a multi-scale signal (regression; SPEC C10).

    Representations of the input:

    - ``"spectral"`` (default): (N, T/2, 2), one token per wavenumber k = 1..T/2 holding the
      real and imaginary parts of the discrete Fourier coefficient scaled by 2/T (a unit sine
      at wavenumber k has modulus 1 at token k). Grades (``graded_object = "positions"``):
      1/k for token k: the inverse wavenumber.
    - ``"time"``: (N, T/patch, patch), the raw samples cut into patches; the grades then refer
      to no input axis (``graded_object = "none"``).

    Targets: ``"component"`` (default) the slow component (the first band's, whatever the
    order of ``bands``) sampled every T/num_points steps,
    (N, num_points); ``"amplitude"`` its amplitude A_0, (N, 1). The slow component is a linear
    function of the signal when bands do not overlap, so a linear baseline is strong on
    ``"component"``; ``"amplitude"`` is nonlinear.
    """

    length: int = 64
    bands: tuple[tuple[int, int], ...] = ((1, 2), (4, 8), (12, 24))
    amplitude_range: tuple[float, float] = (0.5, 1.5)
    noise: float = 0.1
    num_points: int = 16
    representation: str = "spectral"
    patch: int = 4
    target: str = "component"

    name: ClassVar[str] = "multiscale"
    kind: ClassVar[str] = "regression"
    metric: ClassVar[str] = "r2"

    def __post_init__(self) -> None:
        check_int("length", self.length, minimum=4)
        if self.length % 2:
            raise ValueError(f"length must be even, got {self.length}")
        if isinstance(self.bands, (str, bytes)) or not isinstance(self.bands,
                                                                   Sequence | np.ndarray):
            raise TypeError(f"bands must be a sequence of (low, high) wavenumber pairs, got "
                            f"{self.bands!r} ({type(self.bands).__name__})")
        self.bands = tuple(check_numbers(f"bands[{i}]", band, length=2, integer=True)
                           for i, band in enumerate(self.bands))
        nyquist = self.length // 2
        if not self.bands or any(not 1 <= lo <= hi < nyquist for lo, hi in self.bands):
            raise ValueError(f"bands must be non-empty (low, high) with 1 <= low <= high < "
                             f"length/2 = {nyquist}, got {self.bands} (a sine at wavenumber "
                             "length/2 samples as sin φ·(−1)^t: its amplitude and phase are "
                             "lost)")
        lo, hi = check_numbers("amplitude_range", self.amplitude_range, length=2)
        if not 0 <= lo <= hi:
            raise ValueError(f"amplitude_range must satisfy 0 <= low <= high, got "
                             f"{self.amplitude_range}")
        self.amplitude_range = (lo, hi)
        check_float("noise", self.noise, minimum=0.0)
        check_int("num_points", self.num_points, minimum=1, maximum=self.length)
        if self.length % self.num_points:
            raise ValueError(f"num_points must divide length={self.length}, got "
                             f"{self.num_points}")
        check_choice("representation", self.representation, REPRESENTATIONS)
        check_int("patch", self.patch, minimum=1)
        if self.representation == "time" and self.length % self.patch:
            raise ValueError(f"patch must divide length={self.length}, got {self.patch}")
        check_choice("target", self.target, TARGETS)

    @property
    def graded_object(self) -> str:  # type: ignore[override]
        return "positions" if self.representation == "spectral" else "none"

    @property
    def grades(self) -> tuple[float, ...]:
        if self.representation == "time":
            return ()
        return tuple(1.0 / k for k in range(1, self.length // 2 + 1))

    @property
    def input_dim(self) -> int:
        return 2 if self.representation == "spectral" else self.patch

    @property
    def num_outputs(self) -> int:
        return self.num_points if self.target == "component" else 1

    @property
    def max_len(self) -> int:
        return self.length // 2 if self.representation == "spectral" else self.length // self.patch

    @property
    def stride(self) -> int:
        return self.length // self.num_points

    def components(self, n: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
        """(components (N, S, T), amplitudes (N, S), noise (N, T)), float64."""
        g = torch.Generator().manual_seed(seed)
        s = len(self.bands)
        lo = torch.tensor([b[0] for b in self.bands])
        hi = torch.tensor([b[1] for b in self.bands])
        k = lo + (torch.rand(n, s, generator=g, dtype=torch.float64) * (hi - lo + 1)).long()
        a_lo, a_hi = self.amplitude_range
        amp = a_lo + (a_hi - a_lo) * torch.rand(n, s, generator=g, dtype=torch.float64)
        phase = 2 * math.pi * torch.rand(n, s, generator=g, dtype=torch.float64)
        t = torch.arange(self.length, dtype=torch.float64)
        comps = amp[..., None] * torch.sin(2 * math.pi * k[..., None] * t / self.length
                                           + phase[..., None])
        noise = self.noise * torch.randn(n, self.length, generator=g, dtype=torch.float64)
        return comps, amp, noise

    def represent(self, signal: Tensor) -> Tensor:
        """The model input of signals (N, T) in the configured representation, float32."""
        if self.representation == "time":
            return signal.reshape(signal.shape[0], -1, self.patch).float()
        coef = torch.fft.rfft(signal, dim=-1)[:, 1:] * (2.0 / self.length)
        return torch.stack([coef.real, coef.imag], dim=-1).float()

    def _generate(self, n: int, seed: int) -> dict[str, Tensor]:
        comps, amp, noise = self.components(n, seed)
        signal = comps.sum(1) + noise
        if self.target == "component":
            y = comps[:, 0, :: self.stride]
        else:
            y = amp[:, :1]
        return {"inputs": self.represent(signal), "targets": y.float()}

    def relabel(self, data: TaskDataset, seed: int) -> TaskDataset:
        """Shift every signal circularly by a random multiple m of the target stride: a
        bijection that shifts the slow component by the same m (the amplitude is unchanged).
        With ``num_points == 1`` the stride is the whole signal and every shift is the identity:
        ValueError, as a relabelled split would be a random split under another name."""
        seed = check_seed(seed)
        if self.num_points == 1:
            raise ValueError(f"a relabelled split is not meaningful for task {self.name!r} with "
                             f"num_points=1: shifts are multiples of the target stride, here "
                             f"the whole length {self.length}, so every shift is the identity; "
                             "use num_points >= 2")
        g = torch.Generator().manual_seed(seed)
        n = len(data)
        steps = torch.randint(0, self.num_points, (n,), generator=g)
        m = steps * self.stride
        x = data.inputs.to(torch.float64)
        if self.representation == "time":
            sig = x.reshape(n, self.length)
            idx = (torch.arange(self.length)[None, :] - m[:, None]) % self.length
            x_new = self.represent(torch.gather(sig, 1, idx))
        else:
            k = torch.arange(1, self.length // 2 + 1, dtype=torch.float64)
            rot = torch.polar(torch.ones(n, k.shape[0], dtype=torch.float64),
                              -2 * math.pi * k[None, :] * m[:, None] / self.length)
            z = torch.complex(x[..., 0], x[..., 1]) * rot
            x_new = torch.stack([z.real, z.imag], dim=-1).float()
        y = data.targets
        if self.target == "component":
            idx = (torch.arange(self.num_points)[None, :] - steps[:, None]) % self.num_points
            y = torch.gather(y, 1, idx)
        return data.replace(inputs=x_new, targets=y)
