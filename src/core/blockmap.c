// Block headers (a slab with a free list: no malloc per allocation) and the
// pointer -> live block hash (open addressing, linear probing, backward-shift
// deletion: O(1) expected, no tombstones to sweep).
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

#define NF_SLAB_BLOCKS 256

nf_block_t *nf__block_new(nf_pool_t *p) {
  if (NF_UNLIKELY(!p->slab_free)) {
    if (p->nslabs == p->slabs_cap) {
      uint64_t cap = p->slabs_cap ? p->slabs_cap * 2 : 16;
      void **s = realloc(p->slabs, cap * sizeof *s);
      if (!s) return NULL;
      p->slabs = s;
      p->slabs_cap = cap;
    }
    nf_block_t *slab = calloc(NF_SLAB_BLOCKS, sizeof *slab);
    if (!slab) return NULL;
    p->slabs[p->nslabs++] = slab;
    for (int i = NF_SLAB_BLOCKS - 1; i >= 0; i--) {
      slab[i].fnext = p->slab_free;
      p->slab_free = &slab[i];
    }
  }
  nf_block_t *b = p->slab_free;
  p->slab_free = b->fnext;
  memset(b, 0, sizeof *b);
  return b;
}

void nf__block_delete(nf_pool_t *p, nf_block_t *b) {
  b->state = NF_BLK_FREE; // never LIVE in the free list: nf_free's guess (p->last) checks it
  if (p->last == b) p->last = NULL;
  b->fnext = p->slab_free;
  p->slab_free = b;
}

static inline uint64_t slot_of(const nf_blockmap_t *m, uintptr_t key) {
  uint64_t h = (uint64_t)(key >> NF_ALIGN_SHIFT) * 0x9E3779B97F4A7C15ull;
  return (h ^ (h >> 32)) & m->mask;
}

static nf_status_t map_grow(nf_blockmap_t *m) {
  uint64_t ncap = m->slots ? (m->mask + 1) * 2 : 1024;
  nf_map_slot_t *ns = calloc(ncap, sizeof *ns);
  if (!ns) return NF_ERR_NOMEM;
  nf_blockmap_t n = {ns, ncap - 1, 0};
  for (uint64_t i = 0; m->slots && i <= m->mask; i++) {
    if (!m->slots[i].key) continue;
    uint64_t j = slot_of(&n, m->slots[i].key);
    while (ns[j].key) j = (j + 1) & n.mask;
    ns[j] = m->slots[i];
    n.count++;
  }
  free(m->slots);
  *m = n;
  return NF_OK;
}

nf_status_t nf__map_reserve(nf_pool_t *p) {
  nf_blockmap_t *m = &p->map;
  if (NF_UNLIKELY(!m->slots || (m->count + 1) * 2 > m->mask + 1)) return map_grow(m);
  return NF_OK;
}

void nf__map_insert(nf_pool_t *p, nf_block_t *b) {
  nf_blockmap_t *m = &p->map;
  uint64_t j = slot_of(m, b->addr);
  while (m->slots[j].key) j = (j + 1) & m->mask;
  m->slots[j].key = b->addr;
  m->slots[j].val = b;
  m->count++;
}

nf_block_t *nf__map_find(nf_pool_t *p, uintptr_t key) {
  const nf_blockmap_t *m = &p->map;
  if (!m->slots || !key) return NULL;
  for (uint64_t j = slot_of(m, key);; j = (j + 1) & m->mask) {
    // Parked blocks (core.h, bins) stay in the map between their free and
    // their pop; they are not live.
    if (m->slots[j].key == key) return m->slots[j].val->state == NF_BLK_LIVE ? m->slots[j].val : NULL;
    if (!m->slots[j].key) return NULL;
  }
}

void nf__map_remove(nf_pool_t *p, uintptr_t key) {
  nf_blockmap_t *m = &p->map;
  uint64_t j = slot_of(m, key);
  while (m->slots[j].key != key) {
    if (!m->slots[j].key) return;
    j = (j + 1) & m->mask;
  }
  // Backward shift: pull later entries of the probe run into the hole.
  uint64_t i = j;
  for (;;) {
    m->slots[i].key = 0;
    uint64_t k = i;
    for (;;) {
      k = (k + 1) & m->mask;
      if (!m->slots[k].key) { m->count--; return; }
      uint64_t home = slot_of(m, m->slots[k].key);
      // Move k into i unless its home lies cyclically in (i, k].
      bool stays = i <= k ? (i < home && home <= k) : (i < home || home <= k);
      if (!stays) break;
    }
    m->slots[i] = m->slots[k];
    i = k;
  }
}

void nf__blocks_destroy(nf_pool_t *p) {
  for (uint64_t i = 0; i < p->nslabs; i++) free(p->slabs[i]);
  free(p->slabs);
  free(p->map.slots);
  p->slabs = NULL;
  p->map.slots = NULL;
}
