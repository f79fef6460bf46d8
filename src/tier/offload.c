// Same-address offload and prefetch of live blocks (nf_offload, nf_prefetch).
//
// A block owns the granules wholly inside it; only those move. A physical
// granule can be mapped at two addresses at once, which makes every step
// below non-destructive until the data has a second home:
//
// offload to host   (offload_host.c) map new host granules H at a staging
//                   range, copy the block's device granules D into it on the
//                   caller's stream, record. Once the copy completed (polled
//                   later, never waited for unless asked): unmap D at the
//                   block, map H there, unmap the staging range; D returns to
//                   the pool. If that finish fails, the error waits for
//                   nf_offload_wait (p->xfer_err), not the call that polled.
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

// Stream s waits (on the GPU) for the work queued on stream x so far: a
// fresh record on x, not an older one, which the latest work is not behind.
static nf_status_t wait_on(nf_pool_t *p, uint32_t s, uint32_t x) {
  nf_status_t st = nf__stream_record(p, x);
  return st == NF_OK ? NF_BE(p, stream_wait, stream_wait, p->streams[s].handle, nf__stream_event(&p->streams[x])) : st;
}

// Order stream s after the work of the block's other streams (allocation,
// record_stream): its copy then starts after all of it. No host wait.
nf_status_t nf__order_block(nf_pool_t *p, const nf_block_t *b, uint32_t s) {
  for (uint64_t m = (b->extra | 1ull << b->stream) & ~(1ull << s); m; m &= m - 1) {
    nf_status_t st = wait_on(p, s, (uint32_t)__builtin_ctzll(m));
    if (st != NF_OK) return nf__error(st, "nofrag: offload: ordering streams failed: %s", nf__backend_err());
  }
  return NF_OK;
}

// A finish that failed: kept for nf_offload_wait, where the user asks about
// the offloads, not returned by the call (on another block, maybe) that
// happened to poll. The first is kept; later ones are counted.
static void xfer_defer(nf_pool_t *p, nf_status_t st) {
  if (p->xfer_err != NF_OK) {
    p->xfer_err_more++;
    return;
  }
  p->xfer_err = st;
  snprintf(p->xfer_msg, sizeof p->xfer_msg, "%s", nf_last_error());
}

// After a tier operation on live block b: whether a failed remap or set
// access left granules of it mapped without access (until its nf_prefetch).
// Such a block is not parked at its free: a bin's pop hands a parked block out
// again without looking at its granules (pool.c, bin_pop).
static void note_ready(nf_pool_t *p, nf_block_t *b) {
  if (b && b->state == NF_BLK_LIVE)
    b->unready = !nf__block_away(p, b) && !nf__range_mapped(p, b->chunk, b->addr, b->size);
}

// A failed event query or wait is returned at once (the backend is failing:
// nothing else can be known to be done); a failed finish is deferred.
nf_status_t nf__xfer_poll(nf_pool_t *p, bool blocking) {
  uint64_t busy = 0; // streams found not done in this poll: not asked again (one query per stream)
  for (nf_xfer_t **l = &p->xfers; *l;) {
    nf_xfer_t *x = *l;
    bool done = false;
    if (!(busy >> x->s & 1) || p->streams[x->s].done_tick >= x->tick) {
      // A deferred drop (nf__xfer_defer) needs a record made after its copies.
      nf_status_t st = p->streams[x->s].rec_tick < x->tick ? nf__stream_record(p, x->s) : NF_OK;
      if (st == NF_OK) st = nf__stream_done(p, x->s, x->tick, blocking, &done);
      if (st != NF_OK) return st;
      if (!done) busy |= 1ull << x->s;
    }
    if (!done) { l = &x->next; continue; }
    nf_status_t st = NF_OK;
    *l = x->next;
    if (x->b) {
      st = x->detached ? nf__detached_finish(p, x) : nf__host_finish(p, x);
      note_ready(p, x->b);
    } else {
      nf__stage_drop(p, x);
    }
    if (st != NF_OK) xfer_defer(p, st);
    nf__xfer_free(x);
  }
  return NF_OK;
}

bool nf__xfer_drain(nf_pool_t *p, uint32_t s) {
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
  return done;
}

void nf__xfer_push(nf_pool_t *p, nf_xfer_t *x) {
  x->next = p->xfers;
  p->xfers = x;
}

void nf__xfer_defer(nf_pool_t *p, nf_xfer_t *x, uint32_t s) {
  x->b = NULL;
  x->s = s;
  x->tick = p->tick + 1; // no record made so far covers the copies
  nf__xfer_push(p, x);
}

nf_status_t nf__xfer_reclaim(nf_pool_t *p) {
  for (nf_xfer_t *x = p->xfers; x; x = x->next)
    if (x->b && x->n) return nf__xfer_poll(p, true);
  return NF_OK;
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

// The device has no room for the n granules a prefetch needs (the granule
// pool reports OOM without a message: the caller names what failed).
nf_status_t nf__prefetch_oom(nf_pool_t *p, uint64_t n) {
  char need[32];
  nf__fmt_bytes(need, sizeof need, n << p->gshift);
  return nf__error(NF_ERR_OOM, "nofrag: prefetch: no device memory for %s (the block stays offloaded, intact)", need);
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
  nf__pool_lock(p);
  nf_block_t *b = NULL;
  uint32_t s = 0;
  uint64_t g0, g1;
  nf_status_t st = not_capturing(p, "nf_offload");
  if (st == NF_OK) st = lookup(p, ptr, "nf_offload", &b);
  if (st == NF_OK) st = nf__stream_index_for(p, stream, b, &s);
  if (st == NF_OK) st = nf__block_home(p, b, 1ull << s); // before b->stream is read
  if (st == NF_OK && p->leftover) nf__leftover_retry(p); // (not during a capture)
  if (st == NF_OK && p->xfers) st = nf__xfer_poll(p, false);
  if (st != NF_OK) goto out;
  if (b->where) {
    if (b->where != tier)
      st = nf__error(NF_ERR_INVALID, "nofrag: nf_offload of %p: already offloaded to %s; nf_prefetch it first", ptr,
                     b->where == NF_TIER_HOST ? "host memory" : b->where == NF_TIER_DISK ? "disk" : "host memory (detached)");
    goto out;
  }
  if (!nf__owned(p, b, &g0, &g1)) goto out; // under a granule: nothing it owns alone
  if (b->shared) { // another process maps these granules (nf_ipc_export): they must not move
    st = nf__error(NF_ERR_INVALID, "nofrag: nf_offload of %p: the block is shared with another process "
                   "(nf_ipc_export; CUDA IPC), which maps its device memory: it stays on the device until freed", ptr);
    goto out;
  }
  // Mapping units (units:N) are unmapped only whole: the detached and disk
  // tiers unmap the owned range in one run (a unit inside goes back to the
  // backend whole; the prefetch maps single granules), the host tier swaps a
  // unit inside for host granules whole. A unit the block shares in part
  // (its edge, far from the limit) cannot move.
  if (NF_UNLIKELY(p->un_live) && nf__unit_cut(p, b->chunk, g0, g1)) {
    st = nf__error(NF_ERR_INVALID, "nofrag: nf_offload of %p: the block lies over part of a mapping unit "
                   "(units:%llu), which moves only whole; set units:0 for a pool that offloads such blocks", ptr,
                   (unsigned long long)p->cfg.units);
    goto out;
  }
  // Granules a failed tier operation left without access (note_ready; only
  // owned granules are remapped): the copy out reads the block, so they get
  // it first (on a GPU a copy from memory mapped without access is an illegal
  // address, fatal to the context).
  if (b->unready && (st = nf__set_ready(p, b->chunk, g0, g1)) != NF_OK) {
    char msg[400];
    snprintf(msg, sizeof msg, "%s", nf__unprefixed(nf_last_error())); // (nf__error writes where it lies)
    st = nf__error(st, "nofrag: nf_offload of %p: part of the block is without access since an earlier failure, "
                   "and setting it failed (%s); nothing moved", ptr, msg);
    goto out;
  }
  st = tier == NF_TIER_HOST ? nf__offload_host(p, b, s, g0, g1)
       : tier == NF_TIER_DISK ? nf__offload_disk(p, b, s, g0, g1)
                              : nf__offload_detached(p, b, s, g0, g1);
out:
  note_ready(p, b);
  nf__pub_full(p);
  nf__pool_unlock(p);
  return st;
}

nf_status_t nf_prefetch(nf_pool_t *p, void *ptr, nf_stream_t stream) {
  if (!p || !ptr) return nf__error(NF_ERR_INVALID, "nofrag: nf_prefetch: NULL argument");
  nf__pool_lock(p);
  nf_block_t *b = NULL;
  uint32_t s = 0;
  uint64_t g0, g1;
  nf_offl_t **link = NULL, *o = NULL;
  nf_status_t st = not_capturing(p, "nf_prefetch");
  if (st == NF_OK) st = lookup(p, ptr, "nf_prefetch", &b);
  if (st == NF_OK) st = nf__stream_index_for(p, stream, b, &s);
  if (st == NF_OK) st = nf__block_home(p, b, 1ull << s); // before b->stream is read
  if (st == NF_OK && p->leftover) nf__leftover_retry(p); // (not during a capture)
  if (st == NF_OK && p->xfers) st = nf__xfer_poll(p, false);
  if (st != NF_OK || !nf__owned(p, b, &g0, &g1)) goto out;
  if (b->where) o = nf__offl_find(p, b, &link);
  if (o && o->x) { // still copying out: the block never left the device (not counted: nothing moved)
    // The copy is in flight because the work it follows may still run:
    // stream s must see the block's data after that work (nf_prefetch's
    // promise). The copy's stream was ordered after every stream of the
    // block, so one record there, after the copy, covers them all (no host
    // wait). On failure nothing is cancelled.
    if (o->x->s != s && (st = wait_on(p, s, o->x->s)) != NF_OK) {
      st = nf__error(st, "nofrag: prefetch: ordering after the offload's copy failed: %s", nf__backend_err());
      goto out;
    }
    offload_cancel(b, o);
  } else if (b->where == NF_TIER_DISK) {
    if ((st = nf__prefetch_disk(p, b, o, s, g0, g1)) != NF_OK) goto out;
    nf__prefetched_on(b, s);
  } else if (b->where == NF_TIER_HOST_DETACHED) {
    if ((st = nf__prefetch_detached(p, b, o, s, g0, g1)) != NF_OK) goto out;
    nf__prefetched_on(b, s);
  } else if ((st = nf__prefetch_host(p, b, o, s, g0, g1, !o)) != NF_OK) {
    goto out;
  }
  if (o) {
    if (b->where == NF_TIER_HOST) p->offl_granules -= o->n;
    *link = o->next;
    free(o);
    b->where = 0;
  }
out:
  note_ready(p, b);
  nf__pub_full(p);
  nf__pool_unlock(p);
  return st;
}

nf_status_t nf_offload_wait(nf_pool_t *p) {
  if (!p) return nf__error(NF_ERR_INVALID, "nofrag: nf_offload_wait: NULL pool");
  nf__pool_lock(p);
  nf_status_t st = not_capturing(p, "nf_offload_wait");
  if (st == NF_OK && p->leftover) nf__leftover_retry(p);
  if (st == NF_OK) st = nf__xfer_poll(p, true);
  if (st == NF_OK && p->xfer_err != NF_OK) { // an offload whose finish failed (xfer_defer), reported once
    if (p->xfer_err_more)
      st = nf__error(p->xfer_err, "%s (and %llu more offloads failed to finish since)", p->xfer_msg,
                     (unsigned long long)p->xfer_err_more);
    else
      st = nf__error(p->xfer_err, "%s", p->xfer_msg);
    p->xfer_err = NF_OK;
    p->xfer_err_more = 0;
  }
  nf__pub_full(p);
  nf__pool_unlock(p);
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
      // ... counted with spill (host granules in free ranges) until swept:
      // its peak follows, as for every other way `spilled` grows.
      nf__peak(&p->st.spilled_peak, (p->host_mapped - p->offl_granules) << p->gshift);
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
  for (const nf_xfer_t *x = p->xfers; x; x = x->next)
    for (uint64_t j = 0; j < x->n; j++) n += x->hg[j] != UINT32_MAX; // (none: went back to its block)
  return n;
}

void nf__offload_destroy(nf_pool_t *p) {
  nf__xfer_poll(p, true);
  while (p->xfers) { // polling failed: drop them anyway
    nf_xfer_t *x = p->xfers;
    p->xfers = x->next;
    nf__stage_drop(p, x);
    nf__xfer_free(x);
  }
  while (p->offl) {
    nf_offl_t *o = p->offl;
    p->offl = o->next;
    if (o->hg) nf__detached_forget(p, o); // host granules back, released with the others
    free(o);
  }
  nf__leftover_retry(p); // the last try
  while (p->leftover) {
    nf_xfer_t *x = p->leftover;
    p->leftover = x->next;
    free(x);
  }
  if (p->disk_fd >= 0) close(p->disk_fd);
  p->disk_fd = -1;
}

// Where a live block's bytes are, granule by granule (an unmapped granule of
// a live block is on disk).
nf_status_t nf_block_tiers(nf_pool_t *p, const void *ptr, uint64_t bytes[3]) {
  if (!p || !bytes) return nf__error(NF_ERR_INVALID, "nofrag: nf_block_tiers: NULL argument");
  nf__pool_lock(p);
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
  nf__pool_unlock(p);
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
