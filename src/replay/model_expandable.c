// expandable_segments:True in the model of PyTorch's caching allocator (see
// model.h, model_native.c). Each rule cites the function of
// c10/cuda/CUDACachingAllocator.cpp it follows (Note [Expandable Segments]):
// per stream and pool one segment of reserved address space, mapped in pages
// of 2 MiB (small pool, kSmallBuffer) or 20 MiB (large pool, kLargeBuffer) as
// blocks need them, best fit inside it, pages unmapped only by
// release_cached_blocks (OOM retry, empty_cache).
//
// A segment's mapped pages are exactly the pages covered by its mapped
// blocks (map and unmap work on whole pages at page-aligned block edges), so
// the model tracks no page handles: mapping is a block becoming mapped.
#include "model.h"

#include <stdlib.h>

static int allocatable(const nf__model *m, int32_t id) { return id >= 0 && !m->b[id].allocated; }

// ExpandableSegment: segment_size_ is the page, max_handles_ =
// ceil(totalGlobalMem * 9/8 / page) pages of address space.
static uint64_t segment_bytes(int pool) {
  uint64_t page = pool ? NF_M_SMALL_BUFFER : NF_M_LARGE_BUFFER;
  uint64_t want = NF_MODEL_DEVICE_BYTES + NF_MODEL_DEVICE_BYTES / 8;
  return (want + page - 1) / page * page;
}

// find_expandable_block: the lowest-address unmapped block of this stream's
// pool (pool->unmapped is ordered by (stream, ptr)), extended backwards by a
// free block just before it, whose run of free and unmapped blocks holds
// `size`; else a new segment reserving 1 1/8 of the device's memory. A
// request larger than a whole segment fits nowhere: PyTorch's map of it
// fails (more than the device) and it raises OOM, so -1 here, not a segment
// too small for the caller to walk past its end.
static int32_t find_expandable_block(nf__model *m, int pool, uint64_t stream, uint64_t size) {
  if (size > segment_bytes(pool)) return -1;
  nf__mvec *u = &m->unmapped[pool];
  for (size_t i = 0; i < u->n && m->b[u->v[i]].stream <= stream; i++) {
    int32_t c = u->v[i];
    if (m->b[c].stream != stream) continue;
    if (allocatable(m, m->b[c].prev)) c = m->b[c].prev;
    uint64_t bytes = 0; // has_available_address_space
    for (int32_t b = c; bytes < size && allocatable(m, b); b = m->b[b].next) bytes += m->b[b].size;
    if (bytes >= size) return c;
  }
  if (m->nsegs == m->capsegs) {
    size_t cap = m->capsegs ? m->capsegs * 2 : 8;
    nf__mseg *s = realloc(m->segs, cap * sizeof *s);
    if (!s) { m->nomem = 1; return -1; }
    m->segs = s;
    m->capsegs = cap;
  }
  nf__mseg *sg = &m->segs[m->nsegs];
  sg->page = pool ? NF_M_SMALL_BUFFER : NF_M_LARGE_BUFFER;
  sg->size = segment_bytes(pool);
  sg->base = m->next_addr;
  sg->live = 1;
  m->next_addr += sg->size;
  int32_t id = nf__m_new_block(m);
  if (id < 0) return -1;
  nf__mblock *b = &m->b[id];
  b->addr = sg->base;
  b->size = sg->size;
  b->stream = stream;
  b->small = (uint8_t)pool;
  b->seg = (int32_t)m->nsegs++;
  b->mapped = 0;
  if (nf__m_set_insert(m, u, id, 0) != 0) return -1;
  if (++m->segments > m->res->segments_peak) m->res->segments_peak = m->segments;
  return id;
}

// map_block: map the pages covering the first `size` bytes of unmapped
// block `id` (ExpandableSegment::map rounds up to whole pages), leave the
// rest unmapped after it, merge with free mapped neighbours and put the
// result in the pool. Returns the (possibly merged) block id.
static int32_t map_block(nf__model *m, int32_t id, uint64_t size) {
  nf__mblock *b = &m->b[id];
  uint64_t page = m->segs[b->seg].page;
  uint64_t mapped = (size + page - 1) / page * page;
  if (mapped > b->size) mapped = b->size;
  int pool = b->small;
  nf__m_set_erase(m, &m->unmapped[pool], id, 0);
  b->mapped = 1;
  b->origin = m->cur_event; // these pages are mapped for the current alloc
  if (mapped < b->size) {
    int32_t r = nf__m_new_block(m);
    if (r < 0) return -1;
    b = &m->b[id]; // the array may have moved
    nf__mblock *rb = &m->b[r];
    rb->addr = b->addr + mapped;
    rb->size = b->size - mapped;
    rb->stream = b->stream;
    rb->small = b->small;
    rb->seg = b->seg;
    rb->mapped = 0;
    rb->prev = id;
    rb->next = b->next;
    if (rb->next >= 0) m->b[rb->next].prev = r;
    b->next = r;
    b->size = mapped;
    if (nf__m_set_insert(m, &m->unmapped[pool], r, 0) != 0) return -1;
  }
  nf__m_try_merge(m, id, m->b[id].prev);
  nf__m_try_merge(m, id, m->b[id].next);
  if (nf__m_set_insert(m, &m->blocks[pool], id, 1) != 0) return -1;
  nf__m_add_reserved(m, mapped);
  m->res->device_allocs++;
  return id;
}

// try_allocate_expandable_block: map the candidate's start if it is
// unmapped, then map from the following unmapped block until the free block
// holds `size`; hand it out of the pool.
int32_t nf__mx_try_allocate(nf__model *m, int pool, uint64_t stream, uint64_t size) {
  int32_t c = find_expandable_block(m, pool, stream, size);
  if (c < 0) return -1;
  if (!m->b[c].mapped) {
    uint64_t first = m->b[c].size < size ? m->b[c].size : size;
    if ((c = map_block(m, c, first)) < 0) return -1;
  }
  while (m->b[c].size < size) {
    int32_t n = m->b[c].next;
    if (n < 0) return -1; // ran off the segment: cannot happen after the check above, but never read b[-1]
    uint64_t rem = size - m->b[c].size;
    if ((c = map_block(m, n, rem < m->b[n].size ? rem : m->b[n].size)) < 0) return -1;
  }
  nf__m_set_erase(m, &m->blocks[pool], c, 1);
  return c;
}

// unmap_block: unmap the whole pages inside free block `id`
// (ExpandableSegment::unmap: from the first page boundary at or after its
// start to the last at or before its end); the slivers before and after stay
// free mapped blocks; the unmapped part merges with unmapped neighbours.
// Returns the unmapped block (or `id` unchanged, still mapped, if no whole
// page was inside).
static int32_t unmap_block(nf__model *m, int32_t id) {
  nf__mblock *b = &m->b[id];
  const nf__mseg *sg = &m->segs[b->seg];
  uint64_t off = b->addr - sg->base, end = off + b->size;
  uint64_t ubeg = (off + sg->page - 1) / sg->page * sg->page, uend = end / sg->page * sg->page;
  if (ubeg >= uend) return id;
  int pool = b->small;
  nf__m_set_erase(m, &m->blocks[pool], id, 1);
  uint64_t before = ubeg - off, after = end - uend;
  if (before) {
    int32_t f = nf__m_new_block(m);
    if (f < 0) return -1;
    b = &m->b[id];
    nf__mblock *fb = &m->b[f];
    *fb = *b;
    fb->size = before;
    fb->prev = b->prev;
    fb->next = id;
    if (fb->prev >= 0) m->b[fb->prev].next = f;
    b->prev = f;
    if (nf__m_set_insert(m, &m->blocks[pool], f, 1) != 0) return -1;
  }
  if (after) {
    int32_t f = nf__m_new_block(m);
    if (f < 0) return -1;
    b = &m->b[id];
    nf__mblock *fb = &m->b[f];
    *fb = *b;
    fb->addr = sg->base + uend;
    fb->size = after;
    fb->prev = id;
    fb->next = b->next;
    if (fb->next >= 0) m->b[fb->next].prev = f;
    b->next = f;
    if (nf__m_set_insert(m, &m->blocks[pool], f, 1) != 0) return -1;
  }
  b = &m->b[id];
  b->addr = sg->base + ubeg;
  b->size = uend - ubeg;
  b->mapped = 0;
  m->reserved -= uend - ubeg;
  m->res->device_frees++;
  nf__m_try_merge(m, id, m->b[id].prev);
  nf__m_try_merge(m, id, m->b[id].next);
  if (nf__m_set_insert(m, &m->unmapped[pool], id, 0) != 0) return -1;
  return id;
}

// release_blocks on an expandable pool: gather the free mapped blocks first
// (unmapping changes the pool), unmap each; a segment left as one unmapped
// block is released whole (release_expandable_segment).
void nf__mx_release_pool(nf__model *m, int pool) {
  nf__mvec *s = &m->blocks[pool];
  size_t n = s->n;
  if (!n) return;
  int32_t *ids = malloc(n * sizeof *ids);
  if (!ids) { m->nomem = 1; return; }
  for (size_t i = 0; i < n; i++) ids[i] = s->v[i];
  for (size_t i = 0; i < n && !m->nomem; i++) {
    int32_t id = unmap_block(m, ids[i]);
    if (id < 0) break;
    nf__mblock *b = &m->b[id];
    if (!b->mapped && b->prev < 0 && b->next < 0) {
      nf__m_set_erase(m, &m->unmapped[pool], id, 0);
      m->segs[b->seg].live = 0;
      m->segments--;
      nf__m_drop_block(m, id);
    }
  }
  free(ids);
}
