// Private to the offload files (offload.c: host tier, copies in flight,
// public API; offload_disk.c; offload_detached.c: host window and the
// detached host tier).
#ifndef NF_OFFLOAD_H
#define NF_OFFLOAD_H

#include "internal.h"

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
} nf_xfer_t;

// An offloaded block (host: remapped or in flight; detached: hg[] hold the
// owned range; disk: file extent).
typedef struct nf_offl_s {
  struct nf_offl_s *next;
  nf_block_t *b;
  nf_xfer_t *x;  // offload still in flight
  uint64_t n;    // granules moved
  uint64_t off;  // disk: file offset of the owned range
  uint32_t *hg;  // detached: host granule per owned granule
} nf_offl_t;

nf_offl_t *nf__offl_find(nf_pool_t *p, const nf_block_t *b, nf_offl_t ***link);
void nf__xfer_free(nf_xfer_t *x);
void nf__xfer_push(nf_pool_t *p, nf_xfer_t *x);
// After a failure once copies may have been queued on stream s: wait for them
// (a fresh record, else the last one) before their memory is given back.
void nf__xfer_drain(nf_pool_t *p, uint32_t s);
nf_status_t nf__host_take(nf_pool_t *p, uint64_t n, uint32_t *hg);
nf_status_t nf__order_block(nf_pool_t *p, const nf_block_t *b, uint32_t s);

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
