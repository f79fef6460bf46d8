// The free-block index: each arena's free blocks in a two-level segregated
// fit (TLSF) index, and the block surgery around it (split, coalesce on
// release). Below the placement policy (placement.c), which searches this
// index, and below the streams and the vmm, which hand blocks back to it.
#include "core/core.h"

void nf__tlsf_insert(nf_tlsf_t *t, nf_block_t *b) {
  int fl, sl;
  nf__tlsf_mapping(b->size >> NF_ALIGN_SHIFT, &fl, &sl);
  nf_block_t *h = t->heads[fl][sl];
  b->fprev = NULL;
  b->fnext = h;
  if (h) h->fprev = b;
  t->heads[fl][sl] = b;
  t->fl_bitmap |= 1ull << fl;
  t->sl_bitmap[fl] |= 1u << sl;
}

void nf__tlsf_remove(nf_tlsf_t *t, nf_block_t *b) {
  int fl, sl;
  nf__tlsf_mapping(b->size >> NF_ALIGN_SHIFT, &fl, &sl);
  if (b->fprev) b->fprev->fnext = b->fnext;
  else t->heads[fl][sl] = b->fnext;
  if (b->fnext) b->fnext->fprev = b->fprev;
  if (!t->heads[fl][sl]) {
    t->sl_bitmap[fl] &= ~(1u << sl);
    if (!t->sl_bitmap[fl]) t->fl_bitmap &= ~(1ull << fl);
  }
  b->fprev = b->fnext = NULL;
}

static nf_block_t *split_front(nf_pool_t *p, nf_block_t *b, uint64_t size) {
  nf_block_t *r = nf__block_new(p);
  if (!r) return NULL;
  r->addr = b->addr + size;
  r->size = b->size - size;
  r->chunk = b->chunk;
  r->arena = b->arena;
  r->state = NF_BLK_FREE;
  r->smask = b->smask;
  r->tick = b->tick;
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  return r;
}

// Carve [b->addr + off, + size) out of the detached free block b; the rest
// goes back to the free index. Returns the carved block, or NULL (no host
// memory for a header) with everything back in the free index.
nf_block_t *nf__split(nf_pool_t *p, nf_block_t *b, uint64_t off, uint64_t size) {
  if (off) {
    nf_block_t *r = split_front(p, b, off);
    if (!r) { nf__tlsf_insert(nf__tlsf_of(p, b), b); return NULL; }
    nf__tlsf_insert(nf__tlsf_of(p, b), b);
    b = r;
  }
  if (b->size > size) {
    nf_block_t *r = split_front(p, b, size);
    if (!r) { nf__release_block(p, b); return NULL; }
    nf__tlsf_insert(nf__tlsf_of(p, r), r);
  }
  return b;
}

// Free neighbours always merge: the merged block must be ordered after the
// work of both (union of streams, the later free tick: conservative, never
// unsafe); a neighbour whose work is known complete adds nothing.
static void merge_order(const nf_pool_t *p, nf_block_t *keep, const nf_block_t *gone) {
  if (keep->smask && nf__block_retired(p, keep)) keep->smask = 0;
  if (!gone->smask || nf__block_retired(p, gone)) return;
  if (!keep->smask || gone->tick > keep->tick) keep->tick = gone->tick;
  keep->smask |= gone->smask;
}

// Merge l->next into l (both free). `indexed` is whichever of the two sits in
// a free structure (a bin or the TLSF index); it leaves it.
static void merge_next(nf_pool_t *p, nf_tlsf_t *t, nf_block_t *l, nf_block_t *indexed) {
  nf_block_t *r = l->next;
  merge_order(p, l, r);
  if (NF_UNLIKELY(indexed->parked)) nf__bin_unlink(p, indexed);
  else nf__tlsf_remove(t, indexed);
  l->size += r->size;
  l->next = r->next;
  if (r->next) r->next->prev = l;
  nf__block_delete(p, r);
}

// Insert a freed block into its arena's index, coalescing with free
// neighbours. `b` must be detached (state FREE, smask/tick set).
// Every free neighbour on each side, not one: a parked neighbour (bins keep
// free blocks un-coalesced) may have an indexed free block beyond it, which a
// single merge left adjacent and apart for good (nf_pool_check now says so).
void nf__release_block(nf_pool_t *p, nf_block_t *b) {
  p->fx++;
  nf_tlsf_t *t = nf__tlsf_of(p, b);
  while (b->next && b->next->state == NF_BLK_FREE) merge_next(p, t, b, b->next);
  for (nf_block_t *q; (q = b->prev) && q->state == NF_BLK_FREE; b = q) merge_next(p, t, q, q);
  nf__tlsf_insert(t, b);
}

void nf__bin_unlink(nf_pool_t *p, nf_block_t *b) {
  nf__bin_out(p, b);
  nf__map_remove(p, b->addr);
}

// Placement would have carved b from the start of its coalesced run (b and
// the free block after it): that block, the run's rest, gets the streams
// and tick the run would have had (conservative: a superset, a later tick).
void nf__bin_take_order(nf_pool_t *p, const nf_block_t *b, nf_block_t *r) {
  nf_block_t k = {.smask = b->smask, .tick = b->tick};
  merge_order(p, &k, r);
  r->smask = k.smask;
  r->tick = k.tick;
}

// The hot pair's deferred park (pool.c, nf__pool_lock): free_hot checked
// every condition of the park, and nothing ran since. Were that ever not so,
// the block is released as an unparked free (views were off: free_hot's
// condition).
void nf__hot_settle(nf_pool_t *p) {
  nf_block_t *b = p->hot;
  p->hot = NULL;
  if (NF_UNLIKELY(!nf__bin_park(p, b, b->memo))) {
    nf__map_remove(p, b->addr);
    nf__release_block(p, b);
  }
}

// Oldest first, so that the newest freed ends up first in its TLSF class (as
// when it is released at its free). A release may merge (and unlink) another
// parked neighbour: the walk restarts from the bin's head each time.
void nf__bins_flush(nf_pool_t *p) {
  if (p->hot) nf__hot_settle(p); // the hot block counts as parked (a flush inside a free: the release)
  p->fx++;
  for (uint32_t i = 0; p->bin_blocks && i < NF_BINS; i++) {
    nf_bin_t *bin = &p->bins[i];
    while (bin->head) {
      nf_block_t *b = bin->head;
      while (b->fnext) b = b->fnext;
      nf__bin_unlink(p, b);
      nf__release_block(p, b);
    }
  }
}

// Largest free run that is fully mapped, and the number of granules that
// live (or pending) blocks overlap. One walk over all blocks.
uint64_t nf__largest_free_mapped(const nf_pool_t *p, uint64_t *live_granules) {
  uint64_t best = 0, lg = 0;
  for (const nf_chunk_t *c = p->chunks; c; c = c->next) {
    const uint64_t *ready = c->mapped + ((c->ngran + 63) >> 6);
    uint64_t last_g = UINT64_MAX; // last granule counted as live (blocks are address-ordered)
    for (const nf_block_t *b = c->first; b;) {
      if (b->state != NF_BLK_FREE) {
        uint64_t g0 = (b->addr - c->base) >> p->gshift;
        uint64_t g1 = (b->addr + b->size - c->base + p->granule - 1) >> p->gshift;
        lg += g1 - g0 - (g0 == last_g);
        last_g = g1 - 1;
        b = b->next;
        continue;
      }
      uintptr_t ra = b->addr - c->base, rb = ra;
      for (; b && b->state == NF_BLK_FREE; b = b->next) rb = b->addr + b->size - c->base;
      // Maximal sequences of ready granules over the run, clipped to it.
      uint64_t g = ra >> p->gshift, gb = (rb + p->granule - 1) >> p->gshift;
      while (g < gb) {
        // A word at a time where it can (a large free run is mostly one
        // kind of bit): the walk runs every 100 ms from the published
        // counters, on the alloc/free path.
        uint64_t w = ready[g >> 6] >> (g & 63);
        if (!w) { g = (g | 63) + 1; continue; }
        g += (uint64_t)__builtin_ctzll(w);
        if (g >= gb) break;
        uint64_t e = g;
        for (;;) {
          uint64_t x = ~ready[e >> 6] >> (e & 63); // zeros from e on
          if (x) { e += (uint64_t)__builtin_ctzll(x); break; }
          e = (e | 63) + 1;
          if (e >= gb) break;
        }
        if (e > gb) e = gb;
        uint64_t lo = g << p->gshift, hi = e << p->gshift;
        lo = lo > ra ? lo : ra;
        hi = hi < rb ? hi : rb;
        if (hi > lo && hi - lo > best) best = hi - lo;
        g = e;
      }
    }
  }
  if (live_granules) *live_granules = lg - p->edge_live; // a shared granule's second place holds none of its own (edge.c)
  return best;
}

bool nf__next_retired_run(const nf_pool_t *p, const nf_chunk_t *c, nf_block_t **bp, uint64_t *g0, uint64_t *g1) {
  nf_block_t *b = *bp;
  while (b && (b->state != NF_BLK_FREE || !nf__block_retired(p, b))) b = b->next;
  if (!b) { *bp = NULL; return false; }
  uintptr_t ra = b->addr, rb = ra;
  while (b && b->state == NF_BLK_FREE && nf__block_retired(p, b)) { rb = b->addr + b->size; b = b->next; }
  *bp = b;
  *g0 = (ra - c->base + p->granule - 1) >> p->gshift;
  *g1 = (rb - c->base) >> p->gshift;
  return true;
}
