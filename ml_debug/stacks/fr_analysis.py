"""Flight Recorder cross-rank analysis: match every process group's collectives by sequence number.

Each rank's Flight Recorder numbers the collectives of a process group 1, 2, 3 ... in the order
the rank issued them (``collective_seq_id``). Ranks that run the same program issue the same
collective under the same number, so lining the ranks' entries up by that number tells, like
PyTorch's own ``fr_trace`` analyser does:

- **not enqueued**: the ranks that never issued collective #N which others issued (they are
  stuck before it, or went another way);
- **mismatch** (a desync): collective #N has a different op, size or dtype on some ranks. Where
  the ranks split evenly, the signature this process group has used before is taken as the
  normal one, so the rank that issued something new is the one named;
- **first incomplete**: the first collective that some rank issued and that did not complete.

Input: the per-rank records of :mod:`ml_debug.stacks.flight` (``ok`` ones carry ``collectives``:
the compact entries :func:`compact` keeps of each dump). Output: plain data for the report's
``flight_recorder.analysis`` and one sentence per finding. Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import chain
from operator import itemgetter
from typing import Any

from ml_debug.core.gcpause import gc_paused
from ml_debug.core.ranges import compress

KEEP_PER_GROUP = 64
"""Entries kept per process group and rank: the analysis looks at the last collectives only."""

# Collectives whose sizes legitimately differ between ranks (uneven all_to_all splits; the root of
# a gather/scatter holds the whole buffer): only their op is compared.
SIZES_MAY_DIFFER = ("all_to_all", "alltoall", "gather", "scatter")


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def compact(dump: dict[str, Any], keep: int = KEEP_PER_GROUP) -> list[dict[str, Any]]:
    """Per process group of one rank's dump: its status and its last `keep` collectives (not p2p)."""
    status = dump.get("pg_status") or {}
    groups: dict[str, dict[str, Any]] = {}
    for pg_id, st in status.items():
        if isinstance(st, dict):
            groups[_text(pg_id)] = {"pg_id": _text(pg_id), "name": None, "desc": "",
                                    "last_enqueued": _int(st.get("last_enqueued_collective")),
                                    "last_completed": _int(st.get("last_completed_collective")), "entries": []}
    for e in dump.get("entries") or []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        seq = _int(e.get("collective_seq_id"))
        if seq is None or seq < 1:
            continue
        pg_id = _text(e.get("pg_id"))
        g = groups.setdefault(pg_id, {"pg_id": pg_id, "name": None, "desc": "", "last_enqueued": None,
                                      "last_completed": None, "entries": []})
        pg = e.get("process_group") or []
        if g["name"] is None and pg:
            g["name"] = _text(pg[0])
            g["desc"] = _text(pg[1]) if len(pg) > 1 else ""
        g["entries"].append({"seq": seq, "op": _text(e.get("profiling_name", "?")),
                             "input_sizes": e.get("input_sizes"), "output_sizes": e.get("output_sizes"),
                             "input_dtypes": e.get("input_dtypes"), "output_dtypes": e.get("output_dtypes"),
                             "state": _text(e.get("state", "?"))})
    out = []
    for g in sorted(groups.values(), key=lambda g: g["pg_id"]):
        g["entries"] = sorted(g["entries"], key=lambda x: x["seq"])[-keep:]
        out.append(g)
    return out


class EntryPool:
    """The distinct entries already kept, per collective number, across every record given to
    :func:`share_entries` with this pool: one per `dump-stacks` run, so that the ranks of all nodes
    (not only of one node) share their equal entries."""

    __slots__ = ("kept",)

    MAX_PER_SEQ = 16
    """Distinct entries kept under one collective number (one per kind of process group or so); more
    are left unshared, which costs memory and time but changes no result."""

    def __init__(self) -> None:
        self.kept: dict[int, list[dict[str, Any]]] = {}


def share_entries(records: list[dict[str, Any]], pool: EntryPool | None = None) -> None:
    """Make equal entries of these records one object (in place), as one node's document is read.

    The ranks of a job issue the same collectives: their entries, parsed from JSON as objects of
    their own, are ~1 KiB each and 2 million at 16k ranks. Each entry is compared (at C speed) with
    the few already kept under its collective number, and replaced by the equal one: the records
    then hold each distinct entry once. Nothing the analysis reads changes, but what it compares
    between ranks is then the same object, which it recognises without reading it (a pool shared
    by every node's records makes that true across nodes too: 16k ranks, 2.0 -> 0.x s)."""
    seen = pool.kept if pool is not None else {}
    cap = EntryPool.MAX_PER_SEQ
    for r in records:
        groups = r.get("collectives") if isinstance(r, dict) else None
        for g in groups if isinstance(groups, list) else ():
            entries = g.get("entries") if isinstance(g, dict) else None
            if not isinstance(entries, list):
                continue
            for i, e in enumerate(entries):
                seq = e.get("seq") if isinstance(e, dict) else None
                if not isinstance(seq, int):
                    continue
                kept = seen.get(seq)
                if kept is None:
                    seen[seq] = [e]
                    continue
                for k in kept:
                    if k is e or k == e:
                        entries[i] = k
                        break
                else:
                    if len(kept) < cap:
                        kept.append(e)


# ---- matching ----------------------------------------------------------------------------------
#
# At 16k ranks a process group such as the default one has 16k members of 64 entries each: every
# step below looks at each entry a constant number of times. A member's entries are read by
# position (they are consecutive collective numbers, as compact() keeps them), and the common case
# (every rank issued the same thing) is found by comparing whole runs of raw fields at C speed; the
# signatures are only built where two ranks' raw fields differ.

def _who(rec: dict[str, Any]) -> str:
    return f"rank {rec['rank']}" if rec.get("rank") is not None else f"pid {rec.get('pid')}"


def _list(recs: Iterable[dict[str, Any]]) -> str:
    recs = list(recs)
    if len(recs) > 1 and all(r.get("rank") is not None for r in recs):
        return "ranks " + compress(int(r["rank"]) for r in recs)
    return ", ".join(_who(r) for r in recs)


def _members(recs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"rank": r.get("rank"), "host": r.get("host"), "pid": r.get("pid")} for r in recs]


def _shape(v: Any) -> str:
    return str(v).replace(" ", "") if v not in (None, []) else "[]"


def _listed(value: Any) -> list[Any]:
    """A dump's list field, or nothing when a damaged dump holds something else there."""
    return list(value) if isinstance(value, (list, tuple)) else []


def signature(e: dict[str, Any]) -> tuple[str, str, str, str]:
    """(op, input sizes, output sizes, dtypes) as compared between ranks."""
    dtypes = sorted({*map(str, _listed(e.get("input_dtypes"))), *map(str, _listed(e.get("output_dtypes")))})
    return (e["op"], _shape(e.get("input_sizes")), _shape(e.get("output_sizes")), ",".join(dtypes))


def describe_entry(e: dict[str, Any]) -> str:
    """`gloo:all_reduce [[7]] Float`."""
    dtypes = ",".join(sorted({str(d) for d in _listed(e.get("input_dtypes"))}))
    return f"{e['op']} {_shape(e.get('input_sizes'))}" + (f" {dtypes}" if dtypes else "")


def _kind(a: tuple[str, str, str, str], b: tuple[str, str, str, str]) -> str:
    if a[0] != b[0]:
        return "op"
    if a[1:3] != b[1:3]:
        return "size"
    return "dtype"


def _comparable(sigs: list[tuple[str, str, str, str]]) -> list[tuple[str, ...]]:
    """What must agree: the whole signature, or only the op for collectives whose sizes may differ."""
    if any(any(k in s[0] for k in SIZES_MAY_DIFFER) for s in sigs):
        return [(s[0],) for s in sigs]
    return list(sigs)


Member = tuple[dict[str, Any], dict[str, Any]]
"""(rank record, that rank's data for one process group)."""

# The fields signature() reads: two entries with equal raw fields have equal signatures.
_RAW = itemgetter("op", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes")
_SEQ = itemgetter("seq")


class _Entries:
    """One member's entries of a group, found by collective number in constant time when they are
    consecutive numbers in order (as compact() keeps them); by a scan otherwise."""

    __slots__ = ("entries", "first", "_regular")

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries
        self.first = entries[0]["seq"] if entries else 0
        self._regular: bool | None = None

    @property
    def regular(self) -> bool:
        """Consecutive numbers in order (checked once, when first needed)."""
        if self._regular is None:
            self._regular = not self.entries or (type(self.first) is int and list(map(_SEQ, self.entries))
                                                 == list(range(self.first, self.first + len(self.entries))))
        return self._regular

    @regular.setter
    def regular(self, value: bool) -> None:
        self._regular = value

    def at(self, seq: int) -> list[dict[str, Any]]:
        """The entries numbered `seq`, in the order the rank kept them."""
        if self.regular:
            i = seq - self.first
            return [self.entries[i]] if 0 <= i < len(self.entries) else []
        return [e for e in self.entries if e["seq"] == seq]


def _mismatch_at(members: list[Member], index: list[_Entries], seq: int,
                 history: Counter[tuple[str, ...]]) -> dict[str, Any] | None:
    """Collective `seq` compared between the ranks that kept it: the mismatch, or None (then counted
    in `history`, the signatures this group issued before)."""
    have = [(rec, e) for (rec, _), ix in zip(members, index, strict=True) for e in ix.at(seq)]
    if len(have) < 2:
        return None
    sigs = [signature(e) for _, e in have]
    keys = _comparable(sigs)
    if len(set(keys)) > 1:
        split: dict[tuple[str, ...], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
        for key, item in zip(keys, have, strict=True):
            split.setdefault(key, []).append(item)
        # the normal side: most ranks; on a tie, the signature this group issued before
        ordered = sorted(split.items(), key=lambda kv: (len(kv[1]), history[kv[0]]), reverse=True)
        normal_key = ordered[0][0]
        sides = [{"ranks": [r.get("rank") for r, _ in items], "who": _list(r for r, _ in items),
                  "members": _members(r for r, _ in items), "op": items[0][1]["op"],
                  "input_sizes": items[0][1].get("input_sizes"),
                  "output_sizes": items[0][1].get("output_sizes"),
                  "dtypes": sorted({str(d) for d in items[0][1].get("input_dtypes") or []}),
                  "text": describe_entry(items[0][1]), "odd": key != normal_key}
                 for key, items in ordered]
        normal_sig = signature(ordered[0][1][0][1])
        odd_sig = signature(ordered[1][1][0][1])
        sides.sort(key=lambda side: not side["odd"])  # the odd ones first
        return {"seq": seq, "kind": _kind(normal_sig, odd_sig), "sides": sides}
    history.update(keys[:1])
    return None


def _scan(index: list[_Entries], common: int, low: int) -> tuple[list[int], set[int]] | None:
    """Over the numbers low..common: how many ranks kept each one (as differences from the previous),
    and the positions where some rank's raw fields are not those of the first rank that kept it.
    None when a rank's entries are not consecutive numbers or an entry lacks one of the fields (the
    general path then says what it makes of them)."""
    span = common - low + 1
    if span > sum(len(ix.entries) for ix in index):  # numbers no rank kept (a damaged dump's): not a run
        return None
    ref: list[Any] = [None] * span  # the entry of the first rank (in order) that kept each number
    count = [0] * (span + 1)
    differ: set[int] = set()
    try:
        for ix in index:
            ents, first = ix.entries, ix.first
            if not ents:
                continue
            a = max(low, first) - low
            b = min(common, first + len(ents) - 1) - low
            if type(first) is not int or a > b:
                if not ix.regular:
                    return None
                continue
            i0, i1 = a + low - first, b + low - first + 1
            # every entry must sit at its number: those outside the run are checked here, those in
            # it by the comparisons below (an entry's "seq" is one of the fields compared)
            if any(ents[i]["seq"] != first + i for i in chain(range(i0), range(i1, len(ents)))):
                return None
            count[a] += 1
            count[b + 1] -= 1
            run = ents[i0:i1]
            if ref[a:b + 1] != run:  # else the common case: equal entries, one comparison of the whole run
                for p, e in enumerate(run, a):
                    if e["seq"] != low + p:
                        return None
                    r = ref[p]
                    if r is None:
                        ref[p] = e
                    elif r != e and _RAW(r) != _RAW(e):  # entries may differ in their state only
                        differ.add(p)
            ix.regular = True
    except KeyError:
        return None
    return count, differ


def _mismatch(members: list[Member], index: list[_Entries], common: int, low: int) -> dict[str, Any] | None:
    """The first collective number in low..common whose signature differs between the ranks that kept it."""
    if common < low:
        return None
    scan = _scan(index, common, low)
    if scan is None:  # entries out of order, repeated or odd: number by number (those some rank kept)
        history: Counter[tuple[str, ...]] = Counter()
        kept_by_some = {e.get("seq") for ix in index for e in ix.entries}
        for seq in sorted(s for s in kept_by_some if type(s) is int and low <= s <= common):
            found = _mismatch_at(members, index, seq, history)
            if found:
                return found
        return None
    count, differ = scan
    kept = 0
    agreed: list[int] = []  # the numbers kept by 2+ ranks that agree on them
    for p in range(common - low + 1):
        kept += count[p]
        if kept < 2:
            continue
        if p in differ:
            history = Counter(_comparable([signature(_entry_of(index, low + q))])[0] for q in agreed)
            found = _mismatch_at(members, index, low + p, history)
            if found:
                return found
        agreed.append(p)
    return None


def _entry_of(index: list[_Entries], seq: int) -> dict[str, Any]:
    return next(e for ix in index for e in ix.at(seq))


def _entry_at(index: list[_Entries], seq: int) -> dict[str, Any] | None:
    for ix in index:
        found = ix.at(seq)
        if found:
            return found[0]
    return None


def analyse_group(name: str, members: list[Member]) -> dict[str, Any]:
    """The analysis of one process group: `members` are (rank record, that rank's group data)."""
    desc = next((g["desc"] for _, g in members if g.get("desc")), "")
    enq = {id(r): g["last_enqueued"] for r, g in members if g.get("last_enqueued") is not None}
    done = {id(r): g["last_completed"] for r, g in members if g.get("last_completed") is not None}
    whos = [_who(r) for r, _ in members]
    out: dict[str, Any] = {"pg": name, "desc": desc, "ranks": [r.get("rank") for r, _ in members],
                           "last_enqueued": dict(zip(whos, [g.get("last_enqueued") for _, g in members],
                                                     strict=True)),
                           "last_completed": dict(zip(whos, [g.get("last_completed") for _, g in members],
                                                      strict=True)),
                           "not_enqueued": [], "mismatch": None, "first_incomplete": None}
    if not enq:
        return out
    index = [_Entries(g["entries"]) for _, g in members]
    reached = [enq.get(id(r)) or 0 for r, _ in members]  # per member, in order
    top = max(enq.values())
    # (a) ranks that never issued a collective others issued: one finding per first missing number
    late = sorted({v for v in enq.values() if v < top})
    for v in late:
        missing = [r for r, _ in members if enq.get(id(r)) == v]
        issued = [r for (r, _), n in zip(members, reached, strict=True) if n > v]
        e = _entry_at([ix for ix, n in zip(index, reached, strict=True) if n > v], v + 1)
        out["not_enqueued"].append({"seq": v + 1, "ranks": [r.get("rank") for r in missing],
                                    "who": _list(missing), "by": [r.get("rank") for r in issued],
                                    "by_who": _list(issued), "members": _members(missing),
                                    "op": e["op"] if e else None, "text": describe_entry(e) if e else None})
    # (b) the first collective whose signature differs, among the numbers every rank issued
    common = min(enq.values())
    low = max([1, *(g["entries"][0]["seq"] for _, g in members if g["entries"])])
    out["mismatch"] = _mismatch(members, index, common, low)
    # (c) the first collective some rank issued and that did not complete
    first = min(done.values()) + 1 if done else None
    if first is not None and first <= top:
        e = _entry_at(index, first)
        have = [r for (r, _), n in zip(members, reached, strict=True) if n >= first]
        have_ids = {id(r) for r in have}
        states = sorted({x["state"] for ix in index for x in ix.at(first)})
        out["first_incomplete"] = {"seq": first, "op": e["op"] if e else None,
                                   "text": describe_entry(e) if e else None,
                                   "enqueued_by": _list(have),
                                   "not_enqueued_by": _list(r for r, _ in members if id(r) not in have_ids),
                                   "states": states}
    return out


def findings(groups: list[dict[str, Any]]) -> list[str]:
    """One sentence per finding, the strongest (a desync) first."""
    first: list[str] = []
    rest: list[str] = []
    for g in groups:
        pg = f"pg {g['pg']}" + (f" ({g['desc']})" if g.get("desc") else "")
        m = g.get("mismatch")
        if m:
            odd = [s for s in m["sides"] if s["odd"]]
            normal = [s for s in m["sides"] if not s["odd"]]
            first.append(f"desync in collective #{m['seq']} of {pg}: "
                         + "; ".join(f"{s['who']} issued {s['text']}" for s in odd)
                         + " while " + "; ".join(f"{s['who']} issued {s['text']}" for s in normal)
                         + f" ({m['kind']} mismatch)")
        for n in g.get("not_enqueued") or []:
            what = f" ({n['text']})" if n.get("text") else ""
            rest.append(f"{n['who']} never issued collective #{n['seq']} of {pg}{what}, which {n['by_who']} issued")
        inc = g.get("first_incomplete")
        if inc and not g.get("not_enqueued") and not m:
            what = f" ({inc['text']})" if inc.get("text") else ""
            rest.append(f"collective #{inc['seq']} of {pg}{what} did not complete on "
                        f"{inc['enqueued_by']} ({'/'.join(inc['states']) or 'no state'})")
    return first + rest


def analyse(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The cross-rank analysis of Flight Recorder records (None when fewer than two ranks have data)."""
    ok = [r for r in records if r.get("ok") and r.get("collectives")]
    if len(ok) < 2:
        return None
    with gc_paused():  # millions of small objects over a large heap (16k ranks: 0.86 -> 0.6 s)
        return _analyse(ok)


def _analyse(ok: list[dict[str, Any]]) -> dict[str, Any]:
    by_group: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for r in ok:
        for g in r["collectives"]:
            key = g.get("name") or g["pg_id"]
            by_group.setdefault(key, []).append((r, g))
    # analysed in the order the ranks hold them (near in memory), reported in the order of their names
    done = {name: analyse_group(name, members) for name, members in by_group.items() if len(members) >= 2}
    groups = [done[name] for name in sorted(done)]
    found = findings(groups)
    culprits: list[dict[str, Any]] = []
    for g in groups:
        m = g.get("mismatch")
        if m:
            for s in m["sides"]:
                if s["odd"]:
                    culprits += [{**x, "why": "desync"} for x in s["members"]]
        for n in g.get("not_enqueued") or []:
            if len(n["ranks"]) <= len(n["by"]):
                culprits += [{**x, "why": "not-enqueued"} for x in n["members"]]
    return {"process_groups": groups, "findings": found, "culprits": culprits,
            "evidence": "flight recorder analysis: " + (found[0] if found else
                                                        "every rank issued the same collectives, all completed")}
