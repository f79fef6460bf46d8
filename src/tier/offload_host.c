// Host tier of nf_offload (NF_TIER_HOST, "attached"): the block stays mapped,
// with host granules in place of its device granules once the copy out has
// completed, and nf_prefetch of such a block (or of a block with spilled
// granules). See offload.c for the tiers. Every step keeps a copy of the
// data until it has a second home (a staging range maps the host granules
// at a second address); where a step and then its rollback fail, the
// rollback falls back to what still holds the data, and reports a loss
// only where nothing does.
#include "tier/tier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Cleanup calls are retried 3 times; a range they still cannot unmap or
// release is kept (p->leftover) and tried again at the next tier call and at
// the pool's end: a backend failing for a while must not leak a mapping or
// an address range for the pool's lifetime. True: released.
static bool unstage_try(nf_pool_t *p, uintptr_t stage, uint64_t *mapped, uint64_t size) {
  for (int t = 0; t < 3 && *mapped; t++)
    if (NF_BE(p, unmap, unmap, stage, *mapped) == NF_OK) *mapped = 0;
  for (int t = 0; t < 3 && !*mapped; t++)
    if (NF_BE(p, va_release, va_release, stage, size) == NF_OK) return true;
  return false;
}
static void unstage(nf_pool_t *p, uintptr_t stage, uint64_t mapped, uint64_t size) {
  if (unstage_try(p, stage, &mapped, size)) return;
  nf_xfer_t *x = calloc(1, sizeof *x);
  if (!x) return; // out of host memory too: the range stays for the pool's lifetime
  x->stage = stage;
  x->left = mapped;
  x->n = size >> p->gshift;
  x->next = p->leftover;
  p->leftover = x;
}

void nf__leftover_retry(nf_pool_t *p) {
  char msg[512]; // the caller's message stays
  nf_status_t st = nf_last_status();
  snprintf(msg, sizeof msg, "%s", nf_last_error());
  for (nf_xfer_t **l = &p->leftover; *l;) {
    nf_xfer_t *x = *l;
    if (unstage_try(p, x->stage, &x->left, x->n << p->gshift)) *l = x->next, free(x);
    else l = &x->next;
  }
  nf__error(st, "%s", msg);
}

// Staging: reserve n granules of address space and map host granules hg
// there with access set. On error nothing is left behind.
static nf_status_t stage_map(nf_pool_t *p, nf_xfer_t *x) {
  uint64_t G = p->granule;
  nf_status_t st = NF_BE(p, va_reserve, va_reserve, x->n * G, G, &x->stage);
  if (st != NF_OK) return nf__error(st, "nofrag: offload: reserving a staging range failed: %s", nf__backend_err());
  uint64_t j = 0;
  for (; j < x->n; j++)
    if ((st = NF_BE(p, map, map, x->stage + j * G, G, p->gran[x->hg[j]].handle)) != NF_OK) break;
  if (st == NF_OK && (st = NF_BE(p, set_access, set_access, x->stage, x->n * G)) == NF_OK) return NF_OK;
  nf__error(st, "nofrag: offload: mapping the staging range failed: %s", nf__backend_err());
  unstage(p, x->stage, j * G, x->n * G);
  return st;
}

// (hg[j] UINT32_MAX: none, the host granule went back to the block.)
void nf__stage_drop(nf_pool_t *p, nf_xfer_t *x) {
  if (x->stage) unstage(p, x->stage, x->n * p->granule, x->n * p->granule);
  for (uint64_t j = 0; j < x->n; j++)
    if (x->hg[j] != UINT32_MAX) nf__gran_push_free(p, x->hg[j]);
}

// Take n host granules off the free list (creating them up to spill_limit).
nf_status_t nf__host_take(nf_pool_t *p, uint64_t n, uint32_t *hg) {
  if (p->host_free_count < n) {
    nf_status_t st = nf__host_granules_create(p, n - p->host_free_count);
    // The limit stops creation without a message; a backend out of pinned
    // memory has its own, which says what really ran out.
    if (st == NF_ERR_OOM && p->host_created >= p->max_host_granules) {
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

// Copy each run of consecutive block granules gs[j], j >= *queued, to/from
// the staging range. *queued: the granules j < *queued whose copies were
// queued (by this call or before it).
static nf_status_t copy_runs(nf_pool_t *p, const nf_xfer_t *x, const nf_chunk_t *c, bool to_stage, uint64_t *queued) {
  uint64_t G = p->granule;
  for (uint64_t j = *queued; j < x->n;) {
    uint64_t e = j + 1;
    while (e < x->n && x->gs[e] == x->gs[e - 1] + 1) e++;
    uintptr_t blk = c->base + x->gs[j] * G, stg = x->stage + j * G;
    nf_status_t st = NF_BE(p, copy, copy, to_stage ? stg : blk, to_stage ? blk : stg, (e - j) * G,
                           p->streams[x->s].handle);
    if (st != NF_OK) return nf__error(st, "nofrag: offload copy failed: %s", nf__backend_err());
    *queued = j = e;
  }
  return NF_OK;
}

// Replace the granule mapped at g of c by physical granule i (made ready by
// nf__set_ready); *old gets the one it replaced, for the caller to keep or
// free. On error the old granule is mapped there again (not ready yet) and
// *old is UINT32_MAX; if even that fails, nothing is mapped at g and *old
// gets the old granule back (still holding the data): the caller places a
// granule there again (place) or reports the loss.
static nf_status_t remap_one(nf_pool_t *p, nf_chunk_t *c, uint64_t g, uint32_t i, uint32_t *old) {
  uint64_t G = p->granule;
  uintptr_t va = c->base + g * G;
  uint32_t o = c->phys[g];
  *old = UINT32_MAX;
  nf_status_t st = NF_BE(p, unmap, unmap, va, G);
  if (st != NF_OK) return nf__error(st, "nofrag: remap: unmap failed: %s", nf__backend_err());
  NF_READY(c)[g >> 6] &= ~(1ull << (g & 63));
  p->fx++;
  if ((st = NF_BE(p, map, map, va, G, p->gran[i].handle)) != NF_OK) {
    char msg[300];
    snprintf(msg, sizeof msg, "%s", nf__backend_err());
    for (int t = 0; t < 3; t++) // put the old granule back: it still holds the data
      if (NF_BE(p, map, map, va, G, p->gran[o].handle) == NF_OK)
        return nf__error(st, "nofrag: remap: map failed: %s", msg);
    c->mapped[g >> 6] &= ~(1ull << (g & 63));
    p->gran_mapped--;
    p->host_mapped -= p->gran[o].tier == NF_TIER_HOST;
    *old = o;
    return nf__error(st, "nofrag: remap: map failed (%s) and the old mapping could not be restored", msg);
  }
  p->host_mapped += (p->gran[i].tier == NF_TIER_HOST) - (p->gran[o].tier == NF_TIER_HOST);
  c->phys[g] = i;
  p->gran[i].state = NF_GR_MAPPED;
  *old = o;
  return NF_OK;
}

// Map physical granule i at g of c, where nothing is mapped (a remap whose
// restore failed); retried. Not ready yet (nf__set_ready).
static nf_status_t place(nf_pool_t *p, nf_chunk_t *c, uint64_t g, uint32_t i) {
  nf_status_t st = NF_OK;
  for (int t = 0; t < 3; t++)
    if ((st = NF_BE(p, map, map, c->base + g * p->granule, p->granule, p->gran[i].handle)) == NF_OK) {
      nf__bit_set(c->mapped, g);
      c->phys[g] = i;
      p->gran[i].state = NF_GR_MAPPED;
      p->gran_mapped++;
      p->host_mapped += p->gran[i].tier == NF_TIER_HOST;
      p->fx++;
      return NF_OK;
    }
  return nf__error(st, "nofrag: remap: map failed: %s", nf__backend_err());
}

static bool holds(const nf_chunk_t *c, uint64_t g, uint32_t i) { return nf__bit(c->mapped, g) && c->phys[g] == i; }

// Every granule of the copy is mapped with access (a set access that failed
// 3 times leaves granules without it, until the block's next prefetch).
static bool ready(const nf_chunk_t *c, const nf_xfer_t *x) {
  for (uint64_t j = 0; j < x->n; j++)
    if (!nf__bit(NF_READY(c), x->gs[j])) return false;
  return true;
}

// nf__set_ready, retried.
static nf_status_t ready_retried(nf_pool_t *p, nf_chunk_t *c, uint64_t g0, uint64_t g1) {
  nf_status_t st = NF_OK;
  for (int t = 0; t < 3; t++)
    if ((st = nf__set_ready(p, c, g0, g1)) == NF_OK) break;
  return st;
}

// A mapping unit (units:N) wholly the block's, at virtual granules [u0,
// u0+n) of c, swapped for host granules hg[0..n) that hold its data (the
// copy completed): the driver unmaps a mapping only whole, so the unit goes
// in one unmap (then is released) and each host granule is mapped in its
// place. Where a map fails 3 times the unit is put back whole (*intact: as
// before, not ready); where that fails too, each granule ends with its host
// granule or, where none can be mapped, nothing: *lost counts those, *hole
// is the first.
static nf_status_t unit_swap(nf_pool_t *p, nf_chunk_t *c, uint64_t u0, uint64_t n, const uint32_t *hg,
                             bool *intact, uint64_t *lost, uintptr_t *hole) {
  uint64_t G = p->granule, k = 0, j;
  uintptr_t va = c->base + u0 * G;
  uint32_t head = p->gran[c->phys[u0]].unit - 1;
  nf_status_t st = NF_OK;
  *intact = true;
  for (int t = 0; t < 3; t++)
    if ((st = NF_BE(p, unmap, unmap, va, n * G)) == NF_OK) break;
  if (st != NF_OK) return nf__error(st, "nofrag: remap: unmapping a %llu-granule unit failed: %s",
                                    (unsigned long long)n, nf__backend_err());
  for (uint64_t g = u0; g < u0 + n; g++) nf__bit_clr(NF_READY(c), g);
  p->fx++;
  for (; k < n; k++) {
    for (int t = 0; t < 3; t++)
      if ((st = NF_BE(p, map, map, va + k * G, G, p->gran[hg[k]].handle)) == NF_OK) break;
    if (st != NF_OK) break;
  }
  char msg[300] = "";
  if (k < n) { // back: the host granules mapped so far off, the unit on again
    snprintf(msg, sizeof msg, "%s", nf__backend_err());
    for (j = k; j > 0; j--) {
      nf_status_t su = NF_ERR_BACKEND;
      for (int t = 0; t < 3 && su != NF_OK; t++) su = NF_BE(p, unmap, unmap, va + (j - 1) * G, G);
      if (su != NF_OK) break;
    }
    for (int t = 0; t < 3 && !j; t++)
      if (NF_BE(p, map, map, va, n * G, p->gran[head].handle) == NF_OK)
        return nf__error(st, "nofrag: remap: map failed (%s); the unit is mapped back whole", msg);
    // Neither way whole: host granules [0, j) stay mapped, the rest are
    // tried again (4 times: a granule is lost only after 10 failed maps in
    // a row, as on remap_one's path).
    for (k = j; k < n; k++) {
      nf_status_t sm = NF_ERR_BACKEND;
      for (int t = 0; t < 4 && sm != NF_OK; t++) sm = NF_BE(p, map, map, va + k * G, G, p->gran[hg[k]].handle);
      if (sm == NF_OK) continue;
      nf__bit_clr(c->mapped, u0 + k);
      p->gran_mapped--;
      if (!(*lost)++) *hole = va + k * G;
    }
  }
  *intact = false;
  for (k = 0; k < n; k++)
    if (nf__bit(c->mapped, u0 + k)) {
      c->phys[u0 + k] = hg[k];
      p->host_mapped++;
    }
  nf__unit_unmapped(p, head); // released (or LOOSE until the next release)
  return msg[0] ? nf__error(st, "nofrag: remap: map failed (%s) and the unit could not be mapped again", msg) : NF_OK;
}

// Swap the block's granules gs[j] for nw[j] (j < n), then set access over
// the range. old[j] gets what was replaced (UINT32_MAX: a unit's granule,
// released with it); *done how many were swapped. On error nothing may be
// mapped at gs[*done] (remap_one): old[*done] is then the granule that was
// there. A unit is swapped whole (nf_offload refuses a block over part of
// one); *lost and *hole as unit_swap's.
static nf_status_t remap_all(nf_pool_t *p, nf_chunk_t *c, const uint64_t *gs, const uint32_t *nw, uint32_t *old,
                             uint64_t n, uint64_t *done, uint64_t *lost, uintptr_t *hole) {
  nf_status_t st = NF_OK;
  uint64_t j = 0, u0, un;
  while (j < n) {
    if (NF_UNLIKELY(nf__unit_of(p, c->phys[gs[j]], &u0, &un))) {
      bool intact;
      st = unit_swap(p, c, u0, un, nw + j, &intact, lost, hole);
      if (intact) break;
      for (uint64_t k = 0; k < un; k++) old[j + k] = UINT32_MAX;
      j += un;
      if (st != NF_OK) break;
      continue;
    }
    for (int t = 0; t < 3; t++) // a failed remap leaves the old granule there: retry
      if ((st = remap_one(p, c, gs[j], nw[j], &old[j])) == NF_OK || !nf__bit(c->mapped, gs[j])) break;
    if (st != NF_OK) break;
    j++;
  }
  *done = j;
  // A live block must end up accessible: a failed set-access is retried
  // (granules already swapped cannot be handed back cheaply).
  nf_status_t st2 = n ? ready_retried(p, c, gs[0], gs[n - 1] + 1) : NF_OK;
  return st != NF_OK ? st : st2;
}

// An offload whose copy completed: the host granules take the block's place.
// Where a swap fails the block keeps a granule holding the data (its device
// granule, or where neither mapping survived, either one mapped again: the
// copy completed): it stays intact, offloaded with the granules that moved,
// or on the device (not offloaded) if none did. Only a granule where nothing
// can be mapped loses its data. The message names the block: the failure is
// reported by nf_offload_wait, not by the call that happened to finish it.
nf_status_t nf__host_finish(nf_pool_t *p, nf_xfer_t *x) {
  nf_block_t *b = x->b;
  nf_chunk_t *c = b->chunk;
  uint64_t G = p->granule, done = 0, placed = 0, lost = 0;
  uintptr_t hole = 0;
  uint32_t *old = malloc(x->n * sizeof *old);
  nf_status_t st = old ? remap_all(p, c, x->gs, x->hg, old, x->n, &done, &lost, &hole)
                       : nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  char msg[400];
  snprintf(msg, sizeof msg, "%s", nf__unprefixed(nf_last_error()));
  for (uint64_t j = 0; j < done; j++) // device granules back to the pool (a unit's went with it)
    if (old[j] != UINT32_MAX) nf__gran_push_free(p, old[j]);
  if (st != NF_OK && done < x->n && !nf__bit(c->mapped, x->gs[done])) {
    uint64_t g = x->gs[done];
    if (place(p, c, g, x->hg[done]) != NF_OK && place(p, c, g, old[done]) != NF_OK && !lost++) hole = c->base + g * G;
    if (!holds(c, g, old[done])) nf__gran_push_free(p, old[done]);
    ready_retried(p, c, x->gs[0], x->gs[x->n - 1] + 1);
  }
  free(old);
  unstage(p, x->stage, x->n * G, x->n * G);
  for (uint64_t j = 0; j < x->n; j++) {
    if (holds(c, x->gs[j], x->hg[j])) placed++;
    else nf__gran_push_free(p, x->hg[j]); // not placed: back to the list
  }
  nf_offl_t **link, *o = nf__offl_find(p, b, &link);
  o->x = NULL;
  p->offl_granules += placed;
  o->n += placed;
  if (placed) {
    p->st.offloads++;
  } else { // nothing moved: the block is not offloaded (spilled granules stay spilled)
    p->offl_granules -= o->n;
    *link = o->next;
    free(o);
    b->where = 0;
  }
  if (st == NF_OK) return NF_OK;
  if (hole)
    return nf__error(st, "nofrag: offload of %p: finishing it failed (%s) and no granule could be mapped at %p "
                     "again: %llu B of the block's data are lost (from there)", (void *)b->addr, msg, (void *)hole,
                     (unsigned long long)(lost * G));
  return nf__error(st, "nofrag: offload of %p: finishing it failed (%s); the block is intact, %s%s", (void *)b->addr,
                   msg, placed ? "offloaded in part (prefetch it as usual)" : "still on the device (not offloaded)",
                   ready(c, x) ? "" : ", part of it mapped without access until nf_prefetch");
}

nf_status_t nf__offload_host(nf_pool_t *p, nf_block_t *b, uint32_t s, uint64_t g0, uint64_t g1) {
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
  uint64_t queued = 0;
  if ((st = nf__order_block(p, b, s)) != NF_OK || (st = copy_runs(p, x, c, true, &queued)) != NF_OK ||
      (st = nf__stream_record(p, s)) != NF_OK) {
    if (queued && !nf__xfer_drain(p, s)) { // the copies may still run: they read the block, write the staging range
      nf__prefetched_on(b, s);             // the block's free waits for them too
      nf__xfer_defer(p, x, s);
      free(o);
      return st;
    }
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

// A prefetch failed after granules were swapped: block granule gs[j] holds
// dev[j] instead of hg[j], or nothing (a swap whose restore failed); copies
// into dev[j], j < landed, were queued. The host granules keep the data,
// mapped at the staging range too. Put them back, except where a copy may
// still be writing dev[j] (`waited` false: the wait for the copies failed):
// that granule stays, filled in stream order. Where a host granule cannot go
// back, dev[j] keeps the data if its copy was queued, else it is copied from
// the staging range into it; only where that fails too is the data there
// lost. The staging range goes, and every granule not mapped at the block is
// freed, once the copies are known done; else the range and the host granules
// the copies read wait for them (nf__xfer_defer: x is the list's, *deferred).
// Those that end on the device leave o's count (o NULL: a spilled block).
// fate: n entries of scratch. Returns the bytes lost, *first the first lost
// address.
static uint64_t prefetch_undo(nf_pool_t *p, nf_chunk_t *c, nf_xfer_t *x, const uint32_t *dev, uint64_t landed,
                              bool waited, uint32_t *fate, nf_offl_t *o, uintptr_t *first, bool *deferred) {
  enum { HOST, FILLED, COPIED, LOST }; // COPIED: by a copy here
  uint64_t G = p->granule, lost = 0;
  for (uint64_t j = waited ? 0 : landed; j < x->n; j++) {
    uint64_t g = x->gs[j];
    uint32_t old;
    for (int t = 0; t < 3 && holds(c, g, dev[j]); t++) remap_one(p, c, g, x->hg[j], &old);
    if (!nf__bit(c->mapped, g) && place(p, c, g, x->hg[j]) != NF_OK) place(p, c, g, dev[j]);
  }
  ready_retried(p, c, x->gs[0], x->gs[x->n - 1] + 1);
  bool queued = false;
  for (uint64_t j = 0; j < x->n; j++) {
    uint64_t g = x->gs[j];
    fate[j] = holds(c, g, x->hg[j]) ? HOST : holds(c, g, dev[j]) && j < landed ? FILLED : LOST;
    if (fate[j] == LOST && holds(c, g, dev[j]) && nf__bit(NF_READY(c), g)) {
      if (NF_BE(p, copy, copy, c->base + g * G, x->stage + j * G, G, p->streams[x->s].handle) == NF_OK)
        fate[j] = COPIED, queued = true;
    }
  }
  // Copies queued here or left running: in stream order they land before
  // anything queued later, provided their source outlives them.
  *deferred = (queued || !waited) && !nf__xfer_drain(p, x->s);
  if (!*deferred) unstage(p, x->stage, x->n * G, x->n * G);
  for (uint64_t j = 0; j < x->n; j++) {
    uint64_t g = x->gs[j];
    if (!holds(c, g, dev[j])) nf__gran_push_free(p, dev[j]); // no copy writes it (j >= landed, or waited for)
    if (fate[j] == HOST) {
      x->hg[j] = UINT32_MAX; // at the block: not the staging range's to free
      continue;
    }
    if (!*deferred) nf__gran_push_free(p, x->hg[j]);
    if (o) o->n--, p->offl_granules--;
    if (fate[j] == LOST) {
      if (!lost) *first = c->base + g * G;
      lost += G;
    }
  }
  if (*deferred) nf__xfer_defer(p, x, x->s);
  return lost;
}

// o: the block's offload record (NULL: a block with spilled granules).
nf_status_t nf__prefetch_host(nf_pool_t *p, nf_block_t *b, nf_offl_t *o, uint32_t s, uint64_t g0, uint64_t g1,
                           bool spilled) {
  nf_chunk_t *c = b->chunk;
  nf_status_t st;
  nf_xfer_t *x = calloc(1, sizeof *x);
  uint32_t *dev = malloc((g1 - g0) * sizeof *dev), *old = malloc((g1 - g0) * sizeof *old);
  if (x) x->gs = malloc((g1 - g0) * sizeof *x->gs);
  if (x) x->hg = malloc((g1 - g0) * sizeof *x->hg);
  if (!x || !dev || !old || !x->gs || !x->hg) {
    st = nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
    goto fail;
  }
  for (uint64_t g = g0; g < g1; g++)
    if (p->gran[c->phys[g]].tier == NF_TIER_HOST) {
      x->gs[x->n] = g;
      x->hg[x->n++] = c->phys[g];
    }
  x->s = s;
  // A set access that failed (retried) in an earlier remap of the block left
  // granules mapped without access: the prefetch sets it over the range.
  if (!x->n) {
    st = nf__set_ready(p, c, g0, g1);
    goto fail;
  }
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
  uint64_t done = 0, queued = 0, nolost = 0;
  uintptr_t nohole = 0; // (no unit here: the block's granules are host granules)
  st = remap_all(p, c, x->gs, dev, old, x->n, &done, &nolost, &nohole);
  if (st == NF_OK) st = nf__set_ready(p, c, g0, g1);
  if (st == NF_OK) st = copy_runs(p, x, c, false, &queued);
  if (st == NF_OK) st = nf__stream_record(p, s);
  bool waited = true;
  if (st != NF_OK) {
    char msg[400];
    snprintf(msg, sizeof msg, "%s", nf__unprefixed(nf_last_error()));
    // Copies queued before the failure land before the granules go back. If
    // they cannot be waited for, they may still be writing the device
    // granules, which then cannot go back: queue the rest instead, and the
    // prefetch completes in stream order. Each way is tried 3 times.
    waited = !queued;
    for (int t = 0; t < 3 && !waited; t++)
      if (!(waited = nf__xfer_drain(p, s)) && copy_runs(p, x, c, false, &queued) == NF_OK) goto prefetched;
    uintptr_t first = 0;
    bool deferred;
    uint64_t lost = prefetch_undo(p, c, x, dev, queued, waited, old, o, &first, &deferred);
    const char *acc = ready(c, x) ? "" : " (part of the block is mapped without access until the next nf_prefetch)";
    if (deferred || !waited) nf__prefetched_on(b, s); // copies into it may still run: its free waits for them
    if (deferred) x = NULL;                          // the copies in flight hold it
    if (lost)
      nf__error(st, "nofrag: nf_prefetch of %p: %s; putting its host memory back failed too: %llu B of the block's "
                "data are LOST (from %p; the rest is intact)%s", (void *)b->addr, msg, (unsigned long long)lost,
                (void *)first, acc);
    else
      nf__error(st, "nofrag: %s%s", msg, acc);
    goto fail;
  }
prefetched:
  x->tick = waited ? p->streams[s].rec_tick : p->tick + 1; // not waited: a record made later (nf__xfer_defer)
  nf__prefetched_on(b, s);
  p->st.prefetches++;
  for (uint64_t j = 0; j < x->n; j++) p->gran[x->hg[j]].state = NF_GR_MAPPED; // until stage_drop
  nf__xfer_push(p, x);
  free(dev);
  free(old);
  return NF_OK;
fail:
  nf__xfer_free(x);
  free(dev);
  free(old);
  return st;
}

