"""Problems shipped with program search (003 §3.4–3.5), each with a verifier that trusts nothing.

- `cap-set` (`cap_set_problem(n)`): the greedy cap-set skeleton of 003 Fig. 3.1 in F_3^n.
- `bin-packing` (`bin_packing_problem(dataset)`): FunSearch's online bin packing on the OR3 and
  Weibull 5k instances shipped in `data/` (attribution in `data/README.md`).
- `matmul` (`matmul_problem(n, m, p, rank)`): AlphaEvolve's evolvable optimiser for exact low-rank
  decompositions of the matrix-multiplication tensor.

Importing this package registers the three factories with `register_problem`.
"""

from graded.search.program.problem import register_problem
from graded.search.program.problems.bin_packing import bin_packing_problem
from graded.search.program.problems.cap_set import cap_set_problem
from graded.search.program.problems.matmul import matmul_problem

__all__ = ["bin_packing_problem", "cap_set_problem", "matmul_problem"]

register_problem("cap-set", cap_set_problem)
register_problem("bin-packing", bin_packing_problem)
register_problem("matmul", matmul_problem)
