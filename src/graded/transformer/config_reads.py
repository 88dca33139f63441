"""How a :class:`~graded.transformer.config.TransformerConfig` reads its fields: the fields whose
None follows another (:data:`FOLLOWS`), and the fields it would leave unread: set away from
their defaults they would change nothing without a word, so the config refuses them (its
cross-field validation calls these), naming the field and the setting that leaves it unread.
``config`` is the config being validated."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from graded._schema import Invalid

if TYPE_CHECKING:
    from graded.transformer.config import TransformerConfig

__all__ = ["FOLLOWS", "GRADING_FIELDS", "refuse_forgotten_grading", "refuse_unread"]


def _same(value: Any) -> Any:
    return value


#: The fields whose None follows another field, each with the field it follows and the rule
#: that turns that field's value into the one None stands for:
#: :meth:`TransformerConfig.resolved` reads a field's value as a model takes it.
FOLLOWS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "d_ff": ("d_model", lambda d_model: 4 * d_model),
    "n_kv_heads": ("n_heads", _same),
    "attn_dropout": ("dropout", _same),
    "qkv_bias": ("bias", _same),
    "out_bias": ("bias", _same),
    "ffn_bias": ("bias", _same),
    "final_norm": ("norm_first", _same),
}

#: The fields of the grading that ``grading`` selects (000 §5-7): only a graded model reads
#: them, so set on a config that leaves ``grading`` out they would change nothing
#: (:func:`refuse_forgotten_grading`). ``input_grades``, ``token_grading``,
#: ``grade_input_activation`` and ``grade_position_normalize`` are refused on every ungraded
#: config, ``grading=None`` given or not: they would add a stage to the model.
GRADING_FIELDS = (
    "grading_f", "grading_base", "learnable_grades", "grades_per_head", "grade_init",
    "grade_init_value", "grade_attention_variant", "grade_input", "grade_positions",
    "grade_attention", "grade_ffn", "grade_output", "grade_normalize", "grade_position_alpha",
    "fold_grading", "token_grade_stages",
)


def _grade_inits_reading_value() -> dict[str, bool]:
    """Whether each grade init reads ``grade_init_value``, as its entry says
    (:attr:`graded.transformer.grading_plan.GradeInit.reads_value`), read when validating."""
    from graded.transformer.grading_plan import GRADE_INIT_ENTRIES

    return {name: entry.reads_value for name, entry in GRADE_INIT_ENTRIES.items()}


def refuse_forgotten_grading(config: TransformerConfig) -> None:
    """Refuse fields of :data:`GRADING_FIELDS` set away from their defaults on a config
    that leaves ``grading`` out: the model built is ungraded and reads none of them, so a
    config meant to be graded (``learnable_grades=True`` without ``grading``) would
    train an ungraded model without a word. The error blames ``grading`` and names each
    such field with its value. A ``grading=None`` given explicitly (or assigned) keeps
    them as the settings of the grading the config would have, so that it alone turns
    a graded config's grading off (the ungraded twins the shipped configs suggest,
    ``--set model.grading=null``)."""
    if config.grading is not None or "grading" in config.model_fields_set:
        return
    fields = type(config).model_fields
    given = [f"{name}={getattr(config, name)!r}" for name in GRADING_FIELDS
             if getattr(config, name)
             != fields[name].get_default(call_default_factory=True)]
    if given:
        raise Invalid(
            f"'linear' or 'exponential' for the grading settings {', '.join(given)} to "
            "have effect: with grading left out the model is ungraded and reads no "
            "grading setting; set grading, or leave those settings out (given explicitly, "
            "grading=None keeps them, as the settings of the grading an ungraded twin "
            "would have)", "grading", config.grading)


def refuse_unread(config: TransformerConfig) -> None:
    """Refuse a field set away from its default where the model would not read it, which
    would change nothing without a word; the error names the field, the setting that
    leaves it unread and why. The grading's own fields are checked on a graded config
    only: on one given ``grading=None`` they stay the settings of the grading it would
    have, so that ``grading=None`` alone turns grading off (the ungraded twins the
    shipped configs suggest; with ``grading`` left out they are refused,
    :func:`refuse_forgotten_grading`); so do ``grading_f`` on an EGT and ``grading_base`` on an
    LGT, the settings of the other kind, so that ``grading`` alone switches the kind.
    Fields that one model kind reads and another does not (``n_decoder_layers``,
    ``tie_embeddings``, ...) are checked where the kind is known:
    :func:`graded.transformer.models.unread_fields`."""
    stages = config.token_grade_stages if config.token_grading else []
    unread = [
        ("input_grades", not config.grade_input,
         "grade_input=False grades no input features, so their grades are never read"),
        ("rope_base", config.positional != "rope",
         f"positional={config.positional!r} has no rotary positions, whose theta it is"),
    ]
    if config.grading is not None:
        reads = _grade_inits_reading_value()  # an init without an entry: its build says so
        unread += [
            ("grade_init_value", not reads.get(config.grade_init, True),
             f"grade_init={config.grade_init!r} reads no value; the grade inits that read "
             f"it: {', '.join(repr(name) for name, read in reads.items() if read)}"),
            ("grade_position_alpha", not config.grade_positions,
             "grade_positions=False grades no position vectors"),
            ("grades_per_head", not config.grade_attention,
             "grade_attention=False grades no attention"),
            ("grade_attention_variant", not config.grade_attention,
             "grade_attention=False grades no attention"),
            ("token_grade_stages", not config.token_grading,
             "token_grading=False grades no stage per token"),
            ("grade_normalize", not (config.grade_input or config.grade_ffn or "ffn" in stages
                                     or ("input" in stages and config.vocab_size is not None)),
             "grade_input=False and grade_ffn=False (and no per-token input or ffn stage) "
             "leave no graded input or ffn stage, the stages it normalises (000 Def 5.19, "
             "5.23)"),
        ]
    for name, ignored, why in unread:
        default = type(config).model_fields[name].get_default(call_default_factory=True)
        if ignored and getattr(config, name) != default:
            raise Invalid(f"its default {default!r} (or left out): {why}", name,
                          getattr(config, name))
