"""``graded search`` without a method names the methods this installation has, each one the
parser offers (PatternBoost's command line may be missing: it is then not suggested)."""

from __future__ import annotations

import sys

from graded.cli import main


def test_search_without_a_method_lists_the_methods(capsys):
    assert main(["search"]) == 2
    assert capsys.readouterr().err == ("graded: error: choose a search method: patternboost, "
                                       "program (`graded search METHOD --help` explains one)\n")


def test_a_method_that_is_not_installed_is_not_suggested(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "graded.search.patternboost.cli", None)  # ImportError
    assert main(["search"]) == 2
    assert capsys.readouterr().err == ("graded: error: choose a search method: program "
                                       "(`graded search METHOD --help` explains one)\n")
