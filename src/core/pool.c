// The hot path: nf_alloc / nf_free / record_stream / block_size, the
// deferred-coalescing bins they park in and pop from, and the entry points
// of private pools and nf_alloc_at. A pool's creation, limits and trim are in
// capacity.c. Policy lives in placement.c, mapping in vmm.c, ordering in
// stream.c.
#include "core/core.h"

// ------------------------------------------------------------------ alloc
// Room under the limit for rsize bytes wherever they land (a partial granule at each end).
static inline bool limit_room(const nf_pool_t *p, uint64_t rsize) {
  return p->gran_created + (rsize >> p->gshift) + 2 <= p->max_granules;
}

// Called under the lock. Sets the one-line message and builds the OOM report;
// true when the report is to be printed (nf__oom_print) after unlocking.
static bool fail_oom(nf_pool_t *p, size_t size, uint64_t rsize, nf_stream_t s, nf_status_t st) {
  if (st != NF_ERR_OOM) return false; // message already set by the failing call
  p->st.ooms++;
  char req[32], live[32], mapped[32], phys[32], lim[32], lf[32];
  nf__fmt_bytes(req, sizeof req, size);
  nf__fmt_bytes(live, sizeof live, p->st.live);
  nf__fmt_bytes(mapped, sizeof mapped, p->gran_mapped << p->gshift);
  nf__fmt_bytes(phys, sizeof phys, p->gran_created << p->gshift);
  nf__fmt_bytes(lim, sizeof lim, p->cfg.limit);
  uint64_t live_gr = 0;
  nf__fmt_bytes(lf, sizeof lf, nf__largest_free_mapped(p, &live_gr));
  // Room under the limit: the driver refused, or a capture forbade a wait. Keep that cause.
  char cause[320] = "";
  if (limit_room(p, rsize))
    snprintf(cause, sizeof cause, "; not the limit: %s", nf_last_error());
  nf__error(NF_ERR_OOM,
            "nofrag: out of memory: tried to allocate %s (%llu B, rounded %llu B) on stream %p; "
            "live %s in %llu blocks over %llu granules, mapped %s, physical %s, limit %s "
            "(granule %llu B); largest free mapped range %s%s",
            req, (unsigned long long)size, (unsigned long long)rsize, s, live,
            (unsigned long long)p->st.live_blocks, (unsigned long long)live_gr, mapped, phys, lim,
            (unsigned long long)p->granule, lf, cause);
  return p->obs.oom && p->obs.oom(p, size, s, false);
}

// A block becomes free: the views learn its granules are no longer busy
// (`used`: its streams worked on them, so they order the next user), then
// it joins its free index.
static void block_release(nf_pool_t *p, nf_block_t *b, bool used) {
  if (NF_UNLIKELY(p->vw_on)) nf__release_viewed(p, b, used);
  else nf__release_block(p, b);
}

// Order, carve and map the detached free block *bp for a request. On error
// the block is back in the free index and nothing else changed.
static nf_status_t place_block(nf_pool_t *p, nf_block_t **bp, uint64_t off, uint64_t rsize, uint32_t s,
                               bool mapped) {
  nf_block_t *b = *bp;
  nf_status_t st;
  if (NF_UNLIKELY(!nf__block_usable(p, b, s)) && (st = nf__order_after(p, b, s)) != NF_OK) {
    nf__tlsf_insert(nf__tlsf_of(p, b), b);
    return st;
  }
  if (NF_UNLIKELY(!(b = nf__split(p, b, off, rsize)))) return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  // Live from here: stitching and pending-block release must neither unmap
  // nor coalesce the block being placed.
  b->state = NF_BLK_LIVE;
  b->stream = (uint16_t)s;
  if (NF_UNLIKELY(p->vw_on)) nf__view_live(p, b);
  bool split = false;
  if (NF_UNLIKELY(p->un_live) && (st = nf__units_fit(p, b, &split)) != NF_OK) {
    b->state = NF_BLK_FREE;
    block_release(p, b, false);
    return st;
  }
  mapped &= !split;
  if (!mapped && !nf__range_mapped(p, b->chunk, b->addr, rsize) && (st = nf__map_block(p, b)) != NF_OK) {
    b->state = NF_BLK_FREE;
    block_release(p, b, false);
    return st;
  }
  *bp = b;
  return NF_OK;
}

// A parked (or hot) block taken for an allocation of its size (it stays in
// the map: live again). Placement would have carved b from the start of its
// coalesced run (b and the free block r after it): r, the run's rest, gets
// the streams and tick the run would have had (conservative: a superset, a
// later tick). Same streams: merge_order's result up to streams known
// complete, which behave as absent (retirement is monotone).
static inline void bin_take_run(nf_pool_t *p, const nf_block_t *b) {
  nf_block_t *r = b->next;
  if (!r || r->state != NF_BLK_FREE) return;
  if (NF_LIKELY(r->smask == b->smask)) {
    if (b->tick > r->tick) r->tick = b->tick;
  } else {
    nf__bin_take_order(p, b, r);
  }
}
// Out of its bin for an allocation of its size.
static inline void bin_take(nf_pool_t *p, nf_block_t *b) {
  nf__bin_out(p, b);
  bin_take_run(p, b);
}

// A parked block of exactly `rsize` that stream s may use with no event call
// (as placement's fast path: same stream, or the other streams' work known
// complete or already waited on) and whose granules are all still ready;
// taken out of its bin (NULL: none). Only where nf__place would have chosen
// the same address, so that the replay figures (peak, calls, minimum
// capacity) are those without bins; any other request flushes the bins first:
// - exact: the block's park is the pool's latest event (p->fx) and its
//   allocation was a placement with no mapping (or such a pop). Releasing it
//   would restore the free run placement carved it from, now first in its
//   class, and nothing else changed: placement would carve it again (not in
//   `tight` placement, which weighs streams, nor near the limit);
// - small arena, otherwise: no block indexed in the exact class (placement's
//   fast path would take that one first), measured to keep every replay
//   figure of the shared traces unchanged.
// Either way no free block just below (coalesced, the run would start there)
// and no parked one just above (the run would be longer).
// bin_pop's rules, shared with the hot pair (free_hot): a pop is exact where
// the block's park was the pool's latest event (`quiet`) after an allocation
// placement made with no mapping (`memo`); its neighbours must not extend the
// run placement would carve; a non-exact pop needs an empty exact TLSF class.
static inline bool pop_exact(const nf_pool_t *p, bool quiet_memo, uint64_t rsize) {
  return quiet_memo && !p->cfg.tight && limit_room(p, rsize);
}
static inline bool pop_neighbours_ok(const nf_block_t *b) {
  return (!b->prev || b->prev->state != NF_BLK_FREE) && (!b->next || !b->next->parked);
}
static inline bool pop_class_empty(const nf_pool_t *p, uint64_t units) {
  int fl, sl;
  nf__tlsf_mapping(units, &fl, &sl);
  return !p->tlsf[NF_ARENA_SMALL].heads[fl][sl];
}

static nf_block_t *bin_pop(nf_pool_t *p, uint64_t rsize, uint32_t s) {
  uint64_t units = rsize >> NF_ALIGN_SHIFT;
  nf_bin_t *bin = &p->bins[nf__bin_of(units)];
  if (bin->units != units || !bin->head) return NULL;
  nf_block_t *b = bin->head;
  // Its park was the pool's latest event: nothing was mapped or unmapped
  // since it was live (and so wholly mapped).
  bool quiet = b->fx == p->fx;
  bool exact = pop_exact(p, quiet && b->memo, rsize);
  int n = 1;
  if (exact && pop_neighbours_ok(b) && nf__block_usable(p, b, s)) {
    bin_take(p, b);
    return b;
  }
  if (!exact) {
    if (b->arena != NF_ARENA_SMALL || !pop_class_empty(p, units)) return NULL;
    n = 4;
  }
  for (; b && n > 0; b = b->fnext, n--)
    if (pop_neighbours_ok(b) && nf__block_usable(p, b, s) &&
        ((quiet && b == bin->head) || nf__range_mapped(p, b->chunk, b->addr, rsize))) {
      bin_take(p, b);
      b->memo = exact;
      return b;
    }
  return NULL;
}

// Under the lock: the free block of pool pv (NULL: general) holding
// [at, at + n), taken out of its free index, or NULL.
static nf_block_t *free_block_at(nf_pool_t *p, const nf_priv_t *pv, uintptr_t at, uint64_t n) {
  for (nf_chunk_t *c = p->chunks; c; c = c->next) {
    if (c->priv != pv || at < c->base || at >= c->base + c->size) continue;
    for (nf_block_t *b = c->first; b; b = b->next)
      if (b->state == NF_BLK_FREE && b->addr <= at && at + n <= b->addr + b->size) {
        nf__tlsf_remove(nf__tlsf_of(p, b), b);
        return b;
      }
  }
  return NULL;
}

// The allocation is done: its bookkeeping, under the lock, which it drops.
static inline void *alloc_done(nf_pool_t *p, nf_block_t *b, size_t size, uint64_t rsize, uint32_t s,
                               nf_stream_t stream) {
  b->stream = (uint16_t)s;
  b->req = size;
  b->extra = 0;
  b->shared = 0;
  b->fx = ++p->fx;
  p->st.live += size;
  p->st.live_rounded += rsize;
  p->st.live_blocks++;
  p->st.allocs++;
  if (NF_UNLIKELY(b->chunk->priv != NULL)) { b->chunk->priv->live += size; b->chunk->priv->live_blocks++; } // as nf_free
  nf__peak(&p->st.live_peak, p->st.live);
  nf__peak(&p->st.live_rounded_peak, p->st.live_rounded);
  if (NF_UNLIKELY(p->obs.op)) p->obs.op(p, true, b->addr, size, stream);
  p->last = b;
  nf__pub_fast(p, true);
  nf__pool_unlock(p);
  return (void *)b->addr;
}

// Larger than the limit, and spill (up to spill_limit more) cannot serve it.
// Under the lock (nf__lock, taken by alloc_entry: the limit is read there,
// as nf_set_limit writes it), which it drops.
static NF_NOINLINE void *alloc_too_large(nf_pool_t *p, size_t size, nf_stream_t stream) {
  if (p->hot) nf__hot_settle(p); // as nf__pool_lock: the report walks the blocks
  char req[32], lim[32];
  nf__fmt_bytes(req, sizeof req, size);
  nf__fmt_bytes(lim, sizeof lim, p->cfg.limit);
  bool spill = p->cfg.spill;
  p->st.ooms++;
  bool print = p->obs.oom && p->obs.oom(p, size, stream, true);
  nf__pub_full(p);
  nf__pool_unlock(p);
  if (print) p->obs.oom_print();
  nf__error(NF_ERR_OOM, "nofrag: out of memory: tried to allocate %s (%llu B), more than the whole limit %s%s",
            req, (unsigned long long)size, lim, spill ? " plus spill_limit" : "");
  return NULL;
}

static void *alloc_locked(nf_pool_t *p, size_t size, uint64_t rsize, nf_stream_t stream,
                                      bool explicit_pv, uint64_t pv_id, uintptr_t at);

// nf_alloc, or with `explicit_pv` nf_alloc_private: the allocation goes to
// private pool `pv_id` (else to the one a route names, else the general
// pool); `at` nonzero: exactly there (nf_alloc_at). Inline here: the hot
// pair; the rest is alloc_locked.
static inline void *alloc_entry(nf_pool_t *p, size_t size, nf_stream_t stream, bool explicit_pv, uint64_t pv_id,
                                uintptr_t at) {
  if (NF_UNLIKELY(!p)) { nf__error(NF_ERR_INVALID, "nofrag: nf_alloc: NULL pool"); return NULL; }
  if (NF_UNLIKELY(!size)) { nf__error_clear(); return NULL; }
  nf__lock(&p->lock_); // not nf__pool_lock: the hot block is taken or parked right here
  // The limit under the lock: nf_set_limit changes it (and may roll it back).
  if (NF_UNLIKELY((uint64_t)size > p->cfg.limit) &&
      (!p->cfg.spill || (uint64_t)size - p->cfg.limit > p->max_host_granules << p->gshift))
    return alloc_too_large(p, size, stream);
  uint64_t rsize = ((uint64_t)size + NF_ALIGN - 1) & ~(NF_ALIGN - 1);
  nf_block_t *b = p->hot;
  if (b) {
    // The hot pair: the block the last free left un-parked, of this size
    // and stream. Its park and this pop (bin_pop's quiet case, decided at
    // the free) would leave the pool exactly as this does.
    if (b->size == rsize && !explicit_pv && !at && !p->nroutes && p->streams[b->stream].handle == stream) {
      p->hot = NULL;
      if (NF_UNLIKELY(p->last_stream != b->stream)) nf__stream_switch(p, b->stream); // as a lookup would
      b->memo = pop_exact(p, b->memo, rsize); // as bin_pop (its inputs unchanged since the free)
      b->state = NF_BLK_LIVE;
      bin_take_run(p, b);
      return alloc_done(p, b, size, rsize, b->stream, stream);
    }
    nf__hot_settle(p);
  }
  return alloc_locked(p, size, rsize, stream, explicit_pv, pv_id, at);
}

// Under the lock, no hot block: bins, placement, growth; drops the lock.
static NF_NOINLINE void *alloc_locked(nf_pool_t *p, size_t size, uint64_t rsize, nf_stream_t stream, bool explicit_pv,
                          uint64_t pv_id, uintptr_t at) {
  int arena = rsize <= p->cfg.small_max ? NF_ARENA_SMALL : NF_ARENA_LARGE;
  uint32_t s = p->last_stream;
  uint64_t dev0 = p->gran_created, host0 = p->host_created; // given back if this fails
  nf_block_t *b;
  nf_status_t st = NF_OK;
  if (NF_UNLIKELY(!p->nstreams || p->streams[s].handle != stream) && (st = nf__stream_index(p, stream, &s)) != NF_OK)
    goto fail;
  nf_tlsf_t *tl = p->tlsf;
  nf_priv_t *pv = NULL;
  if (NF_UNLIKELY(explicit_pv | (p->nroutes != 0 && !at))) {
    pv = explicit_pv ? nf__priv_find(p, pv_id) : nf__priv_route(p, s);
    if (explicit_pv && !pv) {
      st = nf__error(NF_ERR_INVALID, "nofrag: %s: no private pool %llu", at ? "nf_alloc_at" : "nf_alloc_private",
                     (unsigned long long)pv_id);
      goto fail;
    }
    if (pv) tl = pv->tlsf;
  }
  // The cached pair: a parked block of this exact size (no placement, split
  // or coalescing; no backend call).
  if (p->bin_blocks && !pv && !at && !p->vw_on && !p->host_sweep && (b = bin_pop(p, rsize, s)) != NULL) {
    b->state = NF_BLK_LIVE;
    goto popped;
  }
  // The placed block's map entry, made room for before anything is placed:
  // out of host memory then changes nothing.
  if (NF_UNLIKELY(nf__map_reserve(p) != NF_OK)) {
    st = nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
    goto fail;
  }
  // Any other placement sees the free structure coalesced, as without bins.
  if (NF_UNLIKELY(p->bin_blocks != 0)) nf__bins_flush(p);
  // Spilled granules left in free ranges go before placement looks: new
  // blocks belong on the device.
  if (NF_UNLIKELY(p->host_sweep) && p->tick != p->sweep_tick) nf__host_sweep(p);
  uint64_t off;
  bool mapped;
  if (NF_UNLIKELY(at != 0)) { // restoring a checkpoint (PyTorch's CUDA-graph trees)
    nf__bins_flush(p); // the range may hold parked blocks
    if (!(b = free_block_at(p, pv, at, rsize))) {
      st = nf__error(NF_ERR_INVALID, "nofrag: nf_alloc_at: [%p, +%llu B) is not free in pool %llu", (void *)at,
                     (unsigned long long)rsize, (unsigned long long)(pv ? pv->id : 0));
      goto fail;
    }
    if (!nf__capture_ok(p, b, s)) { // ordering after the block's streams needs event calls: not in a capture
      nf__tlsf_insert(nf__tlsf_of(p, b), b);
      st = nf__error(NF_ERR_INVALID, "nofrag: nf_alloc_at: [%p, +%llu B) was freed on another stream whose work "
                     "is not known complete, and a stream is being captured (no event call possible)",
                     (void *)at, (unsigned long long)rsize);
      goto fail;
    }
    off = at - b->addr;
    if ((st = place_block(p, &b, off, rsize, s, false)) != NF_OK) goto fail;
    b->memo = false;
    goto placed;
  }
  b = nf__place(p, tl, arena, rsize, s, &off, &mapped);
  // Blocks freed with record_stream wait on the pending list until their
  // extra streams' work is done. Before this request maps memory, the done
  // ones go back (event queries, no host wait; as PyTorch's allocator polls
  // its events at each malloc): else a loop that frees every block with a
  // record_stream grew the pool to its limit (the whole device, uncapped)
  // before stitching's blocking poll ever released one.
  if (NF_UNLIKELY(p->pending != NULL) && (!b || !mapped) && !p->capture_mask) {
    if (b) nf__tlsf_insert(nf__tlsf_of(p, b), b);
    (void)nf__pending_poll(p, false); // a failed query: the blocking poll at the limit reports it
    b = nf__place(p, tl, arena, rsize, s, &off, &mapped);
  }
  if (NF_UNLIKELY(!b)) {
    if ((st = pv ? nf__priv_chunk_new(p, pv, arena, rsize) : nf__chunk_new(p, arena, rsize)) != NF_OK) goto fail;
    if (!(b = nf__place(p, tl, arena, rsize, s, &off, &mapped))) {
      st = nf__error(NF_ERR_INVALID, "nofrag: internal error: fresh range not found");
      goto fail;
    }
  }
  bool memo = mapped; // placed with no mapping (bin_pop)
  for (int attempt = 0;; attempt++) {
    if ((st = place_block(p, &b, off, rsize, s, mapped)) == NF_OK) break;
    memo = false;
    // Out of granules: once stitching has unmapped every cached granule, the
    // placement needing the fewest new ones may still fit.
    if (st != NF_ERR_OOM || attempt || !(b = nf__place_min(p, tl, rsize, s, &off, &mapped))) break;
  }
  // Still out of granules: maybe one fewer, its first shared with another
  // block's last (edge.c; config `edges`). The OOM's message stands if not.
  if (NF_UNLIKELY(st == NF_ERR_OOM) && !pv && p->cfg.edges) st = nf__edge_place(p, rsize, s, &b);
  if (st != NF_OK) goto fail;
  b->memo = memo;
placed:
  nf__map_insert(p, b); // room made above (placement only removes entries: bins flushed)
popped:
  return alloc_done(p, b, size, rsize, s, stream);
fail:;
  p->fx++;
  // Growth creates granules up to the limit before it finds the request does
  // not fit: they go back (what stitching unmapped on the way stays cache).
  nf__granules_unmake(p, dev0, host0);
  bool print = fail_oom(p, size, rsize, stream, st);
  nf__pub_full(p);
  nf__pool_unlock(p);
  if (print) p->obs.oom_print(); // outside the lock: stderr may block
  return NULL;
}

// Explain a pointer that is not a live block's start, for the error message.
// `probe`: one outside every chunk is another pool's (NF_ERR_FOREIGN, quiet).
static nf_status_t bad_free(nf_pool_t *p, const void *ptr, bool probe) {
  uintptr_t a = (uintptr_t)ptr;
  nf_chunk_t *c = p->chunks;
  while (c && (a < c->base || a >= c->base + c->size)) c = c->next;
  if (probe && !c) return NF_ERR_FOREIGN;
  p->st.invalid_frees++;
  if (c) {
    for (nf_block_t *b = c->first; b; b = b->next) {
      if (a < b->addr || a >= b->addr + b->size) continue;
      if (b->state == NF_BLK_LIVE)
        return nf__error(NF_ERR_INVALID, "nofrag: free of %p: interior pointer of the block at %p (%llu B)",
                         ptr, (void *)b->addr, (unsigned long long)b->req);
      return nf__error(NF_ERR_INVALID, "nofrag: free of %p: not a live block (double free?)", ptr);
    }
  }
  return nf__error(NF_ERR_INVALID, "nofrag: free of %p: pointer not allocated by this pool", ptr);
}

// Release policy with decay, after each free: cached memory goes back only
// once it stayed cached through a whole epoch of release_after frees and
// release_idle_ms (pool clock), and only what stayed: the epoch's low point
// above half the threshold. Between two frees, allocations lower the cached
// bytes (or raise them by the unused tail of a granule they map), so the
// level just before each free (now less the `freed` bytes: the free maps and
// unmaps nothing before this) is the low point since the last one, to within
// that tail: a training step's peak, where the cache is nearly
// empty, ends the epoch and the swing stays cached however many frees the
// step makes. (Sampling after the free instead missed the peak whenever the
// first free after it was large, and released 12,006 granules in the middle
// of a GPT-2 run on an 80 GB H100.) Not during a capture: unmapping is a
// driver call the capture may forbid.
static NF_NOINLINE void release_epoch(nf_pool_t *p, uint64_t freed, uint64_t now);
static inline void release_note(nf_pool_t *p, uint64_t freed) {
  uint64_t now = nf__cached(p);
  if (NF_LIKELY(now <= p->cfg.release_threshold) || p->capture_mask) p->rel_frees = 0;
  else release_epoch(p, freed, now);
}
static void release_epoch(nf_pool_t *p, uint64_t freed, uint64_t now) {
  uint64_t thr = p->cfg.release_threshold;
  uint64_t pre = now > freed ? now - freed : 0;
  if (pre <= thr || !p->rel_frees) { // a new epoch, from this free's level
    p->rel_frees = 1;
    p->rel_low = now;
    p->rel_t0 = p->cfg.release_idle_ms ? p->clock(p->clock_ctx) : 0;
  } else {
    p->rel_frees++;
    if (pre < p->rel_low) p->rel_low = pre;
  }
  if (p->rel_frees - 1 < p->cfg.release_after) return;
  if (p->cfg.release_idle_ms) { // the clock is read every 64th free only
    if ((p->rel_frees & 63) && p->cfg.release_after) return;
    uint64_t t = p->clock(p->clock_ctx);
    if (t < p->rel_t0 || t - p->rel_t0 < p->cfg.release_idle_ms * 1000000ull) return; // (a clock gone back: wait)
  }
  nf__maybe_release(p, p->rel_low < now ? p->rel_low : now);
  p->rel_frees = 0;
}

// The bookkeeping every free of a live block does (free_hot, free_locked):
// its free tick and stream, and the pool's counters.
static inline void free_tick(nf_pool_t *p, nf_block_t *b) {
  b->tick = ++p->tick;
  b->smask = 1ull << b->stream;
  p->streams[b->stream].last_free = b->tick;
}
static inline void free_count(nf_pool_t *p, const nf_block_t *b) {
  p->st.live -= b->req;
  p->st.live_rounded -= b->size;
  p->st.live_blocks--;
  p->st.frees++;
}

// ------------------------------------------------------------------ the hot pair
// A free, then an allocation of the same size on the same stream: the cached
// pair, and the loop of a training step's small temporaries. Eagerly, the free
// parks the block in its bin and the allocation pops it again (bin_pop's quiet
// case). Here the free leaves the block un-parked as p->hot when that pop is
// certain, and the allocation takes it back; any other operation parks it
// first (nf__pool_lock, nf__bins_flush), before it looks at anything, so every
// operation sees what the eager park would have left: the bins' figures, and
// so replay's, do not change. The free itself is the whole of nf_free_ex's for
// a block with nothing pending on it in a pool with nothing unusual going on
// (no views, tiers, spilled granules, private chunk, hooks, parked large
// block), where nf__bin_park would park it: each condition below is one that
// sends nf_free_ex, nf__bin_parkable or bin_pop elsewhere. The pair then costs ~370
// instructions instead of ~515 (no map lookup, bin list or nf_free_ex's
// branches; docs/benchmarks.md section 14).
static NF_ALWAYS_INLINE bool free_hot(nf_pool_t *p, nf_block_t *b) {
  bool large = b->arena != NF_ARENA_SMALL, memo = b->memo && b->fx == p->fx;
  if (b->where | b->unready | b->extra | (p->bin_large != NULL) | (p->obs.op != NULL) | (p->xfers != 0) |
      (p->tick + 1 < p->ev_hot) | (b->stream >= NF_MAX_STREAMS)) // (NF_STREAM_ORPHAN: free_locked)
    return false;
  nf_bin_t *bin = nf__bin_parkable(p, b, memo);
  if (!bin) return false;
  p->fx++;
  free_tick(p, b);
  b->state = NF_BLK_FREE;
  uint64_t freed = b->size;
  free_count(p, b);
  // Would bin_pop, right after the park, take it for its own stream? (Its
  // park would be the latest event: quiet.)
  bool pop = !p->hot_off && pop_neighbours_ok(b) &&
             (pop_exact(p, memo, freed) || (!large && pop_class_empty(p, freed >> NF_ALIGN_SHIFT)));
  if (pop) {
    b->memo = memo; // as nf__bin_push, which nf__hot_settle calls
    b->fx = p->fx;
    p->hot = b;
  } else {
    nf__bin_push(p, bin, b, memo);
  }
  release_note(p, freed);
  nf__pub_fast(p, false);
  return true;
}

void *nf_alloc(nf_pool_t *p, size_t size, nf_stream_t stream) { return alloc_entry(p, size, stream, false, 0, 0); }

nf_status_t nf_free(nf_pool_t *p, void *ptr) { return nf_free_ex(p, ptr, NULL, 0); }

static nf_status_t free_locked(nf_pool_t *p, nf_block_t *b, void *ptr, size_t *size, unsigned flags);

nf_status_t nf_free_ex(nf_pool_t *p, void *ptr, size_t *size, unsigned flags) {
  if (size) *size = 0;
  if (NF_UNLIKELY(!p)) return nf__error(NF_ERR_INVALID, "nofrag: nf_free: NULL pool");
  if (NF_UNLIKELY(flags & ~NF_FREE_PROBE)) return nf__error(NF_ERR_INVALID, "nofrag: nf_free_ex: unknown flags %#x", flags);
  if (!ptr) return NF_OK;
  nf__pool_lock(p);
  nf_block_t *b = p->last; // freeing the block just allocated: no map lookup
  if (!b || b->addr != (uintptr_t)ptr || b->state != NF_BLK_LIVE) b = nf__map_find(p, (uintptr_t)ptr);
  if (NF_LIKELY(b != NULL) && free_hot(p, b)) {
    if (size) *size = b->req; // before unlocking: another thread may take the block at once
    nf__pool_unlock(p);
    return NF_OK;
  }
  return free_locked(p, b, ptr, size, flags);
}

// Under the lock: every other free (b NULL: not a live block); drops the lock.
static NF_NOINLINE nf_status_t free_locked(nf_pool_t *p, nf_block_t *b, void *ptr, size_t *size, unsigned flags) {
  if (NF_UNLIKELY(!b)) {
    nf_status_t st = bad_free(p, ptr, flags & NF_FREE_PROBE);
    nf__pool_unlock(p);
    return st;
  }
  // Its stream lost its slot to another (stream.c, streams_steal): it gets
  // one again, which its free's tick and mask name. Failed: nothing changed.
  // (Handed to another stream's slot where none can be had: the trace row
  // names the block's own stream all the same.)
  nf_stream_t own = nf__block_stream(p, b);
  nf_status_t hs = nf__block_home_any(p, b);
  if (NF_UNLIKELY(hs != NF_OK)) {
    nf__pool_unlock(p);
    return hs;
  }
  size_t req = b->req; // b may be merged away below
  uint32_t bs = b->stream;
  // Where placement put it, and nothing happened since (bin_pop).
  bool memo = b->memo && b->fx == p->fx, parkable = !(b->where | b->unready);
  p->fx++;
  // A parked large block is released before anything else happens, in the
  // order eager release would have had.
  if (NF_UNLIKELY(p->bin_large != NULL)) {
    nf_block_t *x = p->bin_large;
    nf__bin_unlink(p, x);
    nf__release_block(p, x);
  }
  if (NF_UNLIKELY(b->where)) b->extra |= p->tier.busy(p, b); // set only where a tier moved it
  // Spilled granules this free leaves in a free range are unmapped soon
  // (nf__host_sweep), so that the next blocks land on the device.
  if (NF_UNLIKELY(p->host_mapped > p->offl_granules) && !p->host_sweep) {
    uint64_t g0 = (b->addr - b->chunk->base) >> p->gshift;
    uint64_t g1 = (b->addr + b->size - b->chunk->base + p->granule - 1) >> p->gshift;
    for (uint64_t g = g0; g < g1 && !p->host_sweep; g++)
      p->host_sweep = nf__bit(b->chunk->mapped, g) && p->gran[b->chunk->phys[g]].tier == NF_TIER_HOST;
  }
  free_tick(p, b);
  if (NF_UNLIKELY(b->extra)) {
    nf_status_t st = nf__pending_add(p, b);
    if (st != NF_OK) { nf__pool_unlock(p); return st; }
  } else {
    b->state = NF_BLK_FREE;
  }
  if (NF_UNLIKELY(b->where)) { p->tier.forget(p, b); nf__pub_dirty(p); } // cannot fail: after the last fallible step
  b->unready = 0; // (a free range's readiness is placement's to check)
  if (NF_UNLIKELY(p->obs.op)) p->obs.op(p, false, b->addr, b->req, own);
  uint64_t freed = b->size; // b may be merged away below
  free_count(p, b);
  if (NF_UNLIKELY(b->chunk->priv != NULL)) { b->chunk->priv->live -= b->req; b->chunk->priv->live_blocks--; }
  if (b->state != NF_BLK_FREE || !parkable || !nf__bin_park(p, b, memo)) { // parked: stays in the map
    nf__map_remove(p, b->addr);
    if (b->state == NF_BLK_FREE) block_release(p, b, true);
  }
  release_note(p, freed);
  if (NF_UNLIKELY(p->host_sweep) && p->tick - p->sweep_tick >= 16) nf__host_sweep(p);
  if (NF_UNLIKELY(p->xfers) && !(p->tick & 15) && !p->capture_mask) { // xfers: only a tier queues copies
    p->tier.poll(p, false);
    nf__pub_dirty(p);
  }
  if (NF_UNLIKELY(p->tick < p->ev_hot)) nf__stream_mark(p, bs); // after an eviction wait (stream.c)
  nf__pub_fast(p, false);
  nf__pool_unlock(p);
  if (size) *size = req;
  return NF_OK;
}

nf_status_t nf_record_stream(nf_pool_t *p, void *ptr, nf_stream_t stream) {
  if (!p || !ptr) return nf__error(NF_ERR_INVALID, "nofrag: nf_record_stream: NULL argument");
  nf__pool_lock(p);
  nf_block_t *b = nf__map_find(p, (uintptr_t)ptr);
  uint32_t s = 0;
  nf_status_t st = b ? nf__stream_index_for(p, stream, b, &s) // (b keeps its slot: it names b's free)
                     : nf__error(NF_ERR_INVALID, "nofrag: record_stream of %p: not a live block", ptr);
  if (st == NF_OK && s != b->stream) b->extra |= 1ull << s;
  nf__pool_unlock(p);
  return st;
}

size_t nf_block_size(nf_pool_t *p, const void *ptr) {
  if (!p) return 0;
  nf__pool_lock(p);
  nf_block_t *b = nf__map_find(p, (uintptr_t)ptr);
  size_t n = b ? b->req : 0;
  nf__pool_unlock(p);
  return n;
}

// Entry points of private pools (private_pool.c) and of re-creating a block
// at an address: the same path as nf_alloc.
void *nf_alloc_private(nf_pool_t *p, uint64_t id, size_t size, nf_stream_t stream) {
  if (p && !id) { nf__error(NF_ERR_INVALID, "nofrag: nf_alloc_private: private pool id 0 is the general pool"); return NULL; }
  return alloc_entry(p, size, stream, true, id, 0);
}

void *nf_alloc_at(nf_pool_t *p, uint64_t id, void *addr, size_t size, nf_stream_t stream) {
  if (p && !addr) { nf__error(NF_ERR_INVALID, "nofrag: nf_alloc_at: NULL address"); return NULL; }
  if (p && ((uintptr_t)addr & (NF_ALIGN - 1))) { // a block there would misalign every block after it
    nf__error(NF_ERR_INVALID, "nofrag: nf_alloc_at: %p is not %llu-byte aligned", addr, (unsigned long long)NF_ALIGN);
    return NULL;
  }
  return alloc_entry(p, size, stream, id != 0, id, (uintptr_t)addr);
}
