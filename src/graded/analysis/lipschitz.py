"""Empirical Lipschitz constants and noise robustness against the papers' bounds.

Claims tested: 000 Prop 5.12 (LGT) and Prop 6.13 (EGT), ‖Ψ(X+Δ) − Ψ(X)‖₂ ≤ Λ‖Δ‖₂ with
Λ ≤ L_T·s^{Nh+3}, s the grading's largest scale (q_max for LGT, where the paper writes q for
f(q); λ^{q_max} for EGT), N layers, h heads (h counted twice for the ``"queries_keys"``
variant, which applies M on both sides of a head: :func:`lipschitz_bound_factors`); and 001
Prop 3.7, ≤ L_T·λ^{q_max}·ε.

:func:`empirical_lipschitz` estimates ‖f(x+Δ) − f(x)‖/‖Δ‖ (Frobenius norms over the whole
input tensor) at radius ‖Δ‖ = ε for

- ``n_random`` Gaussian directions (a lower bound on the local constant), and
- ``steps`` of normalised gradient ascent on ½‖f(x+Δ) − f(x)‖² at fixed ‖Δ‖ = ε, started at a
  random direction. For a linear f(x) = W x the gradient is WᵀW Δ, so this is power iteration
  and the ratio converges to the spectral norm ‖W‖₂, the exact Lipschitz constant.

Both are lower bounds on the true (global) Lipschitz constant. The input X of the model-level
constant is what the input grading φ_q acts on (001 Def 3.1, T_G(X) = T(φ(X)); 000 Def 5.19):
the token embeddings of a token model, the raw features of a model over real features, whose
grading acts before the input projection (:func:`_input_perturbation`). Perturbing a feature
model after its projection would leave its input grading out of the map, and compare the graded
model and its twin at different points of one function.

L_T, the Lipschitz constant of
the ungraded transformer, is not computable (softmax attention is not globally Lipschitz), so
:func:`model_lipschitz` estimates it from below with the same procedure on the ungraded twin
and reports the ratio graded/ungraded next to the bound's factor s^{Nh+3} (and s for 001 Prop
3.7). A ratio above a factor would contradict the bound only if the twin's estimate were
tight; a ratio far below it says the bound is loose.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from graded.analysis._common import (
    LOW_PRECISION,
    OUTPUT_PADDING,
    Inputs,
    check_materialised,
    eval_mode,
    padding_argument,
    real_rows,
    real_tokens,
    run_model,
)
from graded.analysis.capture import embedding_perturbation
from graded.analysis.twin import ungraded_twin
from graded.attention.graded import graded_parts
from graded.checks import check_finite, check_finite_nonnegative, check_float, check_int
from graded.transformer.blocks import DecoderBlock, EncoderBlock
from graded.transformer.graded import GradedFeatures, TokenGrading, gradings
from graded.transformer.models import InputEmbedding

__all__ = [
    "LipschitzEstimate",
    "empirical_lipschitz",
    "lipschitz_bound_factors",
    "model_lipschitz",
]


@dataclass
class LipschitzEstimate:
    """Ratios ‖f(x+Δ) − f(x)‖/‖Δ‖ at ‖Δ‖ = ``epsilon``: the largest and mean over random Δ,
    the largest over the adversarial iterates, and ``estimate`` = max of the two."""

    random_max: float
    random_mean: float
    adversarial: float
    estimate: float
    epsilon: float
    adversarial_trace: list[float] = field(default_factory=list, repr=False)


def _kind(x: object) -> str:
    """A tensor's dtype, or another object's type, for an error message."""
    return str(x.dtype) if isinstance(x, Tensor) else type(x).__name__


def _ratio(f: Callable[[Tensor], Tensor], x: Tensor, fx: Tensor, delta: Tensor) -> Tensor:
    return torch.linalg.vector_norm(f(x + delta) - fx) / torch.linalg.vector_norm(delta)


def empirical_lipschitz(
    f: Callable[[Tensor], Tensor], x: Tensor, *, epsilon: float | None = None,
    relative_epsilon: float = 1e-2, n_random: int = 8, steps: int = 10,
    generator: torch.Generator | None = None,
) -> LipschitzEstimate:
    """Estimate the local Lipschitz constant of ``f`` at ``x`` (see the module docstring).

    ``epsilon`` is the perturbation norm; by default ``relative_epsilon·‖x‖`` (or
    ``relative_epsilon`` when x = 0). ``f`` must be differentiable for ``steps > 0``; x and
    f(x) must be finite.
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor, got {_kind(x)}")
    n_random, steps = check_lipschitz_counts(n_random, steps)
    x = x.detach()
    if x.numel() == 0:  # no direction to perturb: every ratio would be 0/0
        raise ValueError(f"x must have at least one entry to perturb, got shape "
                         f"{tuple(x.shape)}")
    check_finite(x, "x")
    if epsilon is None:
        relative_epsilon = check_float("relative_epsilon", relative_epsilon, minimum=0.0,
                                       strict_min=True)
        norm = float(torch.linalg.vector_norm(x))
        epsilon = relative_epsilon * norm if norm > 0 else relative_epsilon
    epsilon = check_float("epsilon", epsilon, minimum=0.0, strict_min=True)

    def direction() -> Tensor:
        d = torch.randn(x.shape, dtype=x.dtype, device=x.device, generator=generator)
        return d * (epsilon / torch.linalg.vector_norm(d))

    with torch.no_grad():
        fx = f(x)
        check_finite(fx, "f(x)")  # every ratio would be NaN or inf
        randoms = [float(_ratio(f, x, fx, direction())) for _ in range(n_random)]
    trace: list[float] = []
    delta = direction()
    for _ in range(steps):
        delta = delta.detach().requires_grad_(True)
        with torch.enable_grad():
            diff = f(x + delta) - fx
            objective = 0.5 * diff.pow(2).sum()
            (grad,) = torch.autograd.grad(objective, delta)
        trace.append(float(torch.linalg.vector_norm(diff.detach()) / epsilon))
        gnorm = torch.linalg.vector_norm(grad)
        if not gnorm > 0:
            break
        delta = grad * (epsilon / gnorm)
    if steps:
        with torch.no_grad():
            trace.append(float(_ratio(f, x, fx, delta.detach())))
    r_max = max(randoms) if randoms else 0.0
    r_mean = sum(randoms) / len(randoms) if randoms else 0.0
    adv = max(trace) if trace else 0.0
    return LipschitzEstimate(r_max, r_mean, adv, max(r_max, adv), float(epsilon), trace)


def check_lipschitz_counts(n_random: int, steps: int,
                           steps_name: str = "steps") -> tuple[int, int]:
    """The numbers of random directions and of ascent steps: ints >= 0, not both 0. Ascent
    steps take gradients, which ``torch.inference_mode`` turns off (``torch.enable_grad``
    does not turn them back on): refused there, naming the way out."""
    n_random = check_int("n_random", n_random, minimum=0)
    steps = check_int(steps_name, steps, minimum=0)
    if n_random + steps == 0:
        raise ValueError(f"need n_random >= 0 and {steps_name} >= 0, not both 0; got "
                         f"n_random={n_random}, {steps_name}={steps}")
    if steps and torch.is_inference_mode_enabled():
        raise RuntimeError(f"the adversarial Lipschitz estimate ({steps_name}={steps}) takes "
                           "gradients, which torch.inference_mode() turns off: call it outside "
                           f"inference mode (torch.no_grad() is fine), or with {steps_name}=0")
    return n_random, steps


def lipschitz_bound_factors(
    model: nn.Module, *, token_grades: Tensor | Sequence[Tensor] | None = None,
) -> dict[str, float]:
    """The grading factors of the papers' bounds for ``model``.

    ``max_scale`` s: the largest scale of any grading of the model (``max_scale()``);
    ``prop_5_12_factor`` = s^{N·h·a+3} (000 Prop 5.12 for LGT, Prop 6.13 for EGT);
    ``prop_3_7_factor`` = s (001 Prop 3.7). An ungraded model has s = 1.

    ``attention_applications`` a: how many times a head's attention applies M. The proof of
    Prop 5.12 counts one M per head (Def 5.13), a = 1, which is what the ``"scores"``,
    ``"values"`` and ``"multi_head"`` variants do; ``"queries_keys"`` grades both sides, Q M²
    Kᵀ, so each head scales by up to s², and the proof's count, s^{N·h+3}, would undercount
    it: its a is 2 (:func:`graded.attention.graded.graded_parts`), as 001 Thm 4.6's bound
    squares for it in the study's E6.

    A model that grades tokens (``TransformerConfig.token_grading``, 000 §6.2) scales a
    stage's features by diag(M)·M_{q_i}, with q_i = s_i·p set by the token grades of the call:
    its largest scale is that of the grades ``token_grades`` (the call's ``token_grades``; a
    seq2seq model's ``decoder_token_grades`` too, as a sequence), over every per-token stage.
    The profile p alone is the grading of s_i = 1, no bound for the grades of a call, so such
    a model without ``token_grades`` is refused.
    """
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no config: expected a graded.transformer "
                         "model")
    check_materialised(model)  # the scales are read from the grades
    scales = [g.max_scale() for g in gradings(model).values() if g.role != "token"]
    token_scale = _token_stage_scale(model, token_grades)
    if token_scale is not None:
        scales.append(token_scale)
    s = max(scales) if scales else 1.0
    # N counts every transformer block (encoder and decoder stacks of a seq2seq model), a
    # block shared across depth once per place it holds in the stack (once per application).
    n_layers = sum(1 for _, m in model.named_modules(remove_duplicate=False)
                   if isinstance(m, (EncoderBlock, DecoderBlock)))
    applications = (len(graded_parts(config.grade_attention_variant))
                    if getattr(config, "grade_attention", False) else 1)
    exponent = n_layers * config.n_heads * applications + 3
    try:
        factor = s**exponent
    except OverflowError:  # the bound is astronomically loose: report it as inf
        factor = float("inf")
    return {"max_scale": s, "n_layers": float(n_layers), "n_heads": float(config.n_heads),
            "attention_applications": float(applications), "prop_5_12_factor": factor,
            "prop_3_7_factor": s}


#: The keyword arguments of the graded.transformer models that carry per-token grades.
TOKEN_GRADE_ARGUMENTS = ("token_grades", "decoder_token_grades")


def _token_stage_scale(model: nn.Module,
                       token_grades: Tensor | Sequence[Tensor] | None) -> float | None:
    """The largest scale max_{i,k} diag(M)_k·(M_{q_i})_k of the per-token stages of ``model``
    (:class:`GradedFeatures` with ``per_token``) under the grades ``token_grades``; None for a
    model that grades no token. Each token grading's scales are taken over all the grades
    given (a seq2seq model's source and target grades alike: at most the exact value's
    larger)."""
    token_gradings = [m for m in model.modules() if isinstance(m, TokenGrading)]
    if not token_gradings:
        return None
    grades = ([token_grades] if isinstance(token_grades, Tensor)
              else [] if token_grades is None else list(token_grades))
    if not grades:
        raise ValueError(f"{type(model).__name__} grades tokens (token_grading): the largest "
                         "scale of its per-token stages depends on the token grades of the "
                         "call; pass token_grades (the model's token_grades tensor(s))")
    token_max = None  # (d,) the largest per-token scale of each feature
    for tg in token_gradings:
        for i, g in enumerate(grades):
            if not isinstance(g, Tensor) or g.numel() == 0:
                raise ValueError(f"token_grades[{i}] must be a non-empty tensor of token "
                                 f"grades, got {g!r}")
            check_finite_nonnegative(g, f"token_grades[{i}]")
            t = tg.profile.scales_at(g.detach().to(tg.profile.grades.dtype)).detach()
            t = t.reshape(-1, t.shape[-1]).amax(dim=0)
            token_max = t if token_max is None else torch.maximum(token_max, t)
    assert token_max is not None
    stages = [m for m in model.modules() if isinstance(m, GradedFeatures) and m.per_token]
    stage_max = [float((token_max if m.grading is None
                        else m.grading.scales().detach().to(token_max.dtype) * token_max).max())
                 for m in stages]
    return max(stage_max) if stage_max else float(token_max.max())


@contextlib.contextmanager
def _input_perturbation(model: nn.Module) -> Iterator[dict[str, Tensor | None]]:
    """:func:`~graded.analysis.capture.embedding_perturbation` for a token model (X = the
    token embeddings, which its input grading scales); for a model over real features
    (``config.vocab_size`` None), ``slot["delta"]`` is added to the raw features the first
    input embedding receives, before its input grading and projection (000 Def 5.19), and
    ``slot["clean"]`` holds them."""
    embed = next((m for m in model.modules() if isinstance(m, InputEmbedding)), None)
    if embed is None or embed.config.vocab_size is not None:
        with embedding_perturbation(model) as slot:
            yield slot
        return
    slot: dict[str, Tensor | None] = {"delta": None, "clean": None}

    def hook(_module: nn.Module, args: tuple[object, ...]) -> tuple[object, ...] | None:
        features = args[0]
        assert isinstance(features, Tensor)
        slot["clean"] = features.detach()
        return None if slot["delta"] is None else (features + slot["delta"], *args[1:])

    handle = embed.register_forward_pre_hook(hook)
    try:
        yield slot
    finally:
        handle.remove()


def _embedding_function(model: nn.Module, inputs: Inputs,
                        **model_kwargs: object) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    """Ψ as a function of its input X (:func:`_input_perturbation`), and X itself, for
    ``model`` on ``inputs``."""
    with torch.no_grad(), _input_perturbation(model) as slot:
        run_model(model, inputs, **model_kwargs)
    x = slot["clean"]
    real = real_tokens(model, inputs, model_kwargs, x)
    out_padding = padding_argument(model, inputs, model_kwargs, OUTPUT_PADDING)

    def f(x_new: Tensor) -> Tensor:
        with _input_perturbation(model) as s:
            s["delta"] = x_new - x
            out = run_model(model, inputs, **model_kwargs)
        return out[0] if isinstance(out, tuple) else out

    if real is None and out_padding is None:
        return f, x

    def f_real(x_real: Tensor) -> Tensor:  # Δ on the real tokens, the change at the real rows
        out = f(x_real if real is None else x.masked_scatter(real.unsqueeze(-1), x_real))
        # per-token outputs (B, T, ...): the real rows'; a pooled output (B, C) as it is
        rows = real_rows(out_padding, out.shape)
        return out if rows is None else out[rows]

    return f_real, (x if real is None else x[real])


def _low_precision(model: nn.Module) -> bool:
    """Whether ``model`` holds a float16/bfloat16 parameter or buffer."""
    return any(t.dtype in LOW_PRECISION
               for t in [*model.parameters(), *model.buffers()])


def _to_float32(value: object) -> object:
    """A float16/bfloat16 tensor (or such tensors in a tuple) as float32; others unchanged."""
    if isinstance(value, Tensor):
        return value.float() if value.dtype in LOW_PRECISION else value
    if isinstance(value, tuple):
        return tuple(_to_float32(v) for v in value)
    return value


def model_lipschitz(
    model: nn.Module, inputs: Inputs, *, compare_ungraded: bool = True,
    relative_epsilon: float = 1e-2, n_random: int = 8, steps: int = 10, seed: int = 0,
    **model_kwargs: object,
) -> dict[str, float]:
    """Empirical Lipschitz constant of the model's output (logits) with respect to its input X
    (the token embeddings of a token model, the raw features of a model over real features:
    what the input grading acts on, see the module docstring), in eval mode, next to the bound
    factors of :func:`lipschitz_bound_factors`.

    Keys: ``graded/{random_max, random_mean, adversarial, estimate}``, the same under
    ``ungraded/`` for the ungraded twin (same weights, M = I) when ``compare_ungraded``, their
    ``ratio`` (graded/ungraded estimate), ``epsilon`` and the bound factors (of the call's
    ``token_grades``/``decoder_token_grades`` for a model that grades tokens). With a
    ``key_padding_mask`` (B, T) the perturbation and the output change are those of the real
    tokens only (:func:`~graded.analysis._common.real_tokens`); a batch of padding only has
    none, and its estimates, ``epsilon`` and ``ratio`` are NaN (the mean of nothing, as the
    other diagnostics' means over no real query).

    A float16/bfloat16 model is measured as a float32 copy (same weights, floating inputs
    cast to float32): at ‖Δ‖ = 1% of ‖X‖ the change of the output is below the resolution of
    a 16-bit float, so its finite differences would measure rounding, not the model.
    """
    check_materialised(model)
    seed = check_int("seed", seed)  # torch's manual_seed names no argument
    n_random, steps = check_lipschitz_counts(n_random, steps)  # also where no token is measured
    relative_epsilon = check_float("relative_epsilon", relative_epsilon, minimum=0.0,
                                   strict_min=True)
    out: dict[str, float] = {}
    if _low_precision(model):
        model = copy.deepcopy(model)
        for t in [*model.parameters(), *model.buffers()]:
            if t.dtype in LOW_PRECISION:  # float64 parts, if any, keep their precision
                t.data = t.data.float()
        inputs = _to_float32(inputs)
        model_kwargs = {key: _to_float32(v) for key, v in model_kwargs.items()}
    models = {"graded": model}
    if compare_ungraded:
        models["ungraded"] = ungraded_twin(model)
    for label, m in models.items():
        with eval_mode(m):
            f, x = _embedding_function(m, inputs, **model_kwargs)
            gen = torch.Generator(device=x.device).manual_seed(seed)
            if x.numel() == 0:  # a batch of padding only: no real token, no estimate
                nan = float("nan")
                est = LipschitzEstimate(nan, nan, nan, nan, nan)
            else:
                est = empirical_lipschitz(f, x, relative_epsilon=relative_epsilon,
                                          n_random=n_random, steps=steps, generator=gen)
        out[f"{label}/random_max"] = est.random_max
        out[f"{label}/random_mean"] = est.random_mean
        out[f"{label}/adversarial"] = est.adversarial
        out[f"{label}/estimate"] = est.estimate
        out["epsilon"] = est.epsilon
    if compare_ungraded:
        base, graded = out["ungraded/estimate"], out["graded/estimate"]
        # NaN (no estimate) stays NaN; a twin that does not move at all gives inf
        out["ratio"] = (graded / base if base > 0 or math.isnan(base) or math.isnan(graded)
                        else float("inf"))
    grades = [v for key, v in model_kwargs.items()
              if key in TOKEN_GRADE_ARGUMENTS and v is not None]
    out.update(lipschitz_bound_factors(model, token_grades=grades or None))
    return out
