"""The study's experiments, registered by name (E1 … E9) in report order.

:func:`registry` returns ``{name: experiment}``; every class below implements
:class:`graded.study.core.Experiment` (E1 also :class:`graded.study.core.JobExperiment`, so the
runner spreads its training runs over the workers).

=====  ===========================================================  ===========================
name   what it measures                                             claims
=====  ===========================================================  ===========================
E1     sample efficiency: learning curves of grading arms           2, 000-S, 7, 000-I
E2     robustness: noise on high/low-grade features, size split,    3, 6, 000-R
       Lipschitz estimates against the ungraded twin
E3     attention rank with the scale-matched control                1
E4/E5  positional bias against α; head diversity                    4, 5
E6     grade-gradient scaling; Jacobian norms against the bounds    6, 7
E7     wall-clock overhead of grading                               8
E8     morphic routing: utilities, ablation, calibration, tools     11–17
E9     numerical checks of 004's statements                         9, 10, 18–28
=====  ===========================================================  ===========================
"""

from __future__ import annotations

from graded.study.core import Experiment
from graded.study.experiments.e1_sample_efficiency import SampleEfficiencyExperiment
from graded.study.experiments.e2_robustness import RobustnessExperiment
from graded.study.experiments.e3_rank import RankExperiment
from graded.study.experiments.e6_gradients import GradientsExperiment
from graded.study.experiments.e7_overhead import OverheadExperiment
from graded.study.experiments.e8_morphic import MorphicExperiment
from graded.study.experiments.e9_numerics import NumericsExperiment
from graded.study.experiments.e45_heads_positions import PositionsHeadsExperiment

__all__ = ["registry", "select"]


def registry() -> dict[str, Experiment]:
    """Every experiment of the study by name, in report order."""
    experiments: list[Experiment] = [
        SampleEfficiencyExperiment(), RobustnessExperiment(), RankExperiment(),
        PositionsHeadsExperiment(), GradientsExperiment(), OverheadExperiment(),
        MorphicExperiment(), NumericsExperiment(),
    ]
    return {e.name: e for e in experiments}


def select(only: str | None) -> dict[str, Experiment]:
    """The experiments named in ``only`` (comma-separated, e.g. ``"E1,E3"``; ``E4`` or ``E5``
    select ``E4/E5``), or all of them for None. An unknown name is a ValueError listing
    the known ones; so is an ``only`` that names none (``""``, ``","``: an empty shell variable
    would otherwise run the whole study)."""
    every = registry()
    if only is None:
        return every
    alias = {part: name for name in every for part in name.split("/")}
    chosen: dict[str, Experiment] = {}
    for raw in only.split(","):
        want = raw.strip().upper()
        if not want:
            continue
        name = alias.get(want) or (want if want in every else None)
        if name is None:
            raise ValueError(f"--only names unknown experiment {raw.strip()!r}; expected some of "
                             f"{', '.join(every)}")
        chosen[name] = every[name]
    if not chosen:
        raise ValueError(f"--only={only!r} names no experiment; expected some of "
                         f"{', '.join(every)}")
    return {n: e for n, e in every.items() if n in chosen}
