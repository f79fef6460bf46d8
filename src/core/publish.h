// Counters the core publishes for observers outside the process (`nofrag
// top`): a seqlock-protected array in a buffer the observe layer hands in
// (p->pub; observe/monitor.c maps it in a shared-memory file whose layout is
// observe/monitor_shm.h). Writers are serialised by the pool lock; readers
// (other processes) by the seqlock: `seq` is odd while a write is in
// progress. Fields are relaxed/release atomics so that the protocol is
// data-race free in the C11 sense (and TSan-clean) without fences; on x86
// every one of these stores is a plain mov.
#ifndef NF_CORE_PUBLISH_H
#define NF_CORE_PUBLISH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum {
  NF_PUB_LIVE, NF_PUB_LIVE_PEAK, NF_PUB_ALLOCS, NF_PUB_FREES, // fast path: every alloc/free
  NF_PUB_MAPPED, NF_PUB_PHYSICAL, NF_PUB_LIMIT, NF_PUB_GRANULE,
  NF_PUB_LARGEST_FREE, // may be stale: walked on slow paths at most every 100 ms
  NF_PUB_SPILLED,      // host granules mapped by spill x G
  NF_PUB_OOMS, NF_PUB_RECLAIMS, NF_PUB_BACKEND_CALLS,
  // Appended later: a reader takes from a file the fields its `size` holds
  // (an older writer's file reads 0 for these).
  NF_PUB_OFFLOADED,    // host granules holding nf_offload'ed blocks x G (attached and detached)
  NF_PUB_AWAY,         // live bytes not mapped (disk and detached offloads): fragmentation leaves them out
  NF_PUB_BACKEND_NS,   // nanoseconds in backend calls (nf_stats_t.backend_ns; slow paths)
  NF_PUB_NFIELDS
};
#define NF_PUB_V1_FIELDS 13 // fields of the first layout: the smallest file a reader accepts

typedef struct nf_pub_s {
  _Atomic uint64_t seq;
  _Atomic uint64_t v[NF_PUB_NFIELDS];
} nf_pub_t;

struct nf_pool_s;
// Publish every field (slow paths), under the lock. No-op when p->pub is NULL.
void nf__pub_full(struct nf_pool_s *p);

#endif
