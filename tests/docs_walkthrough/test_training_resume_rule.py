"""docs/training.md, "The resume rule": the table of keys that may change on resume and the
list of refused `train.*` keys together name every field of `TrainOptions` once, each on the
side `graded.train.runs.resume_changes` puts it.

The page once left `train.compile` out of the table (a resume accepts it) and
`train.precision` out of the refused list (a resume refuses it), while saying "these keys may
change and everything else is refused".
"""

import re
from pathlib import Path

from graded.train.options import TrainOptions
from graded.train.runs import resume_changes

DOC = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def resume_rule(text: str) -> tuple[set[str], set[str]]:
    """The `train.*` fields the page lets change on resume, and those it says are refused."""
    section = text.split("**The resume rule.**", 1)[1].split("A refusal is one", 1)[0]
    table, refused = section.split("Refused:", 1)
    may = set()
    for row in table.splitlines():
        cells = row.split("|")
        if len(cells) > 2 and "train." in cells[1]:
            may |= set(re.findall(r"`(?:train\.)?(\w+)`", cells[1]))
    after = refused.split("`recipe.*`", 1)[1]  # "... and `train.batch_size`, `grad_accum`, ..."
    return may, set(re.findall(r"`(?:train\.)?(\w+)`", after))


def changed_value(value):
    """Another value of a TrainOptions field: resume_changes compares values, not types."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return f"other-{value}"


def test_the_resume_rule_names_every_train_option_on_the_side_a_resume_puts_it():
    may, refused = resume_rule(DOC.read_text(encoding="utf-8"))
    assert not may & refused, may & refused
    options = TrainOptions()
    for name in TrainOptions.model_fields:
        old = {"train": {name: getattr(options, name)}}
        new = {"train": {name: changed_value(getattr(options, name))}}
        accepted, rejected = resume_changes(old, new)
        assert f"train.{name}" in {**accepted, **rejected}, name
        side = "may change" if f"train.{name}" in accepted else "refused"
        assert name in (may if side == "may change" else refused), (
            f"train.{name}: a resume says {side}, the page does not list it there")
    assert may | refused <= set(TrainOptions.model_fields), (may | refused) - set(
        TrainOptions.model_fields)
