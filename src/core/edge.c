// Edge sharing (config `edges`; docs/design.md, "Edge sharing").
//
// A block whose size is not a whole number of granules leaves the rest of its
// last granule free, and at the limit nothing may be able to use it: llama's
// failed probe on an H100 was 2 granules short while its 609 live blocks held
// 54 granules more than their bytes (docs/benchmarks.md section 25). A request
// of k granules and r bytes (0 < r < G) placed on a granule boundary needs
// k + 1 granules. When nothing else fits, it may instead start r bytes before
// the end of a granule X whose first bytes another block uses and whose last r
// bytes are free: X is mapped a second time, at the first granule j of a window
// of k + 1 unused virtual granules (the chunk's `guest` bit: mapped and ready
// there, owned at its own place i), and the block takes [G - r, G) of j and the
// k granules after it, mapped as usual. It needs k granules, not k + 1.
// Likewise its end may take the first r bytes of a granule whose last bytes
// another block uses (its tail shared), or both ends may be shared, h + t =
// r + G bytes in two such granules: k - 1 granules.
//
// The two places of X never share a byte (nor a cache line: blocks are 512 B
// aligned): at i a shadow block covers [G - r, G), the bytes the new block uses
// through j; at j a shadow covers [0, G - r), the bytes the other side may use
// through i. Shadows are neither free nor live: no placement takes them, no
// statistic counts them, and only the release of the paired block ends them
// (nf__release_viewed): j becomes a parked view of X (view.c), and both shadows
// become free space carrying the paired block's streams, so that the next user
// of those bytes, through either place, is ordered after its work. While the
// pair lives X cannot move: the shadow at i keeps that place busy.
//
// Only at the limit (views on), for requests of the large arena, outside
// private pools and captures, for device granules that are not part of a unit.
// nf_pool_check proves the pairing (nf__edge_check).
#include "core/core.h"

#include <stdlib.h>

// A granule a free block shares with a non-free one, at place g of c, that
// may lend its free part: owned there, ready, on the device, not in a unit.
static bool lendable(const nf_pool_t *p, const nf_chunk_t *c, uint64_t g) {
  if (!nf__bit(c->mapped, g) || !nf__bit(NF_READY(c), g) || nf__guest(c, g)) return false;
  const nf_granule_t *x = &p->gran[c->phys[g]];
  return x->tier == NF_TIER_DEVICE && !x->unit && x->state == NF_GR_MAPPED;
}

// Lenders: free blocks of the general pool (coalesced, so a non-free block
// lies beyond their partial granule) whose first granule is partly used
// before them and wholly free after (`tail`: that granule's last bytes can go
// to a block's first granule), or whose last granule is partly used after
// them (`head`: its first bytes, to a block's last). Each side: the best fit
// for `want` bytes (the least left over), and the largest.
typedef struct lender_s {
  nf_block_t *b;
  uint64_t g, free; // its partial granule, and the free bytes there
} lender_t;
typedef struct lenders_s {
  lender_t fit[2], big[2]; // [0]: granule tails (a block's head goes there), [1]: granule heads
} lenders_t;

static void lender_note(lenders_t *L, int side, nf_block_t *b, uint64_t g, uint64_t fr, uint64_t want) {
  if (fr >= want && (!L->fit[side].b || fr < L->fit[side].free)) L->fit[side] = (lender_t){b, g, fr};
  if (!L->big[side].b || fr > L->big[side].free) L->big[side] = (lender_t){b, g, fr};
}

static void lenders_find(nf_pool_t *p, uint64_t want, lenders_t *L) {
  *L = (lenders_t){0};
  uint64_t G = p->granule;
  for (int a = 0; a < NF_ARENA_COUNT; a++)
    for (int f = 0; f < NF_FL_COUNT; f++) {
      if (!(p->tlsf[a].fl_bitmap >> f & 1)) continue;
      for (int l = 0; l < NF_SL_COUNT; l++)
        for (nf_block_t *b = p->tlsf[a].heads[f][l]; b; b = b->fnext) {
          const nf_chunk_t *c = b->chunk;
          uint64_t lo = b->addr - c->base, hi = lo + b->size, x = lo & (G - 1), e = hi & (G - 1);
          if (x && b->size >= G - x && lendable(p, c, lo >> p->gshift)) lender_note(L, 0, b, lo >> p->gshift, G - x, want);
          if (e && b->size >= e && lendable(p, c, hi >> p->gshift)) lender_note(L, 1, b, hi >> p->gshift, e, want);
        }
    }
}

// A free block of the general large arena holding n whole virtual granules
// that are neither mapped nor parked views: the first of them in *gout.
static nf_block_t *window_find(nf_pool_t *p, uint64_t n, uint64_t *gout) {
  nf_tlsf_t *t = &p->tlsf[NF_ARENA_LARGE];
  uint64_t need = n << p->gshift;
  for (int f = 0; f < NF_FL_COUNT; f++) {
    if (!(t->fl_bitmap >> f & 1)) continue;
    for (int l = 0; l < NF_SL_COUNT; l++)
      for (nf_block_t *b = t->heads[f][l]; b; b = b->fnext) {
        if (b->size < need) continue;
        const nf_chunk_t *c = b->chunk;
        uint64_t g0 = (b->addr - c->base + p->granule - 1) >> p->gshift;
        uint64_t g1 = (b->addr + b->size - c->base) >> p->gshift;
        for (uint64_t g = g0, run = 0; g < g1; g++) {
          run = nf__bit(c->mapped, g) || nf__bit(c->stale, g) ? 0 : run + 1;
          if (run == n) {
            *gout = g + 1 - n;
            return b;
          }
        }
      }
  }
  return NULL;
}

// Device granules a request could still get: free, creatable under the
// limit, or cached (mapped where no non-free block lies, movable).
static uint64_t granules_gatherable(const nf_pool_t *p) {
  uint64_t n = p->gran_free_count + (p->max_granules > p->gran_created ? p->max_granules - p->gran_created : 0);
  for (const nf_chunk_t *c = p->chunks; c; c = c->next) {
    if (c->priv) continue;
    for (uint64_t w = 0; w < (c->ngran + 63) >> 6; w++)
      for (uint64_t m = c->mapped[w] & ~c->busy[w]; m; m &= m - 1) {
        const nf_granule_t *x = &p->gran[c->phys[(w << 6) + (uint64_t)__builtin_ctzll(m)]];
        n += x->tier == NF_TIER_DEVICE && !x->unit;
      }
  }
  return n;
}

// A shadow carved back into free space, after the block it served is gone:
// its bytes' next user is ordered after the streams m up to tick (and after
// what was there before, kept in its own mask).
static void shadow_free(nf_pool_t *p, nf_block_t *sh, uint64_t m, uint64_t tick, bool merge) {
  if (m && (!sh->smask || tick > sh->tick)) sh->tick = tick;
  sh->smask |= m;
  sh->state = NF_BLK_FREE;
  sh->edge = NF_EDGE_NONE;
  sh->twin = NULL;
  nf__view_dead(p, sh, merge); // busy bits; merge: the granule's last users take m
  nf__release_block(p, sh);
}

// Carved shadows undone before their pair was made (NULL: not carved): back
// to free space with the streams they had.
static void shadows_free(nf_pool_t *p, nf_block_t *sh[4]) {
  for (int i = 0; i < 4; i++)
    if (sh[i]) shadow_free(p, sh[i], 0, 0, false);
}

// The pair of a released block's shared end granule ends (its guest shadow).
static void edge_dead(nf_pool_t *p, nf_block_t *guest) {
  nf_chunk_t *c = guest->chunk;
  // f: the block's range, released (free), beside its guest shadow
  nf_block_t *host = guest->twin, *f = guest->edge & NF_EDGE_HEAD ? guest->next : guest->prev;
  uint64_t j = (guest->addr - c->base) >> p->gshift, m = f->smask, tick = f->tick;
  uint32_t xi = c->phys[j];
  // The second mapping stays, as a parked view of the granule: no backend call here.
  nf__bit_clr(c->guest, j);
  nf__bit_clr(c->mapped, j);
  nf__bit_clr(NF_READY(c), j);
  shadow_free(p, guest, m, tick, false); // nobody used the granule through it: no user to add
  nf__view_park_at(p, c, j, xi, m ? tick : 0);
  shadow_free(p, host, m, tick, true); // the granule, owned there, takes the block's streams
  p->edge_live--;
  p->fx++;
}

void nf__release_viewed(nf_pool_t *p, nf_block_t *b, bool used) {
  nf_block_t *gh = b->edge & NF_EDGE_HEAD ? b->prev : NULL, *gt = b->edge & NF_EDGE_TAIL ? b->next : NULL;
  b->edge = NF_EDGE_NONE;
  nf__view_dead(p, b, used);
  nf__release_block(p, b);
  if (NF_UNLIKELY(gh != NULL)) edge_dead(p, gh);
  if (NF_UNLIKELY(gt != NULL)) edge_dead(p, gt);
}

// The free block of c holding [a, a + n) (not parked: bins are flushed), or NULL.
static nf_block_t *free_at(nf_chunk_t *c, uintptr_t a, uint64_t n) {
  for (nf_block_t *b = c->first; b && b->addr <= a; b = b->next)
    if (a + n <= b->addr + b->size) return b->state == NF_BLK_FREE && !b->parked ? b : NULL;
  return NULL;
}

// [a, a + n) of c carved out of its free block as a shadow (its rest stays
// free, indexed). NULL: no host memory for a header (nothing changed).
static nf_block_t *shadow_carve(nf_pool_t *p, nf_chunk_t *c, uintptr_t a, uint64_t n) {
  nf_block_t *f = free_at(c, a, n), *sh;
  if (!f) return NULL;
  nf__tlsf_remove(nf__tlsf_of(p, f), f);
  if (!(sh = nf__split(p, f, a - f->addr, n))) return NULL;
  sh->state = NF_BLK_SHADOW; // keeps the free block's streams: its bytes' users before it
  sh->stream = 0;
  return sh;
}

// Granule xi mapped a second time, at g of c (map and set access). On failure
// nothing changed, or (a backend failing on: the mapping neither unmapped nor
// given access after 6 tries each) the mapping stays as a parked view of xi,
// with access, which the views unmap in time: never forgotten mapped.
static nf_status_t guest_map(nf_pool_t *p, nf_chunk_t *c, uint64_t g, uint32_t xi) {
  uintptr_t va = c->base + (g << p->gshift);
  nf_status_t st = NF_BE(p, map, map, va, p->granule, p->gran[xi].handle);
  if (st != NF_OK && p->vw_count && nf__view_evict_all(p)) st = NF_BE(p, map, map, va, p->granule, p->gran[xi].handle);
  if (st == NF_OK && (st = NF_BE(p, set_access, set_access, va, p->granule)) != NF_OK) {
    char msg[NF_BACKEND_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", nf__backend_err());
    for (int t = 0; t < 6; t++) { // nothing ran through it
      if (NF_BE(p, unmap, unmap, va, p->granule) == NF_OK) break;
      if (NF_BE(p, set_access, set_access, va, p->granule) == NF_OK) {
        c->phys[g] = xi;
        nf__view_park_at(p, c, g, xi, 0);
        break;
      }
    }
    return nf__error(st, "nofrag: set access failed: %s", msg);
  }
  if (st != NF_OK) return nf__error(st, "nofrag: map failed: %s", nf__backend_err());
  c->phys[g] = xi;
  nf__bit_set(c->guest, g);
  nf__bit_set(c->mapped, g);
  nf__bit_set(NF_READY(c), g);
  p->fx++;
  return NF_OK;
}

// Block b's end `end` (NF_EDGE_HEAD or _TAIL) shared: its two shadows name each other.
static void pair_link(nf_block_t *b, nf_block_t *guest, nf_block_t *host, uint8_t end) {
  guest->edge = NF_EDGE_GUEST | end;
  host->edge = NF_EDGE_HOST | end;
  guest->twin = host;
  host->twin = guest;
  b->edge |= end;
}

// Plans, by granules saved: the head in a lent granule tail (h bytes there),
// the tail in a lent granule head (t bytes), or both.
typedef struct plan_s {
  lender_t hd, tl; // .b NULL: that end not shared
  uint64_t h, t;   // bytes of the block in each shared granule
} plan_t;

static bool plan_make(const nf_pool_t *p, uint64_t rsize, const lenders_t *L, uint64_t avail, plan_t *pl) {
  uint64_t G = p->granule, r = rsize & (G - 1), k = rsize >> p->gshift;
  *pl = (plan_t){0};
  if (avail >= k) { // one end shared is enough: the tighter of the two fits
    int side = !L->fit[0].b ? 1 : !L->fit[1].b ? 0 : L->fit[1].free < L->fit[0].free;
    if (!L->fit[side].b) return false;
    if (side == 0) { pl->hd = L->fit[0]; pl->h = r; }
    else { pl->tl = L->fit[1]; pl->t = r; }
    return true;
  }
  // Both ends: h + t = r + G bytes in two lent granules, k - 1 in between.
  if (avail + 1 < k || !k || !L->big[0].b || !L->big[1].b || L->big[0].free + L->big[1].free < r + G) return false;
  pl->hd = L->big[0];
  pl->tl = L->big[1];
  pl->h = L->big[0].free < r + G - NF_ALIGN ? L->big[0].free : r + G - NF_ALIGN;
  pl->t = r + G - pl->h;
  // Not one granule for both ends: h + t > G bytes of it would overlap.
  return pl->t <= pl->tl.free && !(pl->hd.g == pl->tl.g && pl->hd.b->chunk == pl->tl.b->chunk);
}

nf_status_t nf__edge_place(nf_pool_t *p, uint64_t rsize, uint32_t s, nf_block_t **out) {
  *out = NULL;
  uint64_t G = p->granule;
  if (!p->cfg.edges || !p->vw_on || p->capture_mask || !(rsize & (G - 1)) || rsize <= p->cfg.small_max)
    return NF_ERR_OOM;
  lenders_t L;
  plan_t pl;
  lenders_find(p, rsize & (G - 1), &L);
  if (!plan_make(p, rsize, &L, granules_gatherable(p), &pl)) return NF_ERR_OOM;
  uint64_t m = (rsize - pl.h - pl.t) >> p->gshift, n = m + !!pl.h + !!pl.t, j = 0;
  nf_status_t st;
  nf_block_t *w;
  if (!(w = window_find(p, n, &j))) { // virtual space is plentiful: a fresh range
    if ((st = nf__chunk_new(p, NF_ARENA_LARGE, n << p->gshift)) != NF_OK) return st;
    if (!(w = window_find(p, n, &j))) return nf__error(NF_ERR_INVALID, "nofrag: internal error: fresh range not found");
  }
  nf_chunk_t *c = w->chunk;
  uintptr_t wa = c->base + (j << p->gshift), ba = wa + (pl.h ? G - pl.h : 0);
  // The stream is ordered after the last users of the bytes it takes (a
  // GPU-side event wait at most); those of the granules mapped between, by
  // nf__map_block as for any block.
  if (pl.h && !nf__block_usable(p, pl.hd.b, s) && (st = nf__order_after(p, pl.hd.b, s)) != NF_OK) return st;
  if (pl.t && !nf__block_usable(p, pl.tl.b, s) && (st = nf__order_after(p, pl.tl.b, s)) != NF_OK) return st;
  if (!c->guest && !(c->guest = calloc((c->ngran + 63) >> 6, sizeof(uint64_t))))
    return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  // Carve by address (a lender may hold the window or the other lender's
  // granule): the two host shadows, the block's range, its guest shadows.
  nf_block_t *hh = NULL, *ht = NULL, *gh = NULL, *gt = NULL, *b = NULL;
  nf_chunk_t *c0 = pl.h ? pl.hd.b->chunk : NULL, *c1 = pl.t ? pl.tl.b->chunk : NULL;
  bool ok = (!pl.h || (hh = shadow_carve(p, c0, c0->base + ((pl.hd.g + 1) << p->gshift) - pl.h, pl.h))) &&
            (!pl.t || (ht = shadow_carve(p, c1, c1->base + (pl.tl.g << p->gshift), pl.t))) &&
            (!pl.h || (gh = shadow_carve(p, c, wa, G - pl.h))) &&
            (!pl.t || (gt = shadow_carve(p, c, ba + rsize, G - pl.t))) && (b = free_at(c, ba, rsize));
  if (ok) {
    nf__tlsf_remove(nf__tlsf_of(p, b), b);
    if (!(b = nf__split(p, b, ba - b->addr, rsize))) ok = false;
  }
  if (!ok) {
    shadows_free(p, (nf_block_t *[4]){gt, gh, ht, hh});
    return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  }
  b->state = NF_BLK_LIVE; // from here stitching neither unmaps nor coalesces it
  b->stream = (uint16_t)s;
  st = !pl.h ? NF_OK : guest_map(p, c, j, c0->phys[pl.hd.g]);
  if (st == NF_OK && pl.t && (st = guest_map(p, c, j + n - 1, c1->phys[pl.tl.g])) != NF_OK && pl.h) {
    nf__bit_clr(c->guest, j); // the head's mapping stays, as a parked view
    nf__bit_clr(c->mapped, j);
    nf__bit_clr(NF_READY(c), j);
    nf__view_park_at(p, c, j, c->phys[j], 0);
  }
  if (st != NF_OK) {
    char msg[NF_BACKEND_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", nf_last_error());
    b->state = NF_BLK_FREE;
    nf__release_block(p, b);
    shadows_free(p, (nf_block_t *[4]){gt, gh, ht, hh});
    return nf__error(st, "%s", msg);
  }
  if (pl.h) pair_link(b, gh, hh, NF_EDGE_HEAD);
  if (pl.t) pair_link(b, gt, ht, NF_EDGE_TAIL);
  nf_block_t *all[5] = {hh, ht, gh, gt, b};
  for (int i = 0; i < 5; i++)
    if (all[i]) nf__view_live(p, all[i]);
  p->edge_live += !!pl.h + !!pl.t;
  if (m && (st = nf__map_block(p, b)) != NF_OK) {
    // The rest does not fit after all: the pairs end as after a free (the
    // second mappings stay, parked). The failed call's message stands.
    b->state = NF_BLK_FREE;
    nf__release_viewed(p, b, false);
    return st;
  }
  p->edge_made += !!pl.h + !!pl.t;
  *out = b;
  return NF_OK;
}

#define CHECK(cond, ...) do { if (!(cond)) return nf__error(NF_ERR_INVALID, __VA_ARGS__); } while (0)

// Guest granule g of c: its shadow, the block beside it, the shadow at the
// granule's own place, and the proof that no byte of the granule is reachable
// by two non-shadow blocks: here the shadow covers the other place's part,
// there the other shadow covers this block's part, at one offset.
nf_status_t nf__edge_check(nf_pool_t *p, const nf_chunk_t *c, uint64_t g) {
  uintptr_t ga = c->base + (g << p->gshift), G = p->granule;
  const nf_block_t *sh = c->first;
  while (sh && (sh->state != NF_BLK_SHADOW || sh->addr + sh->size <= ga)) sh = sh->next;
  CHECK(nf__bit(c->mapped, g) && nf__bit(NF_READY(c), g) && !nf__bit(c->stale, g),
        "check: shared granule at %p not mapped and ready, or parked", (void *)ga);
  CHECK(sh && (sh->edge & NF_EDGE_GUEST) && sh->addr >= ga && sh->addr + sh->size <= ga + G,
        "check: shared granule at %p has no shadow", (void *)ga);
  bool head = sh->edge & NF_EDGE_HEAD;
  const nf_block_t *b = head ? sh->next : sh->prev, *host = sh->twin;
  CHECK(head ? sh->addr == ga : sh->addr + sh->size == ga + G, "check: shared granule at %p: shadow misplaced", (void *)ga);
  CHECK(b && (b->state == NF_BLK_LIVE || b->state == NF_BLK_PENDING) && (b->edge & (head ? NF_EDGE_HEAD : NF_EDGE_TAIL)) &&
            (head ? b->addr + b->size >= ga + G : b->addr <= ga),
        "check: shared granule at %p: no block beside its shadow", (void *)ga);
  CHECK(host && host->twin == sh && host->edge == ((sh->edge & ~NF_EDGE_GUEST) | NF_EDGE_HOST),
        "check: shared granule at %p: its shadows are not paired", (void *)ga);
  uint32_t i = c->phys[g];
  CHECK(i < p->gran_cap, "check: shared granule at %p: bad granule %u", (void *)ga, i);
  const nf_granule_t *x = &p->gran[i];
  // Its owning place: the granule the other shadow lies in (at_c / at_g are only hints).
  const nf_chunk_t *o = host->chunk;
  uint64_t og = (host->addr - o->base) >> p->gshift;
  CHECK(x->state == NF_GR_MAPPED && x->tier == NF_TIER_DEVICE && nf__bit(o->mapped, og) && nf__bit(NF_READY(o), og) &&
            o->phys[og] == i && !nf__guest(o, og),
        "check: shared granule at %p: granule %u is not owned where its other shadow is", (void *)ga, i);
  uintptr_t ia = o->base + (og << p->gshift);
  // head: here [0, y) is the shadow's, there [y, G); tail: here [t, G), there [0, t).
  bool split = head ? host->addr == ia + sh->size && host->addr + host->size == ia + G
                    : host->addr == ia && host->size == G - sh->size;
  CHECK(split, "check: shared granule at %p: the shadows do not split granule %u at one offset", (void *)ga, i);
  return NF_OK;
}
