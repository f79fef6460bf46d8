// Views: stitch once (docs/design.md, "Views: stitch once").
//
// A physical granule may be mapped at several virtual granules at once (CUDA
// maps one handle at any number of ranges; the host backend mmaps the same
// memfd extent twice). Exactly one of its mappings owns it: that virtual
// granule's `mapped` bit is set and only there may live data sit. Its other
// mappings are parked views: the chunk's `stale` bit, phys[] naming the
// granule, kept mapped with access set. When stitching would have unmapped a
// cached granule to map it where a request needs it, the granule is instead
// mapped there once more and its old place is parked (no unmap, no host wait);
// when a later block lands where a parked view is and the granule is free or
// merely cached, the view takes it back with no map call (at most a GPU-side
// event wait, where another stream used it last). A
// workload that repeats each step converges to taking views back: zero calls.
//
// Safety: a granule is taken (from the free list, or from its owning place
// when no non-free block overlaps that place: not `busy`) only after the new
// block's stream is ordered after the granule's last users (vmask / vtick,
// merged at every free: a GPU-side event wait, no host wait); those users
// are forgotten only once the block is placed (nf__view_settle). A virtual
// granule is unmapped only once the work on it is known complete. Views live
// in free address space only: a `busy` granule never has a stale bit.
#include "core/core.h"

#include <stdlib.h>
#include <string.h>


// A cached granule to move is chosen among this many (each one whose last
// users the stream already follows): the one freed most recently. In a
// workload that repeats, the place freed last is the one needed again
// furthest ahead (Belady's choice, guessed from the past); the first found
// let a two-granule deficit chase itself around the step on vit at 1.01x
// live (843 calls per second half; oldest first: 593; newest: 0).
#define NF_VIEW_CANDIDATES 32

nf_status_t nf__view_chunk_init(nf_chunk_t *c) {
  c->stale = calloc((c->ngran + 63) >> 6, sizeof(uint64_t));
  c->busy = calloc((c->ngran + 63) >> 6, sizeof(uint64_t));
  return c->stale && c->busy ? NF_OK : NF_ERR_NOMEM;
}

void nf__view_chunk_free(nf_chunk_t *c) {
  free(c->stale);
  free(c->busy);
  free(c->ptick);
  c->stale = NULL;
  c->busy = NULL;
  c->ptick = NULL;
}

static inline void span(const nf_pool_t *p, const nf_block_t *b, uint64_t *g0, uint64_t *g1) {
  *g0 = (b->addr - b->chunk->base) >> p->gshift;
  *g1 = (b->addr + b->size - b->chunk->base + p->granule - 1) >> p->gshift;
}

static bool mask_retired(const nf_pool_t *p, uint64_t m, uint64_t tick) {
  nf_block_t t = {.smask = m, .tick = tick};
  return nf__block_retired(p, &t);
}

// Set (on) or clear bits [g0, g1) of bm, a word at a time.
static void bits_put(uint64_t *bm, uint64_t g0, uint64_t g1, bool on) {
  while (g0 < g1) {
    uint64_t b = g0 & 63, n = 64 - b < g1 - g0 ? 64 - b : g1 - g0;
    uint64_t mask = (n == 64 ? ~0ull : (1ull << n) - 1) << b;
    if (on) bm[g0 >> 6] |= mask;
    else bm[g0 >> 6] &= ~mask;
    g0 += n;
  }
}

void nf__view_live(nf_pool_t *p, const nf_block_t *b) {
  if (!p->vw_on) return; // (views_on derives busy from the blocks)
  uint64_t g0, g1;
  span(p, b, &g0, &g1);
  bits_put(b->chunk->busy, g0, g1, true);
}

// Views start moving granules: from here on `busy` is kept and frees record
// their streams in the granules (nf__view_dead); until then neither costs
// anything (a pool that never reaches its limit never pays). busy is derived
// from the blocks; what was freed before counts as used by every stream up
// to now (conservative: one wait per stream at most).
static void views_on(nf_pool_t *p) {
  for (nf_chunk_t *c = p->chunks; c; c = c->next) {
    memset(c->busy, 0, ((c->ngran + 63) >> 6) * sizeof(uint64_t));
    for (const nf_block_t *b = c->first; b; b = b->next) {
      uint64_t g0, g1;
      span(p, b, &g0, &g1);
      if (b->state != NF_BLK_FREE) bits_put(c->busy, g0, g1, true);
    }
  }
  uint64_t all = nf__streams_held(p);
  for (uint64_t i = 0; i < p->gran_cap; i++)
    if (p->gran[i].state != NF_GR_UNUSED) {
      p->gran[i].vmask = all;
      p->gran[i].vtick = p->tick;
    }
  p->vw_on = true;
}

// A block is free (merge: it held data; its streams become its granules' last users).
void nf__view_dead(nf_pool_t *p, const nf_block_t *b, bool merge) {
  if (!p->vw_on) return;
  uint64_t g0, g1;
  nf_chunk_t *c = b->chunk;
  span(p, b, &g0, &g1);
  // Edge granules another non-free block overlaps stay busy (free blocks
  // are coalesced: at most one free block lies before the next non-free one).
  uint64_t c0 = g0, c1 = g1;
  uintptr_t lo = c->base + (g0 << p->gshift), hi = c->base + ((g1 - 1) << p->gshift);
  for (const nf_block_t *q = b->prev; q && q->addr + q->size > lo; q = q->prev)
    if (q->state != NF_BLK_FREE) { c0++; break; }
  for (const nf_block_t *q = b->next; q && q->addr < hi + p->granule && c1 > c0; q = q->next)
    if (q->state != NF_BLK_FREE) { c1--; break; }
  if (c0 < c1) bits_put(c->busy, c0, c1, false);
  if (!merge) return;
  for (uint64_t g = g0; g < g1; g++) {
    if (!nf__bit(c->mapped, g)) continue;
    nf_granule_t *x = &p->gran[c->phys[g]];
    // Other streams' older work, known complete, drops out (one stream: never asked).
    if ((x->vmask & ~b->smask) && mask_retired(p, x->vmask, x->vtick)) x->vmask = 0;
    if (b->tick > x->vtick) x->vtick = b->tick;
    x->vmask |= b->smask;
  }
}

// Granule i can be taken: a free device granule, or one owned by a virtual
// granule no non-free block overlaps (cached) with access set.
static bool takeable(const nf_pool_t *p, uint32_t i) {
  const nf_granule_t *x = &p->gran[i];
  if (x->tier != NF_TIER_DEVICE || x->unit) return false; // a unit's granule never leaves its place (unit.c)
  if (x->state == NF_GR_FREE) return true;
  const nf_chunk_t *o = x->at_c;
  // A private pool's granules are never moved away while it exists (private_pool.c).
  return x->state == NF_GR_MAPPED && o && !o->priv && x->at_g < o->ngran && nf__bit(o->mapped, x->at_g) &&
         o->phys[x->at_g] == i && nf__bit(NF_READY(o), x->at_g) && !nf__bit(o->busy, x->at_g);
}

uint64_t nf__view_adoptable(const nf_pool_t *p, const nf_chunk_t *c, uintptr_t a, uint64_t n) {
  uint64_t g0 = (a - c->base) >> p->gshift, g1 = (a + n - c->base + p->granule - 1) >> p->gshift, k = 0;
  for (uint64_t g = g0; g < g1; g++) k += nf__bit(c->stale, g) && takeable(p, c->phys[g]);
  return k;
}

// Order stream s after granule i's last users (GPU-side: no host wait).
static nf_status_t order(nf_pool_t *p, uint32_t i, uint32_t s) {
  nf_granule_t *x = &p->gran[i];
  if (!x->vmask) return NF_OK;
  nf_block_t t = {.smask = x->vmask, .tick = x->vtick};
  if (nf__block_usable(p, &t, s)) return NF_OK;
  return nf__order_after(p, &t, s);
}

// Stream s may use granule i without being ordered after its last users
// (during a capture: no event call may be made, so nothing else is taken).
static bool orderless(const nf_pool_t *p, uint32_t i, uint32_t s) {
  const nf_granule_t *x = &p->gran[i];
  nf_block_t t = {.smask = x->vmask, .tick = x->vtick};
  return !x->vmask || nf__block_usable(p, &t, s);
}

// Granule i leaves its owning place (it stays mapped there, parked). The
// work through that place is its users' so far (vmask / vtick: every free
// there since it was owned there): the view can go once that is complete,
// however recent the free range around it is (view_fill, step 2).
static void ptick_set(nf_chunk_t *o, uint64_t g, uint64_t tick) {
  if (!o->ptick && (o->ptick = calloc(o->ngran, sizeof *o->ptick))) {
    // Out of memory before (no ptick: step 2 waited for the free run's
    // tick): the views parked then keep that bound, not a tick of 0.
    for (uint64_t x = 0; x < o->ngran; x++)
      if (nf__bit(o->stale, x)) o->ptick[x] = UINT64_MAX;
  }
  if (o->ptick) o->ptick[g] = tick;
}

static void park(nf_pool_t *p, uint32_t i) {
  nf_granule_t *x = &p->gran[i];
  nf_chunk_t *o = x->at_c;
  ptick_set(o, x->at_g, x->vmask ? x->vtick : 0);
  nf__bit_clr(o->mapped, x->at_g);
  nf__bit_clr(NF_READY(o), x->at_g);
  nf__bit_set(o->stale, x->at_g);
  p->fx++;
  x->nviews++;
  p->vw_count++;
  p->gran_mapped--;
}

// Edge sharing (edge.c): the second mapping of granule i at g of c, whose
// block is gone and whose `mapped` bit is cleared, stays as a parked view of
// it; `tick` bounds the work through it (0: none).
void nf__view_park_at(nf_pool_t *p, nf_chunk_t *c, uint64_t g, uint32_t i, uint64_t tick) {
  ptick_set(c, g, tick);
  nf__bit_set(c->stale, g);
  p->gran[i].nviews++;
  p->vw_count++;
  p->fx++;
}

// Granule i (free or parked away, its place's view at g of c) becomes owned there.
static void own(nf_pool_t *p, nf_chunk_t *c, uint64_t g, uint32_t i, bool ready) {
  nf_granule_t *x = &p->gran[i];
  x->state = NF_GR_MAPPED;
  x->at_c = c;
  x->at_g = (uint32_t)g;
  c->phys[g] = i;
  nf__bit_set(c->mapped, g);
  if (ready) nf__bit_set(NF_READY(c), g);
  p->gran_mapped++;
  p->fx++;
}

static void unview(nf_pool_t *p, nf_chunk_t *c, uint64_t g) {
  nf__bit_clr(c->stale, g);
  p->gran[c->phys[g]].nviews--;
  p->vw_count--;
}

// A cached granule to move, from the cursor on: one whose last users stream
// s already follows if any, else the first seen. UINT32_MAX: none.
static uint32_t find_cached(nf_pool_t *p, uint32_t s, bool capture) {
  uint32_t any = UINT32_MAX, best = UINT32_MAX;
  uint64_t best_key = UINT64_MAX;
  int seen = 0;
  nf_chunk_t *c0 = p->vw_cur_c ? p->vw_cur_c : p->chunks;
  uint64_t g = p->vw_cur_c ? p->vw_cur_g : 0;
  bool last = false;
  for (nf_chunk_t *c = c0;;) {
    for (; g < c->ngran && seen < NF_VIEW_CANDIDATES; g++) {
      uint64_t w = c->mapped[g >> 6] >> (g & 63);
      if (!w) { g = (g | 63); continue; }
      g += (uint64_t)__builtin_ctzll(w);
      if (g >= c->ngran) break;
      uint32_t i = c->phys[g];
      if (nf__bit(c->busy, g) || !takeable(p, i)) continue;
      nf_block_t t = {.smask = p->gran[i].vmask, .tick = p->gran[i].vtick};
      if (!t.smask || nf__block_usable(p, &t, s)) {
        seen++;
        uint64_t key = UINT64_MAX - p->gran[i].vtick;
        if (key < best_key) { best = i; best_key = key; p->vw_cur_c = c; p->vw_cur_g = g + 1; }
      } else if (any == UINT32_MAX) any = i;
    }
    if (last || seen >= NF_VIEW_CANDIDATES) break;
    c = c->next ? c->next : p->chunks;
    g = 0;
    last = c == c0; // c0 again, from 0: what lay before the cursor (the rest is seen twice: harmless)
  }
  return best != UINT32_MAX ? best : capture ? UINT32_MAX : any;
}

nf_status_t nf__view_fill(nf_pool_t *p, nf_chunk_t *c, uint64_t g0, uint64_t g1, uint64_t room) {
  nf_block_t *b = p->vw_blk;
  uint32_t s = p->vw_s = b->stream;
  nf_status_t st;
  bool busy = false, cap = p->capture_mask != 0; // during a capture: no event calls, no host waits
  // 1. Parked views here whose granule is free or cached: taken back, no call.
  for (uint64_t g = g0; g < g1; g++) {
    if (!nf__bit(c->stale, g)) continue;
    uint32_t i = c->phys[g];
    if (!takeable(p, i) || (cap && !orderless(p, i, s))) { busy = true; continue; }
    if ((st = order(p, i, s)) != NF_OK) return st;
    if (p->gran[i].state == NF_GR_FREE) nf__gran_unlink(p, i);
    else park(p, i);
    unview(p, c, g);
    own(p, c, g, i, true);
    p->gran[i].took = 1; // its last users are forgotten once the block is placed (nf__view_settle)
    p->vw_reuses++;
  }
  // 2. Views of granules owned elsewhere by live data: unmapped, once the
  //    work on this range is complete.
  if (busy) {
    if (cap) // the views cannot be unmapped without a host wait: let placement try elsewhere
      return nf__error(NF_ERR_OOM, "nofrag: views: the range is still mapped elsewhere by work in flight, "
                                   "and a stream is being captured (no host wait possible)");
    // The work to wait for: that through these views (they were parked
    // after it), not the latest free of the range around them, which may
    // be the block freed just now.
    uint64_t t = c->ptick ? 0 : b->tick;
    for (uint64_t g = g0; g < g1 && t < b->tick; g++)
      if (nf__bit(c->stale, g) && c->ptick[g] > t) t = c->ptick[g];
    if ((st = nf__streams_retire(p, b->smask, t < b->tick ? t : b->tick)) != NF_OK) return st; // then unmap
    for (uint64_t g = g0; g < g1; g++) {
      if (!nf__bit(c->stale, g)) continue;
      uint64_t e = g;
      while (e < g1 && nf__bit(c->stale, e)) e++;
      st = NF_BE(p, unmap, unmap, c->base + (g << p->gshift), (e - g) << p->gshift);
      if (st != NF_OK) return nf__error(st, "nofrag: views: unmap failed: %s", nf__backend_err());
      p->vw_evicted += e - g;
      for (; g < e; g++) unview(p, c, g);
    }
  }
  // 3. Where stitching would run: cached granules are mapped here as well
  //    (map + set access), their old places parked, not unmapped.
  uint64_t need = 0;
  for (uint64_t g = g0; g < g1; g++) need += !nf__bit(c->mapped, g);
  for (uint64_t g = g0; g < g1 && need > room; g++) {
    if (nf__bit(c->mapped, g)) continue;
    if (!p->vw_on) {
      if (cap) break; // views_on records every stream: not during a capture
      views_on(p);
    }
    uint32_t i = find_cached(p, s, cap);
    if (i == UINT32_MAX) break;
   
    if ((st = order(p, i, s)) != NF_OK) return st;
    st = NF_BE(p, map, map, c->base + (g << p->gshift), p->granule, p->gran[i].handle);
    if (st != NF_OK && nf__view_evict_all(p)) // the mapping count's bound (host: vm.max_map_count)
      st = NF_BE(p, map, map, c->base + (g << p->gshift), p->granule, p->gran[i].handle);
    if (st != NF_OK) return nf__error(st, "nofrag: map failed: %s", nf__backend_err()); // the granule stays where it was
    park(p, i);
    own(p, c, g, i, false); // nf__map_range sets access on the run
    p->gran[i].took = 1;
    p->vw_transfers++;
    need--;
  }
  // Too many parked views (cfg.views; each is one mapping, and the host
  // backend's mmap count is bounded by vm.max_map_count): unmap idle ones,
  // waiting for stream work only well above the bound.
  uint64_t max = p->cfg.views;
  if (p->vw_count > max) {
    nf__view_evict(p, p->vw_count - max / 2, false, &st);
    if (st == NF_OK && p->vw_count > max + max / 4) nf__view_evict(p, p->vw_count - max / 2, true, &st);
    if (st != NF_OK) return st;
  }
  return NF_OK;
}

// Block f, free or about to be, inherits granule x's last users (its next
// user is ordered after them).
static void inherit(nf_block_t *f, const nf_granule_t *x) {
  if (!f || !x->vmask) return;
  if (!f->smask || x->vtick > f->tick) f->tick = x->vtick;
  f->smask |= x->vmask;
}

// After the placement that view_fill served: the granules it took now
// belong to block b, whose stream was ordered after their last users, so
// those are forgotten. If the placement failed, the granules stay where they
// were taken (mapped, in what becomes a free range again) and their last
// users join b's streams: the next block there, maybe on another stream, is
// ordered after them (b's stream waited for them, but b holds nothing now).
void nf__view_settle(nf_pool_t *p, nf_block_t *b, uint64_t g0, uint64_t g1, bool placed) {
  nf_chunk_t *c = b->chunk;
  for (uint64_t g = g0; g < g1; g++) {
    if (!nf__bit(c->mapped, g)) continue;
    nf_granule_t *x = &p->gran[c->phys[g]];
    if (!x->took) continue;
    x->took = 0;
    if (placed) {
      // An edge granule's rest is free space, whose next block may be on
      // another stream: only b's stream was ordered after the last users.
      uintptr_t ga = c->base + (g << p->gshift);
      if (g == g0 && b->addr > ga && b->prev->state == NF_BLK_FREE) inherit(b->prev, x);
      if (g == g1 - 1 && b->addr + b->size < ga + p->granule && b->next->state == NF_BLK_FREE) inherit(b->next, x);
      x->vmask = 0;
    } else {
      inherit(b, x);
    }
  }
}

// Unmap up to `want` parked views lying in free address runs whose work is
// known complete (blocking: wait for all stream work first).
uint64_t nf__view_evict(nf_pool_t *p, uint64_t want, bool blocking, nf_status_t *stp) {
  *stp = blocking ? nf__streams_sync(p) : nf__streams_poll(p);
  if (*stp != NF_OK) return 0;
  uint64_t got = 0;
  for (nf_chunk_t *c = p->chunks; c && got < want; c = c->next) {
    nf_block_t *b = c->first;
    uint64_t gi0, gi1;
    while (got < want && nf__next_retired_run(p, c, &b, &gi0, &gi1)) {
      for (uint64_t g = gi0; g < gi1 && got < want; g++) {
        if (!nf__bit(c->stale, g)) continue;
        uint64_t e = g;
        while (e < gi1 && e - g < want - got && nf__bit(c->stale, e)) e++;
        *stp = NF_BE(p, unmap, unmap, c->base + (g << p->gshift), (e - g) << p->gshift);
        if (*stp != NF_OK) { nf__error(*stp, "nofrag: views: unmap failed: %s", nf__backend_err()); return got; }
        got += e - g;
        for (; g < e; g++) unview(p, c, g);
      }
    }
  }
  p->vw_evicted += got;
  return got;
}

// A map failed: the mapping count may be at its bound (host backend:
// vm.max_map_count). Unmap every idle parked view, then the caller retries
// once; true when some went. The failed call's message is kept.
bool nf__view_evict_all(nf_pool_t *p) {
  char msg[NF_BACKEND_ERR_MAX];
  memcpy(msg, nf__backend_err(), sizeof msg);
  nf_status_t st;
  uint64_t got = nf__view_evict(p, UINT64_MAX, false, &st);
  memcpy(nf__backend_err(), msg, sizeof msg);
  return got > 0;
}

// Teardown: every parked view of the chunk is unmapped (errors ignored: the
// address range goes back next).
void nf__view_chunk_unmap(nf_pool_t *p, nf_chunk_t *c) {
  if (!c->stale) return;
  for (uint64_t g = 0; g < c->ngran; g++) {
    if (!c->stale[g >> 6]) { g |= 63; continue; }
    if (!nf__bit(c->stale, g)) continue;
    uint64_t e = g;
    while (e < c->ngran && nf__bit(c->stale, e)) e++;
    (void)NF_BE(p, unmap, unmap, c->base + (g << p->gshift), (e - g) << p->gshift);
    for (; g < e; g++) unview(p, c, g);
  }
}

// nf_pool_check's part: busy re-derived from the blocks; a parked view
// lies where no non-free block is (so no physical byte is reachable by two
// live blocks through two mappings: a granule is owned at one place at most,
// checked by the caller) and names an existing device granule; the view
// counts add up.
nf_status_t nf__view_check(nf_pool_t *p) {
  nf_status_t st = NF_OK;
  uint32_t *nv = calloc(p->gran_cap ? p->gran_cap : 1, sizeof *nv);
  uint64_t total = 0;
  if (!nv) return nf__error(NF_ERR_NOMEM, "check: out of memory");
  for (nf_chunk_t *c = p->chunks; c && st == NF_OK; c = c->next) {
    uint32_t *u = calloc(c->ngran, sizeof *u);
    if (!u) { st = nf__error(NF_ERR_NOMEM, "check: out of memory"); break; }
    for (const nf_block_t *b = c->first; b; b = b->next) {
      if (b->state == NF_BLK_FREE) continue;
      uint64_t g0, g1;
      span(p, b, &g0, &g1);
      for (uint64_t g = g0; g < g1; g++) u[g]++;
    }
    for (uint64_t g = 0; g < c->ngran && st == NF_OK; g++) {
      if (p->vw_on && (u[g] > 0) != nf__bit(c->busy, g))
        st = nf__error(NF_ERR_INVALID, "check: granule %llu of chunk %p: %u blocks overlap it, busy says %d",
                       (unsigned long long)g, (void *)c->base, u[g], (int)nf__bit(c->busy, g));
      else if (nf__bit(c->stale, g)) {
        uint32_t i = c->phys[g];
        if (nf__bit(c->mapped, g) || u[g] || i >= p->gran_cap || p->gran[i].state == NF_GR_UNUSED ||
            p->gran[i].tier != NF_TIER_DEVICE)
          st = nf__error(NF_ERR_INVALID, "check: parked view at %p (granule %u) is %s", (void *)(c->base + (g << p->gshift)),
                         i, u[g] ? "under a live block" : "in a bad state");
        else {
          nv[i]++;
          total++;
        }
      }
    }
    free(u);
  }
  for (uint64_t i = 0; i < p->gran_cap && st == NF_OK; i++)
    if (p->gran[i].state != NF_GR_UNUSED && p->gran[i].nviews != nv[i])
      st = nf__error(NF_ERR_INVALID, "check: granule %llu: %u parked views, counter %u", (unsigned long long)i, nv[i],
                     p->gran[i].nviews);
  if (st == NF_OK && total != p->vw_count)
    st = nf__error(NF_ERR_INVALID, "check: %llu parked views, counter %llu", (unsigned long long)total,
                   (unsigned long long)p->vw_count);
  free(nv);
  return st;
}
