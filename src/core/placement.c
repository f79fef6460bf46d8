// Placement policy: where a request goes in virtual address space.
//
// Free blocks of each arena (small / large) are indexed by a two-level
// segregated fit (TLSF): 48 power-of-two classes x 32 linear sub-classes, with
// bitmaps, so finding a block is O(1) and the waste of a "good fit" is bounded
// by 1/32 of the size. Physical memory is not fragmented by this choice (any
// granule can be mapped anywhere); what placement decides is how many granules
// a live set overlaps, so blocks are packed at 512 B and coalesced eagerly.
//
// Preference order for a request of size s on stream S (see nf__place):
//   1. a block of the exact size class that is already mapped (a pure cache
//      hit: no backend call, O(1));
//   2. otherwise, among up to NF_SCAN fitting blocks, the placement (at a
//      block's start or its end) needing the fewest granules to be mapped.
//   A block freed on another stream is ordered after that stream's work by
//   the caller (one lazily recorded event and a stream wait, see stream.c);
//   3. none: the caller reserves a fresh address range (virtual space is
//      plentiful; the guarantee in nofrag.h relies on that).
// Preferring mapped memory over a tighter fit is what keeps physical memory
// close to live memory without backend calls in steady state.
#include "core/core.h"

#define NF_WALK 8  // blocks inspected in the exact class on the fast path
#define NF_SCAN 48 // blocks inspected on the slow path

// Views (view.c): of k granules not ready, those a parked view takes back
// cost no backend call (1 each: they move a granule); the rest map (64).
static inline uint64_t view_cost(const nf_pool_t *p, const nf_chunk_t *c, uintptr_t a, uint64_t n, uint64_t k) {
  uint64_t v = k ? nf__view_adoptable(p, c, a, n) : 0;
  return (k - v) * 64 + v;
}

// Cost of placing `size` bytes in b at its start or its end: the granules to
// map. Which stream freed the block does not count: ordering after another
// stream costs one event record and one stream wait, a mapping ~50 us, and
// steering around other streams' blocks cost 4% more memory on the FSDP
// trace. Sets *off to the better end.
static uint64_t place_cost(const nf_pool_t *p, const nf_block_t *b, uint64_t size, uint64_t *off) {
  *off = 0;
  if (nf__range_mapped(p, b->chunk, b->addr, size)) return 0; // common: cached
  uint64_t lo = nf__range_unmapped(p, b->chunk, b->addr, size), hi = lo;
  if (p->vw_count) lo = view_cost(p, b->chunk, b->addr, size, lo);
  if (lo && b->size > size) {
    hi = nf__range_unmapped(p, b->chunk, b->addr + b->size - size, size);
    if (p->vw_count) hi = view_cost(p, b->chunk, b->addr + b->size - size, size, hi);
    if (hi < lo) *off = b->size - size;
  }
  return hi < lo ? hi : lo;
}

nf_block_t *nf__place(nf_pool_t *p, nf_tlsf_t *tl, int arena, uint64_t size, uint32_t s, uint64_t *off,
                      bool *mapped) {
  nf_tlsf_t *t = &tl[arena];
  uint64_t units = size >> NF_ALIGN_SHIFT;
  int fl, sl;
  nf__tlsf_mapping(units, &fl, &sl);
  *off = 0;
  *mapped = true;
  // 1. The exact class may hold blocks that fit (TLSF's rounding skips them):
  //    a mapped one there is the fast path.
  int n = 0;
  for (nf_block_t *b = t->heads[fl][sl]; b && n < NF_WALK; b = b->fnext, n++) {
    if (b->size >= size && nf__range_mapped(p, b->chunk, b->addr, size) && nf__capture_ok(p, b, s)) {
      nf__tlsf_remove(t, b);
      return b;
    }
  }
  // 2. Slow path: among a bounded number of fitting blocks (exact class
  //    first, then every class up from the first that surely fits), the one
  //    needing the fewest new granules; the first with none wins at once.
  nf_block_t *best = NULL;
  uint64_t best_cost = UINT64_MAX, best_off = 0, o;
  // Near the limit every granule counts and stitching will run anyway: the
  // tightest fit wins (first fitting block, one usable on S at once first).
  bool tight = p->gran_created + (size >> p->gshift) + 2 > p->max_granules;
  // With `tight`, at its soft limit likewise (views: a layout that repeats
  // step after step is what lets them converge; mapping costs change it).
  if (p->cfg.tight && !tight) tight = nf__gran_room(p, size) - p->gran_free_count < (size >> p->gshift) + 2;
  int budget = tight ? NF_WALK : NF_SCAN;
  n = 0;
  nf_block_t *b = t->heads[fl][sl];
  for (; b && budget > 0 && n < NF_SCAN; b = b->fnext, n++) {
    if (b->size < size || !nf__capture_ok(p, b, s)) continue;
    budget--;
    uint64_t c = tight ? !nf__block_usable(p, b, s) : place_cost(p, b, size, &o);
    if (c < best_cost) { best = b; best_cost = c; best_off = tight ? 0 : o; }
    if (!c) goto done;
  }
  if (best && (tight || budget <= 0)) goto done;
  if (budget <= 0) budget = 1; // a larger class's first block always fits
  // From the first class whose every block fits; if that is the exact class
  // (a size at a class's start, or small) and the loop above scanned it
  // whole, from the next: scoring its blocks again would spend the budget
  // before a larger class's (maybe mapped) blocks are reached.
  int fl0 = fl, sl0 = sl;
  if (units >= NF_SL_COUNT) units += (1ull << (nf__fls64(units) - NF_SL_LOG2)) - 1;
  nf__tlsf_mapping(units, &fl, &sl);
  if (!b && fl == fl0 && sl == sl0 && ++sl == NF_SL_COUNT) fl++, sl = 0;
  for (; fl < NF_FL_COUNT && budget > 0; fl++, sl = 0) {
    uint32_t slm = t->sl_bitmap[fl] & (~0u << sl);
    if (!slm) {
      uint64_t flm = fl + 1 < 64 ? t->fl_bitmap & (~0ull << (fl + 1)) : 0;
      if (!flm) break;
      fl = __builtin_ctzll(flm);
      slm = t->sl_bitmap[fl];
    }
    for (; slm && budget > 0; slm &= slm - 1) {
      for (b = t->heads[fl][__builtin_ctz(slm)]; b && budget > 0; b = b->fnext) {
        if (!nf__capture_ok(p, b, s)) continue; // during a capture only: not counted
        budget--;
        uint64_t c = tight ? !nf__block_usable(p, b, s) : place_cost(p, b, size, &o);
        if (c < best_cost) { best = b; best_cost = c; best_off = tight ? 0 : o; }
        if (!c) goto done;
      }
    }
  }
  if (!best) return NULL; // 3. none: the caller reserves a fresh range
done:
  nf__tlsf_remove(t, best);
  *off = best_off;
  *mapped = !tight && !best_cost; // cost 0: every granule of the placement is ready
  return best;
}

// Last resort before an allocation fails: every free block of both arenas is
// a candidate and the one needing the fewest new granules wins (ties: the
// smaller block). After stitching has unmapped all cached granules, this
// finds the holes whose partial granules, shared with live neighbours, are
// still mapped. O(free blocks); only on the way to an OOM.
nf_block_t *nf__place_min(nf_pool_t *p, nf_tlsf_t *tl, uint64_t size, uint32_t s, uint64_t *off, bool *mapped) {
  nf_block_t *best = NULL;
  uint64_t best_cost = UINT64_MAX, o;
  for (int a = 0; a < NF_ARENA_COUNT; a++)
    for (int f = 0; f < NF_FL_COUNT; f++) {
      if (!(tl[a].fl_bitmap >> f & 1)) continue;
      for (int l = 0; l < NF_SL_COUNT; l++)
        for (nf_block_t *b = tl[a].heads[f][l]; b; b = b->fnext) {
          if (b->size < size || !nf__capture_ok(p, b, s)) continue;
          uint64_t c = place_cost(p, b, size, &o);
          if (c < best_cost || (c == best_cost && b->size < best->size)) {
            best = b;
            best_cost = c;
            *off = o;
          }
        }
    }
  if (best) nf__tlsf_remove(&tl[best->arena], best);
  *mapped = best && !best_cost;
  return best;
}

// ------------------------------------------------------------ units

// A unit touched by block b, being placed (LIVE, not yet mapped), that b
// does not own whole: by the invariant (a unit is wholly free, or owned
// whole by one non-free block) it is wholly free, so it goes back to the
// backend before b is placed partly over it: else its other granules would
// sit stranded (free, immovable) while b lives. Its unmap waits for the work
// of the free blocks over it (host wait; none during a capture).
static nf_status_t unit_dissolve(nf_pool_t *p, nf_block_t *b, uint64_t u0, uint64_t n) {
  nf_chunk_t *c = b->chunk;
  uintptr_t lo = c->base + (u0 << p->gshift), hi = c->base + ((u0 + n) << p->gshift);
  nf_block_t t = {.smask = b->smask, .tick = b->tick}; // b kept the free block's streams (nf__split)
  for (int dir = 0; dir < 2; dir++)
    for (nf_block_t *q = dir ? b->next : b->prev; q && q->addr < hi && q->addr + q->size > lo; q = dir ? q->next : q->prev) {
      if (q->state != NF_BLK_FREE) return NF_OK; // stranded already (placed far from the limit): stays
      if (q->smask && (!t.smask || q->tick > t.tick)) t.tick = q->tick;
      t.smask |= q->smask;
    }
  if (t.smask && !nf__block_retired(p, &t)) {
    if (p->capture_mask)
      return nf__error(NF_ERR_OOM, "nofrag: a mapping unit under the request is still in use by work in flight, "
                                   "and a stream is being captured (no host wait possible)");
    nf_status_t st = nf__streams_retire(p, t.smask, t.tick);
    if (st != NF_OK) return st;
  }
  p->un_split++;
  return nf__unmap_run(p, c, u0, u0 + n);
}

nf_status_t nf__units_fit(nf_pool_t *p, nf_block_t *b, bool *unmapped) {
  nf_chunk_t *c = b->chunk;
  // A private pool's free memory is never unmapped while it has users (a
  // captured graph's replays write to it; nofrag.h): its units stay, as
  // far from the limit, and follow the normal rules once it is handed back.
  if (c->priv) return NF_OK;
  uint64_t s0 = (b->addr - c->base) >> p->gshift, s1 = (b->addr + b->size - c->base + p->granule - 1) >> p->gshift;
  uint64_t o0 = 0, o1 = 0;
  // Far from the limit a stranded granule costs nothing: leave the unit.
  if (p->gran_created + (p->max_granules >> NF_UNIT_NEAR) <= p->max_granules) return NF_OK;
  nf__owned(p, b, &o0, &o1);
  for (int e = 0; e < 2; e++) {
    uint64_t g = e ? s1 - 1 : s0, u0, n;
    if (!nf__bit(c->mapped, g) || !nf__unit_of(p, c->phys[g], &u0, &n) || (u0 >= o0 && u0 + n <= o1)) continue;
    nf_status_t st = unit_dissolve(p, b, u0, n);
    if (st != NF_OK) return st;
    *unmapped = true;
  }
  return NF_OK;
}
