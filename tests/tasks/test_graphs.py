"""Graph properties: families, invariants against independent computations, splits, options.

The independent computations read the graph straight from the tokens (not through the codec)
and use matrix powers where the task uses breadth-first search and loops.
"""

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch

from graded.kinds import run_baselines
from graded.tasks import GraphProperties, get_task
from graded.tasks.graphs import FAMILIES


def parse(task, row):
    """(n, edges as 1-indexed pairs) read from one row of tokens, padding dropped."""
    tokens = task.vocab.decode(row)
    n = int(tokens[0].split("=")[1])
    values = [int(t) for t in tokens[1:]]
    return n, list(zip(values[::2], values[1::2]))


def adjacency(n, edges):
    a = np.zeros((n, n), dtype=np.int64)
    for u, v in edges:
        a[u - 1, v - 1] = a[v - 1, u - 1] = 1
    return a


def reachable_everywhere(a):
    """Connected iff (I + A)^(n-1) has no zero entry."""
    n = len(a)
    return bool((np.linalg.matrix_power(np.eye(n, dtype=np.int64) + a, n - 1) > 0).all())


def no_odd_closed_walk(a):
    """Bipartite iff trace(A^k) = 0 for every odd k <= n (a shortest odd cycle has <= n)."""
    return all(np.trace(np.linalg.matrix_power(a, k)) == 0 for k in range(1, len(a) + 1, 2))


def triangles_by_trace(a):
    return int(np.trace(np.linalg.matrix_power(a, 3))) // 6


def graphs_of(task, data):
    return [adjacency(*parse(task, row)) for row in data.inputs]


def isomorphic_by_brute_force(a, b):
    n = len(a)
    return a.shape == b.shape and any(
        np.array_equal(a[np.ix_(p, p)], b) for p in map(list, itertools.permutations(range(n))))


def family_task(family, **options):
    return GraphProperties(graph_families=(family,), **options)


def test_documented_example_is_the_edge_list_after_the_vertex_count():
    task = GraphProperties(max_vertices=5)
    cycle = adjacency(5, [(1, 2), (2, 4), (4, 3), (3, 5), (5, 1)])
    assert " ".join(task.format_graph(cycle)) == "n=5 1 2 1 5 2 4 3 4 3 5"
    data = task.encode_graphs([cycle])
    assert np.array_equal(task.graphs(data)[0], cycle)
    assert data.tensors["token_grades"][0, :11].tolist() == [0] + [2] * 10


def test_trees_have_n_minus_one_edges_and_are_connected():
    task = family_task("tree", min_vertices=3, max_vertices=12)
    for row in task.generate(60, seed=0).inputs:
        n, edges = parse(task, row)
        assert len(edges) == n - 1 and reachable_everywhere(adjacency(n, edges))


def test_random_trees_cover_every_labelled_tree_on_four_vertices():
    task = family_task("tree", min_vertices=4, max_vertices=4)
    shapes = {tuple(parse(task, row)[1]) for row in task.generate(400, seed=1).inputs}
    assert len(shapes) == 4 ** 2  # Cayley: n^(n-2) labelled trees


def test_cycles_are_connected_and_two_regular():
    task = family_task("cycle", min_vertices=3, max_vertices=12)
    for a in graphs_of(task, task.generate(40, seed=2)):
        assert (a.sum(1) == 2).all() and reachable_everywhere(a)


def test_complete_bipartite_graphs_have_no_odd_cycle_and_two_co_cliques():
    task = family_task("complete_bipartite", min_vertices=3, max_vertices=10)
    for a in graphs_of(task, task.generate(40, seed=3)):
        assert no_odd_closed_walk(a)
        # non-adjacency (with v itself) is an equivalence relation with two classes
        classes = {frozenset(np.flatnonzero(a[v] == 0).tolist()) for v in range(len(a))}
        assert len(classes) == 2 and sum(map(len, classes)) == len(a)


@pytest.mark.parametrize("degree", [1, 3, 4])
def test_regular_graphs_have_one_degree_up_to_one_vertex_when_n_d_is_odd(degree):
    task = family_task("regular", degree=degree, min_vertices=3, max_vertices=11)
    for a in graphs_of(task, task.generate(40, seed=4)):
        n, d = len(a), min(degree, len(a) - 1)
        expected = sorted([d] * n if n * d % 2 == 0 else [d - 1] + [d] * (n - 1))
        assert sorted(a.sum(1).tolist()) == expected


def test_edge_swaps_give_many_non_isomorphic_cubic_graphs():
    from graded.encodings import canonical_certificate

    task = family_task("regular", degree=3, min_vertices=10, max_vertices=10)
    classes = {canonical_certificate(a) for a in graphs_of(task, task.generate(40, seed=4))}
    assert len(classes) >= 5  # of the 21 connected and disconnected cubic graphs on 10 vertices


def test_grids_are_connected_bipartite_with_degrees_at_most_four():
    task = family_task("grid", min_vertices=3, max_vertices=16)
    for a in graphs_of(task, task.generate(40, seed=5)):
        n = len(a)
        assert reachable_everywhere(a) and no_odd_closed_walk(a) and a.sum(1).max() <= 4
        # n cells in rows of width w: n - ceil(n/w) horizontal and n - w vertical edges
        widths = range(2, max(2, math.isqrt(n)) + 1)
        assert a.sum() // 2 in {(n - math.ceil(n / w)) + (n - w) for w in widths}


def test_erdos_renyi_edge_density_is_edge_prob():
    task = family_task("erdos_renyi", edge_prob=0.3, min_vertices=10, max_vertices=10)
    density = np.mean([a[np.triu_indices(10, 1)].mean()
                       for a in graphs_of(task, task.generate(200, seed=6))])
    assert abs(density - 0.3) < 0.03


def test_vertex_numbers_are_shuffled_so_cycles_differ():
    task = family_task("cycle", min_vertices=8, max_vertices=8)
    rows = {tuple(row.tolist()) for row in task.generate(20, seed=7).inputs}
    assert len(rows) > 15  # 7!/2 = 2520 labelled 8-cycles


def independent_target(target, n, edges):
    a = adjacency(n, edges)
    if target == "bipartite":
        return int(no_odd_closed_walk(a))
    if target == "connected":
        return int(reachable_everywhere(a))
    if target == "triangles":
        t = triangles_by_trace(a)
        return 0 if t == 0 else 1 if t == 1 else 2 if t <= 3 else 3 if t <= 7 else 4
    if target == "max_degree":
        return max(Counter(v for e in edges for v in e).values(), default=0)
    return len(edges)


@pytest.mark.parametrize("target", ["bipartite", "connected", "triangles", "max_degree", "edges"])
def test_targets_match_an_independent_computation(target):
    task = GraphProperties(target=target, min_vertices=3, max_vertices=9, edge_prob=0.5)
    data = task.generate(150, seed=8)
    expected = [independent_target(target, *parse(task, row)) for row in data.inputs]
    assert data.targets.tolist() == expected
    assert len(set(expected)) > 1


def test_token_grades_are_the_degrees_of_the_named_vertices():
    task = GraphProperties()
    data = task.generate(30, seed=9)
    for row, grades in zip(data.inputs, data.tensors["token_grades"]):
        _, edges = parse(task, row)
        degree = Counter(v for e in edges for v in e)
        expected = [0, *(degree[v] for e in edges for v in e)]
        assert grades.tolist() == expected + [0] * (task.max_len - len(expected))


def test_family_tensor_names_the_generator():
    task = GraphProperties(graph_families=("tree", "cycle"))
    data = task.generate(50, seed=10)
    for row, f in zip(data.inputs, data.tensors["family"].tolist()):
        n, edges = parse(task, row)
        assert len(edges) == {"tree": n - 1, "cycle": n}[FAMILIES[f]]
    assert data.info["families"] == FAMILIES


def test_family_split_trains_and_tests_on_disjoint_families():
    task = GraphProperties(max_vertices=7, test_families=("cycle", "grid"))
    train, test = task.split("family", 120, 60, seed=0)
    train_names = {FAMILIES[f] for f in train.tensors["family"].tolist()}
    test_names = {FAMILIES[f] for f in test.tensors["family"].tolist()}
    assert train_names == {"erdos_renyi", "tree", "complete_bipartite", "regular"}
    assert test_names == {"cycle", "grid"}
    baselines = run_baselines(train, test)
    majority = torch.bincount(train.targets).argmax()
    assert baselines["majority"] == pytest.approx(float((test.targets == majority).float().mean()))


def test_size_split_trains_on_fewer_vertices_with_one_vocabulary():
    task = GraphProperties(target="edges", min_vertices=4, max_vertices=10)
    train, test = task.split("size", 50, 50, seed=0)
    n_train = [parse(task, row)[0] for row in train.inputs]
    n_test = [parse(task, row)[0] for row in test.inputs]
    assert max(n_train) <= 7 < min(n_test)
    small, large = task.size_configs()
    assert small.vocab.tokens == large.vocab.tokens == task.vocab.tokens
    assert small.num_outputs == large.num_outputs == task.num_outputs


@pytest.mark.parametrize("target", ["bipartite", "connected", "triangles", "max_degree", "edges"])
def test_relabelled_copies_are_isomorphic_with_the_same_targets(target):
    task = GraphProperties(target=target, min_vertices=4, max_vertices=6, edge_prob=0.5)
    train, test = task.split("relabelled", 20, 20, seed=0)
    plain = task.generate(20, seed=1)  # the test graphs before relabelling
    shown = task.relabel(plain, seed=2)  # the split's test candidates
    assert torch.equal(shown.targets, plain.targets)
    assert torch.equal(shown.tensors["family"], plain.tensors["family"])
    moved = sum(not torch.equal(a, b) for a, b in zip(shown.inputs, plain.inputs))
    assert moved >= 10
    for a, b in zip(graphs_of(task, shown), graphs_of(task, plain)):
        assert isomorphic_by_brute_force(a, b)
    # the test side: the relabelled graphs that are not shown in training, in order
    seen = {tuple(r) for r in train.inputs.tolist()}
    kept = [r for r in shown.inputs.tolist() if tuple(r) not in seen]
    assert test.inputs.tolist()[: len(kept)] == kept and len(test) == 20
    assert not seen & {tuple(r) for r in test.inputs.tolist()}
    # train holds canonical forms: same targets as drawn, and canonical again is unchanged
    drawn = task.generate(20, seed=0)
    assert torch.equal(train.targets, drawn.targets)
    assert torch.equal(task.canonicalize(train).inputs, train.inputs)
    assert torch.equal(task.canonicalize(shown).inputs, task.canonicalize(plain).inputs)


@pytest.mark.parametrize("options, pattern", [
    ({"target": "colour"}, r"target must be one of .* got 'colour'"),
    ({"graph_families": ("trees",)}, r"graph_families entry must be one of .* got 'trees'"),
    ({"test_families": ()}, r"test_families must name at least one family"),
    ({"graph_families": ("tree", "tree")}, r"graph_families must not repeat a family"),
    ({"min_vertices": 2}, r"min_vertices must be >= 3, got 2"),
    ({"min_vertices": 8, "max_vertices": 6}, r"max_vertices must be >= 8, got 6"),
    ({"max_vertices": 65}, r"max_vertices must be <= 64, got 65"),
    ({"vocab_vertices": 5}, r"vocab_vertices must be >= 10, got 5"),
    ({"edge_prob": 1.5}, r"edge_prob must be <= 1.0, got 1.5"),
    ({"degree": 0}, r"degree must be >= 1, got 0"),
])
def test_bad_options_raise_naming_the_value(options, pattern):
    with pytest.raises(ValueError, match=pattern):
        get_task("graph_properties", **options)


def test_family_split_rejects_held_out_families_it_cannot_use():
    with pytest.raises(ValueError, match=r"test_families \['grid'\] are not among"):
        GraphProperties(graph_families=("tree", "cycle"), test_families=("grid",)).split(
            "family", 5, 5)
    with pytest.raises(ValueError, match="needs a training family"):
        GraphProperties(graph_families=("tree",), test_families=("tree",)).split("family", 5, 5)


def test_a_single_family_name_is_accepted_as_a_one_family_tuple():
    task = get_task("graph_properties", graph_families="tree", test_families="tree")
    assert task.graph_families == ("tree",) and task.config()["test_families"] == ("tree",)
    with pytest.raises(TypeError, match="graph_families must be a family name or a sequence"):
        get_task("graph_properties", graph_families=3)
