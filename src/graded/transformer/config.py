"""Model configuration: one serialisable config for every transformer shape.

A :class:`graded._schema.ConfigModel` (pydantic v2, unknown keys are errors, assignments are
validated). Each choice is checked against the constant of the module that implements it:
:data:`graded.positional.POSITIONAL`, :data:`graded.transformer.layers.ACTIVATIONS` and
``NORMS``, :data:`graded.attention.scores.SCORES`, the attention backend registry,
:data:`graded.grading.GRADINGS` and ``LINEAR_FUNCTIONS``,
:data:`graded.attention.graded.VARIANTS` and :data:`graded.transformer.graded.GRADE_INITS`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BeforeValidator, Field, model_validator

from graded._schema import (
    ConfigModel,
    Invalid,
    choice,
    is_int,
    is_number,
    positive_int,
    satisfies,
)
from graded.attention.backends import available_backends
from graded.attention.graded import VARIANTS
from graded.attention.scores import SCORES
from graded.grading import GRADINGS, LINEAR_FUNCTIONS
from graded.positional import POSITIONAL, TABLE_POSITIONAL, position_start
from graded.transformer.config_reads import (
    FOLLOWS,
    GRADING_FIELDS,
    refuse_forgotten_grading,
    refuse_unread,
)
from graded.transformer.layers import ACTIVATIONS, NORMS

__all__ = ["CYCLE_KEYS", "FOLLOWS", "GRADING_FIELDS", "TOKEN_GRADE_STAGES", "TransformerConfig"]

#: The keys of an ``attn_backend_cycle`` entry.
CYCLE_KEYS = ("backend", "options")

#: Stages that per-token grading acts on (000 §6.2 input representation, Remark 6.16).
TOKEN_GRADE_STAGES = ("input", "ffn", "output")

def _grade_inits() -> tuple[str, ...]:
    # graded.transformer.graded imports this module: read its constant when validating.
    from graded.transformer.graded import GRADE_INITS

    return GRADE_INITS


def _probability(optional: bool = False) -> BeforeValidator:
    return satisfies(lambda v: is_number(v) and 0.0 <= v < 1.0, "a probability in [0, 1)",
                     optional=optional)


def _finite(v: Any) -> bool:
    """A number, neither infinite nor NaN (either would reach the weights or grades
    silently)."""
    return is_number(v) and math.isfinite(v)


PositiveInt = Annotated[int, positive_int()]
OptionalPositiveInt = Annotated[int | None, positive_int(optional=True)]


def _python_values(value: Any) -> Any:
    """``value`` with every NumPy scalar in it (through dicts, lists and tuples) as the Python
    number or bool it holds: a backend accepts ``np.False_`` or ``np.int64(8)`` as its option,
    and the config keeps the options to save them as JSON or YAML, which take Python values
    only (a NumPy scalar kept as given made ``to_json`` fail)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _python_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_python_values(v) for v in value]
    return value


#: A backend's options (name -> value), NumPy scalars read as Python values.
BackendOptions = Annotated[dict[str, Any], BeforeValidator(_python_values)]


class TransformerConfig(ConfigModel):
    """Hyperparameters of a transformer (002 Ch. 3, 6; 003 §2).

    ``vocab_size`` is the token vocabulary; set it to None and ``input_dim`` to a feature size
    for models over real-valued inputs (encoder classifiers/regressors). ``n_decoder_layers``
    defaults to ``n_layers`` in seq2seq models. ``positional``: ``sinusoidal`` (0-indexed),
    ``sinusoidal1`` (1-indexed, 003 §2.2), ``learned``, ``rope``, ``alibi`` or ``none``.
    ``norm_first`` selects pre-norm blocks (post-norm as in Vaswani et al. otherwise).
    ``rope_base`` is RoPE's θ (ω_m = θ^{-2m/d}). ``n_kv_heads`` < ``n_heads`` selects
    grouped-query attention (keys and values shared by groups of heads; 1 = multi-query).
    ``activation``: ``relu``, ``gelu``, ``gelu_tanh`` (GPT-2's approximation), ``silu`` or the
    gated ``swiglu``. Switches that reference models need: ``qkv_bias``, ``out_bias`` and
    ``ffn_bias`` (None: as ``bias``) for the attention input and output projections and the FFN;
    ``final_norm`` (None: a final norm on pre-norm stacks only, as GPT-2; True adds one to a
    post-norm stack too, as ``torch.nn.Transformer``); ``embed_scale`` multiplies token
    embeddings by √d_model (Vaswani et al. §3.4); ``embed_norm`` normalises the summed
    embeddings (BERT); ``logit_bias`` adds a bias to the LM/seq2seq output layer.
    ``d_ff`` (None: 4·``d_model``), ``n_kv_heads`` (None: ``n_heads``), ``attn_dropout`` (None:
    ``dropout``) and these switches take another field's value when None, as :data:`FOLLOWS`
    says; :meth:`resolved` reads the value a model takes.
    ``attn_backend`` names the self-attention backend and ``cross_attn_backend`` (default
    ``"full"``) the cross-attention one of seq2seq decoders (see
    :mod:`graded.attention.backends`), each with its ``*_options``. A combination a backend
    cannot serve (``positional="alibi"``, an ``attn_score`` other than ``scaled_dot``) is
    refused here, naming the backends that can; causal and cross-attention are checked when a
    decoder is built, attention weights and generation with a cache when asked for.
    ``attn_backend_cycle`` (default empty: every layer on ``attn_backend``) gives
    self-attention layer r of each stack (encoder layers, decoder layers, each counted from 0)
    entry r mod len(cycle), a dict with optional keys ``"backend"`` (default ``attn_backend``)
    and ``"options"`` (merged over ``attn_backend_options`` when the backend is
    ``attn_backend``, alone otherwise): the Sparse Transformer's interleaved factorized
    attention, attention(X) = W_p · attend(X, A^(r mod p)) (Child et al. 2019, §5.1, Eq. 6),
    e.g. ``[{"options": {"part": "local"}}, {"options": {"part": "summary"}}]`` on
    ``sparse_fixed`` (:meth:`layer_backend`). Each entry meets the checks ``attn_backend``
    meets. Every backend (``attn_backend``, ``cross_attn_backend``, each cycle entry's) is
    built once here with its options, so an option it refuses (unknown, missing, or a value
    such as ``window=0``) is refused when the config is made, in the backend's own words.

    Grading fields (000 §5-7) select the feature-graded LGT/EGT: ``grading`` is None
    (ungraded), ``"linear"`` or ``"exponential"``; ``grading_f`` (LGT's f), ``grading_base``
    (EGT's λ), ``learnable_grades``, ``grades_per_head``, ``grade_init`` (``neutral`` = M = I,
    ``zeros``, ``constant`` or ``warm_start`` q_k = c·k with c = ``grade_init_value``),
    ``grade_attention_variant``, the stage switches ``grade_input``, ``grade_positions``,
    ``grade_attention``, ``grade_ffn``, ``grade_output``, ``grade_normalize`` and
    ``grade_position_alpha`` (α of the graded positions, which scale the added Pe(t): a table
    positional, sinusoidal or learned, only) and ``input_grades`` (the natural
    grades of the input features, length ``input_dim``, e.g. a task's grading tuple).
    ``fold_grading`` (default True) folds each diagonal grading that sits next to a linear map
    into that map's weights where this is exact (the attention projections, the FFN's output
    layer, the output head); False applies every grading to the activations, the formulas as
    written. The two agree up to rounding. See
    :mod:`graded.transformer.graded` and :mod:`graded.attention.graded`.

    The stages through which grading changes the function class (a fixed diagonal grading next
    to a linear map is a reparametrisation; docs/what_grading_changes.md), each a switch on a
    graded config: ``token_grading`` (per-token grading matrices M_{q_i} with q_i = s_i·p from
    each token's grade s_i, passed as ``token_grades`` to the model, at the
    ``token_grade_stages`` input, ffn, output; 000 §6.2, Remark 6.16; a classifier or
    regressor pools its tokens before the output layer, so it grades them per token at the
    input and ffn stages only, ``TransformerClassifier.UNAPPLIED_TOKEN_STAGES``: left out,
    the stages are every stage the model has, and a run config refuses a list naming
    "output" for it),
    ``grade_input_activation`` (``"relu"``: 000 Def 5.19's h_i = σ(W x''_i + b)) and
    ``grade_position_normalize`` (000 Eq. 48: z'_i = z_i/‖z_i‖ after the graded positions are
    added).

    A field set away from its default where this config leaves it unread (``input_grades``
    with ``grade_input=False``, ``rope_base`` without rotary positions, ...) is refused, as it
    would change nothing (:mod:`graded.transformer.config_reads`); the fields a model kind
    leaves unread are refused by a run config (:func:`graded.transformer.models.unread_fields`).
    The grading's fields (:data:`GRADING_FIELDS`) set on a config that leaves ``grading`` out are
    refused too, naming them: the model would be ungraded;
    ``grading=None`` given explicitly keeps them, the ungraded twin of a graded config.

    Errors are ValueErrors reading ``TransformerConfig.<field>=<value> is invalid: expected
    ...``. A switch (a bool field) takes True or False only: 1, 0 or ``"yes"`` are refused (the
    rule of every config, :class:`graded._schema.Strict`).
    """

    vocab_size: OptionalPositiveInt = 256
    d_model: PositiveInt = 128
    n_heads: PositiveInt = 4
    n_layers: PositiveInt = 2
    n_kv_heads: OptionalPositiveInt = None
    rope_base: Annotated[float, satisfies(lambda v: _finite(v) and v > 1,
                                          "a finite number > 1 (RoPE's θ)")] = 10000.0
    d_ff: OptionalPositiveInt = None
    max_len: PositiveInt = 512
    dropout: Annotated[float, _probability()] = 0.0
    attn_dropout: Annotated[float | None, _probability(optional=True)] = None
    positional: Annotated[Literal[POSITIONAL], choice(POSITIONAL)] = "sinusoidal"
    activation: Annotated[Literal[ACTIVATIONS], choice(ACTIVATIONS)] = "gelu"
    norm: Annotated[Literal[NORMS], choice(NORMS)] = "layer"
    norm_eps: Annotated[float, satisfies(lambda v: _finite(v) and v > 0,
                                                "a finite positive number")] = 1e-5
    norm_first: bool = True
    bias: bool = True
    # Architecture switches of reference models (None = follow ``bias`` / the norm placement).
    qkv_bias: bool | None = None
    out_bias: bool | None = None
    ffn_bias: bool | None = None
    final_norm: bool | None = None
    embed_scale: bool = False
    embed_norm: bool = False
    logit_bias: bool = False
    tie_embeddings: bool = True
    attn_backend: Annotated[str, choice(available_backends)] = "full"
    attn_backend_options: BackendOptions = Field(default_factory=dict)
    attn_backend_cycle: Annotated[list[dict[str, Any]], BeforeValidator(_python_values)] = Field(
        default_factory=list)
    cross_attn_backend: Annotated[str, choice(available_backends)] = "full"
    cross_attn_backend_options: BackendOptions = Field(default_factory=dict)
    attn_score: Annotated[Literal[SCORES], choice(SCORES)] = "scaled_dot"
    # a token id: ints only (pydantic would take True as 1, "3" as 3); its range is checked below
    pad_id: Annotated[int | None, satisfies(is_int, "a token id (an int)", optional=True)] = None
    input_dim: OptionalPositiveInt = None
    n_decoder_layers: OptionalPositiveInt = None
    init_std: Annotated[float, satisfies(lambda v: _finite(v) and v >= 0,
                                         "a finite standard deviation >= 0")] = 0.02
    # Feature grading (000 §5-7): None, "linear" (LGT) or "exponential" (EGT).
    grading: Annotated[Literal[GRADINGS] | None, choice(
        GRADINGS, optional=True, what="None, 'linear' (LGT) or 'exponential' (EGT)")] = None
    grading_f: Annotated[Literal[LINEAR_FUNCTIONS], choice(LINEAR_FUNCTIONS)] = "shift"
    grading_base: Annotated[float, satisfies(lambda v: _finite(v) and v > 1.0,
                                              "a finite base lambda > 1 (000 Def 6.1)")] = 2.0
    learnable_grades: bool = False
    grades_per_head: bool = False
    grade_init: Annotated[str, choice(_grade_inits)] = "neutral"
    grade_init_value: Annotated[float, satisfies(_finite, "a finite number")] = 0.0
    grade_attention_variant: Annotated[Literal[VARIANTS], choice(VARIANTS)] = "scores"
    grade_input: bool = True
    grade_positions: bool = True
    grade_attention: bool = True
    grade_ffn: bool = True
    grade_output: bool = True
    grade_normalize: bool = False
    grade_position_alpha: Annotated[float, satisfies(
        lambda v: _finite(v) and v >= 0, "a finite number >= 0")] = 0.0
    fold_grading: bool = True
    input_grades: Annotated[list[float] | None, satisfies(
        lambda v: isinstance(v, list | tuple) and all(_finite(q) for q in v),
        "a list of finite grades", optional=True)] = None
    # Stages through which grading changes the function class (docs/what_grading_changes.md).
    token_grading: bool = False
    token_grade_stages: list[Literal[TOKEN_GRADE_STAGES]] = Field(
        default_factory=lambda: list(TOKEN_GRADE_STAGES))
    grade_input_activation: Annotated[Literal["relu"] | None, choice(
        ("relu",), optional=True, what="None or 'relu' (000 Def 5.19's sigma)")] = None
    grade_position_normalize: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ff_dim(self) -> int:
        """The FFN's hidden width: ``d_ff``, or 4·``d_model`` where it is None."""
        return self.resolved("d_ff")

    def follows(self, name: str) -> Any:
        """The value that None stands for in field ``name`` of :data:`FOLLOWS` (4·``d_model``
        for ``d_ff``, ``bias`` for ``qkv_bias``, ...), whatever ``name`` holds."""
        if name not in FOLLOWS:
            raise KeyError(f"TransformerConfig.{name} follows no other field; expected one of "
                           f"{list(FOLLOWS)}")
        source, rule = FOLLOWS[name]
        return rule(getattr(self, source))

    def resolved(self, name: str) -> Any:
        """Field ``name`` of :data:`FOLLOWS` as the model takes it: its value, or where it is
        None the value of the field it follows (:meth:`follows`)."""
        followed, value = self.follows(name), getattr(self, name)
        return followed if value is None else value

    def layer_backend(self, layer: int) -> tuple[str, dict[str, Any]]:
        """The (backend name, options) of self-attention layer ``layer`` of a stack:
        ``attn_backend`` and ``attn_backend_options`` without a cycle, else entry
        ``layer mod len(attn_backend_cycle)`` (its options over ``attn_backend_options`` when
        it keeps ``attn_backend``, alone otherwise)."""
        if not self.attn_backend_cycle:
            return self.attn_backend, dict(self.attn_backend_options)
        entry = self.attn_backend_cycle[layer % len(self.attn_backend_cycle)]
        name = entry.get("backend", self.attn_backend)
        options = dict(entry.get("options", {}))
        if name == self.attn_backend:
            options = {**self.attn_backend_options, **options}
        return name, options

    @staticmethod
    def _check_backend_options(field: str, name: str, options: dict[str, Any],
                               shown: Any = None) -> None:
        """Backend ``name`` built once with ``options``, as a model builds it
        (:func:`graded.attention.backends.get_backend`: unknown and missing options, then the
        backend's own checks of each value), so that an option it refuses (a misspelled one,
        ``window=0`` for ``sliding_window``) is refused when the config is made, not when a
        model is built; the error names ``field`` with its value (``shown``, default
        ``options``) and repeats the backend's, which names the option, the backend and what
        it expects."""
        from graded.attention.backends import get_backend

        try:
            get_backend(name, **options)
        except (TypeError, ValueError) as error:
            raise Invalid(f"options that backend {name!r} accepts ({error})", field,
                          options if shown is None else shown) from error

    def _check_cycle(self) -> None:
        """Each ``attn_backend_cycle`` entry: known keys, a registered backend, options the
        backend accepts (:meth:`_check_backend_options`); the error names the entry."""
        field = "attn_backend_cycle"
        for r, entry in enumerate(self.attn_backend_cycle):
            where = f"{field}[{r}]"
            if not isinstance(entry, dict):
                raise Invalid(f"a dict with optional keys {', '.join(CYCLE_KEYS)}", where, entry)
            unknown = sorted(set(entry) - set(CYCLE_KEYS))
            if unknown:
                raise Invalid(f"a dict with optional keys {', '.join(CYCLE_KEYS)}, not "
                              f"{', '.join(map(repr, unknown))}", where, entry)
            name = entry.get("backend", self.attn_backend)
            known = available_backends()
            if not isinstance(name, str) or name not in known:
                raise Invalid(f"a backend name, one of {', '.join(known)}", f"{where}.backend",
                              name)
            options = entry.get("options", {})
            if not isinstance(options, dict):
                raise Invalid("a dict of backend options", f"{where}.options", options)
            self._check_backend_options(f"{where}.options", name, self.layer_backend(r)[1],
                                        options)

    @model_validator(mode="after")
    def _across_fields(self) -> TransformerConfig:
        """The checks that involve several fields; each names the field it blames."""

        def need(ok: bool, name: str, expected: str) -> None:
            if not ok:
                raise Invalid(expected, name, getattr(self, name))

        need(self.vocab_size is not None or self.input_dim is not None, "vocab_size",
             "a vocabulary size, or input_dim for real-valued inputs")
        need(self.d_model % self.n_heads == 0, "d_model",
             f"a multiple of n_heads={self.n_heads}")
        need(self.n_kv_heads is None or self.n_heads % self.n_kv_heads == 0, "n_kv_heads",
             f"None or a divisor of n_heads={self.n_heads} (grouped-query attention)")
        need(self.positional not in ("sinusoidal", "sinusoidal1") or self.d_model % 2 == 0,
             "d_model", "an even number for sinusoidal positions")
        need(self.positional != "rope" or self.head_dim % 2 == 0, "d_model",
             "d_model/n_heads even for rotary positions")
        need(self.pad_id is None or (self.vocab_size is not None
                                     and 0 <= self.pad_id < self.vocab_size),
             "pad_id", f"None or a token id in [0, {self.vocab_size})")
        # a token model reads ids: input_dim and input_grades would be ignored without a word
        need(self.vocab_size is None or self.input_dim is None, "input_dim",
             f"None for a token model (vocab_size={self.vocab_size}): set vocab_size=None for "
             "real-valued inputs of input_dim features")
        need(self.input_grades is None or (self.input_dim is not None
                                           and len(self.input_grades) == self.input_dim),
             "input_grades", f"None or a list of input_dim={self.input_dim} grades (feature "
             "inputs only)")
        need(self.input_grades is None or self.grading is not None, "input_grades",
             "None on an ungraded model (the grades of its input grading): set "
             "grading='linear' or 'exponential'")
        from graded.attention.backends import FEATURES, backend_capabilities, backends_supporting

        # the options of each backend, as the backend checks them (the cycle's entries below)
        self._check_backend_options("attn_backend_options", self.attn_backend,
                                    self.attn_backend_options)
        self._check_backend_options("cross_attn_backend_options", self.cross_attn_backend,
                                    self.cross_attn_backend_options)
        self._check_cycle()
        # the self-attention backends (attn_backend, then each cycle entry's) and cross's
        self_attention = [("attn_backend", self.attn_backend)] + [
            (f"attn_backend_cycle[{r}].backend", self.layer_backend(r)[0])
            for r in range(len(self.attn_backend_cycle))]
        cross = [("cross_attn_backend", self.cross_attn_backend)]

        def able(backends: list[tuple[str, str]], feature: str, why: str) -> None:
            for field, name in backends:
                if not getattr(backend_capabilities(name), feature):
                    raise Invalid(f"a backend that serves {FEATURES[feature]} ({why}): one of "
                                  f"{', '.join(backends_supporting(feature))}", field, name)

        if self.positional == "alibi":
            able(self_attention, "attn_bias", "positional='alibi'")
        if self.attn_score != "scaled_dot":
            able(self_attention + cross, "custom_score", f"attn_score={self.attn_score!r}")
        for name in ("token_grading", "grade_input_activation", "grade_position_normalize"):
            need(self.grading is not None or not getattr(self, name), name,
                 "unset on an ungraded model (it is a stage of the graded transformer): set "
                 "grading='linear' or 'exponential'")
        refuse_forgotten_grading(self)
        need(not (self.token_grading and self.grading == "linear"
                  and self.grading_f == "identity"), "grading_f",
             "'shift', 'abs_shift' or 'softplus' with token_grading: f = identity gives f(0) = 0, "
             "so M_{q_i} = 0 for every token of grade s_i = 0 (q_i = s_i·p)")
        need(len(set(self.token_grade_stages)) == len(self.token_grade_stages)
             and len(self.token_grade_stages) > 0, "token_grade_stages",
             f"a non-empty list of distinct stages from {list(TOKEN_GRADE_STAGES)}")
        # 000 Def 5.21 grades the position vectors Pe(t) added to the embeddings: rope, alibi
        # and none add none, so alpha would change nothing
        need(self.grading is None or not self.grade_positions or self.grade_position_alpha == 0
             or self.positional in TABLE_POSITIONAL, "grade_position_alpha",
             f"0 with positional={self.positional!r}, which adds no position vectors for the "
             f"graded positions to scale (000 Def 5.21), or a positional of "
             f"{list(TABLE_POSITIONAL)}")
        last = self.max_len - 1 + position_start(self.positional)  # the last position t
        need(self.grading != "linear" or self.grade_position_alpha * last < 1.0,
             "grade_position_alpha",
             f"alpha*{last} < 1 so that the LGT factor 1 - alpha*t stays positive up to the "
             f"last position t = {last} (max_len={self.max_len}, positional="
             f"{self.positional!r})")
        refuse_unread(self)
        return self
