// Detached host tier of nf_offload (NF_TIER_HOST_DETACHED) and the host
// window it copies through.
//
// The attached host tier (offload.c) keeps the block usable in place: host
// granules are mapped at the block, which costs a staging mapping, a remap
// and set-access on host memory per granule moved (~380 us per 2 MiB on the
// H200, docs/benchmarks.md section 3). A detached offload leaves the owned
// range unmapped instead, like the disk tier, with the data in host granules
// that are reachable through the host window: every host granule used here
// is mapped once, for its lifetime, at window + index * granule. A move then
// costs one unmap (offload) or one map + set-access (prefetch) of device
// granules, plus the copy.
//
// offload    take host granules H, copy the owned range into their window
//            addresses on the stream, record. Once the copy completed: unmap
//            the owned range (its granules return to the pool).
// prefetch   map device granules at the owned range, copy H -> block on the
//            stream; H return to the host free list once the copy completed.
#include "tier/tier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WIN_SHIFT 9 // granules per window range: 512 (1 GiB of 2 MiB granules)

static uintptr_t win_addr(const nf_pool_t *p, uint32_t i) {
  return p->win[i >> WIN_SHIFT] + ((uint64_t)(i & ((1u << WIN_SHIFT) - 1)) << p->gshift);
}

// Window address of host granule i, mapping it there first if needed.
static nf_status_t win_map(nf_pool_t *p, uint32_t i, uintptr_t *va) {
  uint64_t k = i >> WIN_SHIFT;
  if (k >= p->win_n) {
    uint64_t n = k + 1 > 2 * p->win_n ? k + 1 : 2 * p->win_n;
    uintptr_t *w = realloc(p->win, n * sizeof *w);
    if (!w) return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
    memset(w + p->win_n, 0, (n - p->win_n) * sizeof *w);
    p->win = w;
    p->win_n = n;
  }
  nf_status_t st;
  if (!p->win[k] && (st = NF_BE(p, va_reserve, va_reserve, p->granule << WIN_SHIFT, p->granule, &p->win[k])) != NF_OK)
    return nf__error(st, "nofrag: offload: reserving the host window failed: %s", nf__backend_err());
  *va = win_addr(p, i);
  if (p->gran[i].win == 1) return NF_OK;
  if (!p->gran[i].win && (st = NF_BE(p, map, map, *va, p->granule, p->gran[i].handle)) != NF_OK)
    return nf__error(st, "nofrag: offload: mapping a host granule at the window failed: %s", nf__backend_err());
  if ((st = NF_BE(p, set_access, set_access, *va, p->granule)) != NF_OK) {
    nf__error(st, "nofrag: offload: set access on the host window failed: %s", nf__backend_err());
    for (int t = 0; t < 3; t++)
      if (NF_BE(p, unmap, unmap, *va, p->granule) == NF_OK) {
        p->gran[i].win = 0;
        return st;
      }
    p->gran[i].win = 2; // still mapped there, without access: set at the next use, unmapped at release
    return st;
  }
  p->gran[i].win = 1;
  return NF_OK;
}

nf_status_t nf__win_unmap(nf_pool_t *p, uint32_t i) {
  if (!p->gran[i].win) return NF_OK;
  nf_status_t st = NF_BE(p, unmap, unmap, win_addr(p, i), p->granule);
  if (st != NF_OK) return nf__error(st, "nofrag: unmapping a host granule from the window failed: %s", nf__backend_err());
  p->gran[i].win = 0;
  return NF_OK;
}

void nf__win_destroy(nf_pool_t *p) {
  for (uint64_t k = 0; k < p->win_n; k++)
    if (p->win[k]) NF_BE(p, va_release, va_release, p->win[k], p->granule << WIN_SHIFT);
  free(p->win);
  p->win = NULL;
  p->win_n = 0;
}

// Copy between the block's granules [g0, g0 + n) and the window addresses
// of hg[], one copy per run of consecutive window addresses. *queued: some
// copy was queued.
static nf_status_t copy_window(nf_pool_t *p, const nf_chunk_t *c, uint64_t g0, const uint32_t *hg, uint64_t n,
                               uint32_t s, bool out, bool *queued) {
  uint64_t G = p->granule;
  nf_status_t st = NF_OK;
  for (uint64_t j = 0, e; j < n; j = e) {
    uintptr_t w = 0, we = 0; // set by win_map (initialised for the compiler's flow analysis)
    if ((st = win_map(p, hg[j], &w)) != NF_OK) return st;
    for (e = j + 1; e < n; e++) {
      if ((st = win_map(p, hg[e], &we)) != NF_OK) return st;
      if (we != w + (e - j) * G) break;
    }
    uintptr_t blk = c->base + (g0 + j) * G;
    st = NF_BE(p, copy, copy, out ? w : blk, out ? blk : w, (e - j) * G, p->streams[s].handle);
    if (st != NF_OK) return nf__error(st, "nofrag: offload copy failed: %s", nf__backend_err());
    *queued = true;
  }
  return NF_OK;
}

nf_status_t nf__offload_detached(nf_pool_t *p, nf_block_t *b, uint32_t s, uint64_t g0, uint64_t g1) {
  uint64_t n = g1 - g0;
  nf_xfer_t *x = calloc(1, sizeof *x);
  nf_offl_t *o = calloc(1, sizeof *o);
  if (x) x->hg = malloc(n * sizeof *x->hg);
  if (!x || !o || !x->hg) {
    nf__xfer_free(x);
    free(o);
    return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  }
  nf_status_t st = nf__host_take(p, n, x->hg);
  if (st != NF_OK) { nf__xfer_free(x); free(o); return st; }
  bool queued = false;
  if ((st = nf__order_block(p, b, s)) != NF_OK || (st = copy_window(p, b->chunk, g0, x->hg, n, s, true, &queued)) != NF_OK ||
      (st = nf__stream_record(p, s)) != NF_OK) {
    x->n = n;
    if (queued && !nf__xfer_drain(p, s)) { // the copies may still run: they read the block, write the host granules
      nf__prefetched_on(b, s);             // the block's free waits for them too
      nf__xfer_defer(p, x, s);
      free(o);
      return st;
    }
    for (uint64_t j = 0; j < n; j++) nf__gran_push_free(p, x->hg[j]);
    nf__xfer_free(x);
    free(o);
    return st;
  }
  *x = (nf_xfer_t){.b = b, .n = n, .hg = x->hg, .g0 = g0, .s = s, .tick = p->streams[s].rec_tick, .detached = true};
  o->b = b;
  o->x = x;
  o->next = p->offl;
  p->offl = o;
  b->where = NF_TIER_HOST_DETACHED;
  nf__xfer_push(p, x);
  return NF_OK;
}

// The copy out completed: unmap the owned range. If that fails the block
// keeps its device granules (they hold the data too) and is not offloaded;
// the message names it (nf_offload_wait reports it, offload.c).
nf_status_t nf__detached_finish(nf_pool_t *p, nf_xfer_t *x) {
  nf_block_t *b = x->b;
  nf_offl_t **link, *o = nf__offl_find(p, b, &link);
  nf_status_t st = nf__unmap_run(p, b->chunk, x->g0, x->g0 + x->n);
  if (st != NF_OK) {
    for (uint64_t j = 0; j < x->n; j++) nf__gran_push_free(p, x->hg[j]);
    *link = o->next;
    free(o);
    b->where = 0;
    return nf__error(st, "nofrag: offload of %p (detached): finishing it failed (unmap failed: %s); the block is "
                     "intact, still on the device (not offloaded)", (void *)b->addr, nf__backend_err());
  }
  p->away_granules += x->n;
  p->detached_granules += x->n;
  o->hg = x->hg;
  o->n = x->n;
  o->x = NULL;
  x->hg = NULL;
  p->st.offloads++;
  return NF_OK;
}

nf_status_t nf__prefetch_detached(nf_pool_t *p, nf_block_t *b, nf_offl_t *o, uint32_t s, uint64_t g0, uint64_t g1) {
  nf_chunk_t *c = b->chunk;
  nf_xfer_t *x = calloc(1, sizeof *x);
  if (!x) return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  p->away_granules -= o->n; // mapping counts the range as new granules
  nf_status_t st = nf__map_range(p, c, g0, g1, o->n << p->gshift, false);
  if (st == NF_ERR_OOM) nf__prefetch_oom(p, o->n);
  bool queued = false, waited = true;
  if (st == NF_OK && (st = copy_window(p, c, g0, o->hg, o->n, s, false, &queued)) == NF_OK) st = nf__stream_record(p, s);
  // Copies that cannot be waited for may still be writing the range, which
  // then cannot be unmapped: all of them are queued again instead (the host
  // granules hold the data), and the prefetch completes in stream order.
  // Each way is tried 3 times.
  for (int t = 0; t < 3 && st != NF_OK && queued && !(waited = nf__xfer_drain(p, s)); t++)
    if (copy_window(p, c, g0, o->hg, o->n, s, false, &queued) == NF_OK) st = NF_OK;
  if (st != NF_OK) {
    // Back to detached: the range is unmapped again (the host granules kept
    // the data). A granule that cannot be unmapped stays, marked not ready:
    // the next prefetch maps around it and copies into it (nf_pool_check).
    // (Copies neither waited for nor queued again, 3 times each: the unmap
    // goes ahead under them, the one case left.)
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nf_last_error());
    for (uint64_t g = g0; g < g1; g++) {
      for (int t = 0; t < 3 && nf__bit(c->mapped, g); t++) nf__unmap_run(p, c, g, g + 1);
      if (nf__bit(c->mapped, g)) nf__bit_clr(NF_READY(c), g);
    }
    p->away_granules += o->n;
    free(x);
    nf__error(st, "%s", msg);
    return st;
  }
  *x = (nf_xfer_t){.n = o->n, .hg = o->hg, .s = s, .tick = waited ? p->streams[s].rec_tick : p->tick + 1};
  p->detached_granules -= o->n;
  o->hg = NULL;
  o->n = 0;
  nf__xfer_push(p, x);
  p->st.prefetches++;
  return NF_OK;
}

nf_status_t nf__detached_check(nf_pool_t *p, uint8_t *seen) {
  for (nf_offl_t *o = p->offl; o; o = o->next)
    for (uint64_t j = 0; j < o->n && o->hg; j++) {
      uint32_t i = o->hg[j];
      if (seen[i] || p->gran[i].tier != NF_TIER_HOST || p->gran[i].state != NF_GR_MAPPED)
        return nf__error(NF_ERR_INVALID, "check: host granule %u of a detached block is also in use elsewhere or "
                         "in a bad state", i);
      seen[i] = 1;
    }
  return NF_OK;
}

// A detached block is freed: its host granules go back (the range stays
// unmapped; free ranges may be).
void nf__detached_forget(nf_pool_t *p, nf_offl_t *o) {
  for (uint64_t j = 0; j < o->n && o->hg; j++) nf__gran_push_free(p, o->hg[j]);
  p->detached_granules -= o->n;
  p->away_granules -= o->n;
  free(o->hg);
  o->hg = NULL;
  o->n = 0;
}
