// Private pools: memory a CUDA graph (or PyTorch's MemPool) owns.
//
// Why: a graph replays the kernels it captured, writing into the addresses it
// saw at capture. A temporary freed inside the capture must therefore never
// be handed to anyone outside the graph while the graph exists -- with one
// shared free index it was, and the next replay silently overwrote another
// tensor. So a private pool owns whole address ranges (chunk->priv) with its
// own free index: its freed blocks are reused only by allocations routed to
// it, and nf__unmap_cached skips its chunks, so its granules are never
// unmapped or stitched away while it exists (only nf_private_trim, asked for
// explicitly, unmaps its free ranges).
//
// Routing: an allocation goes to a private pool when nf_alloc_private names
// it, or when a route matches: a stream route (nf_private_begin: the stream
// is being captured) or a thread route (nf_private_begin_thread: PyTorch's
// use_mem_pool). Routes nest; the newest matching one wins (innermost first).
//
// Captures: while any stream route exists (capture_mask), the core makes no
// event call (no record, query or synchronize: CUDA forbids them on a
// capturing stream, and a global-mode capture forbids them anywhere) and no
// host wait: placement takes only blocks usable without ordering
// (nf__capture_ok), stream settling and pending polls are deferred to after
// the capture, record_stream records are made lazily by nf__pending_poll.
//
// Hand-back: when the last user releases a pool, its chunks join the general
// pool. Live blocks stay valid where they are; free and pending blocks become
// ordered after every stream the pool knows (as if freed on each of them
// now), since graph replays may have run on any of them -- and so do the
// granules of free ranges, which views may move or take back (view.c).
// nf_private_trim likewise unmaps only after every stream's work.
#include "core/core.h"

#include <pthread.h>
#include <stdlib.h>

// Address range reserved per private chunk: a private pool is usually much
// smaller than the general one (va_chunk may be hundreds of GiB).
#define NF_PRIV_CHUNK (16 * NF_GiB)

nf_priv_t *nf__priv_find(const nf_pool_t *p, uint64_t id) {
  for (nf_priv_t *pv = p->privs; pv; pv = pv->next)
    if (pv->id == id) return pv;
  return NULL;
}

static uint64_t thread_self(void) { return (uint64_t)(uintptr_t)pthread_self(); }

nf_priv_t *nf__priv_route(const nf_pool_t *p, uint32_t s) {
  uint64_t me = 0;
  for (uint32_t i = p->nroutes; i-- > 0;) {
    const nf_route_t *r = &p->routes[i];
    if (r->by_thread) {
      if (!me) me = thread_self();
      if (r->thread == me) return r->pv;
    } else if (r->s == s) {
      return r->pv;
    }
  }
  return NULL;
}

static void capture_mask_update(nf_pool_t *p) {
  uint64_t m = 0;
  for (uint32_t i = 0; i < p->nroutes; i++)
    if (!p->routes[i].by_thread) m |= 1ull << p->routes[i].s;
  p->capture_mask = m;
}

nf_status_t nf__priv_chunk_new(nf_pool_t *p, nf_priv_t *pv, int arena, uint64_t min_size) {
  uint64_t keep = p->cfg.va_chunk;
  if (keep > NF_PRIV_CHUNK) p->cfg.va_chunk = NF_PRIV_CHUNK;
  nf_status_t st = nf__chunk_new(p, arena, min_size);
  p->cfg.va_chunk = keep;
  if (st != NF_OK) return st;
  nf_chunk_t *c = p->chunks; // nf__chunk_new puts the new range first, its one free block indexed
  nf__tlsf_remove(&p->tlsf[arena], c->first);
  c->priv = pv;
  nf__tlsf_insert(&pv->tlsf[arena], c->first);
  return NF_OK;
}

// Drop every route to pv.
static void routes_drop(nf_pool_t *p, const nf_priv_t *pv) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < p->nroutes; i++)
    if (p->routes[i].pv != pv) p->routes[n++] = p->routes[i];
  p->nroutes = n;
  capture_mask_update(p);
}

// Graph replays may have used pv's non-live blocks on any stream, unseen:
// they are stamped as freed on every stream now.
static void stamp_all(nf_pool_t *p, const nf_priv_t *pv) {
  // Not the slots given back (stream.c, streams_recycle): their streams may
  // be gone, and a stamp would make the next settle record on them.
  uint64_t all = nf__streams_held(p);
  uint64_t t = ++p->tick;
  for (uint64_t m = all; m; m &= m - 1) p->streams[__builtin_ctzll(m)].last_free = t;
  for (nf_chunk_t *c = p->chunks; c; c = c->next)
    for (nf_block_t *b = c->priv == pv ? c->first : NULL; b; b = b->next)
      if (b->state != NF_BLK_LIVE) { // pending ones too: freed later, by nf__pending_poll, with these
        b->smask = all;
        b->tick = t;
      }
}

// The last user is gone: chunks join the general pool (see the header).
static void hand_back(nf_pool_t *p, nf_priv_t *pv) {
  routes_drop(p, pv);
  stamp_all(p, pv);
  for (nf_chunk_t *c = p->chunks; c; c = c->next) {
    if (c->priv != pv) continue;
    for (nf_block_t *b = c->first; b; b = b->next) {
      if (b->state != NF_BLK_FREE) continue;
      nf__tlsf_remove(&pv->tlsf[b->arena], b);
      // Its granules' last users become every stream as well: a view taking
      // one orders its new user after them (view.c, order).
      if (p->vw_on) nf__view_dead(p, b, true);
    }
    c->priv = NULL;
    c->handed = 1;
    p->fx++;
    // Free neighbours within a chunk are already merged: index as they are.
    for (nf_block_t *b = c->first; b; b = b->next)
      if (b->state == NF_BLK_FREE) nf__tlsf_insert(&p->tlsf[b->arena], b);
  }
  nf_priv_t **pp = &p->privs;
  while (*pp != pv) pp = &(*pp)->next;
  *pp = pv->next;
  free(pv);
  nf__chunks_drop_empty(p); // trimmed first (PyTorch's adapter does): its ranges go back
}

uint64_t nf__priv_check(nf_pool_t *p, nf_status_t *st) {
  uint64_t n = 0;
  *st = NF_OK;
  for (const nf_priv_t *pv = p->privs; pv; pv = pv->next) {
    uint64_t live = 0;
    for (int a = 0; a < NF_ARENA_COUNT; a++)
      for (int f = 0; f < NF_FL_COUNT; f++)
        for (int s = 0; s < NF_SL_COUNT; s++)
          for (const nf_block_t *b = pv->tlsf[a].heads[f][s]; b; b = b->fnext) {
            if (b->state != NF_BLK_FREE || b->arena != a || b->chunk->priv != pv)
              *st = nf__error(NF_ERR_INVALID, "check: block %p in private pool %llu's free index: not its free block",
                              (void *)b->addr, (unsigned long long)pv->id);
            n++;
          }
    for (const nf_chunk_t *c = p->chunks; c; c = c->next)
      for (const nf_block_t *b = c->priv == pv ? c->first : NULL; b; b = b->next) live += b->state == NF_BLK_LIVE;
    if (live != pv->live_blocks)
      *st = nf__error(NF_ERR_INVALID, "check: private pool %llu counts %llu live blocks, walk %llu",
                      (unsigned long long)pv->id, (unsigned long long)pv->live_blocks, (unsigned long long)live);
    if (!pv->uses) *st = nf__error(NF_ERR_INVALID, "check: private pool %llu has no user", (unsigned long long)pv->id);
  }
  for (uint32_t i = 0; i < p->nroutes; i++)
    if (!p->routes[i].pv || p->routes[i].pv->uses == 0)
      *st = nf__error(NF_ERR_INVALID, "check: route %u to a released pool", i);
  return n;
}

void nf__privs_destroy(nf_pool_t *p) {
  for (nf_priv_t *pv = p->privs, *n; pv; pv = n) {
    n = pv->next;
    free(pv);
  }
  p->privs = NULL;
  free(p->routes);
  p->routes = NULL;
  p->nroutes = p->routes_cap = 0;
  p->capture_mask = 0;
}

// ------------------------------------------------------------------ API

#define NEED_ID(fn)                                                                                       \
  do {                                                                                                    \
    if (!p) return nf__error(NF_ERR_INVALID, "nofrag: " fn ": NULL pool");                               \
    if (!id) return nf__error(NF_ERR_INVALID, "nofrag: " fn ": private pool id 0 is the general pool"); \
  } while (0)

nf_status_t nf_private_incref(nf_pool_t *p, uint64_t id) {
  NEED_ID("nf_private_incref");
  nf__pool_lock(p);
  nf_priv_t *pv = nf__priv_find(p, id);
  nf_status_t st = NF_OK;
  if (pv) {
    pv->uses++;
  } else if (!(pv = calloc(1, sizeof *pv))) {
    st = nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  } else {
    pv->id = id;
    pv->uses = 1;
    pv->next = p->privs;
    p->privs = pv;
  }
  nf__pool_unlock(p);
  return st;
}

nf_status_t nf_private_release(nf_pool_t *p, uint64_t id) {
  NEED_ID("nf_private_release");
  nf__pool_lock(p);
  nf_priv_t *pv = nf__priv_find(p, id);
  nf_status_t st = NF_OK;
  if (!pv) st = nf__error(NF_ERR_INVALID, "nofrag: nf_private_release: no private pool %llu", (unsigned long long)id);
  else if (--pv->uses == 0) hand_back(p, pv);
  nf__pool_unlock(p);
  return st;
}

uint64_t nf_private_use_count(nf_pool_t *p, uint64_t id) {
  if (!p) return 0;
  nf__pool_lock(p);
  const nf_priv_t *pv = nf__priv_find(p, id);
  uint64_t n = pv ? pv->uses : 0;
  nf__pool_unlock(p);
  return n;
}

static nf_status_t route_add(nf_pool_t *p, uint64_t id, nf_stream_t stream, bool by_thread) {
  nf__pool_lock(p);
  nf_priv_t *pv = nf__priv_find(p, id);
  uint32_t s = 0;
  nf_status_t st = pv ? NF_OK
                      : nf__error(NF_ERR_INVALID, "nofrag: nf_private_begin: no private pool %llu (nf_private_incref first)",
                                  (unsigned long long)id);
  if (st == NF_OK && !by_thread) {
    // A capture may have begun before the pool is told of it (a MemPool
    // begun inside one): then finding the stream a slot must make no host
    // wait (recycling, stealing), which would break the capture.
    int capturing = 0;
    if (p->be->ops->stream_capturing && p->be->ops->stream_capturing(p->be, stream, &capturing) != NF_OK)
      capturing = 1; // unknown: assume the worst
    p->capture_lookup = capturing != 0;
    st = nf__stream_index(p, stream, &s);
    p->capture_lookup = false;
  }
  if (st == NF_OK && p->nroutes == p->routes_cap) {
    uint32_t cap = p->routes_cap ? p->routes_cap * 2 : 8;
    nf_route_t *r = realloc(p->routes, cap * sizeof *r);
    if (!r) st = nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
    else { p->routes = r; p->routes_cap = cap; }
  }
  if (st == NF_OK) {
    p->routes[p->nroutes++] = (nf_route_t){.pv = pv, .thread = by_thread ? thread_self() : 0, .s = s,
                                            .by_thread = by_thread};
    capture_mask_update(p);
  }
  nf__pool_unlock(p);
  return st;
}

nf_status_t nf_private_begin(nf_pool_t *p, uint64_t id, nf_stream_t stream) {
  NEED_ID("nf_private_begin");
  return route_add(p, id, stream, false);
}

nf_status_t nf_private_begin_thread(nf_pool_t *p, uint64_t id) {
  NEED_ID("nf_private_begin_thread");
  return route_add(p, id, NULL, true);
}

nf_status_t nf_private_end(nf_pool_t *p, uint64_t id) {
  NEED_ID("nf_private_end");
  nf__pool_lock(p);
  nf_priv_t *pv = nf__priv_find(p, id);
  uint32_t before = p->nroutes;
  if (pv) routes_drop(p, pv);
  nf_status_t st = pv && p->nroutes < before
                       ? NF_OK
                       : nf__error(NF_ERR_INVALID, "nofrag: nf_private_end: nothing is routed to private pool %llu",
                                   (unsigned long long)id);
  nf__pool_unlock(p);
  return st;
}

nf_status_t nf_private_trim(nf_pool_t *p, uint64_t id) {
  NEED_ID("nf_private_trim");
  nf__pool_lock(p);
  nf_priv_t *pv = nf__priv_find(p, id);
  nf_status_t st = NF_OK;
  if (!pv)
    st = nf__error(NF_ERR_INVALID, "nofrag: nf_private_trim: no private pool %llu", (unsigned long long)id);
  else if (p->capture_mask)
    st = nf__error(NF_ERR_INVALID, "nofrag: nf_private_trim: a stream is being captured; trim after nf_private_end");
  if (st == NF_OK) st = nf__pending_poll(p, true);
  // Replays may still write the free ranges on a stream whose own frees are
  // all known complete, which the blocking settle would skip: every stream's
  // work up to now is waited for.
  if (st == NF_OK) stamp_all(p, pv);
  if (st == NF_OK) nf__unmap_cached_in(p, pv, UINT64_MAX, true, &st);
  if (st == NF_OK) st = nf__granules_release(p, p->cfg.retain >> p->gshift);
  nf__pub_full(p);
  nf__pool_unlock(p);
  return st;
}

size_t nf_private_live(nf_pool_t *p, uint64_t id, void **out, size_t n) {
  if (!p || !id) return 0;
  nf__pool_lock(p);
  const nf_priv_t *pv = nf__priv_find(p, id);
  size_t k = 0;
  for (const nf_chunk_t *c = pv ? p->chunks : NULL; c; c = c->next)
    for (const nf_block_t *b = c->priv == pv ? c->first : NULL; b; b = b->next) {
      if (b->state != NF_BLK_LIVE) continue;
      if (k < n) out[k] = (void *)b->addr;
      k++;
    }
  nf__pool_unlock(p);
  return k;
}

uint64_t nf_private_of(nf_pool_t *p, const void *ptr) {
  if (!p) return 0;
  nf__pool_lock(p);
  const nf_block_t *b = nf__map_find(p, (uintptr_t)ptr);
  uint64_t id = b && b->chunk->priv ? b->chunk->priv->id : 0;
  nf__pool_unlock(p);
  return id;
}

int nf_capturing(nf_pool_t *p) {
  if (!p) return 0;
  nf__pool_lock(p);
  int c = p->capture_mask != 0;
  nf__pool_unlock(p);
  return c;
}
