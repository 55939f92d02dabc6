"""Rule-based failure-mode detection from a case transcript (arXiv 2603.01045 §5.2, App. G.2).

The detectors read only the transcript rows the engine writes (tool results as the agents saw them):

* **Data receipt events.** P2P/BP ``receive_messages`` results carry ``from`` and ``timestamp`` (send
  round); SFS ``read_file`` results carry ``metadata.modified_by`` / ``modified_at_round``. A successful
  read of one's own file is not a receipt.
* **Knowledge sets (our rule for "directly or via aggregated messages").** ``K_i(t)`` = the agents whose
  data agent i can have used when it wrote its reply of round t. ``K_i(1) = {i}`` and
  ``K_i(t+1) = K_i(t) ∪ ⋃ K_s(w)`` over the items i received in round t from sender s, sent (or
  written) in round w. A message is thus assumed to carry everything its sender knew when sending it —
  an upper bound on what was actually relayed, so the premature-submission rule errs towards *not*
  flagging an agent.

Modes (non-exclusive):

* ``premature_submission``: some agent i submitted in round s while a peer its answer depends on was
  missing from ``K_i(s)``. The peers come from `posttrain_lab.benchmarks.silo.dependency_peers(task, N, i)` (all N-1
  peers for global tasks; predecessors for II-11/II-20; neighbours for II-14), i.e. ``min_peers_needed``
  counted per agent.
* ``consensus_failure``: the submitted answers of a *global* task differ (``|{ŷ_i}| > 1`` after
  `normalize_value`). Segmented tasks (each agent its own slice) cannot have this mode.
* ``computation_error``: some agent had the full data its answer depends on (every dependency peer in
  ``K_i(s)``) and still submitted a wrong answer.

Emergent leaders (App. G.3): agents receiving more than 1.5x the average number of items; see
`posttrain_lab.benchmarks.silo.metrics.emergent_leaders` (the engine passes the per-agent receive counts).
"""

from __future__ import annotations

from typing import Any


def _receipts(rec: dict[str, Any], protocol: str) -> list[tuple[int, int]]:
    """(sender, sent_round) of every data item delivered to the agent in this transcript row."""
    out: list[tuple[int, int]] = []
    me = rec.get("agent_id")
    for item in rec.get("results") or []:
        tool, res = item.get("tool"), item.get("result")
        if not isinstance(res, dict):
            continue
        if protocol in ("p2p", "bp") and tool == "receive_messages":
            for m in res.get("messages") or []:
                s, w = m.get("from"), m.get("timestamp")
                if isinstance(s, int) and isinstance(w, int) and s != me:
                    out.append((s, w))
        elif protocol == "sfs" and tool == "read_file" and res.get("success"):
            md = res.get("metadata") or {}
            s, w = md.get("modified_by"), md.get("modified_at_round")
            if isinstance(s, int) and isinstance(w, int) and s != me:
                out.append((s, w))
    return out


def knowledge_masks(transcript: list[dict[str, Any]], protocol: str, num_agents: int) -> list[list[int]]:
    """``K[t][i]`` as bitmasks for t = 0..R+1 (index t = the reply of round t; index 0 unused)."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    last = 0
    for rec in transcript:
        r = int(rec.get("round", 0))
        by_round.setdefault(r, []).append(rec)
        last = max(last, r)
    K = [[1 << i for i in range(num_agents)] for _ in range(last + 2)]
    for t in range(1, last + 1):
        nxt = list(K[t])
        for rec in by_round.get(t, []):
            i = rec.get("agent_id")
            if not isinstance(i, int) or not 0 <= i < num_agents:
                continue
            for s, w in _receipts(rec, protocol):
                if 0 <= s < num_agents and 1 <= w <= t:
                    nxt[i] |= K[w][s]
        K[t + 1] = nxt
    return K


def analyze_failures(
    transcript: list[dict[str, Any]],
    *,
    protocol: str,
    task_id: str,
    num_agents: int,
    answers: list[Any],
    submit_rounds: list[int | None],
    correct: list[bool],
) -> dict[str, Any]:
    """The three failure modes of arXiv 2603.01045 §5.2 plus per-agent evidence."""
    from posttrain_lab.benchmarks.silo import dependency_peers, task_info
    from posttrain_lab.benchmarks.silo.metrics import answer_key

    n = num_agents
    K = knowledge_masks(transcript, protocol, n)
    peers_known: list[int | None] = []
    premature: list[int] = []
    comp_err: list[int] = []
    for i in range(n):
        s = submit_rounds[i]
        if s is None:
            peers_known.append(None)
            continue
        mask = K[min(s, len(K) - 1)][i]
        peers_known.append(bin(mask).count("1") - 1)
        deps = 0
        for j in dependency_peers(task_id, n, i):
            deps |= 1 << j
        has_all = mask & deps == deps
        if not has_all:
            premature.append(i)
        if has_all and not correct[i]:
            comp_err.append(i)
    segmented = task_info(task_id).is_segmented
    submitted_answers = [a for a, s in zip(answers, submit_rounds, strict=True) if s is not None]
    distinct = len({answer_key(a) for a in submitted_answers})
    return {
        "premature_submission": bool(premature),
        "consensus_failure": (not segmented) and distinct > 1,
        "computation_error": bool(comp_err),
        "premature_agents": premature,
        "computation_error_agents": comp_err,
        "distinct_answers": distinct,
        "peers_known_at_submit": peers_known,
    }
