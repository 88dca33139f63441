"""``diagnose`` on a model whose attention backend draws at every call (``lsh`` without a
seed: fresh random rotations each forward pass, as in the Reformer) measures one draw: its
maps, ranks and head divergences are those of a single naive forward pass made from the
random state the call started in, and it leaves that random state as it found it."""

from __future__ import annotations

import math

import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import diagnose

T = 8


def lsh_lm() -> TransformerLM:
    """Two causal LSH layers: the second layer's Q and K depend on the first layer's draw."""
    torch.manual_seed(0)
    config = tiny_config(attn_backend="lsh",
                         attn_backend_options={"n_buckets": 4, "chunk_size": 2})
    return TransformerLM(config).eval()


def naive_maps(model: TransformerLM, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's exact causal softmax of the Q and K its backend receives in one forward
    pass, recorded by forward pre-hooks on the backends (float64)."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks = [block.self_attn.attn.backend.register_forward_pre_hook(
        lambda _m, args: seen.append((args[0].detach(), args[1].detach())))
        for block in model.decoder.stack.blocks]
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    maps = []
    for q, k in seen:
        scores = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.shape[-1])
        maps.append(torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1))
    return maps


def js_divergence(p: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """½ KL(p ‖ m) + ½ KL(r ‖ m), m = ½(p + r), along the last dimension."""
    m = 0.5 * (p + r)
    return 0.5 * sum((torch.special.xlogy(x, x) - torch.special.xlogy(x, m)).sum(-1)
                     for x in (p, r))


def expected_metrics(maps: list[torch.Tensor]) -> dict[str, float]:
    """Entropy, effective rank (Roy & Vetterli) and mean pairwise head JS of the maps, each
    averaged over layers, written out from their definitions."""
    entropy, eff_rank, js = [], [], []
    for a in maps:
        entropy.append(float(-torch.special.xlogy(a, a).sum(-1).mean()))
        s = torch.linalg.svdvals(a)
        p = s / s.sum(-1, keepdim=True)
        eff_rank.append(float(torch.exp(-torch.special.xlogy(p, p).sum(-1)).mean()))
        h = a.shape[1]
        pairs = [float(js_divergence(a[:, i], a[:, j]).mean())
                 for i in range(h) for j in range(h) if i != j]
        js.append(sum(pairs) / len(pairs))
    n = len(maps)
    return {"entropy/mean": sum(entropy) / n,
            "rank/attention/graded/effective_rank": sum(eff_rank) / n,
            "heads/mean_js": sum(js) / n}


def test_lsh_diagnose_maps_ranks_and_heads_come_from_one_forward_pass():
    model = lsh_lm()
    tokens = torch.randint(0, 11, (2, T), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(5)
    report = diagnose(model, tokens, lipschitz_steps=1, n_random=1)
    torch.manual_seed(5)
    maps = naive_maps(model, tokens)
    torch.manual_seed(6)  # another draw: a different second layer, so the check can fail
    other = expected_metrics(naive_maps(model, tokens))
    want = expected_metrics(maps)
    assert abs(other["rank/attention/graded/effective_rank"]
               - want["rank/attention/graded/effective_rank"]) > 1e-4
    for key, value in want.items():
        assert math.isclose(report.metrics[key], value, rel_tol=1e-5, abs_tol=1e-7), key


def test_lsh_diagnose_leaves_the_callers_random_state_as_it_was():
    model = lsh_lm()
    tokens = torch.randint(0, 11, (2, T), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(3)
    before = torch.get_rng_state()
    diagnose(model, tokens, lipschitz_steps=1, n_random=1)
    assert torch.equal(torch.get_rng_state(), before)
