"""graded.plotting: a PNG written whole or not at all, the figure closed either way, and a
session's own matplotlib backend and figures left alone."""

import matplotlib
import pytest

from graded.plotting import pyplot, save_figure


def test_a_failed_drawing_leaves_the_old_png_whole_and_closes_the_figure(tmp_path):
    # savefig wrote into the file itself: a drawing that failed half way (or a Ctrl-C) left a
    # truncated PNG in place of the old one, and the figure open
    path = tmp_path / "curve.png"
    plt = pyplot()
    save_figure(plt.figure(), path)
    old = path.read_bytes()
    fig = plt.figure()

    def half_drawn(target, **kwargs):
        target.write(b"\x89PNG half")
        raise KeyboardInterrupt

    fig.savefig = half_drawn
    with pytest.raises(KeyboardInterrupt):
        save_figure(fig, path)
    assert path.read_bytes() == old
    assert fig.number not in plt.get_fignums()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.png"]


def test_the_png_is_what_savefig_draws(tmp_path):
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save_figure(fig, tmp_path / "a.png", dpi=50)
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(TypeError, match=r"dpi must be an int, got True"):
        save_figure(plt.figure(), tmp_path / "b.png", dpi=True)


def test_a_session_with_pyplot_keeps_its_backend_and_its_figures():
    # matplotlib.use("Agg") on every call switched an imported pyplot's backend, which closes
    # every open figure (a notebook's among them)
    plt = pyplot()
    plt.switch_backend("svg")
    try:
        mine = plt.figure()
        assert pyplot() is plt
        assert matplotlib.get_backend().lower() == "svg"
        assert mine.number in plt.get_fignums()
        plt.close(mine)
    finally:
        plt.switch_backend("Agg")
