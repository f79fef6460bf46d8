// The granule pool's free lists: physical granules not mapped at any owning
// place, one doubly linked list per tier (device, host), so that a granule
// can be taken off wherever it is (views take back a granule they find free).
// Below the vmm, the views and the tiers, which all move granules.
#include "core/core.h"

#include <stdlib.h>

void nf__gran_push_free(nf_pool_t *p, uint32_t i) {
  p->gran[i].state = NF_GR_FREE;
  p->gran[i].prev_free = -1;
  int32_t *head = p->gran[i].tier == NF_TIER_HOST ? &p->host_free : &p->gran_free;
  if (*head >= 0) p->gran[*head].prev_free = (int32_t)i;
  if (p->gran[i].tier == NF_TIER_HOST) {
    p->gran[i].next_free = p->host_free;
    p->host_free = (int32_t)i;
    p->host_free_count++;
    return;
  }
  p->gran[i].next_free = p->gran_free;
  p->gran_free = (int32_t)i;
  p->gran_free_count++;
}

// Pop a free granule of `tier` (the caller checked the count).
uint32_t nf__gran_pop(nf_pool_t *p, nf_tier_t tier) {
  uint32_t i;
  if (tier == NF_TIER_HOST) {
    i = (uint32_t)p->host_free;
    p->host_free = p->gran[i].next_free;
    p->host_free_count--;
  } else {
    i = (uint32_t)p->gran_free;
    p->gran_free = p->gran[i].next_free;
    p->gran_free_count--;
  }
  if (p->gran[i].next_free >= 0) p->gran[p->gran[i].next_free].prev_free = -1;
  return i;
}

// Take free granule i off its free list, wherever it is (views, view.c).
void nf__gran_unlink(nf_pool_t *p, uint32_t i) {
  nf_granule_t *x = &p->gran[i];
  bool h = x->tier == NF_TIER_HOST;
  if (x->prev_free >= 0) p->gran[x->prev_free].next_free = x->next_free;
  else *(h ? &p->host_free : &p->gran_free) = x->next_free;
  if (x->next_free >= 0) p->gran[x->next_free].prev_free = x->prev_free;
  if (h) p->host_free_count--;
  else p->gran_free_count--;
  x->next_free = x->prev_free = -1;
}

// Slot i of gran[] back on the unused list.
void nf__gran_slot_put(nf_pool_t *p, uint32_t i) {
  p->gran[i] = (nf_granule_t){.next_free = p->gran_unused};
  p->gran_unused = (int32_t)i;
}

// A slot in gran[] for a new granule, or -1 (out of host memory).
int32_t nf__gran_slot(nf_pool_t *p) {
  if (p->gran_unused < 0) {
    uint64_t cap = p->gran_cap ? p->gran_cap * 2 : 256;
    if (cap > INT32_MAX) { nf__error(NF_ERR_NOMEM, "nofrag: too many granules"); return -1; }
    nf_granule_t *g = realloc(p->gran, cap * sizeof *g);
    if (!g) { nf__error(NF_ERR_NOMEM, "nofrag: out of host memory"); return -1; }
    for (uint64_t i = cap; i-- > p->gran_cap;) {
      g[i] = (nf_granule_t){.next_free = p->gran_unused};
      p->gran_unused = (int32_t)i;
    }
    p->gran = g;
    p->gran_cap = cap;
  }
  return p->gran_unused;
}
