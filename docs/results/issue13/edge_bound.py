# Edge-sharing bound (issue 13): from a pool snapshot, the virtual granules holding live
# bytes, the partial ones, and how few physical granules could hold the partial ones if two
# virtual granules with disjoint live byte ranges could share one (interval colouring: the
# deepest overlap at any offset). Usage: edge_bound.py SNAPSHOT.json
import json, sys, collections
d = json.load(open(sys.argv[1])); G = d['totals']['granule']
iv = collections.defaultdict(list)  # (chunk, granule index) -> list of [lo, hi) offsets
for c in d['chunks']:
    base = int(c['base'], 16)
    for b in c['blocks']:
        if b['state'] not in ('live', 'pending'): continue
        a = int(b['addr'], 16) - base; e = a + b['size']
        g0, g1 = a // G, (e - 1) // G
        for g in range(g0, g1 + 1):
            lo = max(a, g * G) - g * G; hi = min(e, (g + 1) * G) - g * G
            iv[(base, g)].append((lo, hi))
V = len(iv)
full = 0; partial = []
for k, L in iv.items():
    L.sort(); m = []
    for lo, hi in L:
        if m and lo <= m[-1][1]: m[-1][1] = max(m[-1][1], hi)
        else: m.append([lo, hi])
    if len(m) == 1 and m[0] == [0, G]: full += 1
    else: partial.append(m)
print("virtual granules with live bytes", V, "full", full, "partial", len(partial), "physical", d['totals']['physical'] // G,
      "live/G %.1f" % (d['totals']['live'] / G))
# interval-graph colouring: physical granules needed for the partial ones = max depth at any offset
ev = []
for m in partial:
    for lo, hi in m: ev.append((lo, 1)); ev.append((hi, -1))
ev.sort(key=lambda x: (x[0], x[1])); depth = best = 0
for x, dlt in ev:
    depth += dlt; best = max(best, depth)
print("partial granules", len(partial), "-> with edge sharing (max overlap depth)", best, "saving", len(partial) - best)
kinds = collections.Counter()
for m in partial:
    kinds[('end' if m[0][0] == 0 else '') + ('start' if m[-1][1] == G else '') or 'middle'] += 1
print(kinds)
print("min granules without sharing", V, " with sharing", V - (len(partial) - best))
# Pairs only (one physical granule for two views): a block's last granule [0, x)
# with another's first [y, G), x <= y; greedy matching (ends by x, starts by y).
ends = sorted(m[0][1] for m in partial if len(m) == 1 and m[0][0] == 0 and m[0][1] < G)
starts = sorted(m[0][0] for m in partial if len(m) == 1 and m[0][1] == G and m[0][0] > 0)
pairs, j = 0, 0
for x in ends:
    while j < len(starts) and starts[j] < x: j += 1
    if j < len(starts): pairs += 1; j += 1
print("pairs only: saving", pairs, "-> min granules", V - pairs)
