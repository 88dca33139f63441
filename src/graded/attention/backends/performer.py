"""Performer attention: FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers").

The softmax kernel SM(x, y) = exp(xᵀy) has the positive random-feature estimate (their Lemma 1,
Eq. 7; seed_002 B.2)

    φ(x) = exp(-‖x‖²/2) / √m · [exp(ω_1ᵀx), …, exp(ω_mᵀx)],   E[φ(x)ᵀφ(y)] = exp(xᵀy),

for ω_i ~ N(0, I_d). FAVOR+ draws the ω_i as blocks of orthogonal directions with norms drawn
from the χ_d distribution (their §2.4, "ORF"), so that each ω_i is still marginally N(0, I_d)
and the estimate stays unbiased with lower variance (their Theorem 2). Softmax attention with
scale s uses x = √s·q and y = √s·k (s = 1/√D gives their d^{-1/4} pre-scaling). Attention is
then the kernel attention of :mod:`.linear` with these features, non-causal or causal (their
§2.6, prefix sums).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from graded.attention.backends.base import (
    AttentionBackend,
    Capabilities,
    DecodeState,
    check_inputs,
    check_int_option,
    check_seed,
    check_self_attention,
    checked_bool_option,
    checked_int_option,
    checked_option,
    compute_dtype,
    default_scale,
    empty_output,
    reject_attn_mask,
)
from graded.attention.backends.linear import check_dropout, kernel_attention, kernel_decode
from graded.checks import check_bool, check_float

__all__ = ["PerformerBackend", "draw_random_features", "favor_features"]


def draw_random_features(
    num_features: int,
    dim: int,
    *,
    orthogonal: bool = True,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """(num_features, dim) matrix of ω_i, each marginally N(0, I_dim).

    ``orthogonal``: stacked blocks of ``dim`` exactly orthogonal directions (QR of a Gaussian
    matrix with the sign fix that makes Q Haar-distributed), rescaled by independent χ_dim norms
    (Choromanski et al. 2021, §2.4). Otherwise i.i.d. Gaussian rows. ``orthogonal``: True or
    False only.
    """
    orthogonal = check_bool("draw_random_features: orthogonal", orthogonal)
    if num_features <= 0 or dim <= 0:
        raise ValueError(f"need positive num_features and dim, got {num_features}, {dim}")
    if not orthogonal:
        return torch.randn(num_features, dim, generator=generator, dtype=torch.float64).to(dtype)
    n_blocks = -(-num_features // dim)
    g = torch.randn(n_blocks, dim, dim, generator=generator, dtype=torch.float64)
    qmat, rmat = torch.linalg.qr(g)
    qmat = qmat * torch.sign(torch.diagonal(rmat, dim1=-2, dim2=-1)).unsqueeze(-2)
    directions = qmat.transpose(-2, -1).reshape(n_blocks * dim, dim)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=1)
    return (directions * norms.unsqueeze(1)).to(dtype)


def _log_features(x: Tensor, omega: Tensor) -> Tensor:
    """ωᵀx − ‖x‖²/2: the exponents of φ(x) before the 1/√m factor."""
    log_phi = torch.matmul(x, omega.transpose(0, 1).to(x.dtype))
    return log_phi - 0.5 * (x * x).sum(dim=-1, keepdim=True)


def favor_features(x: Tensor, omega: Tensor, *, stabilize: str | None = None) -> Tensor:
    """Positive random features φ(x) of Lemma 1, (…, T, D) -> (…, T, m).

    ``stabilize``: ``None`` (the exact estimator), ``"row"`` (subtract each row's maximum
    exponent; cancels in attention's per-query normalisation) or ``"all"`` (subtract the
    maximum over positions and features of each (B, H); cancels for keys). Both shifts are
    constants that divide out of y_i, and they keep exp from overflowing."""
    log_phi = _log_features(x, omega)
    if stabilize == "row":
        log_phi = log_phi - log_phi.amax(dim=-1, keepdim=True).detach()
    elif stabilize == "all":
        log_phi = log_phi - log_phi.amax(dim=(-2, -1), keepdim=True).detach()
    elif stabilize is not None:
        raise ValueError(f"stabilize must be None, 'row' or 'all', got {stabilize!r}")
    return torch.exp(log_phi) / math.sqrt(omega.shape[0])


def _shifted_query_features(x: Tensor, omega: Tensor) -> tuple[Tensor, Tensor]:
    """φ(x) of each query divided by e^c, c its largest exponent, and c (B, H, T, 1), detached:
    a per-query constant that cancels in attention's normalisation."""
    log_phi = _log_features(x, omega)
    shift = log_phi.amax(dim=-1, keepdim=True).detach()
    return torch.exp(log_phi - shift) / math.sqrt(omega.shape[0]), shift


def _key_maxima(log_k: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """The largest exponent of each key, (B, H, T) detached, -inf at padding: padded keys
    never set the keys' stabilising shift."""
    key_max = log_k.amax(dim=-1).detach()
    if key_padding_mask is not None:
        key_max = key_max.masked_fill(key_padding_mask[:, None, :], float("-inf"))
    return key_max


def _finite(x: Tensor) -> Tensor:
    """``x`` with -inf (no unpadded key) replaced by 0."""
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _check_feature_type(name: str, feature_type: object) -> str:
    """The ``feature_type`` option: ``"orthogonal"`` or ``"iid"``."""
    if feature_type not in ("orthogonal", "iid"):
        raise ValueError(
            f"{name} backend: feature_type must be 'orthogonal' or 'iid', got {feature_type!r}"
        )
    return feature_type


def _feature_option(option: str, check: Callable[[str, object], object]) -> property:
    """An option of the features' draw, checked whenever it is set (as
    :func:`~.base.checked_option`); a value other than the one in force restarts the
    features (:meth:`PerformerBackend._restart_features`), so the next call uses them."""
    return checked_option(option, check, on_change=lambda backend: backend._restart_features())


class PerformerBackend(AttentionBackend):
    """FAVOR+ approximation of softmax attention (Choromanski et al. 2021, Lemma 1, §2.4–2.6).

    Unbiased for the kernel exp(s·qᵀk), not for the normalised output (a ratio of estimates).
    Time O(B·H·T·m·(D + Dv)), memory O(B·H·T·m) non-causal; causal (Tq == Tk) uses the chunked
    prefix sums of :func:`.linear.kernel_attention`, memory O(B·H·(T·C + (T/C)·m·Dv)). One
    feature matrix is shared by all heads. Padded keys get φ(k) = 0. No general ``attn_mask``.

    Options: ``num_features`` (m; default round(D·ln D), the order of the paper's Theorem 4),
    ``feature_type`` ("orthogonal" or "iid"), ``redraw_interval`` (redraw the features every
    this many forward calls in training mode; None = never), ``seed`` (features drawn from a
    private generator, reproducible), ``head_dim`` (draw at construction so the features are in
    the state dict from the start; otherwise drawn at the first call), ``scale`` (default 1/√D),
    ``chunk_size`` (causal), ``eps`` (denominator guard of the unshifted formula, default
    1e-6), ``ignore_dropout``. :meth:`redraw_features` redraws.

    Every option is checked when set, at construction and after it. The features' options
    (``num_features``, ``feature_type``, ``seed``, ``head_dim``) set later to another value
    restart the features as a backend built with the options now in force would have them:
    the private generator restarted from ``seed`` (torch's global generator without one), the
    count of calls towards ``redraw_interval`` restarted, and the features redrawn at once
    from it (for ``head_dim=None``: dropped, drawn at the next call; if none were drawn yet,
    drawn at the next call as before). So the next call uses the new features, the ones a
    freshly built backend with these options draws. The others act at the next call.

    Stabilisation: each query's exponents are shifted by their maximum and the keys' by the
    largest over the unpadded keys; ``eps`` is carried through both shifts, so the output is
    Σφ(q)ᵀφ(k)v / (Σφ(q)ᵀφ(k) + eps) whatever they are (causally, a row never depends on a
    later key). Half-precision inputs are computed in float32 and the output rounded once
    (float16 cannot hold the features of keys far below the largest, e^{-17} and less: a causal
    query's first keys then vanish and its output is wrong); float32 and float64 as given.

    Incremental decoding keeps the running sums of :func:`.linear.kernel_decode` with the key
    features' stabilising shift (the largest unpadded exponent so far; the sums are rescaled
    when it grows), so memory is O(m·Dv) per layer and head whatever the length, and each
    step equals the causal pass over the whole sequence for the newest position. Features are
    never redrawn while decoding; a state made with features that were redrawn since (by
    :meth:`redraw_features`, a changed feature option, a loaded state dict) is refused: its sums
    belong to the old features.
    """

    name = "performer"
    capabilities = Capabilities(causal=True, cross_attention=True, key_padding_mask=True,
                                incremental=True, shift_invariant=True)
    # checked whenever set (checked_option), as the constructor does; the features' options
    # restart the features when they change (_restart_features)
    num_features = _feature_option("num_features", lambda name, value: check_int_option(
        name, "num_features", value, optional=True))
    feature_type = _feature_option("feature_type", _check_feature_type)
    seed = _feature_option("seed", lambda name, value: check_seed(name, value, optional=True))
    redraw_interval = checked_int_option("redraw_interval", optional=True)
    chunk_size = checked_int_option("chunk_size")
    eps = checked_option("eps", lambda name, value: check_float(
        f"{name} backend: eps", value, minimum=0, strict_min=True))
    ignore_dropout = checked_bool_option("ignore_dropout")

    def __init__(
        self,
        num_features: int | None = None,
        feature_type: str = "orthogonal",
        redraw_interval: int | None = None,
        seed: int | None = None,
        head_dim: int | None = None,
        scale: float | None = None,
        chunk_size: int = 64,
        eps: float = 1e-6,
        ignore_dropout: bool = False,
    ) -> None:
        super().__init__()
        self.register_buffer("omega", torch.empty(0, 0))  # none drawn yet
        self.feature_type = feature_type  # each checked by its property
        self.num_features = num_features
        self.seed = seed  # starts the private generator
        self.redraw_interval = redraw_interval
        self.chunk_size = chunk_size
        self.scale = scale  # checked by its property (AttentionBackend.scale)
        self.eps = eps
        self.ignore_dropout = ignore_dropout
        self.head_dim = head_dim  # draws the features now when given

    def __setstate__(self, state: dict[str, object]) -> None:
        """A backend pickled before ``seed`` was an option it keeps holds only the private
        generator drawn from it: the seed is that generator's initial seed (None without
        one), so setting an option later restarts the features from it, as a backend built
        with that seed does. The base class moves the other options to their slots."""
        super().__setstate__(state)
        if "_seed" not in self.__dict__:
            generator = self.__dict__.get("_generator")
            self.__dict__["_seed"] = None if generator is None else generator.initial_seed()

    @property
    def head_dim(self) -> int | None:
        """The head dimension the features are drawn for; None until they are drawn. Set, it
        is checked and, if it differs, the features restart for it (class docstring)."""
        return self.omega.shape[1] if self.omega.numel() else None

    @head_dim.setter
    def head_dim(self, value: object) -> None:
        head_dim = check_int_option(self.name, "head_dim", value, optional=True)
        if head_dim != self.head_dim:
            self.omega = torch.empty(0, 0, dtype=self.omega.dtype, device=self.omega.device)
            self._restart_features(head_dim)

    def _restart_features(self, head_dim: int | None = None) -> None:
        """Start the features afresh, as a backend built with the options in force: the
        private generator restarted from ``seed``, the count of calls restarted, and the
        features drawn for ``head_dim`` (or for the head_dim of those drawn; none if neither)."""
        seed = self.__dict__.get("_seed")
        self._generator = None if seed is None else torch.Generator().manual_seed(seed)
        self._calls = 0
        dim = head_dim if head_dim is not None else self.head_dim
        if dim is not None:
            self.redraw_features(dim)

    def redraw_features(self, head_dim: int | None = None) -> None:
        """Draw a fresh feature matrix ω (num_features, head_dim)."""
        dim = head_dim if head_dim is not None else self.omega.shape[1]
        if dim <= 0:
            raise ValueError("performer backend: head_dim unknown; pass head_dim to redraw")
        m = self.num_features or max(1, round(dim * math.log(dim)))
        # a buffer that later passes use: drawn as a normal tensor even under
        # torch.inference_mode, whose tensors a pass with autograd could not save
        with torch.inference_mode(False):
            omega = draw_random_features(
                m, dim, orthogonal=self.feature_type == "orthogonal", generator=self._generator
            )
            # in the buffer's place and dtype: a backend moved to float64 keeps float64 features
            self.omega = omega.to(device=self.omega.device, dtype=self.omega.dtype)
        self._new_draw()

    def _new_draw(self) -> None:
        """Count a new feature draw (or loaded features): decoding states of earlier draws
        are refused (:meth:`decode`)."""
        self._draw = self.__dict__.get("_draw", 0) + 1

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: object) -> None:
        """Features drawn at a first call are (0, 0) until then: a state dict that holds drawn
        features loads into a backend that has drawn none yet (a fresh model), and one saved
        before the first call (no features) leaves this backend to draw at its next call."""
        saved = state_dict.get(prefix + "omega")
        if (isinstance(saved, Tensor) and saved.dim() == 2 and saved.shape != self.omega.shape
                and 0 in (saved.numel(), self.omega.numel())):
            self.omega = torch.empty(saved.shape, dtype=self.omega.dtype,
                                     device=self.omega.device)
        super()._load_from_state_dict(state_dict, prefix, *args)
        self._new_draw()

    def _features_ready(self, head_dim: int) -> bool:
        """Draw the features at the first call; refuse another head_dim. True if they were
        drawn before this call."""
        if self.omega.numel() == 0:
            self.redraw_features(head_dim)
            return False
        if self.omega.shape[1] != head_dim:
            raise ValueError(
                f"performer backend: features were drawn for head_dim {self.omega.shape[1]}, "
                f"got inputs with head_dim {head_dim}"
            )
        return True

    def check_attention_dropout(self, dropout_p: float) -> None:
        check_dropout(self.name, dropout_p, self.ignore_dropout)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        if type(is_causal) is not bool:  # the bool itself passes on one comparison
            is_causal = check_bool(f"{self.name} backend: is_causal", is_causal)
        check_inputs(self.name, q, k, v, key_padding_mask, attn_mask, dropout_p)
        reject_attn_mask(self.name, attn_mask)
        self.check_attention_dropout(dropout_p)
        if is_causal:
            check_self_attention(self.name, q, k)
        empty = empty_output(q, k, v)
        if empty is not None:
            return empty
        d = q.shape[-1]
        if self._features_ready(d) and self.training and self.redraw_interval \
                and self._calls % self.redraw_interval == 0 and self._calls > 0:
            self.redraw_features(d)
        if self.training:
            self._calls += 1
        root = math.sqrt(default_scale(self.scale, d))
        omega = self.omega.to(q.device)
        # half precision computed in float32 and rounded once (float32 and float64 as given):
        # float16's range cannot hold the features e^{ωᵀk − c} of keys far below the largest,
        # which a causal query's first keys are
        acc, out_dtype = compute_dtype(q.dtype), v.dtype
        q, k, v = q.to(acc), k.to(acc), v.to(acc)
        phi_q, shift_q = _shifted_query_features(q * root, omega)
        log_k = _log_features(k * root, omega)
        key_max = _key_maxima(log_k, key_padding_mask)
        shift = _finite(key_max.amax(dim=-1, keepdim=True)).unsqueeze(-1)  # (B, H, 1, 1)
        phi_k = torch.exp(log_k - shift) / math.sqrt(omega.shape[0])
        if key_padding_mask is not None:
            phi_k = phi_k.masked_fill(key_padding_mask[:, None, :, None], 0.0)
        out = kernel_attention(phi_q, phi_k, v, causal=is_causal, chunk=self.chunk_size,
                               eps=self._guard(shift_q, shift))
        return out.to(out_dtype)

    def _guard(self, shift_q: Tensor, shift_k: Tensor) -> Tensor:
        """The denominator guard ``eps`` of the unshifted formula, carried into the shifted
        features, (B, H, Tq, 1): φ(q)ᵀφ(k) is computed as e^{-(c_q + c_k)}·φ(q)ᵀφ(k), so the
        guard is e^{-(c_q + c_k)}·eps, and the output is Σφ(q)ᵀφ(k)v / (Σφ(q)ᵀφ(k) + eps)
        whatever the shifts. So the key shift, taken over all keys, cannot make a causal
        query's output depend on later keys, nor decoding differ from the full pass. At least
        the smallest normal number, so that a query with no key gets 0, not 0/0."""
        guard = torch.exp(math.log(self.eps) - shift_q - shift_k)
        return guard.clamp_min(torch.finfo(guard.dtype).tiny)

    def decode(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        state: DecodeState | None,
        *,
        key_padding_mask: Tensor | None = None,
        dropout_p: float = 0.0,
    ) -> tuple[Tensor, DecodeState]:
        check_inputs(self.name, q, k, v, key_padding_mask, None, dropout_p)
        self.check_attention_dropout(dropout_p)
        d = q.shape[-1]
        self._features_ready(d)
        draw = self.__dict__.get("_draw", 0)
        if state is not None and state.length > 0 and state.source != draw:
            raise ValueError(
                f"performer backend: this decoding state ({state.length} positions) was made "
                "with features that have been redrawn since (redraw_features, a changed "
                "feature option or a loaded state dict); its sums cannot be continued with the "
                "new ones: decode the sequence again from its start")
        root = math.sqrt(default_scale(self.scale, d))
        omega = self.omega.to(q.device)
        acc, out_dtype = compute_dtype(q.dtype), v.dtype  # as forward: half in float32
        q, k, v = q.to(acc), k.to(acc), v.to(acc)
        phi_q, shift_q = _shifted_query_features(q * root, omega)
        log_k = _log_features(k * root, omega)
        latest = _key_maxima(log_k, key_padding_mask).amax(dim=-1, keepdim=True).unsqueeze(-1)
        if state is not None and state.length > 0:
            old = state.tensors["shift"]  # the largest unpadded key exponent so far, or -inf
            latest = torch.maximum(latest, old)
        shift = _finite(latest)  # (B, H, 1, 1)
        if state is not None and state.length > 0:
            factor = torch.exp(old - shift)  # rescale the sums to the new shift (0 if none)
            state = DecodeState(state.length, {"kv": state.tensors["kv"] * factor,
                                               "z": state.tensors["z"] * factor[..., 0]})
        phi_k = torch.exp(log_k - shift) / math.sqrt(omega.shape[0])
        if key_padding_mask is not None:
            phi_k = phi_k.masked_fill(key_padding_mask[:, None, :, None], 0.0)
        out, state = kernel_decode(phi_q, phi_k, v, state, chunk=self.chunk_size,
                                   eps=self._guard(shift_q, shift), extra={"shift": latest})
        state.source = draw
        return out.to(out_dtype), state
