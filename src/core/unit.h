// Mapping units (unit.c, placement.c's split): part of the core's private
// header (core.h includes it after the pool's types). The interior of a large
// block, where growth creates it, is created and mapped U granules at a time
// (cfg.units); such a unit is mapped only there and unmapped only whole (then
// released).
#ifndef NF_CORE_UNIT_H
#define NF_CORE_UNIT_H

// Units are made while physical memory stays a sixteenth (>> 4) below the
// limit; within an eighth (>> 3) of it, a block placed over part of a free
// unit splits the unit first (replay: closer bounds gave no better figures).
#define NF_UNIT_MARGIN 4
#define NF_UNIT_NEAR 3
#define NF_UNITS_MAX 1024 // granules in a unit (config `units`; unit_new's slot array)

uint64_t nf__units_make(nf_pool_t *p, nf_chunk_t *c, uint64_t g0, uint64_t g1, uint64_t k, uint64_t *mine);
// The unit granule i belongs to: its first virtual granule *u0 (at its
// place) and its size; false for a granule of its own.
static inline bool nf__unit_of(const nf_pool_t *p, uint32_t i, uint64_t *u0, uint64_t *n) {
  uint32_t h = p->gran[i].unit;
  if (NF_LIKELY(!h)) return false;
  *u0 = p->gran[h - 1].at_g;
  *n = p->gran[h - 1].un;
  return true;
}
bool nf__unit_cut(const nf_pool_t *p, const nf_chunk_t *c, uint64_t g0, uint64_t g1); // [g0, g1) cuts a unit
void nf__unit_unmapped(nf_pool_t *p, uint32_t head);  // after the unit's unmap: release it
void nf__units_loose_release(nf_pool_t *p);
nf_status_t nf__unit_check(nf_pool_t *p, uint64_t *loose); // nf_pool_check's part; *loose: LOOSE granules
// placement.c: before block b (LIVE, not yet mapped) is placed, near the
// limit, units b touches but does not own whole are unmapped first
// (*unmapped set; b then needs mapping).
nf_status_t nf__units_fit(nf_pool_t *p, nf_block_t *b, bool *unmapped);
uint64_t nf__units_stranded(const nf_pool_t *p); // free granules pinned in units a live block lies on in part

#endif
