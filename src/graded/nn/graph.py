"""Graph attention on dense adjacency matrices: GAT, GATv2 and a centrality-graded variant.

- :class:`GATLayer`: 003 §3.6 Eq. (3.1)-(3.2), Veličković et al. 2018:
  e_ij = LeakyReLU(a_1ᵀ W h_i + a_2ᵀ W h_j), α_ij = softmax_{j ∈ N(i)} e_ij, h'_i = Σ_j α_ij W h_j.
  **Erratum:** 003 Remark 3.7 writes LeakyReLU(x) = max(0, x) + α min(0, x) with a *negative* α
  ("such as -0.1"); that function is not monotone (f(-1) = 0.1), contradicting the notes' own
  static-attention argument. GAT uses a small *positive* slope, 0.2, which is the default here.
- :class:`GATv2Layer`: Brody, Alon, Yahav 2022 (003 §3.6 "(2.6')"):
  e_ij = aᵀ LeakyReLU(W_r h_i + W_l h_j), messages W_l h_j (``share_weights`` sets W_r = W_l).
  GAT ranks the neighbours j of every query i in the same order (static attention); GATv2 need
  not (dynamic attention).
- :class:`GradedGraphAttention`: 000 §8.9 (i) "grading nodes by centrality" (the centralities:
  :mod:`graded.nn.centrality`). See its docstring.

Conventions (shared by all three): node features ``x`` (N, F) or (B, N, F); adjacency ``adj``
(N, N) or (B, N, N), any non-zero entry adj[i, j] meaning that j is a neighbour of i (query i
attends to key j; a symmetric matrix is an undirected graph). N(i) contains i itself when
``add_self_loops`` (default, as in 003 §3.6). Attention is exactly zero outside N(i) (003
Remark 3.8 masks the logits with -inf; here with the lowest finite value, then the weights
outside N(i) are set to 0, so that a node with an empty N(i) gets the zero message and no NaN).
``dropout`` acts on the attention weights, as in GAT. The switches (``concat``,
``add_self_loops``, ``bias``, GATv2's ``share_weights`` and ``projection_bias``, ``learn_scale``)
take True or False only: ``concat="false"`` would concatenate, ``bool("false")`` being True;
so does ``need_weights`` of ``forward`` (``need_weights="no"`` would return the weights).
Heads are concatenated (output H·F') or averaged (output F'). The output is *before* the
non-linearity σ of (3.2), so a model chooses σ (ELU in GAT) and can skip it on its last layer.
Row-vector convention of 003 (h W rather than W h). Dense attention costs O(B·H·N²) memory
(GATv2: O(B·H·N²·F')), fine for graphs of a few thousand nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graded._precision import at_least_float32
from graded.checks import check_bool, check_float
from graded.grading import as_grade_tensor
from graded.nn.centrality import CENTRALITIES, CentralityKind, centrality


def _check_graph(x: Tensor, adj: Tensor) -> tuple[Tensor, Tensor, bool]:
    """Batch ``x`` to (B, N, F) and ``adj`` to (B, N, N) bool; report whether x was batched."""
    xb, batched = _batch_features(x, adj)
    ab = (adj if adj.dim() == 3 else adj.unsqueeze(0)) != 0
    return xb, ab.expand(xb.shape[0], -1, -1), batched


def _batch_features(x: Tensor, adj: Tensor) -> tuple[Tensor, bool]:
    """The shape checks of :func:`_check_graph`: ``x`` as (B, N, F), and whether it was."""
    if x.dim() not in (2, 3):
        raise ValueError(f"node features must be (N, F) or (B, N, F), got shape {tuple(x.shape)}")
    batched = x.dim() == 3
    xb = x if batched else x.unsqueeze(0)
    if adj.dim() not in (2, 3) or adj.shape[-1] != adj.shape[-2]:
        raise ValueError(f"adjacency must be (N, N) or (B, N, N), got shape {tuple(adj.shape)}")
    if adj.dim() == 3 and adj.shape[0] != xb.shape[0] and adj.shape[0] != 1:
        raise ValueError(
            f"adjacency batch {adj.shape[0]} does not match features batch "
            f"{xb.shape[0]} (pass x as (B, N, F) with a batched adjacency)"
        )
    if adj.shape[-1] != xb.shape[1]:
        raise ValueError(f"adjacency is for {adj.shape[-1]} nodes but x has {xb.shape[1]} nodes")
    return xb, batched


class _GraphAttention(nn.Module):
    """Masking, softmax, aggregation and head combination shared by GAT and GATv2."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        heads: int,
        concat: bool,
        negative_slope: float,
        dropout: float,
        add_self_loops: bool,
        bias: bool,
        factory: dict[str, Any],
    ) -> None:
        super().__init__()
        concat = check_bool("concat", concat)
        add_self_loops = check_bool("add_self_loops", add_self_loops)
        bias = check_bool("bias", bias)
        for name, v in (
            ("in_features", in_features),
            ("out_features", out_features),
            ("heads", heads),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not negative_slope >= 0:  # NaN too
            raise ValueError(
                f"negative_slope must be >= 0 (monotone LeakyReLU; 003 Remark 3.7's "
                f"negative slope is an erratum), got {negative_slope}"
            )
        self.in_features, self.out_features, self.heads = in_features, out_features, heads
        self.concat, self.negative_slope = concat, float(negative_slope)
        self.add_self_loops = add_self_loops
        self.dropout = nn.Dropout(dropout)
        width = heads * out_features if concat else out_features
        self.bias = nn.Parameter(torch.zeros(width, **factory)) if bias else None

    def _project(self, x: Tensor, lin: nn.Linear) -> Tensor:
        b, n, _ = x.shape  # (B, N, F) -> (B, H, N, F')
        return lin(x).view(b, n, self.heads, self.out_features).transpose(1, 2)

    def logits(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Unmasked logits e (B, H, N, N) and messages (B, H, N, F') of batched ``x``."""
        raise NotImplementedError

    def forward(
        self,
        x: Tensor,
        adj: Tensor,
        *,
        logit_bias: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend over N(i); ``logit_bias`` (broadcastable to (B, H, N, N)) is added to e_ij
        in the logits' dtype (that of ``x``).

        Returns the new features (B?, N, H·F' or F') and, with ``need_weights``, α (B?, H, N, N).
        """
        if type(need_weights) is not bool:  # the bool itself passes on one comparison
            need_weights = check_bool("need_weights", need_weights)
        xb, mask, batched = _check_graph(x, adj)
        if xb.shape[-1] != self.in_features:
            raise ValueError(f"node features have {xb.shape[-1]} channels, the layer expects "
                             f"in_features={self.in_features}")
        if self.add_self_loops:
            mask = mask | torch.eye(mask.shape[-1], dtype=torch.bool, device=mask.device)
        e, messages = self.logits(xb)  # (B, H, N, N), (B, H, N, F')
        if logit_bias is not None:
            # in the logits' dtype: a float32 bias promoted bfloat16 logits, and the float32
            # weights then failed to multiply the bfloat16 messages
            e = e + torch.as_tensor(logit_bias, dtype=e.dtype, device=e.device)
        # the dtype's lowest value, not -inf: a node with no neighbour gets a finite uniform row
        # (zeroed below) instead of NaN, so no NaN reaches the backward pass
        e = e.masked_fill(~mask.unsqueeze(1), torch.finfo(e.dtype).min)
        alpha = torch.softmax(e, dim=-1)
        alpha = torch.where(mask.unsqueeze(1), alpha, torch.zeros((), dtype=alpha.dtype))
        out = self.dropout(alpha) @ messages  # (B, H, N, F')
        out = out.transpose(1, 2).flatten(2) if self.concat else out.mean(dim=1)
        if self.bias is not None:
            out = out + self.bias
        if not batched:
            out, alpha = out.squeeze(0), alpha.squeeze(0)
        return (out, alpha) if need_weights else out


class GATLayer(_GraphAttention):
    """Graph attention layer of 003 §3.6 Eq. (3.1)-(3.2) (module docstring for conventions).

    Parameters: ``lin`` (W, no bias), ``att_dst`` (a_1, query part, shape (H, F')), ``att_src``
    (a_2, neighbour part), optional output ``bias``. Glorot initialisation as in GAT.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        heads: int = 1,
        *,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        factory = {"device": device, "dtype": dtype}
        super().__init__(in_features, out_features, heads, concat, negative_slope, dropout,
                         add_self_loops, bias, factory)
        self.lin = nn.Linear(in_features, heads * out_features, bias=False, **factory)
        self.att_dst = nn.Parameter(torch.empty(heads, out_features, **factory))
        self.att_src = nn.Parameter(torch.empty(heads, out_features, **factory))
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.xavier_uniform_(self.att_dst)
        nn.init.xavier_uniform_(self.att_src)

    def logits(self, x: Tensor) -> tuple[Tensor, Tensor]:
        z = self._project(x, self.lin)  # (B, H, N, F')
        query = (z * self.att_dst[:, None, :]).sum(-1)  # a_1ᵀ W h_i: (B, H, N)
        key = (z * self.att_src[:, None, :]).sum(-1)  # a_2ᵀ W h_j: (B, H, N)
        return F.leaky_relu(query[..., :, None] + key[..., None, :], self.negative_slope), z


class GATv2Layer(_GraphAttention):
    """GATv2 (Brody et al. 2022): e_ij = aᵀ LeakyReLU(W_r h_i + W_l h_j), messages W_l h_j.

    Parameters: ``lin_l`` (W_l, neighbours), ``lin_r`` (W_r, queries; the same module as
    ``lin_l`` when ``share_weights``), ``att`` (a, shape (H, F')), optional output ``bias``.
    ``projection_bias`` gives W_l and W_r biases of their own, zero-initialised (PyG's
    ``GATv2Conv`` has them): e_ij = aᵀ LeakyReLU(W_r h_i + b_r + W_l h_j + b_l), messages
    W_l h_j + b_l.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        heads: int = 1,
        *,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        bias: bool = True,
        share_weights: bool = False,
        projection_bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        share_weights = check_bool("share_weights", share_weights)
        projection_bias = check_bool("projection_bias", projection_bias)
        factory = {"device": device, "dtype": dtype}
        super().__init__(in_features, out_features, heads, concat, negative_slope, dropout,
                         add_self_loops, bias, factory)
        self.lin_l = nn.Linear(in_features, heads * out_features, bias=projection_bias,
                               **factory)
        self.lin_r = (
            self.lin_l
            if share_weights
            else nn.Linear(in_features, heads * out_features, bias=projection_bias, **factory)
        )
        self.att = nn.Parameter(torch.empty(heads, out_features, **factory))
        for p in (self.lin_l.weight, self.lin_r.weight, self.att):
            nn.init.xavier_uniform_(p)
        for lin in (self.lin_l, self.lin_r):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def logits(self, x: Tensor) -> tuple[Tensor, Tensor]:
        zl = self._project(x, self.lin_l)  # W_l h_j: (B, H, N, F')
        zr = self._project(x, self.lin_r)  # W_r h_i
        hidden = F.leaky_relu(zr[..., :, None, :] + zl[..., None, :, :], self.negative_slope)
        return (hidden * self.att[:, None, None, :]).sum(-1), zl  # (B, H, N, N)


def _refuse_non_positive_weights(grades: Tensor) -> None:
    """A ValueError naming the first grade q <= -1, whose linear weight 1 + q is not
    positive (floored at 1e-6 it made the node all but invisible, silently)."""
    bad = grades.detach() <= -1
    if bool(bad.any()):
        at = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"the linear grading's weights 1 + q need grades q > -1, got "
            f"{float(grades[at])!r} at index {at if len(at) > 1 else at[0]}")


class GradedGraphAttention(nn.Module):
    """Graph attention whose nodes are graded by centrality (000 §8.9 (i)).

    Node grades q_j = s · c_j / max_k c_k ∈ [0, s] come from a :func:`centrality` c (``grades``
    can also be passed to ``forward``). A grade acts through the grading maps of 000: the EGT
    scale w = λ^q (000 Def 6.1, ``grading="exponential"``, base λ > 1) or the LGT scale
    w = 1 + q (000 Def 5.1 with f(q) = q + 1, ``grading="linear"``). 000 §8.9 gives no formula;
    the choice here (``apply_to``):

    - ``"logits"`` (default): e_ij <- e_ij + log w_j, i.e. α_ij ∝ w_j · exp(e_ij): attention is
      re-weighted towards central neighbours, still exactly zero outside N(i). With the EGT map
      the bias is q_j ln λ, the graded-score form of 000 Def 5.22 applied per key node.
    - ``"features"``: the input grading φ_q of 000 Def 5.19 per node, x_i <- w_i x_i, before the
      layer (changes both the logits and the messages).

    The centralities are those of an undirected graph: without ``grades``, an asymmetric
    adjacency (a directed graph, which the layers themselves accept) is refused.

    With s = 0 (or all grades 0) it equals the underlying layer exactly. ``learn_scale`` makes
    s a parameter. ``version`` 1 is :class:`GATLayer`, 2 (default) :class:`GATv2Layer` (the
    drop-in replacement Brody et al. recommend); other keyword arguments go to that layer.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        heads: int = 1,
        *,
        centrality: CentralityKind = "degree",
        grading: Literal["exponential", "linear"] = "exponential",
        base: float = 2.0,
        grade_scale: float = 1.0,
        learn_scale: bool = False,
        apply_to: Literal["logits", "features"] = "logits",
        version: int = 2,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **layer_kwargs: Any,
    ) -> None:
        super().__init__()
        learn_scale = check_bool("learn_scale", learn_scale)
        if centrality not in CENTRALITIES:
            raise ValueError(f"unknown centrality {centrality!r}, expected one of {CENTRALITIES}")
        if grading not in ("exponential", "linear"):
            raise ValueError(f"grading must be 'exponential' or 'linear', got {grading!r}")
        base = check_float("base", base)  # True was read as λ = 1
        if grading == "exponential" and not base > 1:
            raise ValueError(f"exponential grading needs base λ > 1 (000 Def 6.1), got {base}")
        if apply_to not in ("logits", "features"):
            raise ValueError(f"apply_to must be 'logits' or 'features', got {apply_to!r}")
        if isinstance(version, bool) or version not in (1, 2):  # True == 1 would be GAT
            raise ValueError(f"version must be 1 (GAT) or 2 (GATv2), got {version!r}")
        try:
            finite = (not isinstance(grade_scale, (bool, str))
                      and math.isfinite(float(grade_scale)))
        except (TypeError, ValueError):
            finite = False
        if not finite:  # NaN gave NaN attention for every node, ±inf NaN or one-hot rows
            raise ValueError(f"grade_scale must be a finite number, got {grade_scale!r}")
        if grading == "linear" and not learn_scale and float(grade_scale) <= -1:
            # the most central node has q = s: its weight 1 + s <= 0 was floored at 1e-6
            raise ValueError(
                f"the linear grading's weights 1 + q need grades q > -1, and grade_scale="
                f"{grade_scale!r} gives the most central node q = {float(grade_scale)!r}")
        self.centrality, self.grading, self.base, self.apply_to = (
            centrality,
            grading,
            float(base),
            apply_to,
        )
        scale = torch.tensor(float(grade_scale), device=device, dtype=dtype)
        if learn_scale:
            self.grade_scale = nn.Parameter(scale)
        else:
            self.register_buffer("grade_scale", scale)
        layer = GATLayer if version == 1 else GATv2Layer
        self.layer = layer(in_features, out_features, heads, device=device, dtype=dtype,
                           **layer_kwargs)

    def node_grades(self, adj: Tensor) -> Tensor:
        """q = s · c / max c per graph, (B?, N), in the layer's dtype (at least float32: the
        power iterations of eigenvector and PageRank centrality do not converge in bf16)."""
        c = centrality(adj, self.centrality, dtype=at_least_float32(self.grade_scale.dtype))
        if c.shape[-1] == 0:  # a graph with no nodes: amax has no identity
            return self.grade_scale * c
        top = c.amax(dim=-1, keepdim=True)
        return self.grade_scale * c / torch.where(top > 0, top, torch.ones_like(top))

    def log_weights(self, grades: Tensor) -> Tensor:
        """log w(q): q ln λ (exponential) or log(1 + q) (linear, floored at 1e-6 > 0: grades
        given to ``forward`` and a fixed ``grade_scale`` are refused at q <= -1, a learnable
        scale that moves there is floored)."""
        if self.grading == "exponential":
            return grades * math.log(self.base)
        return torch.log(torch.clamp(1.0 + grades, min=1e-6))

    def forward(
        self,
        x: Tensor,
        adj: Tensor,
        *,
        grades: Tensor | Sequence[float] | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        if type(need_weights) is not bool:
            need_weights = check_bool("need_weights", need_weights)
        if grades is None:
            q = self.node_grades(adj)
        else:
            q = torch.as_tensor(grades, device=x.device)
            allowed = list(dict.fromkeys([(adj.shape[-1],), (*x.shape[:-2], adj.shape[-1])]))
            if tuple(q.shape) not in allowed:  # one grade per node: (N,) or (B, N)
                raise ValueError(f"grades must have shape {' or '.join(map(str, allowed))} "
                                 f"(one per node), got {tuple(q.shape)}")
            q = as_grade_tensor(q, dim=adj.shape[-1])  # a real, finite tensor
            if self.grading == "linear" and not torch.compiler.is_compiling():
                _refuse_non_positive_weights(q)
        # log w and w in float32 at least, rounded once to x's dtype: in bfloat16 q, q·ln λ
        # (or 1 + q, its log) and exp were each rounded, four times the error of one rounding
        work = at_least_float32(x.dtype)
        log_w = self.log_weights(q.to(work))  # (B?, N)
        if self.apply_to == "features":
            # scale the batched features: x (N, F) with an adjacency (1, N, N) has grades (1, N),
            # which broadcasting would turn into a batch of one graph (the plain layer returns
            # (N, ·)), and with an adjacency (B, N, N) into B copies of x (the layer refuses it)
            xb, batched = _batch_features(x, adj)
            scaled = (xb.to(work) * log_w.exp().unsqueeze(-1)).to(x.dtype)  # (B, N, F)
            return self.layer(scaled if batched else scaled.squeeze(0), adj,
                              need_weights=need_weights)
        bias = log_w.to(x.dtype).unsqueeze(-2).unsqueeze(-2)  # over key nodes j: (B?, 1, 1, N)
        if bias.dim() == 3:
            bias = bias.unsqueeze(0)
        return self.layer(x, adj, logit_bias=bias, need_weights=need_weights)
