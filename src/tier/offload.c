// Same-address offload and prefetch of live blocks (nf_offload, nf_prefetch).
//
// A block owns the granules wholly inside it; only those move. A physical
// granule can be mapped at two addresses at once, which makes every step
// below non-destructive until the data has a second home:
//
// offload to host   map new host granules H at a staging range, copy the
//                   block's device granules D into it on the caller's stream,
//                   record. Once the copy completed (polled later, never
//                   waited for unless asked): unmap D at the block, map H
//                   there, unmap the staging range; D returns to the pool.
// prefetch          (the block is not in use: the caller's contract) map H at
//                   a staging range too, put device granules D at the block
//                   instead of H, copy staging -> block on the stream. Work
//                   queued after it on the stream sees the data; H goes back
//                   to the host free list once the copy completed.
// detached          (offload_detached.c) like host, but the range is unmapped
//                   once the copy is done; the data waits in host granules
//                   reached through the host window. Cheaper moves.
// disk              (offload_disk.c) synchronous: copy out through a bounce
//                   buffer, write the file, unmap; prefetch maps device
//                   granules and reads back.
#include "tier/tier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

nf_offl_t *nf__offl_find(nf_pool_t *p, const nf_block_t *b, nf_offl_t ***link) {
  for (nf_offl_t **l = &p->offl; *l; l = &(*l)->next)
    if ((*l)->b == b) {
      if (link) *link = l;
      return *l;
    }
  return NULL;
}

void nf__xfer_free(nf_xfer_t *x) {
  if (!x) return;
  free(x->gs);
  free(x->hg);
  free(x);
}

// Cleanup calls are retried: a transient backend failure there would leak a
// mapping or an address range for the pool's lifetime.
static void unstage(nf_pool_t *p, uintptr_t stage, uint64_t mapped, uint64_t size) {
  for (int t = 0; t < 3 && mapped; t++)
    if (NF_BE(p, unmap, unmap, stage, mapped) == NF_OK) mapped = 0;
  for (int t = 0; t < 3 && !mapped; t++)
    if (NF_BE(p, va_release, va_release, stage, size) == NF_OK) break;
}

// Staging: reserve n granules of address space and map host granules hg
// there with access set. On error nothing is left behind.
static nf_status_t stage_map(nf_pool_t *p, nf_xfer_t *x) {
  uint64_t G = p->granule;
  nf_status_t st = NF_BE(p, va_reserve, va_reserve, x->n * G, G, &x->stage);
  if (st != NF_OK) return nf__error(st, "nofrag: offload: reserving a staging range failed: %s", p->be->err);
  uint64_t j = 0;
  for (; j < x->n; j++)
    if ((st = NF_BE(p, map, map, x->stage + j * G, G, p->gran[x->hg[j]].handle)) != NF_OK) break;
  if (st == NF_OK && (st = NF_BE(p, set_access, set_access, x->stage, x->n * G)) == NF_OK) return NF_OK;
  nf__error(st, "nofrag: offload: mapping the staging range failed: %s", p->be->err);
  unstage(p, x->stage, j * G, x->n * G);
  return st;
}

static void stage_drop(nf_pool_t *p, nf_xfer_t *x) {
  if (x->stage) unstage(p, x->stage, x->n * p->granule, x->n * p->granule);
  for (uint64_t j = 0; j < x->n; j++) nf__gran_push_free(p, x->hg[j]);
}

// Take n host granules off the free list (creating them up to spill_limit).
nf_status_t nf__host_take(nf_pool_t *p, uint64_t n, uint32_t *hg) {
  if (p->host_free_count < n) {
    nf_status_t st = nf__host_granules_create(p, n - p->host_free_count);
    if (st == NF_ERR_OOM) {
      char lim[32];
      nf__fmt_bytes(lim, sizeof lim, p->max_host_granules << p->gshift);
      return nf__error(NF_ERR_OOM, "nofrag: offload: %llu host granules needed, the host tier limit (%s, "
                       "spill_limit) is reached", (unsigned long long)n, lim);
    }
    if (st != NF_OK) return st;
  }
  for (uint64_t j = 0; j < n; j++) {
    hg[j] = nf__gran_pop(p, NF_TIER_HOST);
    p->gran[hg[j]].state = NF_GR_MAPPED;
  }
  return NF_OK;
}

// Order stream s after the work of the block's other streams (allocation,
// record_stream): its copy then starts after all of it. No host wait.
nf_status_t nf__order_block(nf_pool_t *p, const nf_block_t *b, uint32_t s) {
  uint64_t m = (b->extra | 1ull << b->stream) & ~(1ull << s);
  for (; m; m &= m - 1) {
    uint32_t x = (uint32_t)__builtin_ctzll(m);
    nf_status_t st = nf__stream_record(p, x);
    if (st == NF_OK) st = NF_BE(p, stream_wait, stream_wait, p->streams[s].handle, nf__stream_event(&p->streams[x]));
    if (st != NF_OK) return nf__error(st, "nofrag: offload: ordering streams failed: %s", p->be->err);
  }
  return NF_OK;
}

// Copy each run of consecutive block granules gs[] to/from the staging range.
static nf_status_t copy_runs(nf_pool_t *p, const nf_xfer_t *x, const nf_chunk_t *c, bool to_stage) {
  uint64_t G = p->granule;
  for (uint64_t j = 0; j < x->n;) {
    uint64_t e = j + 1;
    while (e < x->n && x->gs[e] == x->gs[e - 1] + 1) e++;
    uintptr_t blk = c->base + x->gs[j] * G, stg = x->stage + j * G;
    p->st.calls.copy++;
    nf_status_t st = p->be->ops->copy(p->be, to_stage ? stg : blk, to_stage ? blk : stg, (e - j) * G,
                                      p->streams[x->s].handle);
    if (st != NF_OK) return nf__error(st, "nofrag: offload copy failed: %s", p->be->err);
    j = e;
  }
  return NF_OK;
}

// Replace the granule mapped at g of c by physical granule i (made ready by
// nf__set_ready); *old gets the one it replaced, for the caller to keep or
// free. On error the old granule is mapped there again (not ready yet) and
// *old is UINT32_MAX; if even that fails, the granule's data is lost and the
// message says so.
static nf_status_t remap_one(nf_pool_t *p, nf_chunk_t *c, uint64_t g, uint32_t i, uint32_t *old) {
  uint64_t G = p->granule;
  uintptr_t va = c->base + g * G;
  uint32_t o = c->phys[g];
  *old = UINT32_MAX;
  nf_status_t st = NF_BE(p, unmap, unmap, va, G);
  if (st != NF_OK) return nf__error(st, "nofrag: remap: unmap failed: %s", p->be->err);
  NF_READY(c)[g >> 6] &= ~(1ull << (g & 63));
  p->fx++;
  if ((st = NF_BE(p, map, map, va, G, p->gran[i].handle)) != NF_OK) {
    char msg[300];
    snprintf(msg, sizeof msg, "%s", p->be->err);
    for (int t = 0; t < 3; t++) // put the old granule back: it still holds the data
      if (NF_BE(p, map, map, va, G, p->gran[o].handle) == NF_OK)
        return nf__error(st, "nofrag: remap: map failed: %s", msg);
    c->mapped[g >> 6] &= ~(1ull << (g & 63));
    p->gran_mapped--;
    p->host_mapped -= p->gran[o].tier == NF_TIER_HOST;
    nf__gran_push_free(p, o);
    return nf__error(st, "nofrag: remap: map failed (%s) and the old mapping could not be restored: "
                     "%llu B at %p are lost", msg, (unsigned long long)G, (void *)va);
  }
  p->host_mapped += (p->gran[i].tier == NF_TIER_HOST) - (p->gran[o].tier == NF_TIER_HOST);
  c->phys[g] = i;
  p->gran[i].state = NF_GR_MAPPED;
  *old = o;
  return NF_OK;
}

// Swap the block's granules gs[j] for nw[j] (j < n), then set access over
// the range. old[j] gets what was replaced; *done how many were swapped.
static nf_status_t remap_all(nf_pool_t *p, nf_chunk_t *c, const uint64_t *gs, const uint32_t *nw, uint32_t *old,
                             uint64_t n, uint64_t *done) {
  nf_status_t st = NF_OK;
  uint64_t j = 0;
  for (; j < n; j++) {
    for (int t = 0; t < 3; t++) // a failed remap leaves the old granule there: retry
      if ((st = remap_one(p, c, gs[j], nw[j], &old[j])) == NF_OK || !nf__bit(c->mapped, gs[j])) break;
    if (st != NF_OK) break;
  }
  *done = j;
  // A live block must end up accessible: a failed set-access is retried
  // (granules already swapped cannot be handed back cheaply).
  nf_status_t st2 = NF_OK;
  for (int t = 0; t < 3 && n; t++)
    if ((st2 = nf__set_ready(p, c, gs[0], gs[n - 1] + 1)) == NF_OK) break;
  return st != NF_OK ? st : st2;
}

// An offload whose copy completed: the host granules take the block's place.
static nf_status_t offload_finish(nf_pool_t *p, nf_xfer_t *x) {
  nf_block_t *b = x->b;
  uint64_t done = 0;
  uint32_t *old = malloc(x->n * sizeof *old);
  if (!old) return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  nf_status_t st = remap_all(p, b->chunk, x->gs, x->hg, old, x->n, &done);
  for (uint64_t j = 0; j < done; j++) nf__gran_push_free(p, old[j]); // device granules back to the pool
  free(old);
  unstage(p, x->stage, x->n * p->granule, x->n * p->granule);
  for (uint64_t j = done; j < x->n; j++) nf__gran_push_free(p, x->hg[j]); // not placed: back to the list
  p->offl_granules += done;
  nf_offl_t *o = nf__offl_find(p, b, NULL);
  o->x = NULL;
  o->n += done;
  p->st.offloads++;
  return st;
}

nf_status_t nf__xfer_poll(nf_pool_t *p, bool blocking) {
  nf_status_t first = NF_OK;
  uint64_t busy = 0; // streams found not done in this poll: not asked again (one query per stream)
  for (nf_xfer_t **l = &p->xfers; *l;) {
    nf_xfer_t *x = *l;
    bool done = false;
    if (!(busy >> x->s & 1) || p->streams[x->s].done_tick >= x->tick) {
      nf_status_t st = nf__stream_done(p, x->s, x->tick, blocking, &done);
      if (st != NF_OK) return st;
      if (!done) busy |= 1ull << x->s;
    }
    if (!done) { l = &x->next; continue; }
    nf_status_t st = NF_OK;
    *l = x->next;
    if (x->b) st = x->detached ? nf__detached_finish(p, x) : offload_finish(p, x);
    else stage_drop(p, x);
    if (st != NF_OK && first == NF_OK) first = st;
    nf__xfer_free(x);
  }
  return first;
}

void nf__xfer_drain(nf_pool_t *p, uint32_t s) {
  nf_stream_rec_t *r = &p->streams[s];
  char msg[512]; // the failure being cleaned up keeps its message
  nf_status_t st = nf_last_status();
  snprintf(msg, sizeof msg, "%s", nf_last_error());
  // Retried: an older record is not behind the copies, and memory they
  // still write would be unmapped or handed out again.
  bool done = false;
  for (int t = 0; t < 3 && !done; t++)
    done = nf__stream_record(p, s) == NF_OK && NF_BE(p, event_sync, event_sync, nf__stream_event(r)) == NF_OK;
  if (!done && r->rec_tick) NF_BE(p, event_sync, event_sync, nf__stream_event(r)); // the best left
  nf__error(st, "%s", msg);
}

void nf__xfer_push(nf_pool_t *p, nf_xfer_t *x) {
  x->next = p->xfers;
  p->xfers = x;
}

nf_status_t nf__xfer_reclaim(nf_pool_t *p) {
  for (nf_xfer_t *x = p->xfers; x; x = x->next)
    if (x->b && x->n) return nf__xfer_poll(p, true);
  return NF_OK;
}

// ------------------------------------------------------------ host tier

static nf_status_t offload_host(nf_pool_t *p, nf_block_t *b, uint32_t s, uint64_t g0, uint64_t g1) {
  nf_chunk_t *c = b->chunk;
  nf_xfer_t *x = calloc(1, sizeof *x);
  nf_offl_t *o = calloc(1, sizeof *o);
  if (x) x->gs = malloc((g1 - g0) * sizeof *x->gs);
  if (x) x->hg = malloc((g1 - g0) * sizeof *x->hg);
  if (!x || !o || !x->gs || !x->hg) {
    nf__xfer_free(x);
    free(o);
    return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  }
  for (uint64_t g = g0; g < g1; g++) // spilled granules are on the host already
    if (p->gran[c->phys[g]].tier == NF_TIER_DEVICE) x->gs[x->n++] = g;
  // Wholly spilled: nothing moves and the block stays a spilled one. Marked
  // offloaded, nf_prefetch would remap it without waiting for the work queued
  // on it before this call (no copy was ordered after that work).
  nf_status_t st = x->n ? nf__host_take(p, x->n, x->hg) : NF_OK;
  if (st != NF_OK || !x->n) { nf__xfer_free(x); free(o); return st; }
  if ((st = stage_map(p, x)) != NF_OK) goto undo;
  x->b = b;
  x->s = s;
  if ((st = nf__order_block(p, b, s)) != NF_OK || (st = copy_runs(p, x, c, true)) != NF_OK ||
      (st = nf__stream_record(p, s)) != NF_OK) {
    nf__xfer_drain(p, s); // the copy may have been queued
    unstage(p, x->stage, x->n * p->granule, x->n * p->granule);
    goto undo;
  }
  x->tick = p->streams[s].rec_tick;
  o->b = b;
  o->n = (g1 - g0) - x->n; // spilled granules: they hold an offloaded block now
  p->offl_granules += o->n;
  o->next = p->offl;
  p->offl = o;
  b->where = NF_TIER_HOST;
  o->x = x;
  nf__xfer_push(p, x);
  return NF_OK;
undo:
  for (uint64_t j = 0; j < x->n; j++) nf__gran_push_free(p, x->hg[j]);
  nf__xfer_free(x);
  free(o);
  return st;
}

// Drop an offload still in flight: the block keeps its device granules;
// the staging range goes once the copy is done. The copy may still read the
// block, so its stream counts as a record_stream stream of the block: the
// block's memory is not reused or unmapped before the copy completes.
static void offload_cancel(nf_block_t *b, nf_offl_t *o) {
  if (o->x->s != b->stream) b->extra |= 1ull << o->x->s;
  o->x->b = NULL;
  o->x = NULL;
}

// A copy back into b was queued on stream s: like record_stream, s counts
// as a user of the block, so a free on the block's own stream does not let
// its range be reused or unmapped (nor a later offload read it) before the
// copy has landed.
static void prefetched_on(nf_block_t *b, uint32_t s) {
  if (s != b->stream) b->extra |= 1ull << s;
}

// The device has no room for the n granules a prefetch needs (the granule
// pool reports OOM without a message: the caller names what failed).
nf_status_t nf__prefetch_oom(nf_pool_t *p, uint64_t n) {
  char need[32];
  nf__fmt_bytes(need, sizeof need, n << p->gshift);
  return nf__error(NF_ERR_OOM, "nofrag: prefetch: no device memory for %s (the block stays offloaded, intact)", need);
}

static nf_status_t prefetch_host(nf_pool_t *p, nf_block_t *b, uint32_t s, uint64_t g0, uint64_t g1, bool spilled) {
  nf_chunk_t *c = b->chunk;
  nf_status_t st;
  nf_xfer_t *x = calloc(1, sizeof *x);
  uint32_t *dev = malloc((g1 - g0) * sizeof *dev);
  if (x) x->gs = malloc((g1 - g0) * sizeof *x->gs);
  if (x) x->hg = malloc((g1 - g0) * sizeof *x->hg);
  if (!x || !dev || !x->gs || !x->hg) {
    nf__xfer_free(x);
    free(dev);
    return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  }
  for (uint64_t g = g0; g < g1; g++)
    if (p->gran[c->phys[g]].tier == NF_TIER_HOST) {
      x->gs[x->n] = g;
      x->hg[x->n++] = c->phys[g];
    }
  x->s = s;
  if (!x->n) { nf__xfer_free(x); free(dev); return NF_OK; }
  // A spilled block may be in use: its streams must be done before its
  // granules move (an offloaded block is not in use, by contract).
  if (spilled) {
    for (uint64_t m = b->extra | 1ull << b->stream | 1ull << s; m; m &= m - 1) {
      uint32_t y = (uint32_t)__builtin_ctzll(m);
      bool done;
      if ((st = nf__stream_record(p, y)) != NF_OK ||
          (st = nf__stream_done(p, y, p->streams[y].rec_tick, true, &done)) != NF_OK)
        goto fail;
    }
  }
  if ((st = nf__gran_acquire(p, x->n, c, g0, g1)) != NF_OK) {
    if (st == NF_ERR_OOM) nf__prefetch_oom(p, x->n);
    goto fail;
  }
  for (uint64_t j = 0; j < x->n; j++) {
    dev[j] = nf__gran_pop(p, NF_TIER_DEVICE);
    p->gran[dev[j]].state = NF_GR_MAPPED;
  }
  // The host granules stay mapped at the block while also mapped at the
  // staging range: the data is safe whatever fails from here.
  if ((st = stage_map(p, x)) != NF_OK) {
    for (uint64_t j = 0; j < x->n; j++) nf__gran_push_free(p, dev[j]);
    goto fail;
  }
  uint64_t done = 0;
  uint32_t *old = malloc(x->n * sizeof *old); // the host granules, = x->hg
  if (!old) { st = nf__error(NF_ERR_NOMEM, "nofrag: out of host memory"); done = 0; }
  else st = remap_all(p, c, x->gs, dev, old, x->n, &done);
  for (uint64_t j = done; j < x->n; j++) nf__gran_push_free(p, dev[j]); // not placed
  if (st == NF_OK) st = copy_runs(p, x, c, false);
  if (st == NF_OK) st = nf__stream_record(p, s);
  if (st != NF_OK) {
    // Put the host granules back where they were swapped out; they kept the
    // data (mapped at the staging range too).
    nf__xfer_drain(p, s);
    uint64_t back = 0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nf_last_error());
    if (old) {
      remap_all(p, c, x->gs, x->hg, old, done, &back);
      for (uint64_t j = 0; j < back; j++) nf__gran_push_free(p, old[j]); // device granules
      for (uint64_t j = back; j < done; j++) nf__gran_push_free(p, x->hg[j]); // could not go back: lost
      free(old);
    }
    unstage(p, x->stage, x->n * p->granule, x->n * p->granule);
    nf__error(st, "%s", msg);
    goto fail;
  }
  free(old);
  x->tick = p->streams[s].rec_tick;
  prefetched_on(b, s);
  p->st.prefetches++;
  for (uint64_t j = 0; j < x->n; j++) p->gran[x->hg[j]].state = NF_GR_MAPPED; // until stage_drop
  nf__xfer_push(p, x);
  free(dev);
  return NF_OK;
fail:
  nf__xfer_free(x);
  free(dev);
  return st;
}

// ------------------------------------------------------------ public API

// Offload, prefetch and their polls record, query and wait on events and
// queue copies: CUDA forbids event calls on a capturing stream (anywhere, in
// a global-mode capture), and a copy queued there would land in the graph.
static nf_status_t not_capturing(const nf_pool_t *p, const char *what) {
  if (NF_LIKELY(!p->capture_mask)) return NF_OK;
  return nf__error(NF_ERR_INVALID, "nofrag: %s: a stream is being captured (CUDA graph); offload and prefetch "
                   "make event calls and copies, which a capture forbids: call it before or after the capture", what);
}

static nf_status_t lookup(nf_pool_t *p, const void *ptr, const char *what, nf_block_t **b) {
  *b = nf__map_find(p, (uintptr_t)ptr);
  if (!*b) return nf__error(NF_ERR_INVALID, "nofrag: %s of %p: not the start of a live block", what, ptr);
  return NF_OK;
}

nf_status_t nf_offload(nf_pool_t *p, void *ptr, nf_stream_t stream, nf_tier_t tier) {
  if (!p || !ptr) return nf__error(NF_ERR_INVALID, "nofrag: nf_offload: NULL argument");
  if (tier != NF_TIER_HOST && tier != NF_TIER_HOST_DETACHED && tier != NF_TIER_DISK)
    return nf__error(NF_ERR_INVALID, "nofrag: nf_offload: tier %d is not NF_TIER_HOST, NF_TIER_HOST_DETACHED or "
                     "NF_TIER_DISK", (int)tier);
  nf__lock(&p->lock);
  nf_block_t *b;
  uint32_t s = 0;
  uint64_t g0, g1;
  nf_status_t st = not_capturing(p, "nf_offload");
  if (st == NF_OK) st = lookup(p, ptr, "nf_offload", &b);
  if (st == NF_OK) st = nf__stream_index(p, stream, &s);
  if (st == NF_OK && p->xfers) st = nf__xfer_poll(p, false);
  if (st != NF_OK) goto out;
  if (b->where) {
    if (b->where != tier)
      st = nf__error(NF_ERR_INVALID, "nofrag: nf_offload of %p: already offloaded to %s; nf_prefetch it first", ptr,
                     b->where == NF_TIER_HOST ? "host memory" : b->where == NF_TIER_DISK ? "disk" : "host memory (detached)");
    goto out;
  }
  if (!nf__owned(p, b, &g0, &g1)) goto out; // under a granule: nothing it owns alone
  st = tier == NF_TIER_HOST ? offload_host(p, b, s, g0, g1)
       : tier == NF_TIER_DISK ? nf__offload_disk(p, b, s, g0, g1)
                              : nf__offload_detached(p, b, s, g0, g1);
out:
  nf__pub_full(p);
  nf__unlock(&p->lock);
  return st;
}

nf_status_t nf_prefetch(nf_pool_t *p, void *ptr, nf_stream_t stream) {
  if (!p || !ptr) return nf__error(NF_ERR_INVALID, "nofrag: nf_prefetch: NULL argument");
  nf__lock(&p->lock);
  nf_block_t *b;
  uint32_t s = 0;
  uint64_t g0, g1;
  nf_offl_t **link = NULL, *o = NULL;
  nf_status_t st = not_capturing(p, "nf_prefetch");
  if (st == NF_OK) st = lookup(p, ptr, "nf_prefetch", &b);
  if (st == NF_OK) st = nf__stream_index(p, stream, &s);
  if (st == NF_OK && p->xfers) st = nf__xfer_poll(p, false);
  if (st != NF_OK || !nf__owned(p, b, &g0, &g1)) goto out;
  if (b->where) o = nf__offl_find(p, b, &link);
  if (o && o->x) { // still copying out: the block never left the device (not counted: nothing moved)
    offload_cancel(b, o);
  } else if (b->where == NF_TIER_DISK) {
    if ((st = nf__prefetch_disk(p, b, o, s, g0, g1)) != NF_OK) goto out;
    prefetched_on(b, s);
  } else if (b->where == NF_TIER_HOST_DETACHED) {
    if ((st = nf__prefetch_detached(p, b, o, s, g0, g1)) != NF_OK) goto out;
    prefetched_on(b, s);
  } else if ((st = prefetch_host(p, b, s, g0, g1, !o)) != NF_OK) {
    goto out;
  }
  if (o) {
    if (b->where == NF_TIER_HOST) p->offl_granules -= o->n;
    *link = o->next;
    free(o);
    b->where = 0;
  }
out:
  nf__pub_full(p);
  nf__unlock(&p->lock);
  return st;
}

nf_status_t nf_offload_wait(nf_pool_t *p) {
  if (!p) return nf__error(NF_ERR_INVALID, "nofrag: nf_offload_wait: NULL pool");
  nf__lock(&p->lock);
  nf_status_t st = not_capturing(p, "nf_offload_wait");
  if (st == NF_OK) st = nf__xfer_poll(p, true);
  nf__pub_full(p);
  nf__unlock(&p->lock);
  return st;
}

// ------------------------------------------------------------ pool hooks

bool nf__block_away(nf_pool_t *p, const nf_block_t *b) {
  if (b->where == NF_TIER_DISK) return true;
  nf_offl_t *o = b->where == NF_TIER_HOST_DETACHED ? nf__offl_find(p, b, NULL) : NULL;
  return o && !o->x;
}

uint64_t nf__offload_busy(nf_pool_t *p, const nf_block_t *b) {
  nf_offl_t *o = nf__offl_find(p, b, NULL);
  return o && o->x && o->x->s != b->stream ? 1ull << o->x->s : 0;
}

void nf__offload_forget(nf_pool_t *p, nf_block_t *b) {
  nf_offl_t **link, *o = nf__offl_find(p, b, &link);
  if (o && o->x) offload_cancel(b, o);
  if (o) {
    if (b->where == NF_TIER_HOST) {
      p->offl_granules -= o->n;
      p->host_sweep = p->host_sweep || o->n; // now cached host granules
    } else if (b->where == NF_TIER_DISK) {
      nf__disk_forget(p, o); // the range stays unmapped: free ranges may be
    } else {
      nf__detached_forget(p, o);
    }
    *link = o->next;
    free(o);
  }
  b->where = 0;
}

uint64_t nf__xfer_staged(const nf_pool_t *p) {
  uint64_t n = 0;
  for (const nf_xfer_t *x = p->xfers; x; x = x->next) n += x->n;
  return n;
}

void nf__offload_destroy(nf_pool_t *p) {
  nf__xfer_poll(p, true);
  while (p->xfers) { // polling failed: drop them anyway
    nf_xfer_t *x = p->xfers;
    p->xfers = x->next;
    stage_drop(p, x);
    nf__xfer_free(x);
  }
  while (p->offl) {
    nf_offl_t *o = p->offl;
    p->offl = o->next;
    if (o->hg) nf__detached_forget(p, o); // host granules back, released with the others
    free(o);
  }
  if (p->disk_fd >= 0) close(p->disk_fd);
  p->disk_fd = -1;
}

// Where a live block's bytes are, granule by granule (an unmapped granule of
// a live block is on disk).
nf_status_t nf_block_tiers(nf_pool_t *p, const void *ptr, uint64_t bytes[3]) {
  if (!p || !bytes) return nf__error(NF_ERR_INVALID, "nofrag: nf_block_tiers: NULL argument");
  nf__lock(&p->lock);
  nf_block_t *b = nf__map_find(p, (uintptr_t)ptr);
  nf_status_t st = b ? NF_OK : nf__error(NF_ERR_INVALID, "nofrag: nf_block_tiers of %p: not the start of a live block", ptr);
  if (st == NF_OK) {
    nf_chunk_t *c = b->chunk;
    uint64_t a = b->addr - c->base, e = a + b->size, G = p->granule;
    bytes[0] = bytes[1] = bytes[2] = 0;
    for (uint64_t g = a >> p->gshift; g < (e + G - 1) >> p->gshift; g++) {
      uint64_t lo = g * G > a ? g * G : a, hi = (g + 1) * G < e ? (g + 1) * G : e;
      int t = nf__bit(c->mapped, g) ? p->gran[c->phys[g]].tier
              : b->where == NF_TIER_HOST_DETACHED ? NF_TIER_HOST : NF_TIER_DISK;
      bytes[t] += hi - lo;
    }
  }
  nf__unlock(&p->lock);
  return st;
}

// What the core calls when it must tell this layer of an event (core.h).
const nf_tier_hooks_t nf__tier_hooks = {
    .poll = nf__xfer_poll,
    .reclaim = nf__xfer_reclaim,
    .win_unmap = nf__win_unmap,
    .busy = nf__offload_busy,
    .forget = nf__offload_forget,
    .away = nf__block_away,
    .staged = nf__xfer_staged,
    .check = nf__detached_check,
    .released = nf__win_destroy,
};
