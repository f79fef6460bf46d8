// The tier layer's private header: same-address moves of live blocks between
// the device and host memory or disk (offload.c: copies in flight, the public
// nf_offload/nf_prefetch API and the hooks the core is handed; offload_host.c:
// the host tier; offload_disk.c; offload_detached.c: host window and the
// detached host tier).
// Spill (a request backed partly by host granules) is a placement decision
// and lives in the core (core/vmm.c); this layer moves blocks already placed.
#ifndef NF_TIER_H
#define NF_TIER_H

#include "core/core.h"

// The hooks the core calls (nf_tier_hooks_t), filled in by the assembler.
extern const nf_tier_hooks_t nf__tier_hooks;
// Pool teardown, before the core's: waits for copies in flight, frees
// offload records. nf__win_destroy once every host granule is released.
void nf__offload_destroy(nf_pool_t *p);
void nf__win_destroy(nf_pool_t *p);

// offload.c: nf__xfer_poll finishes the copies that completed (blocking: all).
// A finish that fails is kept for nf_offload_wait (p->xfer_err); only a
// failed event call is returned.
nf_status_t nf__xfer_poll(nf_pool_t *p, bool blocking);
// At the device limit: wait for the offload copies in flight that hold
// device granules (none: no wait), so that those granules come back.
nf_status_t nf__xfer_reclaim(nf_pool_t *p);
// True when the block's owned range is unmapped while it is live (disk, or
// a detached offload whose copy completed).
bool nf__block_away(nf_pool_t *p, const nf_block_t *b);
// Called by nf_free for a block with `where` set or an offload in flight:
// settles the offload so that the block can be freed like any other (a copy
// still in flight becomes a record_stream stream of the block).
uint64_t nf__offload_busy(nf_pool_t *p, const nf_block_t *b); // stream mask of its copy in flight
void nf__offload_forget(nf_pool_t *p, nf_block_t *b);
uint64_t nf__xfer_staged(const nf_pool_t *p); // host granules held by copies in flight
// offload_detached.c: the host window (host granules mapped once at a second
// address). nf__win_unmap before releasing a host granule.
nf_status_t nf__win_unmap(nf_pool_t *p, uint32_t i);
// nf_pool_check: the host granules holding detached blocks are marked in
// seen[] (index = granule), none twice, none free.
nf_status_t nf__detached_check(nf_pool_t *p, uint8_t *seen);

// A copy in flight. `b` set: an offload waiting to finish (attached: granules
// gs[j] of b's chunk get hg[j]; detached: the owned range [g0, g0 + n) is
// unmapped, hg[] keep the data). NULL: host granules hg[] to give back once
// the copy is done (unmapping the staging range first, if `stage`).
typedef struct nf_xfer_s {
  struct nf_xfer_s *next;
  nf_block_t *b;
  uintptr_t stage; // 0: none (detached copies go through the host window)
  uint64_t n;
  uint64_t *gs;    // block granule index per staging granule (attached)
  uint32_t *hg;    // host granule j (attached: mapped at stage + j*G)
  uint64_t g0;     // detached: first owned granule of b
  uint32_t s;      // stream of the copy
  uint64_t tick;   // its record
  bool detached;
  uint64_t left; // a leftover (p->leftover): bytes still mapped at stage, of n granules reserved
} nf_xfer_t;

// An offloaded block (host: remapped or in flight; detached: hg[] hold the
// owned range; disk: file extent).
typedef struct nf_offl_s {
  struct nf_offl_s *next;
  nf_block_t *b;
  nf_xfer_t *x;  // offload still in flight
  uint64_t n;    // host: host granules holding the block (spilled ones too); else granules moved
  uint64_t off;  // disk: file offset of the owned range
  uint32_t *hg;  // detached: host granule per owned granule
} nf_offl_t;

nf_offl_t *nf__offl_find(nf_pool_t *p, const nf_block_t *b, nf_offl_t ***link);
void nf__xfer_free(nf_xfer_t *x);
void nf__xfer_push(nf_pool_t *p, nf_xfer_t *x);
// After a failure once copies may have been queued on stream s: wait for them
// (a fresh record, retried; else the last one) before their memory is given
// back. The failure being handled keeps its status and message. False: no
// fresh record could be waited for (the copies are not known to be done).
bool nf__xfer_drain(nf_pool_t *p, uint32_t s);
// When that wait failed, what the copies may still touch must not be unmapped
// or handed out before a later wait proves them done (on a GPU they may run
// yet: an unmap under them faults, a granule handed out would be written by
// them). x's staging range (if any) and host granules hg[] go to the copies
// in flight instead of back now, dropped (nf__stage_drop) by the first poll
// whose record, made after this call, has completed.
void nf__xfer_defer(nf_pool_t *p, nf_xfer_t *x, uint32_t s);
nf_status_t nf__order_block(nf_pool_t *p, const nf_block_t *b, uint32_t s);
nf_status_t nf__prefetch_oom(nf_pool_t *p, uint64_t n); // NF_ERR_OOM, with a message

// A copy back into b was queued on stream s: like record_stream, s counts
// as a user of the block, so a free on the block's own stream does not let
// its range be reused or unmapped (nor a later offload read it) before the
// copy has landed.
static inline void nf__prefetched_on(nf_block_t *b, uint32_t s) {
  if (s != b->stream) b->extra |= 1ull << s;
}

// offload_host.c. nf__host_finish: the copy out of x completed, host
// granules take the block's place (an error names the block: nf__xfer_poll
// defers it). nf__stage_drop: a prefetch's copy completed, its host granules
// go back. nf__prefetch_host: o NULL for a block with spilled granules
// (spilled: it may be in use, its streams are waited for).
nf_status_t nf__host_take(nf_pool_t *p, uint64_t n, uint32_t *hg);
nf_status_t nf__offload_host(nf_pool_t *p, nf_block_t *b, uint32_t s, uint64_t g0, uint64_t g1);
nf_status_t nf__host_finish(nf_pool_t *p, nf_xfer_t *x);
void nf__stage_drop(nf_pool_t *p, nf_xfer_t *x);
// Staging ranges a failing backend left mapped or reserved (p->leftover): released where it now can.
void nf__leftover_retry(nf_pool_t *p);
nf_status_t nf__prefetch_host(nf_pool_t *p, nf_block_t *b, nf_offl_t *o, uint32_t s, uint64_t g0, uint64_t g1,
                              bool spilled);

// offload_disk.c
nf_status_t nf__offload_disk(nf_pool_t *p, nf_block_t *b, uint32_t s, uint64_t g0, uint64_t g1);
nf_status_t nf__prefetch_disk(nf_pool_t *p, nf_block_t *b, nf_offl_t *o, uint32_t s, uint64_t g0, uint64_t g1);
void nf__disk_forget(nf_pool_t *p, nf_offl_t *o);

// offload_detached.c
nf_status_t nf__offload_detached(nf_pool_t *p, nf_block_t *b, uint32_t s, uint64_t g0, uint64_t g1);
nf_status_t nf__detached_finish(nf_pool_t *p, nf_xfer_t *x);
nf_status_t nf__prefetch_detached(nf_pool_t *p, nf_block_t *b, nf_offl_t *o, uint32_t s, uint64_t g0, uint64_t g1);
void nf__detached_forget(nf_pool_t *p, nf_offl_t *o);

#endif
