"""DuCA dual-horizon advantage (HIAN, a PROPOSED DESIGN; arXiv 2603.01481): the ``duca`` estimator.

Registered into posttrain's advantage registry (the ``posttrain.advantages`` entry point of the lab);
``get_advantage("duca")(rewards, group_ids, turn_index=..., turn_rewards=..., num_turns=...) -> (B, T)``.
Its own ``zero_variance_groups`` (what the HIAN estimator normalises: the session reward and every turn
criterion) is what the trainer logs as ``zero_var_frac`` when this estimator is selected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posttrain.algos._common import is_number, require
from posttrain.algos.advantages import (
    KIND,
    check_rewards_groups,
    constant_groups,
    group_index,
    group_stats,
    grpo,
    register_advantage,
)
from posttrain.utils.errors import InvalidTypeError, InvalidValueError

Tensor = torch.Tensor


# ----------------------------------------------------------------------------------------------------
# DuCA / HIAN (proposed design)


def _check_spans(session: int, spans: Any, k: int, seq_len: int) -> list[tuple[int, int]]:
    if isinstance(spans, Tensor):
        spans = spans.tolist()
    try:
        pairs = [(s, e) for s, e in spans]
    except (TypeError, ValueError):
        raise InvalidValueError(
            f"hian_advantages: turn_spans[{session}] must be a list of (start, end) pairs"
        ) from None
    if len(pairs) != k:
        raise InvalidValueError(
            f"hian_advantages: session {session} has {k} turn rewards but {len(pairs)} turn spans"
        )
    for j, (s, e) in enumerate(pairs):
        if not (isinstance(s, int) and isinstance(e, int)) or isinstance(s, bool) or isinstance(e, bool):
            raise InvalidValueError(
                f"hian_advantages: turn_spans[{session}][{j}] = {(s, e)!r}: expected two ints"
            )
        if not 0 <= s <= e <= seq_len:
            raise InvalidValueError(
                f"hian_advantages: turn_spans[{session}][{j}] = ({s}, {e}): expected 0 <= start <= end "
                f"<= seq_len ({seq_len}); end is exclusive"
            )
    return pairs


def hian_advantages(
    session_rewards: Tensor,
    group_ids: Tensor | Sequence[int],
    turn_rewards: Sequence[Tensor],
    turn_spans: Sequence[Any],
    seq_len: int,
    *,
    w_turn: float = 1.0,
    w_sess: float = 1.0,
    turn_grouping: str = "pool",
    turn_norm: str = "fused",
    eps: float = 1e-6,
) -> Tensor:
    """DuCA/HIAN dual-horizon per-token advantages — PROPOSED DESIGN (DuCA, arXiv 2603.01481).

    DuCA (arXiv 2603.01481) states only that HIAN normalises turn-level and session-level advantages
    separately before fusing them; the formula below is our proposed design, not the authors' (unpublished).
    For group g (one scenario, G sessions), session i with turns k = 1..K_i:

        A^sess_i     = (R_i − mean_g R) / (std_g R + ε)             (``grpo`` estimator, unbiased std)
        A^turn_{i,k} = (r_{i,k} − μ_turn) / (σ_turn + ε)             unbiased std
            turn_grouping="pool":       μ, σ over all turns of all sessions of group g   (default)
            turn_grouping="turn_index": μ, σ over the turns with the same index k in group g
            a turn with no peer in its pool gets A^turn = 0
        A_{i,t} = w_turn · A^turn_{i,k(t)} + w_sess · A^sess_i     for t in turn k's span; 0 elsewhere

    Vector turn rewards ((K_i, C) tensors, several criteria) are z-scored per criterion, then summed:

        S_{i,k} = Σ_c z_c(r_{i,k,c})
        turn_norm="fused" (default): A^turn_{i,k} = (S_{i,k} − μ_S) / (σ_S + ε) over the same pool, so
            the turn term has unit variance like the session term however many criteria vary;
        turn_norm="per_criterion" (before the 2026-12-01 fixes): A^turn_{i,k} = S_{i,k}; its variance grows with the
            number of criteria that vary in the pool (up to C), so the turn horizon dominates;
        turn_norm="mean": A^turn_{i,k} = S_{i,k} / C (the criteria's mean z-score; variance ≤ 1, shrinking
            when few criteria vary).

    Both are proposed designs; the paper states only "normalised separately before fusion".

    Args:
        session_rewards: (B,) session-level (sparse) rewards.
        group_ids: (B,) integer scenario ids (any order, any group sizes).
        turn_rewards: B tensors, session i's per-turn rewards, shape (K_i,) or (K_i, C).
        turn_spans: B lists of K_i ``(start, end)`` token spans (end exclusive) of the policy's tokens of
            each turn in the (B, seq_len) response tensor; spans of a session must not overlap.
        seq_len: T, the width of the returned tensor.

    Returns (B, T) advantages (no gradient); tokens outside every span are exactly 0.
    """
    where = "hian_advantages"
    if turn_grouping not in ("pool", "turn_index"):
        raise InvalidValueError(
            f"{where}: turn_grouping must be 'pool' or 'turn_index', got {turn_grouping!r}"
        )
    if turn_norm not in TURN_NORMS:
        raise InvalidValueError(f"{where}: turn_norm must be one of {TURN_NORMS}, got {turn_norm!r}")
    for key, val in (("w_turn", w_turn), ("w_sess", w_sess), ("eps", eps)):
        if not is_number(val):
            raise InvalidValueError(f"{where}: {key} must be a number, got {val!r}")
    if eps < 0:
        raise InvalidValueError(f"{where}: eps must be >= 0, got {eps!r}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise InvalidValueError(f"{where}: seq_len must be an int >= 0, got {seq_len!r}")
    r_sess, inv, n_groups = check_rewards_groups(where, session_rewards, group_ids)
    b = r_sess.shape[0]
    if len(turn_rewards) != b or len(turn_spans) != b:
        raise InvalidValueError(
            f"{where}: expected {b} entries (one per session) in turn_rewards and turn_spans, "
            f"got {len(turn_rewards)} and {len(turn_spans)}"
        )
    dtype, device = r_sess.dtype, r_sess.device

    vals, sess_of_turn, k_of_turn, starts, ends = [], [], [], [], []
    n_crit: int | None = None
    first = 0
    for i, tr in enumerate(turn_rewards):
        if not isinstance(tr, Tensor):
            raise InvalidTypeError(f"{where}: turn_rewards[{i}] must be a tensor, got {type(tr).__name__}")
        tr2 = tr.detach().to(dtype=dtype, device=device)
        if tr2.dim() == 1:
            tr2 = tr2.unsqueeze(-1)
        if tr2.dim() != 2:
            raise InvalidValueError(
                f"{where}: turn_rewards[{i}] must have shape (K,) or (K, C), got {tuple(tr.shape)}"
            )
        if tr2.shape[0] > 0:  # an empty session has no criteria to compare
            if n_crit is None:
                n_crit, first = tr2.shape[1], i
            elif tr2.shape[1] != n_crit:
                raise InvalidValueError(
                    f"{where}: turn_rewards[{i}] has {tr2.shape[1]} criteria, "
                    f"turn_rewards[{first}] has {n_crit}"
                )
        if not torch.isfinite(tr2).all():
            raise InvalidValueError(f"{where}: turn_rewards[{i}] contains a non-finite value")
        pairs = _check_spans(i, turn_spans[i], tr2.shape[0], seq_len)
        if pairs:
            vals.append(tr2)
        sess_of_turn += [i] * len(pairs)
        k_of_turn += list(range(len(pairs)))
        starts += [s for s, _ in pairs]
        ends += [e for _, e in pairs]

    with torch.no_grad():
        a_sess = grpo(r_sess, inv, n_groups, eps=eps)
        out = torch.zeros(b, seq_len, dtype=dtype, device=device)
        n_turns = len(sess_of_turn)
        if n_turns == 0 or seq_len == 0:
            return out
        v = torch.cat(vals, dim=0)  # (N, C)
        sess = torch.tensor(sess_of_turn, dtype=torch.long, device=device)
        gid = inv[sess]
        if turn_grouping == "pool":
            keys = gid
        else:
            keys = torch.stack([gid, torch.tensor(k_of_turn, dtype=torch.long, device=device)], dim=1)
        tinv, tgroups = group_index(keys)
        count, mean, std = group_stats(v, tinv, tgroups)
        z = (v - mean[tinv]) / (std[tinv] + eps)
        a_turn = torch.where(count[tinv].unsqueeze(-1) < 2, torch.zeros_like(z), z).sum(dim=-1)  # (N,)
        if turn_norm == "fused":  # re-normalise the summed criteria in the same pools
            _, s_mean, s_std = group_stats(a_turn, tinv, tgroups)
            fused_z = (a_turn - s_mean[tinv]) / (s_std[tinv] + eps)
            a_turn = torch.where(count[tinv] < 2, torch.zeros_like(a_turn), fused_z)
        elif turn_norm == "mean":
            a_turn = a_turn / v.shape[1]

        # token -> turn map via a difference array on integer ids (exact; no float cumsum residue)
        st = torch.tensor(starts, dtype=torch.long, device=device)
        en = torch.tensor(ends, dtype=torch.long, device=device)
        ids = torch.arange(1, n_turns + 1, dtype=torch.long, device=device)
        marks = torch.zeros(b, seq_len + 1, dtype=torch.long, device=device)
        ones = torch.zeros(b, seq_len + 1, dtype=torch.long, device=device)
        nonempty = st < en
        for buf, val in ((marks, ids), (ones, torch.ones_like(ids))):
            buf.index_put_((sess[nonempty], st[nonempty]), val[nonempty], accumulate=True)
            buf.index_put_((sess[nonempty], en[nonempty]), -val[nonempty], accumulate=True)
        cover = ones.cumsum(dim=1)[:, :seq_len]
        overlapping = (cover > 1).any(dim=1).nonzero()
        if overlapping.numel():
            i = int(overlapping[0, 0])
            raise InvalidValueError(f"{where}: turn_spans[{i}] has overlapping spans")
        tok_turn = marks.cumsum(dim=1)[:, :seq_len]  # 0 = outside any turn, else turn id + 1
        inside = tok_turn > 0
        idx = (tok_turn - 1).clamp(min=0)
        fused = w_turn * a_turn[idx] + w_sess * a_sess.unsqueeze(-1)
        out = torch.where(inside, fused, out)
    return out


TURN_NORMS = ("fused", "per_criterion", "mean")


def hian_zero_variance_groups(
    session_rewards: Tensor, group_ids: Tensor, turn_rewards: Tensor, num_turns: Tensor
) -> Tensor:
    """(G,) bool per group (sorted ``group_ids``): True when NOTHING the HIAN estimator normalises varies in
    the group — neither the session reward nor any turn criterion across the group's pooled turns (or the
    group has one session). ``turn_rewards`` (B, K, C) or (B, K), ``num_turns`` (B,)."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    r = session_rewards.double()
    cnt, mean, _ = group_stats(r, inv, n_groups)
    spread = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, (r - mean[inv]).abs())
    varies = spread > 1e-12
    tr = turn_rewards.double()
    if tr.dim() == 2:
        tr = tr.unsqueeze(-1)
    k_max = tr.shape[1]
    valid = torch.arange(k_max).unsqueeze(0) < num_turns.cpu().unsqueeze(1)  # (B, K)
    rows, ks = valid.nonzero(as_tuple=True)
    if rows.numel():
        v = tr[rows, ks]  # (N, C)
        g = inv[rows]
        lo = torch.full((n_groups, v.shape[1]), float("inf"), dtype=torch.float64)
        hi = torch.full((n_groups, v.shape[1]), float("-inf"), dtype=torch.float64)
        lo = lo.scatter_reduce(0, g.unsqueeze(1).expand_as(v), v, reduce="amin")
        hi = hi.scatter_reduce(0, g.unsqueeze(1).expand_as(v), v, reduce="amax")
        varies = varies | ((hi - lo) > 1e-12).any(dim=1)
    return ~varies | (cnt < 2)


def _validate_duca(name: str, p: dict) -> None:
    require(is_number(p["eps"]) and p["eps"] >= 0, KIND, name, "eps", "a number >= 0", p["eps"])
    for key in ("w_turn", "w_sess"):
        require(is_number(p[key]), KIND, name, key, "a number", p[key])
    require(
        p["turn_grouping"] in ("pool", "turn_index"),
        KIND,
        name,
        "turn_grouping",
        "'pool' or 'turn_index'",
        p["turn_grouping"],
    )
    require(p["turn_norm"] in TURN_NORMS, KIND, name, "turn_norm", f"one of {TURN_NORMS}", p["turn_norm"])
    for key in ("turn_index", "turn_rewards", "num_turns"):
        require(
            p[key] is None or isinstance(p[key], Tensor),
            KIND,
            name,
            key,
            "a tensor passed by the multi-turn runner (advantage_inputs), not a config value",
            p[key],
        )


def turn_spans_from_index(turn_index: Tensor, num_turns: Tensor) -> list[list[tuple[int, int]]]:
    """Per row i, the ``num_turns[i]`` token spans ``(start, end)`` (end exclusive) of turns 1..K_i in
    a (B, T) 1-based ``turn_index`` (0 = not a policy token). A turn with no token gets ``(0, 0)``;
    a turn whose tokens are not contiguous is an error."""
    out = []
    for i, (row, k_i) in enumerate(zip(turn_index.tolist(), num_turns.tolist(), strict=True)):
        firsts: dict[int, int] = {}
        lasts: dict[int, int] = {}
        counts: dict[int, int] = {}
        for t, k in enumerate(row):
            if k > 0:
                firsts.setdefault(k, t)
                lasts[k] = t
                counts[k] = counts.get(k, 0) + 1
        if any(k > k_i for k in counts):
            raise InvalidValueError(f"duca: row {i} has tokens of turn {max(counts)} but num_turns = {k_i}")
        spans = []
        for k in range(1, k_i + 1):
            if k not in counts:
                spans.append((0, 0))
                continue
            s, e = firsts[k], lasts[k] + 1
            if e - s != counts[k]:
                raise InvalidValueError(
                    f"duca: row {i}: the tokens of turn {k} are not contiguous in turn_index"
                )
            spans.append((s, e))
        out.append(spans)
    return out


def _duca_zero_variance(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    turn_rewards: Tensor | None = None,
    num_turns: Tensor | None = None,
    **_: Any,
) -> Tensor:
    if turn_rewards is None or num_turns is None:
        return constant_groups(rewards, group_ids)
    return hian_zero_variance_groups(rewards, group_ids, turn_rewards.cpu(), num_turns.cpu())


@register_advantage("duca", validate=_validate_duca, zero_variance=_duca_zero_variance)
def duca(
    r: Tensor,
    inv: Tensor,
    n_groups: int,
    *,
    turn_index: Tensor | None = None,
    turn_rewards: Tensor | None = None,
    num_turns: Tensor | None = None,
    w_turn: float = 1.0,
    w_sess: float = 1.0,
    turn_grouping: str = "pool",
    turn_norm: str = "fused",
    eps: float = 1e-6,
) -> Tensor:
    """DuCA dual-horizon advantage over a multi-turn runner's inputs — HIAN is a PROPOSED DESIGN
    (DuCA, arXiv 2603.01481, states only that turn- and session-level advantages are normalised
    separately before fusion; see :func:`hian_advantages` for the formula).

    ``r`` (B,) are the session rewards (the runner's ``reward: session``); the runner's
    ``advantage_inputs`` give ``turn_index`` (B, T) 1-based turn of each policy token (0 elsewhere),
    ``turn_rewards`` (B, K_max, C) the C criteria per turn and ``num_turns`` (B,). Each criterion is
    z-scored on its own (``turn_grouping``: "pool" = all turns of the group, "turn_index" = turns with
    the same index), summed, re-normalised in the same pools (``turn_norm: fused``, default; ``per_criterion``
    keeps the plain sum, the behaviour before the 2026-12-01 fixes) and fused with the group-normalised session advantage:
    A_{i,t} = w_turn · A^turn_{i,k(t)} + w_sess · A^sess_i. Returns (B, T); 0 on non-policy tokens.
    """
    missing = [
        k
        for k, v in (("turn_index", turn_index), ("turn_rewards", turn_rewards), ("num_turns", num_turns))
        if v is None
    ]
    if missing:
        raise InvalidValueError(
            f"advantage estimator 'duca' needs the per-turn inputs {missing} of a multi-turn episode runner "
            "(rollout.runner.name=multi-turn with turn_inputs=true)"
        )
    b = r.shape[0]
    if turn_index.dim() != 2 or turn_index.shape[0] != b:
        raise InvalidValueError(f"duca: turn_index must have shape ({b}, T), got {tuple(turn_index.shape)}")
    if turn_rewards.dim() not in (2, 3) or turn_rewards.shape[0] != b:
        raise InvalidValueError(
            f"duca: turn_rewards must have shape ({b}, K, C) or ({b}, K), got {tuple(turn_rewards.shape)}"
        )
    if tuple(num_turns.shape) != (b,):
        raise InvalidValueError(f"duca: num_turns must have shape ({b},), got {tuple(num_turns.shape)}")
    k_max = turn_rewards.shape[1]
    if bool((num_turns < 0).any()) or bool((num_turns > k_max).any()):
        raise InvalidValueError(
            f"duca: num_turns must be in [0, {k_max}] (the turn_rewards width), got {num_turns.tolist()}"
        )
    spans = turn_spans_from_index(turn_index.cpu(), num_turns.cpu())
    per_row = [turn_rewards[i, : int(k)] for i, k in enumerate(num_turns.tolist())]
    return hian_advantages(
        r,
        inv,
        per_row,
        spans,
        int(turn_index.shape[1]),
        w_turn=w_turn,
        w_sess=w_sess,
        turn_grouping=turn_grouping,
        turn_norm=turn_norm,
        eps=eps,
    ).to(r.device)
