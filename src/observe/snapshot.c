// Introspection: the JSON snapshot of a pool (nf_snapshot) and the OOM report
// (nf_last_oom_report). Both only read the pool, under its lock; neither adds
// anything to the allocation fast path (the report is built on the failure
// path only, after the one-line nf_last_error message is set).
#include "observe/observe.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ------------------------------------------------------------------ buffer

// Growable string. Growth is geometric so that a snapshot of n blocks costs
// O(n) copies; a failed realloc sets `failed` and later appends do nothing.
typedef struct {
  char *s;
  size_t len, cap;
  bool failed;
} sbuf_t;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void sb_printf(sbuf_t *b, const char *fmt, ...) {
  if (b->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) { b->failed = true; return; }
    if ((size_t)n < b->cap - b->len) { b->len += (size_t)n; return; }
    size_t cap = b->cap * 2 > b->len + (size_t)n + 1 ? b->cap * 2 : b->len + (size_t)n + 1;
    char *s = realloc(b->s, cap);
    if (!s) { b->failed = true; return; }
    b->s = s;
    b->cap = cap;
  }
}

static const char *tier_name(unsigned t) {
  return t == NF_TIER_DEVICE ? "device" : t == NF_TIER_HOST ? "host" : t == NF_TIER_DISK ? "disk" : "unknown";
}

static const char *state_name(unsigned s) {
  return s == NF_BLK_LIVE ? "live" : s == NF_BLK_PENDING ? "pending" : s == NF_BLK_SHADOW ? "shadow" : "free";
}


// ------------------------------------------------------------------ snapshot

static void snap_blocks(sbuf_t *b, const nf_pool_t *p, const nf_chunk_t *c) {
  sb_printf(b, "\"blocks\":[");
  for (const nf_block_t *k = c->first; k; k = k->next) {
    sb_printf(b, "%s\n{\"addr\":\"0x%llx\",\"size\":%llu,\"state\":\"%s\"", k == c->first ? "" : ",",
              (unsigned long long)k->addr, (unsigned long long)k->size, state_name(k->state));
    if (k->state == NF_BLK_SHADOW) // bytes another place's block uses through a second mapping (edge.c)
      sb_printf(b, ",\"shadow_of\":\"0x%llx\"", (unsigned long long)k->twin->addr);
    if (k->state == NF_BLK_LIVE || k->state == NF_BLK_PENDING) // live, or freed but waiting on record_stream work
      sb_printf(b, ",\"requested\":%llu,\"stream\":\"0x%llx\",\"extra_streams\":\"0x%llx\"",
                (unsigned long long)k->req, (unsigned long long)(uintptr_t)nf__block_stream(p, k),
                (unsigned long long)k->extra);
    if (k->edge & NF_EDGE_HEAD) sb_printf(b, ",\"shared_first_granule\":true");
    if (k->edge & NF_EDGE_TAIL) sb_printf(b, ",\"shared_last_granule\":true");
    if (k->state == NF_BLK_FREE || k->state == NF_BLK_PENDING) // streams whose work may still use the memory
      sb_printf(b, ",\"stream_mask\":\"0x%llx\"", (unsigned long long)k->smask);
    if (k->state == NF_BLK_LIVE && k->where) // nf_offload'ed: its owned granules are on that tier
      sb_printf(b, ",\"offloaded\":\"%s\"",
                k->where == NF_TIER_DISK ? "disk" : k->where == NF_TIER_HOST_DETACHED ? "host_detached" : "host");
    sb_printf(b, "}");
  }
  sb_printf(b, "]");
}

// Runs of mapped virtual granules with the same readiness and tier; zero
// bitmap words are skipped, so sparse chunks cost little.
static void snap_mapped(sbuf_t *b, const nf_pool_t *p, const nf_chunk_t *c) {
  const uint64_t *ready = c->mapped + ((c->ngran + 63) >> 6);
  bool first = true;
  sb_printf(b, "\"mapped\":[");
  for (uint64_t g = 0; g < c->ngran;) {
    if (!c->mapped[g >> 6] && !(g & 63)) { g += 64; continue; }
    if (!nf__bit(c->mapped, g)) { g++; continue; }
    bool r = nf__bit(ready, g);
    uint8_t tier = p->gran[c->phys[g]].tier;
    uint64_t e = g + 1;
    while (e < c->ngran && nf__bit(c->mapped, e) && nf__bit(ready, e) == r && p->gran[c->phys[e]].tier == tier) e++;
    sb_printf(b, "%s\n{\"addr\":\"0x%llx\",\"granule\":%llu,\"count\":%llu,\"tier\":\"%s\",\"ready\":%s,\"phys\":[",
              first ? "" : ",", (unsigned long long)(c->base + (g << p->gshift)), (unsigned long long)g,
              (unsigned long long)(e - g), tier_name(tier), r ? "true" : "false");
    for (uint64_t x = g; x < e; x++) sb_printf(b, "%s%u", x == g ? "" : ",", c->phys[x]);
    sb_printf(b, "]}");
    first = false;
    g = e;
  }
  sb_printf(b, "]");
}

char *nf_snapshot(nf_pool_t *p) {
  if (!p) { nf__error(NF_ERR_INVALID, "nofrag: nf_snapshot: NULL pool"); return NULL; }
  sbuf_t b = {.cap = 4096};
  if (!(b.s = malloc(b.cap))) { nf__error(NF_ERR_NOMEM, "nofrag: out of host memory"); return NULL; }
  nf__pool_lock(p);
  nf__bins_flush(p); // blocks as without deferred coalescing
  uint64_t gstate[3] = {0}, tiers[3] = {0};
  for (uint64_t i = 0; i < p->gran_cap; i++) {
    const nf_granule_t *g = &p->gran[i];
    if (g->state <= NF_GR_MAPPED) gstate[g->state]++;
    if (g->state != NF_GR_UNUSED && g->tier <= NF_TIER_DISK) tiers[g->tier]++;
  }
  sb_printf(&b,
            "{\"version\":1,\"device\":%d,\n\"totals\":{\"live\":%llu,\"live_rounded\":%llu,\"mapped\":%llu,\"physical\":%llu,"
            "\"limit\":%llu,\"granule\":%llu,\"cached\":%llu,\"live_blocks\":%llu,\"spilled\":%llu,"
            "\"offloaded\":%llu,\"offloaded_disk\":%llu,\"host_physical\":%llu},\n"
            "\"granules\":{\"created\":%llu,\"mapped\":%llu,\"free\":%llu,\"unused_slots\":%llu,"
            "\"tiers\":{\"device\":%llu,\"host\":%llu,\"disk\":%llu}},\n\"streams\":[",
            p->cfg.device, (unsigned long long)p->st.live, (unsigned long long)p->st.live_rounded,
            (unsigned long long)(p->gran_mapped << p->gshift), (unsigned long long)(p->gran_created << p->gshift),
            (unsigned long long)p->cfg.limit, (unsigned long long)p->granule, (unsigned long long)nf__cached(p),
            (unsigned long long)p->st.live_blocks, (unsigned long long)((p->host_mapped - p->offl_granules) << p->gshift),
            (unsigned long long)((p->offl_granules + p->detached_granules) << p->gshift), (unsigned long long)p->disk_bytes,
            (unsigned long long)(p->host_created << p->gshift), (unsigned long long)(p->gran_created + p->host_created),
            (unsigned long long)gstate[NF_GR_MAPPED], (unsigned long long)gstate[NF_GR_FREE],
            (unsigned long long)gstate[NF_GR_UNUSED], (unsigned long long)tiers[NF_TIER_DEVICE],
            (unsigned long long)tiers[NF_TIER_HOST], (unsigned long long)tiers[NF_TIER_DISK]);
  for (uint32_t i = 0; i < p->nstreams; i++) // a slot given back (stream.c): null
    if (p->stream_free >> i & 1) sb_printf(&b, "%snull", i ? "," : "");
    else sb_printf(&b, "%s\"0x%llx\"", i ? "," : "", (unsigned long long)(uintptr_t)p->streams[i].handle);
  sb_printf(&b, "],\n\"chunks\":[");
  // Chunks in address order (the pool keeps them newest first): a selection
  // pass per chunk would be O(chunks^2), so sort an array of pointers.
  uint64_t nc = 0;
  for (const nf_chunk_t *c = p->chunks; c; c = c->next) nc++;
  const nf_chunk_t **cs = nc ? malloc(nc * sizeof *cs) : NULL;
  if (nc && !cs) b.failed = true;
  uint64_t n = 0;
  for (const nf_chunk_t *c = p->chunks; c && cs; c = c->next) {
    uint64_t j = n++;
    for (; j && cs[j - 1]->base > c->base; j--) cs[j] = cs[j - 1]; // insertion: chunks are few
    cs[j] = c;
  }
  for (uint64_t i = 0; i < n && !b.failed; i++) {
    const nf_chunk_t *c = cs[i];
    sb_printf(&b, "%s\n{\"base\":\"0x%llx\",\"size\":%llu,\"arena\":\"%s\",\"granules\":%llu,\n", i ? "," : "",
              (unsigned long long)c->base, (unsigned long long)c->size,
              c->arena == NF_ARENA_SMALL ? "small" : "large", (unsigned long long)c->ngran);
    snap_blocks(&b, p, c);
    sb_printf(&b, ",\n");
    snap_mapped(&b, p, c);
    sb_printf(&b, "}");
  }
  nf__pool_unlock(p);
  free(cs);
  sb_printf(&b, "]}\n");
  if (b.failed) {
    free(b.s);
    nf__error(NF_ERR_NOMEM, "nofrag: out of host memory for a snapshot");
    return NULL;
  }
  return b.s;
}

void nf_snapshot_free(char *s) { free(s); }

// ------------------------------------------------------------------ OOM report

#define NF_OOM_BURST_NS 1000000000ull // OOMs closer than this belong to one burst
#define NF_OOM_TOP 5

static _Thread_local char tl_oom[4096];

const char *nf_last_oom_report(void) { return tl_oom; }

void nf__oom_print(void) {
  fprintf(stderr, "%s  (printed once per burst of OOMs; NOFRAG_QUIET_OOM=1 silences it)\n", tl_oom);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static bool quiet(void) { return nf__env_on("NOFRAG_QUIET_OOM"); }

// Appends to the thread's report buffer; output past its end is cut.
typedef struct { size_t len; } rep_t;
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void rep(rep_t *r, const char *fmt, ...) {
  if (r->len >= sizeof tl_oom - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tl_oom + r->len, sizeof tl_oom - r->len, fmt, ap);
  va_end(ap);
  if (n > 0) r->len += (size_t)n < sizeof tl_oom - r->len ? (size_t)n : sizeof tl_oom - 1 - r->len;
}

#define B(v, buf) (nf__fmt_bytes(buf, sizeof buf, (v)), buf)

bool nf__oom_report(nf_pool_t *p, uint64_t size, nf_stream_t s, bool too_large) {
  // Burst bookkeeping first: it decides whether this report is printed.
  uint64_t now = now_ns() | 1; // 0 means "no OOM yet"
  bool first = !p->oom_last_ns || now - p->oom_last_ns >= NF_OOM_BURST_NS;
  uint64_t held = p->oom_unprinted;
  p->oom_last_ns = now;
  if (first) p->oom_unprinted = 0;
  else p->oom_unprinted++;

  // One walk: the largest live blocks and the blocks still pending.
  const nf_block_t *top[NF_OOM_TOP] = {0};
  uint64_t pend_n = 0, pend_b = 0;
  for (const nf_chunk_t *c = p->chunks; c; c = c->next)
    for (const nf_block_t *b = c->first; b; b = b->next) {
      if (b->state == NF_BLK_PENDING) { pend_n++; pend_b += b->size; }
      if (b->state != NF_BLK_LIVE || (top[NF_OOM_TOP - 1] && top[NF_OOM_TOP - 1]->req >= b->req)) continue;
      int j = NF_OOM_TOP - 1;
      for (; j > 0 && (!top[j - 1] || top[j - 1]->req < b->req); j--) top[j] = top[j - 1];
      top[j] = b;
    }
  uint64_t live_gr = 0, lfm = nf__largest_free_mapped(p, &live_gr);
  uint64_t G = p->granule, L = p->cfg.limit, live = p->st.live;
  char b1[32], b2[32], b3[32], b4[32], b5[32];

  rep_t r = {0};
  rep(&r, "nofrag: out of memory (OOM #%llu of this pool", (unsigned long long)p->st.ooms);
  if (first && held) rep(&r, "; %llu more in the previous burst were not printed", (unsigned long long)held);
  rep(&r, ")\n  request:   %s (%llu B) on stream %p\n", B(size, b1), (unsigned long long)size, s);
  rep(&r, "  pool:      limit %s, live %s in %llu blocks (over %llu granules of %llu B), mapped %s, "
          "physical %s, cached %s\n",
      B(L, b1), B(live, b2), (unsigned long long)p->st.live_blocks, (unsigned long long)live_gr,
      (unsigned long long)G, B(p->gran_mapped << p->gshift, b3), B(p->gran_created << p->gshift, b4),
      B(nf__cached(p), b5));
  rep(&r, "  largest free mapped range: %s\n", B(lfm, b1));
  // Units (units:N): a unit is unmapped only whole, so one that a live block
  // lies on in part pins its free granules too (nofrag.h's guarantee).
  uint64_t stranded = too_large ? 0 : nf__units_stranded(p);
  if (stranded)
    rep(&r, "  units:     %llu free granules (%s) sit in mapping units that live blocks lie on in part; a unit "
            "moves only whole, so they cannot serve the request (units:%llu: set units:0 for a pool that runs "
            "near its limit)\n",
        (unsigned long long)stranded, B(stranded << p->gshift, b1), (unsigned long long)p->cfg.units);
  if (pend_n)
    rep(&r, "  pending:   %llu freed blocks (%s) wait on record_stream work\n", (unsigned long long)pend_n,
        B(pend_b, b1));
  rep(&r, "  largest live blocks:%s\n", top[0] ? "" : " none");
  for (int i = 0; i < NF_OOM_TOP && top[i]; i++)
    rep(&r, "    %d. %s (%llu B) at %p, stream %p\n", i + 1, B(top[i]->req, b1), (unsigned long long)top[i]->req,
        (void *)top[i]->addr, nf__block_stream(p, top[i]));
  // What reclaim did, from the pool's counters. The delta is since the
  // previous OOM (not this call alone): capturing it per call would add a
  // load to every allocation.
  if (too_large) {
    rep(&r, "  reclaim:   not tried (the request alone exceeds the limit)\n");
  } else {
    uint64_t dr = p->st.reclaims - p->oom_reclaims_mark, dg = p->st.reclaimed_granules - p->oom_reclaimed_mark;
    rep(&r, "  reclaim:   waited for stream work and unmapped every cached granule lying wholly in free "
            "ranges; %llu reclaims unmapped %llu granules since the previous OOM (%llu / %llu in all); "
            "%s stays cached (granules shared with live blocks, or inside the range chosen for the request)\n",
        (unsigned long long)dr, (unsigned long long)dg, (unsigned long long)p->st.reclaims,
        (unsigned long long)p->st.reclaimed_granules, B(nf__cached(p), b1));
  }
  p->oom_reclaims_mark = p->st.reclaims;
  p->oom_reclaimed_mark = p->st.reclaimed_granules;
  // One suggestion: either the bytes do not fit at all, or the granules
  // pinned by live blocks leave too few whole ones (the guarantee in
  // nofrag.h: live granules + ceil(s/G) + 1 <= L/G always succeeds).
  // live + size - L without wrapping: a too-large request may be near
  // SIZE_MAX (a negative size cast), where live + size wraps below L.
  uint64_t over = size > L ? (live > UINT64_MAX - (size - L) ? UINT64_MAX : live + (size - L))
                           : (live > L - size ? live - (L - size) : 0);
  if (over && !p->cfg.spill) {
    rep(&r, "  suggestion: live memory alone exceeds the limit by %s: reduce the batch, raise the limit, or "
            "set spill:host to back the excess with host memory (slower where it is touched)\n",
        B(over, b1));
  } else if (over && too_large) { // with spill: more than limit + spill_limit, whatever the host tier holds
    rep(&r, "  suggestion: the request alone exceeds the limit plus spill_limit (%s + %s): raise spill_limit "
            "or the limit, or reduce the batch\n",
        B(L, b1), B(p->max_host_granules << p->gshift, b2));
  } else if (over) {
    rep(&r, "  suggestion: live memory exceeds the limit by %s and the host tier is full too (%s spilled, "
            "spill_limit %s): raise spill_limit or the limit, or reduce the batch\n",
        B(over, b1), B((p->host_mapped - p->offl_granules) << p->gshift, b2),
        B(p->max_host_granules << p->gshift, b3));
  } else {
    uint64_t need_gr = (size + G - 1) >> p->gshift; // size <= L - live here: no wrap
    uint64_t pin = live_gr + stranded, want = (pin + need_gr + 1) << p->gshift;
    rep(&r, "  suggestion: fragmentation: the largest free range is %s; live blocks pin %llu granules (%s%s) "
            "for %s of data and the request needs %llu more: a limit of %s guarantees it, or free "
            "long-lived small blocks that share granules%s\n",
        B(lfm, b1), (unsigned long long)pin, B(pin << p->gshift, b2), stranded ? ", units included" : "",
        B(live, b3), (unsigned long long)need_gr, B(want, b4), stranded ? ", or set units:0" : "");
  }
  return first && !quiet();
}
