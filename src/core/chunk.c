// Address ranges (chunks): one reserved when placement finds no free block
// big enough (va_chunk at least, the request's size where larger), and given
// back to the backend once a private pool handed it back wholly free with
// nothing mapped. A chunk's granule metadata: `mapped` and `ready` bitmaps,
// the physical granule at each place (`phys`), the views' bits (view.c).
// Mapping into a chunk and its teardown with the pool are vmm.c's.
#include "core/core.h"

#include <stdlib.h>

nf_status_t nf__chunk_new(nf_pool_t *p, int arena, uint64_t min_size) {
  uint64_t g = p->granule;
  uint64_t size = p->cfg.va_chunk > min_size ? p->cfg.va_chunk : min_size;
  if (size > UINT64_MAX - g) return nf__error(NF_ERR_INVALID, "nofrag: size overflows");
  size = (size + g - 1) & ~(g - 1);
  if ((size >> p->gshift) > NF_CHUNK_MAX_GRANULES) // its metadata alone would be gigabytes of host memory
    return nf__error(NF_ERR_OOM, "nofrag: a %llu B address range is %llu granules of %llu B, above the %llu a range "
                     "may hold", (unsigned long long)size, (unsigned long long)(size >> p->gshift),
                     (unsigned long long)g, (unsigned long long)NF_CHUNK_MAX_GRANULES);
  nf_chunk_t *c = calloc(1, sizeof *c);
  nf_block_t *b = nf__block_new(p);
  uint64_t ngran = size >> p->gshift, words = (ngran + 63) >> 6;
  if (c) c->mapped = calloc(words * 2, sizeof(uint64_t));
  if (c) c->phys = malloc(ngran * sizeof(uint32_t));
  if (c) c->ngran = ngran;
  if (!c || !b || !c->mapped || !c->phys || nf__view_chunk_init(c) != NF_OK) {
    if (c) { free(c->mapped); free(c->phys); nf__view_chunk_free(c); }
    free(c);
    if (b) nf__block_delete(p, b);
    return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory for a %llu-granule range",
                     (unsigned long long)ngran);
  }
  nf_status_t st = NF_BE(p, va_reserve, va_reserve, size, g, &c->base);
  if (st != NF_OK) {
    nf__view_chunk_free(c);
    free(c->mapped); free(c->phys); free(c);
    nf__block_delete(p, b);
    bool chunk = p->cfg.va_chunk >= min_size; // the size is va_chunk's, not the request's
    return nf__error(st, "nofrag: reserving %llu B of address space failed: %s%s", (unsigned long long)size,
                     nf__backend_err(), chunk ? " (the size of an address range is va_chunk's: set a smaller va_chunk)" : "");
  }
  c->size = size;
  c->ngran = ngran;
  c->arena = (uint8_t)arena;
  c->first = b;
  c->next = p->chunks;
  p->chunks = c;
  *b = (nf_block_t){.addr = c->base, .size = size, .chunk = c, .state = NF_BLK_FREE,
                    .arena = (uint8_t)arena};
  nf__tlsf_insert(&p->tlsf[arena], b);
  p->fx++;
  return NF_OK;
}

// The range back to the backend and its metadata freed: nothing may be
// mapped in it. On a failed release nothing changes.
nf_status_t nf__chunk_free(nf_pool_t *p, nf_chunk_t *c) {
  nf_status_t st = NF_BE(p, va_release, va_release, c->base, c->size);
  if (st != NF_OK) return st;
  free(c->mapped);
  free(c->phys);
  free(c->guest);
  nf__view_chunk_free(c);
  free(c);
  return NF_OK;
}

// Ranges a private pool handed back go back to the backend once wholly free
// with nothing mapped: every CUDA graph and MemPool reserves its own (16 GiB,
// private_pool.c), and kept, 8,000 of them exhausted the address space (an
// H100 refused 4 MiB at 10 MiB physical). Called by a hand-back (after
// nf_private_trim its ranges are unmapped), nf_trim and the release policy.
void nf__chunks_drop_empty(nf_pool_t *p) {
  for (nf_chunk_t **pc = &p->chunks, *c; (c = *pc);) {
    nf_block_t *b = c->first;
    bool empty = c->handed && !c->priv && b && !b->next && b->state == NF_BLK_FREE && !b->parked && b != p->hot;
    for (uint64_t i = 0, words = (c->ngran + 63) >> 6; empty && i < words; i++)
      empty = !(c->mapped[i] | c->stale[i] | (c->guest ? c->guest[i] : 0));
    if (empty) {
      nf_chunk_t *next = c->next;
      nf__tlsf_remove(&p->tlsf[b->arena], b);
      if (p->vw_cur_c == c) p->vw_cur_c = NULL, p->vw_cur_g = 0; // the views' search cursor (view.c)
      // A granule's owner hint (at_c) may still name this chunk after its
      // views here went: takeable() reads the hint's chunk before checking
      // it, so a freed one was read after free (ASan, soak seed 90516). A
      // NULL hint reads as "not owned here", as a wrong one failing its checks does.
      for (uint64_t i = 0; i < p->gran_cap; i++)
        if (p->gran[i].at_c == c) p->gran[i].at_c = NULL;
      if (nf__chunk_free(p, c) == NF_OK) {
        nf__block_delete(p, b);
        *pc = next;
        p->fx++;
        continue;
      }
      nf__tlsf_insert(&p->tlsf[b->arena], b); // the range stays, as it was
    }
    pc = &c->next;
  }
}
