// What both allocator models share (see model.h): the block table, the sorted
// block sets (PyTorch's std::set orderings), reserved-bytes accounting and
// try_merge_blocks. model_native.c and model_expandable.c call down into
// this file; nothing here calls them.
#include "model.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

const char *nf__model_name(int kind) {
  return kind == NF_MODEL_NATIVE ? "native" : kind == NF_MODEL_EXPANDABLE ? "expandable" : "?";
}

// ------------------------------------------------------------------ blocks

int32_t nf__m_new_block(nf__model *m) {
  int32_t id;
  if (m->nrecycle) {
    id = m->recycle[--m->nrecycle];
  } else {
    if (m->nb == m->capb) {
      size_t cap = m->capb ? m->capb * 2 : 1024;
      nf__mblock *nb = realloc(m->b, cap * sizeof *nb);
      int32_t *nr = realloc(m->recycle, cap * sizeof *nr);
      if (nb) m->b = nb;
      if (nr) m->recycle = nr;
      if (!nb || !nr || cap > INT32_MAX) { m->nomem = 1; return -1; }
      m->capb = cap;
    }
    id = (int32_t)m->nb++;
  }
  memset(&m->b[id], 0, sizeof m->b[id]);
  m->b[id].prev = m->b[id].next = m->b[id].seg = -1;
  m->b[id].mapped = 1; // Block::mapped is true except inside expandable segments
  m->b[id].in_use = 1;
  return id;
}

void nf__m_drop_block(nf__model *m, int32_t id) {
  m->b[id].in_use = 0;
  m->recycle[m->nrecycle++] = id; // recycle has room for every id ever made
}

// BlockComparatorSize: (stream, size, ptr); BlockComparatorAddress: (stream, ptr).
static int cmp_key(const nf__mblock *a, uint64_t stream, uint64_t size, uint64_t addr, int by_size) {
  if (a->stream != stream) return a->stream < stream ? -1 : 1;
  if (by_size && a->size != size) return a->size < size ? -1 : 1;
  if (a->addr != addr) return a->addr < addr ? -1 : 1;
  return 0;
}

// First index whose block is not below the key (std::set::lower_bound).
size_t nf__m_lower_bound(const nf__model *m, const nf__mvec *s, uint64_t stream, uint64_t size, uint64_t addr,
                         int by_size) {
  size_t lo = 0, hi = s->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (cmp_key(&m->b[s->v[mid]], stream, size, addr, by_size) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

int nf__m_set_insert(nf__model *m, nf__mvec *s, int32_t id, int by_size) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 256;
    int32_t *v = realloc(s->v, cap * sizeof *v);
    if (!v) { m->nomem = 1; return -1; }
    s->v = v;
    s->cap = cap;
  }
  const nf__mblock *b = &m->b[id];
  size_t i = nf__m_lower_bound(m, s, b->stream, b->size, b->addr, by_size);
  memmove(s->v + i + 1, s->v + i, (s->n - i) * sizeof *s->v);
  s->v[i] = id;
  s->n++;
  return 0;
}

// Erase `id`, found by its current key: callers erase before changing a block.
void nf__m_set_erase(nf__model *m, nf__mvec *s, int32_t id, int by_size) {
  const nf__mblock *b = &m->b[id];
  size_t i = nf__m_lower_bound(m, s, b->stream, b->size, b->addr, by_size);
  if (i < s->n && s->v[i] == id) {
    memmove(s->v + i, s->v + i + 1, (s->n - i - 1) * sizeof *s->v);
    s->n--;
  }
}

void nf__m_add_reserved(nf__model *m, uint64_t bytes) {
  m->reserved += bytes;
  if (m->reserved > m->res->peak_reserved) {
    m->res->peak_reserved = m->reserved;
    // Reserved only grows inside an op after its releases (malloc: release,
    // then alloc_block), so the state after this op holds the peak.
    m->res->peak_op = m->cur_op + 1;
  }
}

// try_merge_blocks: absorb neighbour `src` into `dst` when src is free and in
// the same mapped state; src leaves its pool set. `dst` is in no set here
// (free_block, map_block and unmap_block insert it after merging).
uint64_t nf__m_try_merge(nf__model *m, int32_t dst, int32_t src) {
  if (src < 0) return 0;
  nf__mblock *d = &m->b[dst], *s = &m->b[src];
  if (s->allocated || d->mapped != s->mapped) return 0;
  int pool = s->small;
  if (s->mapped) nf__m_set_erase(m, &m->blocks[pool], src, 1);
  else nf__m_set_erase(m, &m->unmapped[pool], src, 0);
  if (d->prev == src) { // [src dst]
    d->addr = s->addr;
    d->prev = s->prev;
    if (d->prev >= 0) m->b[d->prev].next = dst;
  } else { // [dst src]
    d->next = s->next;
    if (d->next >= 0) m->b[d->next].prev = dst;
  }
  d->size += s->size;
  nf__m_drop_block(m, src);
  return s->size;
}
