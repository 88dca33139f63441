"""Arguments of `graded generate` and `graded eval` that no run can use: each is refused in one
line naming the value and what was expected, before any work, rather than dropped silently or
failing deep inside torch."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_configs import tiny_config

from graded.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("generate_arguments")
    assert main(["train", str(tiny_config(tmp))]) == 0
    return tmp / "runs" / "tiny"


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("graded: error: "), err
    assert "Traceback" not in err, err
    return lines[-1]


def _room(run: Path, prompt_len: int) -> int:
    from graded.config import load_run_config

    return load_run_config(run).built_model_config.max_len - prompt_len


def test_generate_refuses_more_min_new_tokens_than_max_new_tokens(run, capsys):
    # the run generated 3 tokens as if --min-new-tokens had not been given
    assert main(["generate", str(run), "--prompt", "( [", "--max-new-tokens", "3",
                 "--min-new-tokens", "5"]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        "graded: error: --min-new-tokens 5 is more than the 3 new tokens generated "
        "(--max-new-tokens 3); give at most 3")


def test_generate_refuses_more_min_new_tokens_than_fit_after_the_prompt(run, capsys):
    room = _room(run, 2)
    assert main(["generate", str(run), "--prompt", "( [", "--min-new-tokens",
                 str(room + 1)]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"graded: error: --min-new-tokens {room + 1} is more than the {room} new tokens "
        f"generated (all that fit in the model's max_len); give at most {room}")


def test_generate_takes_as_many_min_new_tokens_as_it_generates(run, capsys):
    room = _room(run, 2)
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "( [", "--min-new-tokens", str(room)]) == 0
    # the end token is held back for all of them: the whole room is generated
    assert len(capsys.readouterr().out.split()) == 2 + room


def test_generate_takes_the_largest_seed_a_generator_takes(run, capsys):
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "(", "--sample", "--seed",
                 str(2**64 - 1)]) == 0
    assert capsys.readouterr().out.split()[0] == "("


def test_generate_refuses_a_seed_past_64_bits_naming_the_option(run, capsys):
    # it was "graded: error: Overflow when unpacking long long", from torch's manual_seed
    with pytest.raises(SystemExit) as exc:
        main(["generate", str(run), "--prompt", "(", "--sample", "--seed", str(2**64)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (f"argument --seed: expected an integer from 0 to {2**64 - 1}, got {2**64}"
            in err), err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["eval", "generate"])
def test_an_empty_checkpoint_is_refused_as_empty(run, capsys, command):
    # `--checkpoint "$UNSET"`: it was read as the current folder, "checkpoint file
    # state.json: missing (. is not a checkpoint folder)"
    prompt = ["--prompt", "("] if command == "generate" else []
    assert main([command, str(run), "--checkpoint", "", *prompt]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == (f"graded: error: --checkpoint '' is empty; expected 'best', 'latest', a "
                    f"checkpoint folder of {run / 'checkpoints'} (step_000000002) or a path "
                    "to one")
