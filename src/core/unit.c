// Mapping units (cfg.units): the driver charges setting access and unmapping
// per mapping, not per byte (H200: 25.7 us to set access on a one-granule
// mapping, 1.9 us per granule of a 16-granule one; creating, 9.4 us against
// 0.5), so growth that creates the interior of a large block in allocations
// of U granules, each mapped in one call, costs about a tenth per granule.
//
// The driver maps an allocation only whole (a non-zero offset is refused)
// and unmaps a mapping only whole, so a unit is a bigger granule with a
// fixed place: it is mapped where it was made and nowhere else, its granules
// are never moved (views, stitching) or offloaded, and it is unmapped only
// whole, once no live block overlaps it (free, work complete), and released
// at once. Each member keeps its own gran[] slot (chunk phys[], the check and
// the snapshot see granules as ever); the head holds the size, and the
// members are chained from it through prev_free (never on a free list).
//
// Units are made only by growth, only for runs wholly inside the block being
// placed, and only with room: U granules more than the singles the request
// takes from the free list, and the pool below its limit by a sixteenth. A
// unit pinned by one live block keeps its other granules where they are, so
// near the limit singles stay the rule.
#include "core/core.h"

#include <stdlib.h>


// A unit's slots in gran[]: n unused slots taken off the unused list (false:
// out of host memory; none taken).
static bool slots_take(nf_pool_t *p, uint32_t *ix, uint64_t n) {
  for (uint64_t j = 0; j < n; j++) {
    int32_t i = nf__gran_slot(p);
    if (i < 0) {
      while (j--) nf__gran_slot_put(p, ix[j]);
      return false;
    }
    p->gran_unused = p->gran[i].next_free;
    ix[j] = (uint32_t)i;
  }
  return true;
}

static void slots_put(nf_pool_t *p, const uint32_t *ix, uint64_t n) {
  for (uint64_t j = n; j--;) nf__gran_slot_put(p, ix[j]);
}

// A unit not mapped whose release failed: LOOSE, on the list that
// nf__units_loose_release (run by every release) retries.
static void loose_push(nf_pool_t *p, uint32_t head) {
  for (int32_t i = (int32_t)head; i >= 0; i = p->gran[i].prev_free) p->gran[i].state = NF_GR_LOOSE;
  p->gran[head].next_free = p->un_loose;
  p->un_loose = (int32_t)head;
}

// One unit of n granules at virtual granules [g, g+n) of c: create, map
// (access is set by the caller with the rest of the run). NF_ERR_OOM and
// backend failures leave nothing behind but, where the rollback's release
// fails too, a LOOSE unit.
static nf_status_t unit_new(nf_pool_t *p, nf_chunk_t *c, uint64_t g, uint64_t n) {
  uint32_t ix[NF_UNITS_MAX];
  if (!slots_take(p, ix, n)) return NF_ERR_NOMEM;
  nf_handle_t h;
  nf_status_t st = NF_BE(p, mem_create, create, NF_TIER_DEVICE, n << p->gshift, &h);
  if (st != NF_OK) {
    slots_put(p, ix, n);
    return nf__error(st, "nofrag: creating a %llu-granule unit failed: %s", (unsigned long long)n, nf__backend_err());
  }
  st = NF_BE(p, map, map, c->base + (g << p->gshift), n << p->gshift, h);
  if (st != NF_OK) {
    nf__error(st, "nofrag: mapping a %llu-granule unit failed: %s", (unsigned long long)n, nf__backend_err());
    if (NF_BE(p, mem_release, release, h) == NF_OK) {
      slots_put(p, ix, n);
      return st;
    }
  }
  for (uint64_t j = 0; j < n; j++)
    p->gran[ix[j]] = (nf_granule_t){.handle = h, .tier = NF_TIER_DEVICE, .state = NF_GR_MAPPED, .at_c = c,
                                    .at_g = (uint32_t)(g + j), .unit = ix[0] + 1, .next_free = -1,
                                    .prev_free = j + 1 < n ? (int32_t)ix[j + 1] : -1};
  p->gran[ix[0]].un = (uint32_t)n;
  p->gran_created += n;
  p->gran_made += n;
  if (st != NF_OK) { // not mapped, not released
    loose_push(p, ix[0]);
    return st;
  }
  for (uint64_t j = 0; j < n; j++) {
    c->phys[g + j] = ix[j];
    nf__bit_set(c->mapped, g + j);
  }
  p->gran_mapped += n;
  p->un_made++;
  p->un_live++;
  p->fx++;
  nf__peak(&p->st.physical_peak, p->gran_created << p->gshift);
  return NF_OK;
}

// Before nf__map_range takes k granules for [g0, g1) of c: make units for
// runs of U unmapped granules wholly inside the block being placed, while
// the request would create at least U more granules than the free list holds
// and the pool stays a sixteenth below its limit (NF_UNIT_MARGIN). Their granules are marked
// in `mine` (bit g - g0); returns how many. A unit that cannot be made
// ends the attempt quietly: singles follow, and report what fails.
uint64_t nf__units_make(nf_pool_t *p, nf_chunk_t *c, uint64_t g0, uint64_t g1, uint64_t k, uint64_t *mine) {
  uint64_t u = p->cfg.units, o0, o1, made = 0;
  const nf_block_t *b = p->un_blk;
  if (u < 2 || !b || b->chunk != c || p->cfg.tight || k < u || !nf__owned(p, b, &o0, &o1)) return 0;
  if (o0 < g0) o0 = g0;
  if (o1 > g1) o1 = g1;
  uint64_t cap = p->max_granules - (p->max_granules >> NF_UNIT_MARGIN);
  for (uint64_t g = o0; g + u <= o1;) {
    uint64_t rest = k - made;
    if (rest < p->gran_free_count + u || p->gran_created + u > cap) break;
    uint64_t e = g;
    while (e < g + u && !nf__bit(c->mapped, e)) e++;
    if (e < g + u) { g = e + 1; continue; }
    if (unit_new(p, c, g, u) != NF_OK) break;
    for (uint64_t x = g; x < g + u; x++) nf__bit_set(mine, x - g0);
    made += u;
    g += u;
  }
  return made;
}

// [g0, g1) of c starts or ends inside a unit.
bool nf__unit_cut(const nf_pool_t *p, const nf_chunk_t *c, uint64_t g0, uint64_t g1) {
  uint64_t u0, n;
  if (g0 >= g1) return false;
  if (nf__bit(c->mapped, g0) && nf__unit_of(p, c->phys[g0], &u0, &n) && u0 != g0) return true;
  return nf__bit(c->mapped, g1 - 1) && nf__unit_of(p, c->phys[g1 - 1], &u0, &n) && u0 + n != g1;
}

static nf_status_t unit_release(nf_pool_t *p, uint32_t head) {
  nf_status_t st = NF_BE(p, mem_release, release, p->gran[head].handle);
  if (st != NF_OK) return nf__error(st, "nofrag: releasing a unit failed: %s", nf__backend_err());
  uint64_t n = p->gran[head].un;
  for (int32_t nx, i = (int32_t)head; i >= 0; i = nx) {
    nx = p->gran[i].prev_free;
    nf__gran_slot_put(p, (uint32_t)i);
  }
  p->gran_created -= n;
  return NF_OK;
}

// The unit whose head is `head` was unmapped (its members' bits are clear):
// release it; if that fails it waits, LOOSE, for the next release.
void nf__unit_unmapped(nf_pool_t *p, uint32_t head) {
  p->un_gone++;
  p->un_live--;
  if (unit_release(p, head) != NF_OK) loose_push(p, head);
}

void nf__units_loose_release(nf_pool_t *p) {
  for (int32_t *at = &p->un_loose; *at >= 0;) {
    uint32_t h = (uint32_t)*at;
    int32_t nx = p->gran[h].next_free;
    if (unit_release(p, h) != NF_OK) { at = &p->gran[h].next_free; continue; }
    *at = nx;
  }
}

// Granules of mapped units that no live (or pending) block overlaps while
// another granule of the same unit is overlapped: free, but pinned with the
// unit (the pool's guarantee counts them as live). For the OOM report: one
// walk over the blocks and one over gran[]; a bitmap per chunk.
uint64_t nf__units_stranded(const nf_pool_t *p) {
  if (!p->un_live) return 0;
  uint64_t stranded = 0;
  for (const nf_chunk_t *c = p->chunks; c; c = c->next) {
    uint64_t *on = calloc((c->ngran + 63) >> 6, sizeof *on);
    if (!on) return 0; // out of host memory: the report goes without it
    for (const nf_block_t *b = c->first; b; b = b->next)
      if (b->state != NF_BLK_FREE)
        for (uint64_t g = (b->addr - c->base) >> p->gshift; g << p->gshift < b->addr + b->size - c->base; g++)
          nf__bit_set(on, g);
    for (uint64_t i = 0; i < p->gran_cap; i++) {
      const nf_granule_t *h = &p->gran[i];
      if (h->state != NF_GR_MAPPED || !h->un || h->unit != i + 1 || h->at_c != c) continue;
      uint64_t used = 0;
      for (uint64_t g = h->at_g; g < h->at_g + h->un; g++) used += nf__bit(on, g);
      if (used) stranded += h->un - used;
    }
    free(on);
  }
  return stranded;
}

// nf_pool_check's part: every unit is mapped whole at consecutive virtual
// granules of one chunk, its members name it and its handle, none has a
// parked view; LOOSE units are on their list (*loose: their granules).
nf_status_t nf__unit_check(nf_pool_t *p, uint64_t *loose_out) {
  uint64_t loose = 0;
  *loose_out = 0;
  for (uint64_t i = 0; i < p->gran_cap; i++) {
    const nf_granule_t *x = &p->gran[i];
    if (x->state == NF_GR_UNUSED || !x->unit) continue;
    const nf_granule_t *h = &p->gran[x->unit - 1];
    if (x->unit - 1 >= p->gran_cap || !h->un || h->unit != x->unit || h->handle != x->handle || x->nviews ||
        x->tier != NF_TIER_DEVICE)
      return nf__error(NF_ERR_INVALID, "check: granule %llu: bad unit membership", (unsigned long long)i);
    uint64_t len = 0;
    if (x->unit - 1 == i)
      for (int32_t m = (int32_t)i; m >= 0 && len <= x->un; m = p->gran[m].prev_free) len++;
    if (x->unit - 1 == i && len != x->un)
      return nf__error(NF_ERR_INVALID, "check: unit %llu chains %llu members, not %u", (unsigned long long)i,
                       (unsigned long long)len, x->un);
    if (x->state == NF_GR_LOOSE) { loose++; continue; }
    const nf_chunk_t *c = h->at_c;
    uint64_t g = x->at_g;
    if (x->state != NF_GR_MAPPED || x->at_c != c || g < h->at_g || g >= h->at_g + h->un || g >= c->ngran ||
        !nf__bit(c->mapped, g) || c->phys[g] != i)
      return nf__error(NF_ERR_INVALID, "check: granule %llu of a unit is not mapped at its place",
                       (unsigned long long)i);
  }
  uint64_t listed = 0;
  for (int32_t h = p->un_loose; h >= 0; h = p->gran[h].next_free) listed += p->gran[h].un;
  if (listed != loose)
    return nf__error(NF_ERR_INVALID, "check: %llu loose unit granules, %llu on the list", (unsigned long long)loose,
                     (unsigned long long)listed);
  *loose_out = loose;
  return NF_OK;
}
