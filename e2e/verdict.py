"""The end-to-end suite's judgement, from the recorder's record alone: which
collection intervals two pods did, which no pod did, and, for the routed
Service, which requests failed. Never from leader-gate's own view (its Lease,
logs or metrics): the record is what the cluster-wide target saw.

Definitions (docs/e2e.md says them to users):

- A *scrape* is one request the recorder logged: when, and which pod made it.
- A pod's *span* is a stretch of its scrapes, each within 1.5 intervals of
  the one before (Prometheus scrapes a target once per interval, on the dot).
- A *duplicated interval* is a scrape made inside another pod's span: that
  pod was between two of its own scrapes, so both were doing the work.
  Goal: 0, always.
- Between two consecutive scrapes of the whole record (by any pods) `g`
  seconds apart, `floor((g - I/10) / I)` intervals were *missed* (none
  when scrapes come every I seconds; I/10 is for the scrape loop's jitter).
- A *hand-over* is two consecutive scrapes by different pods. It belongs to
  the fault whose window (from its start to the moment the suite saw the
  group settled) holds the second scrape. A hand-over in no fault's window
  is *unprovoked*, and reported.
- A hand-over's *time without cluster work* is its gap less one interval:
  how much later than the next scrape due the new pod's first came (0 when
  the new pod scrapes exactly when the old one would have). The table gives
  its median and maximum over the graceful hand-overs.
- Bounds, per fault: a graceful one (rollout, deletion, `handover`, drain,
  scale-down) misses at most 1 interval per hand-over it caused, and none
  when it caused none; a forced one (forced deletion, a container killed, a
  Lease edited by hand) at most ceil((lease duration + retry period) / I) + 1
  per hand-over (or in all, when it caused none). Routed requests that fail
  in a graceful fault's window break its bound.
"""

import math

SPAN_SLACK = 1.5
JITTER = 0.1


def spans(scrapes, interval):
    """Each pod's spans, as {pod: [(first, last), ...]}."""
    out = {}
    last = {}
    for t, pod in sorted(scrapes):
        runs = out.setdefault(pod, [])
        if pod in last and t - last[pod] <= SPAN_SLACK * interval:
            runs[-1] = (runs[-1][0], t)
        else:
            runs.append((t, t))
        last[pod] = t
    return out


def duplicated(scrapes, interval):
    """The scrapes made inside another pod's span: [(t, pod, other)]."""
    by_pod = spans(scrapes, interval)
    out = []
    for t, pod in sorted(scrapes):
        for other, runs in by_pod.items():
            if other != pod and any(first < t < last for first, last in runs):
                out.append((t, pod, other))
                break
    return out


def missed(gap, interval):
    """Intervals missed between two consecutive scrapes `gap` seconds apart."""
    return max(0, math.floor((gap - JITTER * interval) / interval))


def without_work(gap, interval):
    """Time without cluster work in a hand-over whose two scrapes are `gap` apart."""
    return round(max(0.0, gap - interval), 3)


def median(values):
    values = sorted(values)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else round((values[mid - 1] + values[mid]) / 2, 3)


def forced_bound(interval, lease_duration, retry_period):
    return math.ceil((lease_duration + retry_period) / interval) + 1


def judge(scrapes, interval, faults, lease_duration, retry_period, requests=()):
    """The verdict of one workload's record.

    scrapes: [(t, pod)]; faults: [{"kind", "graceful", "start", "end"}] on
    the same clock; requests (routed Services): [(t, ok, pod or None)].
    Returns a dict: per-fault results, hand-overs, totals, and `failures`
    (each broken bound or duplicate, in words); an empty `failures` passes.
    """
    scrapes = sorted(scrapes)
    forced = forced_bound(interval, lease_duration, retry_period)
    gaps = [
        (a[0], b[0], a[1], b[1], b[0] - a[0], missed(b[0] - a[0], interval))
        for a, b in zip(scrapes, scrapes[1:])
    ]

    def window(fault):
        return lambda t: fault["start"] <= t <= fault["end"]

    handovers = []
    for before, after, old, new, gap, lost in gaps:
        if old != new:
            owner = next((i for i, f in enumerate(faults) if window(f)(after)), None)
            handovers.append(
                {"from": old, "to": new, "last": before, "first": after,
                 "gap": round(gap, 3), "without_work": without_work(gap, interval), "missed": lost,
                 "fault": owner}
            )
    results = []
    failures = []
    for i, fault in enumerate(faults):
        inside = window(fault)
        mine = [h for h in handovers if h["fault"] == i]
        lost = sum(g[5] for g in gaps if inside(g[1]))
        longest = max((g[4] for g in gaps if inside(g[1])), default=0.0)
        failed = sum(1 for t, ok, _ in requests if inside(t) and not ok)
        per = 1 if fault["graceful"] else forced
        bound = per * len(mine) if fault["graceful"] else per * max(1, len(mine))
        result = {
            "kind": fault["kind"], "graceful": fault["graceful"],
            "start": fault["start"], "end": fault["end"],
            "handovers": len(mine), "missed": lost, "bound": bound,
            "longest_gap": round(longest, 3), "failed_requests": failed,
        }
        results.append(result)
        if lost > bound:
            failures.append(f"fault {i} ({fault['kind']}): {lost} intervals missed, bound {bound} for {len(mine)} hand-over(s)")
        if fault["graceful"] and failed:
            failures.append(f"fault {i} ({fault['kind']}): {failed} routed requests failed in a graceful hand-over")
    dups = duplicated(scrapes, interval)
    for t, pod, other in dups:
        failures.append(f"duplicated interval at {t:.2f}: {pod} scraped inside {other}'s span")
    unprovoked = [h for h in handovers if h["fault"] is None]
    for h in unprovoked:
        failures.append(f"unprovoked hand-over {h['from']} -> {h['to']} at {h['first']:.2f} (no fault's window)")
    graceful = [h["without_work"] for h in handovers
                if h["fault"] is not None and faults[h["fault"]]["graceful"]]
    totals = {
        "scrapes": len(scrapes),
        "handovers": len(handovers),
        "duplicated": len(dups),
        "missed": sum(g[5] for g in gaps),
        "longest_gap": round(max((g[4] for g in gaps), default=0.0), 3),
        "requests": len(requests),
        "failed_requests": sum(1 for _, ok, _ in requests if not ok),
        "failed_requests_graceful": sum(r["failed_requests"] for r in results if r["graceful"]),
        "graceful_without_work": {"median": median(graceful), "max": max(graceful, default=None)},
    }
    return {"faults": results, "handovers": handovers, "totals": totals, "failures": failures}


def routed_handovers(requests):
    """Changes of the pod that answered, in the routed Service's record."""
    answered = [(t, pod) for t, ok, pod in sorted(requests) if ok and pod]
    return sum(1 for a, b in zip(answered, answered[1:]) if a[1] != b[1])


def table(verdicts, interval):
    """Per workload and fault kind, a table a user can read."""
    head = ["workload", "fault", "graceful", "faults", "hand-overs", "missed", "max missed/fault",
            "bound/hand-over", "failed requests", "longest gap s"]
    rows = []
    for workload, v in verdicts.items():
        kinds = {}
        for r in v["faults"]:
            kinds.setdefault(r["kind"], []).append(r)
        for kind, rs in sorted(kinds.items()):
            per = rs[0]["bound"] // max(1, rs[0]["handovers"]) if rs[0]["handovers"] else rs[0]["bound"]
            rows.append([workload, kind, "yes" if rs[0]["graceful"] else "no", len(rs),
                         sum(r["handovers"] for r in rs), sum(r["missed"] for r in rs),
                         max(r["missed"] for r in rs), per if not rs[0]["graceful"] else 1,
                         sum(r["failed_requests"] for r in rs),
                         max(r["longest_gap"] for r in rs)])
        t = v["totals"]
        rows.append([workload, "TOTAL", "", len(v["faults"]), t["handovers"], t["missed"], "",
                     f"dup {t['duplicated']}", t["failed_requests"], t["longest_gap"]])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda r: "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |"
    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    for workload, v in verdicts.items():
        w = v["totals"]["graceful_without_work"]
        if w["median"] is not None:
            out.append(f"{workload}: time without cluster work per graceful hand-over (gap less one interval): "
                       f"median {w['median']} s, max {w['max']} s")
    out.append(f"(interval {interval} s; duplicated intervals and unprovoked hand-overs fail the run)")
    return "\n".join(out)
