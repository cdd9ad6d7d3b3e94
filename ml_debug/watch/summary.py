"""The incident's one sentence: which rank on which node, where, since when, and the command to run next.

It is composed from what the bundle gathered, all plain data: the watcher's incident
(:class:`ml_debug.watch.verdict.Incident` as a dict), dump-stacks' result (its suspects and verdict,
and the Flight Recorder section with its cross-rank analysis) and, for a straggler, the health of
its node. The strongest evidence wins: a Flight Recorder desync, then the ranks that never issued a
collective the others issued, then the stack suspect, then the watcher's own observation.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from ml_debug.watch.verdict import clock, seconds


def _who(rank: Any, host: Any, pid: Any) -> str:
    who = f"rank {rank}" if rank is not None else f"pid {pid}"
    return f"{who} ({host}, pid {pid})" if rank is not None else f"{who} ({host})"


def _since(incident: dict[str, Any]) -> str:
    since = incident.get("since")
    if since is None:
        return ""
    return f"; no progress since {clock(since)} ({seconds(max(0.0, incident['time'] - since))})"


def _cmd(*words: str) -> str:
    return shlex.join(["mldebug", *words])


def _fr_culprit(fr: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    """(sentence, the rank it names) from the Flight Recorder analysis, when it names one."""
    analysis = (fr or {}).get("analysis") or {}
    for g in analysis.get("process_groups") or []:
        m = g.get("mismatch")
        if m:
            odd = [s for s in m["sides"] if s.get("odd")]
            normal = [s for s in m["sides"] if not s.get("odd")]
            if odd and odd[0]["members"]:
                first = odd[0]["members"][0]
                pg = f"pg {g['pg']}" + (f" ({g['desc']})" if g.get("desc") else "")
                text = (f"{_who(first.get('rank'), first.get('host'), first.get('pid'))} issued a different "
                        f"collective than {normal[0]['who'] if normal else 'the others'} (desync, {m['kind']} "
                        f"mismatch): collective #{m['seq']} of {pg} is {odd[0]['text']} on {odd[0]['who']} but "
                        f"{normal[0]['text'] if normal else '?'} on {normal[0]['who'] if normal else 'the others'}")
                return text, {**first, "why": "desync", "op": odd[0]["op"]}
    for g in analysis.get("process_groups") or []:
        for n in g.get("not_enqueued") or []:
            if n.get("members") and len(n["ranks"]) <= len(n.get("by") or []):
                first = n["members"][0]
                what = f" ({n['text']})" if n.get("text") else ""
                text = (f"{_who(first.get('rank'), first.get('host'), first.get('pid'))} never issued collective "
                        f"#{n['seq']} of pg {g['pg']}{what}, which {n['by_who']} issued")
                return text, {**first, "why": "not-enqueued", "op": n.get("op")}
    return None


def _stack_culprit(stacks: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    """(the verdict without "suspect: ", the first suspect's process) from dump-stacks' result."""
    if not stacks or not stacks.get("suspects"):
        return None
    s = stacks["suspects"][0]
    verdict = str(stacks.get("verdict") or "")
    text = verdict.removeprefix("suspect: ")
    members = s.get("members") or []
    procs = {f"{p.get('host')}:{p.get('pid')}": p for p in stacks.get("processes") or []}
    p = procs.get(members[0]) if members else None
    group = next((g for g in stacks.get("groups") or [] if g.get("id") == s.get("group")), None)
    where = ((group or {}).get("location") or {}).get("where") or s.get("where")  # its own code, not torch's
    who = {"rank": (s.get("ranks") or [None])[0], "host": p.get("host") if p else None,
           "pid": p.get("pid") if p else None, "where": where, "why": s.get("kind")}
    return text, who


def compose(incident: dict[str, Any], stacks: dict[str, Any] | None, target_words: Sequence[str],
            health: dict[str, Any] | None = None) -> tuple[str, list[str], dict[str, Any] | None]:
    """(the summary sentence, the next commands, the culprit) of one incident.

    `target_words` say how to reach the job again: ``[]`` on this node, ``["--hosts", "node1"]``,
    ``["--slurm-job", "123"]``."""
    kind = incident["kind"]
    fr = (stacks or {}).get("flight_recorder")
    since = _since(incident)
    nexts: list[str] = []
    culprit: dict[str, Any] | None = None
    if kind == "unreachable":
        nodes = ", ".join(incident.get("nodes") or [])
        sentence = f"{incident['detail']}: its ranks could not be looked at"
        first = (incident.get("nodes") or ["NODE"])[0].split(":")[0]
        nexts = [f"ssh {first} uptime", _cmd("health", "--hosts", first)]
        return f"node(s) {nodes} stopped answering; {sentence}.", nexts, None
    if kind == "straggler":
        r = (incident.get("ranks") or [{}])[0]
        culprit = {"rank": r.get("rank"), "host": r.get("host"), "pid": r.get("pid"), "where": r.get("where"),
                   "why": "straggler"}
        sentence = f"{_who(r.get('rank'), r.get('host'), r.get('pid'))} is a straggler: {r.get('straggler_why')}"
        bad = [c for c in (health or {}).get("checks") or [] if c.get("status") == "fail"]
        if bad:
            sentence += f"; health of {r.get('host')}: " + "; ".join(f"{c['id']} {c.get('value', '')}".strip()
                                                                   for c in bad[:3])
        node = str(r.get("node") or r.get("host"))
        where = list(target_words) if target_words and target_words[0] != "--hosts" else \
            (["--hosts", node] if target_words else [])
        nexts = [_cmd("health", *where, "--level", "2"), _cmd("dump-stacks", *_target(target_words, r),
                                                               "--samples", "10", "--interval", "0.5")]
        return sentence + ".", nexts, culprit
    fr_hit = _fr_culprit(fr)
    stack_hit = _stack_culprit(stacks)
    node_of = {(r.get("host"), r.get("pid")): r.get("node") for r in incident.get("ranks") or []}
    for hit in (fr_hit, stack_hit):
        if hit is not None:
            hit[1]["node"] = node_of.get((hit[1].get("host"), hit[1].get("pid")))
    exited = incident.get("exited") or []
    if stack_hit is not None and exited and stack_hit[1].get("why") == "missing" and \
            stack_hit[1].get("rank") in {r.get("rank") for r in exited}:
        stack_hit = _after_exit(incident, stacks or {}, exited)
    if fr_hit is not None:
        text, culprit = fr_hit
        if stack_hit is not None and stack_hit[1].get("rank") == culprit.get("rank") and stack_hit[1].get("where"):
            culprit["where"] = stack_hit[1]["where"]
            text += f"; its stack: {stack_hit[1]['where']}"
        sentence = text + since
        nexts = [_cmd("dump-stacks", *_target(target_words, culprit), "--native"),
                 "rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL to have PyTorch confirm the mismatch"
                 if culprit.get("why") == "desync" else
                 "see why it never got there: its stack above, then mldebug trace on that rank"]
    elif stack_hit is not None:
        text, culprit = stack_hit
        sentence = text + since
        nexts = [_cmd("dump-stacks", *_target(target_words, culprit), "--native")]
    else:
        ranks = incident.get("ranks") or []
        head = incident["detail"] if kind != "requested" else "collected on request"
        verdict = (stacks or {}).get("verdict")
        sentence = head + (f"; dump-stacks: {verdict}" if verdict else "")
        first = ranks[0] if ranks else {}
        nexts = [_cmd("dump-stacks", *_target(target_words, first), "--native"),
                 _cmd("gpu-test", *list(target_words))]
    if kind == "requested" and culprit is None:
        return sentence + ".", nexts, None
    return sentence + ".", nexts, culprit


def _after_exit(incident: dict[str, Any], stacks: dict[str, Any],
                exited: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """The ranks still running after a peer exited: where they are, and who is to blame (the live rank
    when it is outside any collective, else the first rank that exited)."""
    groups = {g.get("id"): g for g in stacks.get("groups") or []}
    procs = {(p.get("host"), p.get("pid")): p for p in stacks.get("processes") or []}
    gone = "; ".join(f"{_who(r.get('rank'), r.get('host'), r.get('pid'))} {(r.get('signs') or ['exited'])[0]}"
                     for r in exited[:3])
    for r in incident.get("ranks") or []:
        p = procs.get((r.get("host"), r.get("pid")))
        g = groups.get(p.get("group")) if p else None
        if g is None:
            continue
        coll, loc = g.get("collective"), g.get("location")
        who = _who(r.get("rank"), r.get("host"), r.get("pid"))
        if coll is None:
            where = (loc or {}).get("where")
            return (f"{who} stuck in {where} after its peer left: {gone}",
                    {"rank": r.get("rank"), "host": r.get("host"), "pid": r.get("pid"), "where": where,
                     "why": "outside-collective"})
        first = exited[0]
        return (f"{who} waits in {coll.get('where')} for a peer that left: {gone}",
                {"rank": first.get("rank"), "host": first.get("host"), "pid": first.get("pid"), "where": None,
                 "why": "exited"})
    return None


def _target(target_words: Sequence[str], who: dict[str, Any]) -> list[str]:
    """How dump-stacks reaches one rank again: its pid here, its node over ssh, or the Slurm job."""
    if not target_words:
        return ["--pid", str(who["pid"])] if who.get("pid") is not None else []
    if target_words[0] == "--hosts" and who.get("node"):
        return ["--hosts", str(who["node"]), *target_words[2:]]
    return list(target_words)
