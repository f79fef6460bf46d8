// Granules and virtual memory: mapping on demand into the address ranges
// chunk.c makes, stitching (unmapping cached granules to remap them where a
// request needs them), the release policy and trim.
//
// Per chunk, two bitmaps over its granules: `mapped` (a physical granule is
// mapped there) and `ready` (mapped and access set). Only `ready` granules may
// hold live data; a granule can be mapped but not ready only after a mapping
// failed (a backend error, or a request that failed after views moved granules
// to it), and the next mapping of that range sets its access.
//
// Granules have a tier. Device granules are the pool; host granules (spill,
// nf_offload) sit on their own free list and are used only by spill (after
// device memory and non-blocking stitching are exhausted) and by offload.c.
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Soft target for physical memory: the live peak (request included) + peak/64 + 8 granules.
#define NF_SLACK_SHIFT 6
#define NF_SLACK_GRANULES 8



// First set bit at or after g, below end (end if none): a word at a time,
// so walking a large, mostly unmapped free range costs ngran/64 loads.
static inline uint64_t next_set(const uint64_t *bm, uint64_t g, uint64_t end) {
  while (g < end) {
    uint64_t w = bm[g >> 6] >> (g & 63);
    if (w) {
      g += (uint64_t)__builtin_ctzll(w);
      return g < end ? g : end;
    }
    g = (g | 63) + 1;
  }
  return end;
}

static bool bits_all(const uint64_t *bm, uint64_t g0, uint64_t g1) {
  while (g0 < g1) {
    uint64_t b = g0 & 63, n = 64 - b < g1 - g0 ? 64 - b : g1 - g0;
    uint64_t mask = (n == 64 ? ~0ull : (1ull << n) - 1) << b;
    if ((bm[g0 >> 6] & mask) != mask) return false;
    g0 += n;
  }
  return true;
}

static inline void gran_span(const nf_pool_t *p, const nf_chunk_t *c, uintptr_t a, uint64_t n,
                             uint64_t *g0, uint64_t *g1) {
  *g0 = (a - c->base) >> p->gshift;
  *g1 = (a + n - c->base + p->granule - 1) >> p->gshift;
}

bool nf__range_mapped(const nf_pool_t *p, const nf_chunk_t *c, uintptr_t a, uint64_t n) {
  uint64_t g0, g1;
  gran_span(p, c, a, n, &g0, &g1);
  return bits_all(NF_READY(c), g0, g1);
}

// Granules of [a, a+n) that are not ready (would need mapping).
uint64_t nf__range_unmapped(const nf_pool_t *p, const nf_chunk_t *c, uintptr_t a, uint64_t n) {
  uint64_t g0, g1, k = 0;
  gran_span(p, c, a, n, &g0, &g1);
  const uint64_t *bm = NF_READY(c);
  while (g0 < g1) {
    uint64_t b = g0 & 63, m = 64 - b < g1 - g0 ? 64 - b : g1 - g0;
    uint64_t mask = (m == 64 ? ~0ull : (1ull << m) - 1) << b;
    k += (uint64_t)__builtin_popcountll(~bm[g0 >> 6] & mask);
    g0 += m;
  }
  return k;
}

// ------------------------------------------------------------ granule pool

static nf_status_t gran_new(nf_pool_t *p, nf_tier_t tier) {
  int32_t i = nf__gran_slot(p);
  if (i < 0) return NF_ERR_NOMEM;
  nf_handle_t h;
  nf_status_t st = NF_BE(p, mem_create, create, tier, p->granule, &h);
  if (st != NF_OK)
    return nf__error(st, "nofrag: creating a %llu B %s granule failed: %s", (unsigned long long)p->granule,
                     tier == NF_TIER_HOST ? "host" : "device", nf__backend_err());
  p->gran_unused = p->gran[i].next_free;
  p->gran[i].handle = h;
  p->gran[i].tier = (uint8_t)tier;
  nf__gran_push_free(p, (uint32_t)i);
  return NF_OK;
}

// Create up to n granules of `tier` onto its free list, bounded by the limit
// (device) or spill_limit (host).
static nf_status_t granules_create(nf_pool_t *p, nf_tier_t tier, uint64_t n) {
  bool h = tier == NF_TIER_HOST;
  uint64_t *created = h ? &p->host_created : &p->gran_created;
  uint64_t *peak = h ? &p->st.host_physical_peak : &p->st.physical_peak;
  for (uint64_t max = h ? p->max_host_granules : p->max_granules; n; n--) {
    // Units whose release failed (LOOSE) still count against the limit: retry them there.
    if (*created >= max && !h && p->un_loose >= 0) nf__units_loose_release(p);
    if (*created >= max) return NF_ERR_OOM;
    nf_status_t st = gran_new(p, tier);
    if (st != NF_OK) return st;
    ++*created;
    p->gran_made += !h;
    nf__peak(peak, *created << p->gshift);
  }
  return NF_OK;
}

// Return unmapped granules of `tier` to the backend until at most `keep` exist
// (`evict`: parked views whose work is known complete go first, so that
// their granules can).
static nf_status_t granules_release(nf_pool_t *p, nf_tier_t tier, uint64_t keep, bool evict) {
  uint64_t *created = tier == NF_TIER_HOST ? &p->host_created : &p->gran_created;
  const int32_t *head = tier == NF_TIER_HOST ? &p->host_free : &p->gran_free;
  // Views: a granule still mapped at parked views cannot go back; unmap the
  // views whose work is known complete first (no host wait), skip the rest.
  nf_status_t st;
  if (tier == NF_TIER_DEVICE && p->un_loose >= 0) nf__units_loose_release(p);
  if (evict && p->vw_count && *created > keep) nf__view_evict(p, UINT64_MAX, false, &st);
  for (int32_t nx, j = *head; *created > keep && j >= 0; j = nx) {
    uint32_t i = (uint32_t)j;
    nx = p->gran[i].next_free;
    if (p->gran[i].nviews) continue;
    st = p->tier.win_unmap ? p->tier.win_unmap(p, i) : NF_OK;
    if (st != NF_OK) return st;
    st = NF_BE(p, mem_release, release, p->gran[i].handle);
    if (st != NF_OK) return nf__error(st, "nofrag: releasing a granule failed: %s", nf__backend_err());
    nf__gran_unlink(p, i);
    nf__gran_slot_put(p, i);
    --*created;
  }
  return NF_OK;
}

nf_status_t nf__granules_create(nf_pool_t *p, uint64_t n) { return granules_create(p, NF_TIER_DEVICE, n); }
nf_status_t nf__host_granules_create(nf_pool_t *p, uint64_t n) { return granules_create(p, NF_TIER_HOST, n); }
nf_status_t nf__granules_release(nf_pool_t *p, uint64_t keep) { return granules_release(p, NF_TIER_DEVICE, keep, true); }
// Pinned host memory is precious: unmapped host granules go back on trim.
void nf__host_granules_release(nf_pool_t *p, uint64_t keep) { granules_release(p, NF_TIER_HOST, keep, false); }
void nf__granules_unmake(nf_pool_t *p, uint64_t dev0, uint64_t host0) {
  // What a failed call created lies unmapped on the free lists, in no view:
  // nothing is evicted for it. (A release that fails leaves the granule:
  // cache, as any granule stitching unmapped on the way.)
  if (p->gran_created > dev0) (void)granules_release(p, NF_TIER_DEVICE, dev0, false);
  if (p->host_created > host0) (void)granules_release(p, NF_TIER_HOST, host0, false);
}

// ------------------------------------------------------------ unmapping

// Unmap mapped granules [g0, g1) of c (all mapped) in one call; they go back
// to the free list, units (whole, never cut) back to the backend.
nf_status_t nf__unmap_run(nf_pool_t *p, nf_chunk_t *c, uint64_t g0, uint64_t g1) {
  if (NF_UNLIKELY(p->un_live != 0) && nf__unit_cut(p, c, g0, g1))
    return nf__error(NF_ERR_INVALID, "nofrag: internal: an unmap of granules %llu..%llu would cut a mapping unit",
                     (unsigned long long)g0, (unsigned long long)g1);
  nf_status_t st = NF_BE(p, unmap, unmap, c->base + (g0 << p->gshift), (g1 - g0) << p->gshift);
  if (st != NF_OK) return nf__error(st, "nofrag: unmap failed: %s", nf__backend_err());
  p->fx++;
  p->gran_mapped -= g1 - g0;
  for (uint64_t g = g0; g < g1; g++) {
    nf__bit_clr(c->mapped, g);
    nf__bit_clr(NF_READY(c), g);
    if (NF_UNLIKELY(nf__guest(c, g))) { // a second mapping (edge.c; teardown): the granule is owned elsewhere
      nf__bit_clr(c->guest, g);
      p->gran_mapped++;
      continue;
    }
    uint32_t i = c->phys[g];
    p->host_mapped -= p->gran[i].tier == NF_TIER_HOST;
    if (NF_LIKELY(!p->gran[i].unit)) nf__gran_push_free(p, i);
    uint64_t u0, n;
    if (NF_UNLIKELY(nf__unit_of(p, i, &u0, &n)) && u0 + n - 1 == g) nf__unit_unmapped(p, p->gran[i].unit - 1);
  }
  return NF_OK;
}

// Unmap up to `want` mapped granules lying wholly inside free address runs
// (never inside [keep_g0, keep_g1) of keep_c), passing over the first `skip`
// of them; `dry`: only count them. Blocking: waits for all stream work first;
// otherwise only runs whose work is known complete qualify.
// `tier` >= 0: only granules of that tier.
// Only chunks owned by `owner` (NULL: the general pool): a private pool's
// granules stay mapped while it exists.
// Where the run of takeable granules may go on at x: the end of the item at x
// (x + 1, or a unit's end when x starts a unit lying wholly in [x, gi1)),
// else 0 and *next, where the search resumes.
typedef struct take_s {
  const nf_chunk_t *keep_c;
  uint64_t keep_g0, keep_g1;
  int tier;
} take_t;
static uint64_t take_end(const nf_pool_t *p, const nf_chunk_t *c, uint64_t x, uint64_t gi1, const take_t *t,
                         uint64_t *next) {
  *next = x + 1;
  if (!nf__bit(c->mapped, x)) return 0;
  uint64_t u0 = x, n = 1;
  (void)nf__unit_of(p, c->phys[x], &u0, &n);
  *next = u0 + n;
  if (u0 != x || x + n > gi1 || (c == t->keep_c && x < t->keep_g1 && x + n > t->keep_g0)) return 0;
  if (t->tier >= 0 && p->gran[c->phys[x]].tier != t->tier) return 0;
  return x + n;
}

static uint64_t unmap_cached(nf_pool_t *p, const nf_priv_t *owner, uint64_t want, bool blocking,
                             const nf_chunk_t *keep_c, uint64_t keep_g0, uint64_t keep_g1, int tier, uint64_t skip,
                             bool dry, nf_status_t *stp) {
  *stp = blocking ? nf__streams_sync(p) : nf__streams_poll(p); // no event calls during a capture
  if (*stp != NF_OK) return 0;
  const take_t t = {keep_c, keep_g0, keep_g1, tier};
  uint64_t got = 0;
  for (nf_chunk_t *c = p->chunks; c && got < want; c = c->next) {
    if (c->priv != owner) continue;
    nf_block_t *b = c->first;
    uint64_t gi0, gi1;
    while (got < want && nf__next_retired_run(p, c, &b, &gi0, &gi1)) {
      for (uint64_t g = next_set(c->mapped, gi0, gi1); g < gi1 && got < want; g = next_set(c->mapped, g, gi1)) {
        uint64_t nx, e = take_end(p, c, g, gi1, &t, &nx), e2;
        if (!e) { g = nx; continue; }
        // A unit goes whole: it may end the run past `want` only as its first item.
        uint64_t lim = want - got + skip;
        while (e < gi1 && e - g < lim && (e2 = take_end(p, c, e, gi1, &t, &nx)) && e2 - g <= lim) e = e2;
        uint64_t pass = skip < e - g ? skip : e - g, u0, n;
        if (g + pass < e && nf__unit_of(p, c->phys[g + pass], &u0, &n) && u0 < g + pass) pass = u0 + n - g;
        skip -= skip < pass ? skip : pass;
        if (!dry && e > g + pass && (*stp = nf__unmap_run(p, c, g + pass, e)) != NF_OK) return got;
        got += e - g - pass;
        g = e;
      }
    }
  }
  return got;
}

uint64_t nf__unmap_cached(nf_pool_t *p, uint64_t want, bool blocking, const nf_chunk_t *keep_c,
                          uint64_t keep_g0, uint64_t keep_g1, int tier, nf_status_t *st) {
  nf__bins_flush(p); // parked blocks are cached memory: coalesced first, as without bins
  return unmap_cached(p, NULL, want, blocking, keep_c, keep_g0, keep_g1, tier, 0, false, st);
}

uint64_t nf__unmap_cached_in(nf_pool_t *p, const nf_priv_t *pv, uint64_t want, bool blocking, nf_status_t *st) {
  return unmap_cached(p, pv, want, blocking, NULL, 0, 0, -1, 0, false, st);
}

// ------------------------------------------------------------ mapping

// Stitching: unmap cached granules for a request (counted as reclaims; the
// release policy and trim use nf__unmap_cached directly and are not).
static void stitch(nf_pool_t *p, uint64_t want, bool blocking, const nf_chunk_t *c, uint64_t g0, uint64_t g1,
                   nf_status_t *st) {
  uint64_t need = p->gran_free_count + want, gone = p->un_gone;
  uint64_t got = nf__unmap_cached(p, want, blocking, c, g0, g1, NF_TIER_DEVICE, st);
  if (got) {
    p->st.reclaims++;
    p->st.reclaimed_granules += got;
  }
  // Units went back to the backend whole: their room comes back as singles.
  if (*st == NF_OK && gone != p->un_gone && p->gran_free_count < need && p->gran_created < p->max_granules) {
    uint64_t n = need - p->gran_free_count, r = p->max_granules - p->gran_created;
    nf_status_t cs = nf__granules_create(p, n < r ? n : r);
    if (cs != NF_OK && cs != NF_ERR_OOM) *st = cs;
  }
}

// Make `k` free device granules available: free list, then new granules up
// to the limit, then stitching (unmapping cached granules outside the
// target). `spill`: instead of waiting for streams, host granules may make
// up the rest (*host = how many the caller must take from the host list).
static nf_status_t gran_acquire(nf_pool_t *p, uint64_t k, const nf_chunk_t *c, uint64_t g0, uint64_t g1,
                                uint64_t size, bool spill, uint64_t *host) {
  *host = 0;
  if (p->gran_free_count >= k) return NF_OK;
  nf_status_t st;
  // `tight`: growing past the live peak plus a small slack while cached
  // granules sit in free ranges, stitch them rather than create more, so
  // that physical memory tracks live memory even without a limit. First
  // those whose work is known complete; if much more than the slack sits
  // idle, wait for the streams too. Off by default: a step whose layout
  // differs from the last then pays backend calls (and waits) instead of
  // growing once -- see docs/design.md.
  uint64_t peak = p->st.live_rounded + size;
  if (peak < p->st.live_rounded_peak) peak = p->st.live_rounded_peak;
  uint64_t slack = (peak >> NF_SLACK_SHIFT) + ((uint64_t)NF_SLACK_GRANULES << p->gshift);
  if (p->cfg.tight && ((p->gran_created + k - p->gran_free_count) << p->gshift) > peak + slack) {
    for (int blocking = 0; blocking < 2 && p->gran_free_count < k; blocking++) {
      if (nf__cached(p) < (blocking ? slack : p->granule)) break;
      stitch(p, k - p->gran_free_count, blocking, c, g0, g1, &st);
      if (st != NF_OK) return st;
    }
    if (p->gran_free_count >= k) return NF_OK;
  }
  st = nf__granules_create(p, k - p->gran_free_count);
  if (st == NF_OK) return NF_OK;
  if (st != NF_ERR_OOM) return st;
  // At the limit: device granules of finished offloads, then what is known
  // complete (no host wait: frees older than the last completed event), then
  // wait for offload copies in flight (their blocks are bound for the host
  // anyway; a spilled block would stay there for its lifetime), then spill,
  // else wait for the streams, then also for blocks held back by
  // record_stream.
  // During a capture: no host waits (tier copies, streams), no event calls.
  bool cap = p->capture_mask != 0;
  if (p->xfers && !cap && (st = p->tier.poll(p, false)) != NF_OK) return st; // xfers: only a tier queues copies
  for (int round = 0; round < 3 && p->gran_free_count < k; round++) {
    if (round == 1 && p->xfers && !cap) {
      if ((st = p->tier.reclaim(p)) != NF_OK) return st;
      if (p->gran_free_count >= k) break;
    }
    if (round == 1 && spill) {
      uint64_t need = k - p->gran_free_count;
      if (p->host_free_count < need) {
        if (p->host_sweep) nf__host_sweep(p);
        if (p->host_free_count < need &&
            (st = nf__host_granules_create(p, need - p->host_free_count)) != NF_OK && st != NF_ERR_OOM)
          return st;
      }
      if (p->host_free_count >= need) {
        *host = need;
        return NF_OK;
      }
    }
    if (round == 2 && (st = nf__pending_poll(p, true)) != NF_OK) return st;
    stitch(p, k - p->gran_free_count, round > 0, c, g0, g1, &st);
    if (st != NF_OK) return st;
  }
  return p->gran_free_count >= k ? NF_OK : NF_ERR_OOM;
}

// Granules a request of `size` may take from the free list and by creating
// new ones before gran_acquire would stitch (the limit; with `tight`, the
// live peak plus slack): what view.c need not move from the cache.
uint64_t nf__gran_room(const nf_pool_t *p, uint64_t size) {
  uint64_t room = p->max_granules > p->gran_created ? p->max_granules - p->gran_created : 0;
  if (p->cfg.tight) {
    uint64_t peak = p->st.live_rounded + size;
    if (peak < p->st.live_rounded_peak) peak = p->st.live_rounded_peak;
    uint64_t slack = (peak >> NF_SLACK_SHIFT) + ((uint64_t)NF_SLACK_GRANULES << p->gshift);
    uint64_t t = (peak + slack) >> p->gshift;
    t = t > p->gran_created ? t - p->gran_created : 0;
    if (t < room) room = t;
  }
  return p->gran_free_count + room;
}

nf_status_t nf__gran_acquire(nf_pool_t *p, uint64_t k, const nf_chunk_t *c, uint64_t g0, uint64_t g1) {
  uint64_t host;
  return gran_acquire(p, k, c, g0, g1, k << p->gshift, false, &host);
}

// One-time warning per pool, the first time a request spills.
static void spill_warn(nf_pool_t *p, uint64_t size, uint64_t host) {
  if (p->spill_warned || nf__env_on("NOFRAG_QUIET_SPILL")) return;
  p->spill_warned = true;
  char req[32], lim[32], live[32], sl[32];
  nf__fmt_bytes(req, sizeof req, size);
  nf__fmt_bytes(lim, sizeof lim, p->cfg.limit);
  nf__fmt_bytes(live, sizeof live, p->st.live);
  nf__fmt_bytes(sl, sizeof sl, p->max_host_granules << p->gshift);
  fprintf(stderr,
          "nofrag: warning: device memory is exhausted (limit %s, live %s): %llu granule(s) of a %s request "
          "are backed by host memory instead (spill:host, spill_limit %s). The program keeps running, "
          "slower where it touches spilled memory; spilled bytes are in the stats ('spilled') and in "
          "`nofrag top`. Creating pinned host memory is slow the first time; spill_reserve:SIZE creates it "
          "at start. Printed once per pool (NOFRAG_QUIET_SPILL=1 silences it).\n",
          lim, live, (unsigned long long)host, req, sl);
}

// Undo granules mapped by a failed nf__map_range. A granule whose unmap also
// fails stays mapped (the backend says so) but not ready.
static void map_rollback(nf_pool_t *p, nf_chunk_t *c, const uint64_t *mine, uint64_t g0, uint64_t g1) {
  for (uint64_t g = g0; g < g1; g++) {
    if (!nf__bit(mine, g - g0)) continue;
    uint64_t u0, n = 1;
    if (!nf__unit_of(p, c->phys[g], &u0, &n)) u0 = g; // a unit: whole (made here, so wholly in mine)
    nf__unmap_run(p, c, u0, u0 + n); // error already recorded; state mirrors the backend
    g = u0 + n - 1;
  }
}

// The backend's bound on mappings (host backend: vm.max_map_count, or
// NOFRAG_HOST_MAX_MAPS; each mapped granule is a mapping of its own): a
// request of `k` granules that cannot fit is refused before any is mapped,
// not mapped up to the bound and unmapped again (two kernel calls a granule;
// a single huge request needs 65k of them at vm.max_map_count). `early`
// (before gran_acquire, which may stitch): only when the bound could not be
// met even with every mapping of this pool gone. After: parked views are
// unmapped first, as when a map fails (nf__view_evict_all). NF_ERR_BACKEND
// as for a failed map, not NF_ERR_OOM: a larger limit would not help (the
// replay's capacity search must not take it for one), and the message names
// the bound and the remedy.
static bool room(nf_pool_t *p, uint64_t k) { return !p->be->ops->map_room || p->be->ops->map_room(p->be, k) == NF_OK; }
static nf_status_t map_room(nf_pool_t *p, uint64_t k, bool early) {
  uint64_t ours = p->gran_mapped + p->vw_count;
  if (room(p, early ? (k > ours ? k - ours : 0) : k)) return NF_OK;
  if (!early && p->vw_count && nf__view_evict_all(p) && room(p, k)) return NF_OK;
  return nf__error(NF_ERR_BACKEND, "nofrag: map failed: %s", nf__backend_err());
}

// Set access on every not-ready granule of [g0, g1), once per run.
nf_status_t nf__set_ready(nf_pool_t *p, nf_chunk_t *c, uint64_t g0, uint64_t g1) {
  for (uint64_t g = g0; g < g1;) {
    if (nf__bit(NF_READY(c), g) || !nf__bit(c->mapped, g)) { g++; continue; }
    uint64_t e = g;
    while (e < g1 && !nf__bit(NF_READY(c), e) && nf__bit(c->mapped, e)) e++;
    nf_status_t st = NF_BE(p, set_access, set_access, c->base + (g << p->gshift), (e - g) << p->gshift);
    if (st != NF_OK) return nf__error(st, "nofrag: set access failed: %s", nf__backend_err());
    for (uint64_t x = g; x < e; x++) nf__bit_set(NF_READY(c), x);
    p->fx++;
    g = e;
  }
  return NF_OK;
}

// Map every unmapped granule of [g0, g1) of c, device granules first (host
// ones only when `spill` and the device is exhausted), and make them ready.
nf_status_t nf__map_range(nf_pool_t *p, nf_chunk_t *c, uint64_t g0, uint64_t g1, uint64_t size, bool spill) {
  uint64_t k = 0, host;
  nf_status_t st;
  // Views first (view.c): parked views there are taken back, cached granules
  // moved here without unmapping them where stitching would run.
  if (p->vw_blk && (st = nf__view_fill(p, c, g0, g1, nf__gran_room(p, size))) != NF_OK) return st;
  for (uint64_t g = g0; g < g1; g++) k += !nf__bit(c->mapped, g);
  if (k && (st = map_room(p, k, true)) != NF_OK) return st;
  uint64_t small[4] = {0}, *mine = small; // granules mapped by this call
  if (g1 - g0 > 256 && !(mine = calloc(((g1 - g0) + 63) >> 6, sizeof *mine)))
    return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  uint64_t made = p->un_blk ? nf__units_make(p, c, g0, g1, k, mine) : 0;
  k -= made;
  st = gran_acquire(p, k, c, g0, g1, size, spill, &host);
  if (st == NF_OK && k) st = map_room(p, k, false);
  for (uint64_t g = g0; g < g1 && st == NF_OK; g++) {
    if (nf__bit(c->mapped, g)) continue;
    bool h = p->gran_free_count == 0;
    uint32_t i = nf__gran_pop(p, h ? NF_TIER_HOST : NF_TIER_DEVICE);
    st = NF_BE(p, map, map, c->base + (g << p->gshift), p->granule, p->gran[i].handle);
    if (st != NF_OK && p->vw_count && nf__view_evict_all(p)) // the mapping count's bound (host: vm.max_map_count)
      st = NF_BE(p, map, map, c->base + (g << p->gshift), p->granule, p->gran[i].handle);
    if (st != NF_OK) {
      nf__gran_push_free(p, i);
      nf__error(st, "nofrag: map failed: %s", nf__backend_err());
      break;
    }
    p->gran[i].state = NF_GR_MAPPED;
    p->gran[i].at_c = c;
    p->gran[i].at_g = (uint32_t)g;
    c->phys[g] = i;
    nf__bit_set(c->mapped, g);
    nf__bit_set(mine, g - g0);
    p->gran_mapped++;
    p->host_mapped += h;
  }
  // Access is set once per run of not-ready granules, not per granule.
  if (st == NF_OK) st = nf__set_ready(p, c, g0, g1);
  if (st != NF_OK) {
    // Keep the failing call's message: rollback errors would overwrite it.
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nf_last_error());
    map_rollback(p, c, mine, g0, g1);
    nf__error(st, "%s", msg);
  } else if (host) {
    p->st.spills++;
    nf__peak(&p->st.spilled_peak, (p->host_mapped - p->offl_granules) << p->gshift);
    spill_warn(p, size, host);
  }
  if (mine != small) free(mine);
  nf__peak(&p->st.mapped_peak, p->gran_mapped << p->gshift);
  return st;
}

nf_status_t nf__map_block(nf_pool_t *p, nf_block_t *b) {
  uint64_t g0, g1;
  gran_span(p, b->chunk, b->addr, b->size, &g0, &g1);
  p->vw_blk = p->cfg.views ? b : NULL; // views: the block being placed (b->stream set), its free-time smask/tick
  p->un_blk = b;
  nf_status_t st = nf__map_range(p, b->chunk, g0, g1, b->size, p->cfg.spill != 0);
  if (p->vw_blk && p->vw_on) nf__view_settle(p, b, g0, g1, st == NF_OK);
  p->vw_blk = NULL;
  p->un_blk = NULL;
  return st;
}

// Spilled granules must not stay in the cache, or new blocks would land on
// host memory while the device has room: unmap host granules lying wholly
// inside free ranges whose work is known complete (no host wait). The flag
// stays up while some are still waiting for their streams.
void nf__host_sweep(nf_pool_t *p) {
  nf_status_t st;
  p->sweep_tick = p->tick;
  nf__unmap_cached(p, UINT64_MAX, false, NULL, 0, 0, NF_TIER_HOST, &st);
  if (st != NF_OK) return;
  bool left = false;
  for (nf_chunk_t *c = p->chunks; c && !left; c = c->next)
    for (nf_block_t *b = c->priv ? NULL : c->first; b && !left;) {
      if (b->state != NF_BLK_FREE) { b = b->next; continue; }
      uintptr_t ra = b->addr, rb = ra;
      for (; b && b->state == NF_BLK_FREE; b = b->next) rb = b->addr + b->size;
      uint64_t g0 = (ra - c->base + p->granule - 1) >> p->gshift, g1 = (rb - c->base) >> p->gshift;
      for (uint64_t g = next_set(c->mapped, g0, g1); g < g1 && !left; g = next_set(c->mapped, g + 1, g1))
        left = p->gran[c->phys[g]].tier == NF_TIER_HOST;
    }
  p->host_sweep = left;
}

// Release policy, run after frees (pool.c, release_note): `idle` bytes
// stayed cached the whole release epoch; all of it above half the threshold
// is unmapped (only where stream work is known complete: never blocks) and
// unmapped granules above `retain` go back to the backend.
void nf__maybe_release(nf_pool_t *p, uint64_t idle) {
  uint64_t thr = p->cfg.release_threshold, cached = nf__cached(p);
  if (idle > cached) idle = cached;
  if (idle <= thr) { p->release_floor = 0; return; }
  // After a release that could not unmap all it wanted (stream work not
  // complete), wait until the cache has grown noticeably before walking again.
  if (p->release_floor && cached < p->release_floor + (thr >> 3) + p->granule) return;
  nf_status_t st;
  // The last granules in address order go: placement carves free runs from
  // their low end, so those are the ones the next peak would map again last.
  uint64_t want = (idle - thr / 2) >> p->gshift;
  nf__bins_flush(p); // parked blocks are cached memory: coalesced first, as without bins
  uint64_t n = unmap_cached(p, NULL, UINT64_MAX, false, NULL, 0, 0, -1, 0, true, &st);
  if (want > n) want = n;
  uint64_t got = st == NF_OK ? unmap_cached(p, NULL, want, false, NULL, 0, 0, -1, n - want, false, &st) : 0;
  if (st == NF_OK) nf__granules_release(p, p->cfg.retain >> p->gshift);
  if (st == NF_OK) nf__chunks_drop_empty(p);
  // Host granules stay (up to spill_limit) until nf_trim: creating pinned
  // host memory is slow (on the H200, a 512 MiB offload onto fresh host
  // granules ran at 2.1 GB/s, the way back at 11.4), and a pool that spilled
  // once will likely spill again at the next peak.
  p->release_floor = got < want && nf__cached(p) > thr ? nf__cached(p) : 0;
}

void nf__chunks_destroy(nf_pool_t *p) {
  for (nf_chunk_t *c = p->chunks, *n; c; c = n) {
    n = c->next;
    for (uint64_t g = 0; g < c->ngran;) {
      if (!nf__bit(c->mapped, g)) { g++; continue; }
      uint64_t e = g;
      while (e < c->ngran && nf__bit(c->mapped, e)) e++;
      nf__unmap_run(p, c, g, e);
      g = e;
    }
    nf__view_chunk_unmap(p, c);
    (void)nf__chunk_free(p, c);
  }
  p->chunks = NULL;
  nf__granules_release(p, 0);
  nf__host_granules_release(p, 0);
  if (p->tier.released) p->tier.released(p);
  free(p->gran);
  p->gran = NULL;
}
