// Model of PyTorch 2.11's CUDA caching allocator, default settings (see
// model.h). Every rule below cites the function of
// c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator) it follows; the
// expandable_segments:True differences live in model_expandable.c and are
// switched on by m->expandable where PyTorch checks
// CUDAAllocatorConfig::expandable_segments().
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// ------------------------------------------------------------ allocation

// round_size: below kMinBlockSize round to it, else to a multiple of
// kMinBlockSize (roundup_power2_divisions is off by default).
static uint64_t round_size(uint64_t size) {
  if (size < NF_M_MIN_BLOCK) return NF_M_MIN_BLOCK;
  return NF_M_MIN_BLOCK * ((size + NF_M_MIN_BLOCK - 1) / NF_M_MIN_BLOCK);
}

// get_allocation_size: small requests get a 2 MiB segment, requests under
// kMinLargeAlloc a 20 MiB one, larger ones their size rounded to 2 MiB.
static uint64_t allocation_size(uint64_t size) {
  if (size <= NF_M_SMALL_SIZE) return NF_M_SMALL_BUFFER;
  if (size < NF_M_MIN_LARGE) return NF_M_LARGE_BUFFER;
  return NF_M_ROUND_LARGE * ((size + NF_M_ROUND_LARGE - 1) / NF_M_ROUND_LARGE);
}

// Expandable size (get_free_block): a free block followed by unmapped space
// counts as the size it can grow to.
static uint64_t expandable_size(const nf__model *m, int32_t id) {
  const nf__mblock *b = &m->b[id];
  return b->size + (b->next >= 0 && !m->b[b->next].mapped ? m->b[b->next].size : 0);
}

// get_free_block: best fit, the first block of the pool at or after
// (stream, size) in (stream, size, ptr) order, of the same stream only
// (blocks are never reused across streams). With expandable segments, walk on
// while the next block can expand less, so that the segment's growable tail
// is the last choice. The max_split_size checks never fire: it is unlimited
// by default. Returns the block, taken out of the pool, or -1.
static int32_t get_free_block(nf__model *m, int pool, uint64_t stream, uint64_t size) {
  nf__mvec *s = &m->blocks[pool];
  size_t i = nf__m_lower_bound(m, s, stream, size, 0, 1);
  if (i == s->n || m->b[s->v[i]].stream != stream) return -1;
  if (m->expandable && m->b[s->v[i]].seg >= 0) {
    while (i + 1 < s->n && m->b[s->v[i + 1]].stream == stream &&
           expandable_size(m, s->v[i + 1]) < expandable_size(m, s->v[i]))
      i++;
  }
  int32_t id = s->v[i];
  memmove(s->v + i, s->v + i + 1, (s->n - i - 1) * sizeof *s->v);
  s->n--;
  return id;
}

// alloc_block: with a memory fraction set, fail when
// total_allocated_memory + alloc_size would pass it (the expandable path
// checks the same alloc_size, though it maps only what it needs); else a new
// segment of alloc_size (cudaMalloc) or pages mapped in the stream's
// expandable segment. The driver hands cudaMalloc ranges out top-down (the
// segment_alloc addresses of the shared traces mostly decrease), so a new
// segment sorts below the older ones: best fit breaks size ties by address,
// and with ascending addresses the model picked other blocks than PyTorch
// (gpt2: peak allocated and min capacity differed from PyTorch 2.11 on the
// H200; with descending ones every probe matches it).
static int32_t alloc_block(nf__model *m, int pool, uint64_t stream, uint64_t size, uint64_t alloc_size) {
  // reserved + alloc_size > limit, without the sum wrapping (expandable
  // pages may leave reserved above the limit).
  if (m->limit && (m->reserved >= m->limit || alloc_size > m->limit - m->reserved)) return -1;
  if (m->expandable) return nf__mx_try_allocate(m, pool, stream, size);
  // The address range handed out downwards (2^62 B) runs out only after
  // exabytes of cudaMalloc: an OOM rather than a wrapped address.
  if (alloc_size > m->malloc_top) return -1;
  int32_t id = nf__m_new_block(m);
  if (id < 0) return -1;
  nf__mblock *b = &m->b[id];
  m->malloc_top -= alloc_size;
  b->addr = m->malloc_top;
  b->size = alloc_size;
  b->stream = stream;
  b->small = (uint8_t)pool;
  b->origin = m->cur_event;
  nf__m_add_reserved(m, alloc_size);
  m->res->device_allocs++;
  if (++m->segments > m->res->segments_peak) m->res->segments_peak = m->segments;
  return id;
}

// release_cached_blocks -> release_blocks(large), release_blocks(small):
// cudaFree every free block that is a whole segment (no prev, no next);
// expandable segments unmap their free pages instead.
static void release_cached_blocks(nf__model *m) {
  for (int pool = 0; pool < 2; pool++) {
    if (m->expandable) { nf__mx_release_pool(m, pool); continue; }
    nf__mvec *s = &m->blocks[pool];
    size_t keep = 0;
    for (size_t i = 0; i < s->n; i++) {
      int32_t id = s->v[i];
      nf__mblock *b = &m->b[id];
      if (b->prev < 0 && b->next < 0) { // release_block
        m->reserved -= b->size;
        m->segments--;
        m->res->device_frees++;
        nf__m_drop_block(m, id);
      } else {
        s->v[keep++] = id;
      }
    }
    s->n = keep;
  }
}

// should_split: the small pool and every expandable pool split when at least
// kMinBlockSize remains; the large pool only when more than kSmallSize
// remains (and size < max_split_size, unlimited).
static int should_split(const nf__model *m, const nf__mblock *b, uint64_t size) {
  uint64_t remaining = b->size - size;
  if (b->small || m->expandable) return remaining >= NF_M_MIN_BLOCK;
  return remaining > NF_M_SMALL_SIZE;
}

// malloc: round, pick the pool, best fit; else alloc_block; else
// release_available_cached_blocks (returns false at once while
// max_split_size is unlimited, so not modelled) then release_cached_blocks
// and alloc_block again; else OOM. The found block is split per
// should_split (alloc_found_block): the front is handed out, the rest
// stays in the pool.
static int32_t model_malloc(nf__model *m, uint64_t req, uint64_t stream) {
  if (req > NF_M_MAX_REQUEST) { // no block holds it and alloc_block would fail: free the cache, OOM
    release_cached_blocks(m);
    m->res->alloc_retries++;
    return -1;
  }
  uint64_t size = round_size(req);
  int pool = size <= NF_M_SMALL_SIZE; // get_pool
  int32_t id = get_free_block(m, pool, stream, size);
  if (id < 0) {
    uint64_t alloc_size = allocation_size(size);
    id = alloc_block(m, pool, stream, size, alloc_size);
    if (id < 0 && !m->nomem) {
      release_cached_blocks(m);
      m->res->alloc_retries++;
      id = alloc_block(m, pool, stream, size, alloc_size);
    }
    if (id < 0) return -1;
  }
  if (should_split(m, &m->b[id], size)) {
    int32_t rest = id;
    id = nf__m_new_block(m);
    if (id < 0) return -1;
    nf__mblock *r = &m->b[rest], *b = &m->b[id];
    b->addr = r->addr;
    b->size = size;
    b->stream = stream;
    b->small = r->small;
    b->seg = r->seg;
    b->origin = r->origin;
    b->prev = r->prev;
    if (b->prev >= 0) m->b[b->prev].next = id;
    b->next = rest;
    r->prev = id;
    r->addr += size;
    r->size -= size;
    if (nf__m_set_insert(m, &m->blocks[r->small], rest, 1) != 0) return -1;
  }
  nf__mblock *b = &m->b[id];
  b->allocated = 1;
  b->requested = req;
  m->allocated += b->size; // allocated_bytes counts block->size
  if (m->allocated > m->res->peak_allocated) m->res->peak_allocated = m->allocated;
  return id;
}

// free -> free_block: merge with free neighbours of the same segment (and
// mapped state), then back into the pool it came from. Segments are never
// given back here: only release_cached_blocks does that.
static void model_free(nf__model *m, int32_t id) {
  nf__mblock *b = &m->b[id];
  b->allocated = 0;
  m->allocated -= b->size;
  nf__m_try_merge(m, id, m->b[id].prev);
  nf__m_try_merge(m, id, m->b[id].next);
  nf__m_set_insert(m, &m->blocks[m->b[id].small], id, 1);
}

// ------------------------------------------------------------------ replay

static void model_free_all(nf__model *m) {
  free(m->b);
  free(m->recycle);
  for (int p = 0; p < 2; p++) { free(m->blocks[p].v); free(m->unmapped[p].v); }
  free(m->segs);
}

nf_status_t nf__model_run(int kind, const nf__trace_ops *ops, uint64_t limit, nf__model_result *out) {
  return nf__model_run_hooked(kind, ops, limit, NULL, out);
}

nf_status_t nf__model_run_hooked(int kind, const nf__trace_ops *ops, uint64_t limit, const nf__model_hooks *h,
                                 nf__model_result *out) {
  static const nf__model_hooks none = {0};
  if (!h) h = &none;
  memset(out, 0, sizeof *out);
  out->kind = kind;
  out->limit = limit;
  if (kind != NF_MODEL_NATIVE && kind != NF_MODEL_EXPANDABLE) {
    out->status = NF_ERR_INVALID;
    strcpy(out->error, "unknown allocator model");
    return out->status;
  }
  nf__model m;
  memset(&m, 0, sizeof m);
  m.expandable = kind == NF_MODEL_EXPANDABLE;
  m.limit = limit;
  m.res = out;
  m.next_addr = (uint64_t)1 << 40; // any nonzero bases: addresses only order blocks
  m.malloc_top = (uint64_t)1 << 62;
  int32_t *slot = malloc((ops->n_slots ? ops->n_slots : 1) * sizeof *slot);
  if (!slot) {
    out->status = NF_ERR_NOMEM;
    strcpy(out->error, "out of host memory");
    return out->status;
  }
  double t0 = now_s();
  size_t i;
  uint64_t smax_req = 0, smax_res = 0; // the maxima since the last sample (a short peak stays on the timeline)
  for (i = 0; i < ops->n_ops; i++) {
    const nf__trace_op *op = &ops->ops[i];
    m.cur_op = i;
    m.cur_event = op->event;
    if (op->kind == NF_TRACE_OP_ALLOC && op->size == 0) {
      slot[op->slot] = -1; // allocate(0) returns nullptr without touching the cache (as the replay skips it)
    } else if (op->kind == NF_TRACE_OP_ALLOC) {
      uint64_t stream = op->stream < ops->n_streams ? ops->streams[op->stream] : op->stream;
      int32_t id = model_malloc(&m, op->size, stream);
      if (id < 0) {
        out->fail_event = (size_t)op->event + 1;
        if (m.nomem) {
          out->status = NF_ERR_NOMEM;
          strcpy(out->error, "out of host memory");
        } else {
          out->status = NF_ERR_OOM;
          out->ooms = 1;
          char lim[40] = "no limit";
          if (limit) snprintf(lim, sizeof lim, "limit %llu B", (unsigned long long)limit);
          snprintf(out->error, sizeof out->error, "out of memory: %llu B requested with %llu B reserved, %llu B allocated, %s",
                   (unsigned long long)op->size, (unsigned long long)m.reserved, (unsigned long long)m.allocated, lim);
        }
        break;
      }
      slot[op->slot] = id;
      m.b[id].event = op->event;
      m.requested += op->size;
      if (m.requested > out->peak_requested) out->peak_requested = m.requested;
    } else if (slot[op->slot] >= 0) { // a size-0 alloc's free has nothing to free
      int32_t id = slot[op->slot];
      m.requested -= m.b[id].requested;
      model_free(&m, id);
    }
    if (m.nomem) {
      out->status = NF_ERR_NOMEM;
      strcpy(out->error, "out of host memory");
      break;
    }
    if (m.requested > smax_req) smax_req = m.requested;
    if (m.reserved > smax_res) smax_res = m.reserved;
    if (h->sample && (h->sample_every <= 1 || (i + 1) % h->sample_every == 0)) {
      h->sample(h->ctx, i + 1, smax_req, smax_res);
      smax_req = m.requested;
      smax_res = m.reserved;
    }
    if (h->inspect && i + 1 == h->inspect_at) h->inspect(h->ctx, &m);
  }
  out->seconds = now_s() - t0;
  if (h->sample && i > 0 && h->sample_every > 1 && i % h->sample_every != 0)
    h->sample(h->ctx, i, smax_req, smax_res); // the last op done
  out->ops_done = i;
  out->reserved_end = m.reserved;
  out->allocated_end = m.allocated;
  out->segments_end = m.segments;
  free(slot);
  model_free_all(&m);
  return out->status;
}

nf_status_t nf__model_min_capacity(int kind, const nf__trace_ops *ops, uint64_t granule, uint64_t upper,
                                   nf__model_bisect *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!granule) granule = NF_M_ROUND_LARGE;
  double t0 = now_s();
  nf__model_result *r = malloc(sizeof *r);
  if (!r) { snprintf(err, errlen, "out of host memory"); return NF_ERR_NOMEM; }
  nf_status_t st = NF_OK;
  if (!upper) {
    out->probes++;
    if ((st = nf__model_run(kind, ops, 0, r)) != NF_OK) { snprintf(err, errlen, "%s", r->error); goto done; }
    upper = r->peak_reserved;
  }
  // Invariant: `lo` granules fail, `hi` granules complete. Under peak live
  // nothing can complete (reserved >= allocated >= live).
  // Limits stay under 2^63 B (no granule count times granule wraps); an
  // upper bound below peak live (given by a caller) is no bound: start above.
  const uint64_t max_hi = ((uint64_t)1 << 63) / granule;
  uint64_t hi = upper / granule + (upper % granule != 0), lo = ops->peak_live ? (ops->peak_live - 1) / granule : 0;
  if (hi <= lo) hi = lo + 1;
  if (hi > max_hi) {
    snprintf(err, errlen, "peak live %llu B is beyond any limit the model can probe", (unsigned long long)ops->peak_live);
    st = NF_ERR_OOM;
    goto done;
  }
  out->lower = lo * granule;
  out->upper = hi * granule;
  out->probes++;
  st = nf__model_run(kind, ops, hi * granule, &out->at_min);
  while (st == NF_ERR_OOM) { // a model need not be monotone: widen until it completes
    if (hi > max_hi / 2) {
      snprintf(err, errlen, "no limit up to %llu B completes: %s", (unsigned long long)(hi * granule),
               out->at_min.error);
      goto done;
    }
    lo = hi;
    hi *= 2;
    out->probes++;
    st = nf__model_run(kind, ops, hi * granule, &out->at_min);
  }
  if (st != NF_OK) { snprintf(err, errlen, "%s", out->at_min.error); goto done; }
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    out->probes++;
    nf_status_t s = nf__model_run(kind, ops, mid * granule, r);
    if (s == NF_OK) { hi = mid; out->at_min = *r; }
    else if (s == NF_ERR_OOM) lo = mid;
    else { st = s; snprintf(err, errlen, "%s", r->error); goto done; }
  }
  out->min_capacity = hi * granule;
done:
  out->seconds = now_s() - t0;
  free(r);
  return st;
}
