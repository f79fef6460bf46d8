// Publishing the core's counters into an observer's buffer (publish.h): the
// slow path that writes every field. The fast path (two or three counters
// per alloc/free) is nf__pub_fast in core.h.
#include "core/core.h"

#include <time.h>

_Static_assert(NF_PUB_V1_FIELDS == NF_PUB_OFFLOADED, "fields are only appended after the first layout");

static uint64_t mono_ns(void) {
  struct timespec ts; // coarse: a 100 ms rate limit needs no more
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void nf__pub_full(nf_pool_t *p) {
  nf_pub_t *m = p->pub;
  if (!m) return;
  uint64_t v[NF_PUB_NFIELDS] = {0};
  v[NF_PUB_LIVE] = p->st.live;
  v[NF_PUB_LIVE_PEAK] = p->st.live_peak;
  v[NF_PUB_ALLOCS] = p->st.allocs;
  v[NF_PUB_FREES] = p->st.frees;
  v[NF_PUB_MAPPED] = p->gran_mapped << p->gshift;
  v[NF_PUB_PHYSICAL] = p->gran_created << p->gshift;
  v[NF_PUB_LIMIT] = p->cfg.limit;
  v[NF_PUB_GRANULE] = p->granule;
  // The walk is O(blocks + granules): one per 100 ms window, plus up to 3
  // more when the mapping changed, else the last value stands (a workload
  // that maps often must not pay a walk per mapping change; periodic ticks
  // walk as before). The allowance covers the burst of mappings after a pool
  // opens, so an idle pool does not keep the value from before its last
  // mappings (top showed LARGEST 0B); a skipped walk marks the value stale
  // until the next one (every 4096th op, or nf_stats_get, which publishes).
  uint64_t now = mono_ns();
  bool window = p->pub_lf_ns && now - p->pub_lf_ns < 100000000ull;
  bool remapped = p->gran_mapped != p->pub_mapped || p->gran_created != p->pub_created; // not a periodic tick
  if (!window || (remapped && p->pub_lf_burst < 4)) {
    v[NF_PUB_LARGEST_FREE] = nf__largest_free_mapped(p, NULL);
    if (!window) { p->pub_lf_ns = now; p->pub_lf_burst = 0; }
    p->pub_lf_burst++;
    p->pub_lf_stale = false;
  } else {
    v[NF_PUB_LARGEST_FREE] = atomic_load_explicit(&m->v[NF_PUB_LARGEST_FREE], memory_order_relaxed);
    p->pub_lf_stale = true;
  }
  v[NF_PUB_SPILLED] = (p->host_mapped - p->offl_granules) << p->gshift;
  v[NF_PUB_OFFLOADED] = (p->offl_granules + p->detached_granules) << p->gshift;
  v[NF_PUB_AWAY] = p->away_granules << p->gshift;
  v[NF_PUB_OOMS] = p->st.ooms;
  v[NF_PUB_RECLAIMS] = p->st.reclaims;
  v[NF_PUB_BACKEND_CALLS] = nf__calls_total(&p->st.calls); // as nf_stats_t's
  v[NF_PUB_BACKEND_NS] = nf__calls_total(&p->st.call_ns);
  uint64_t s = atomic_load_explicit(&m->seq, memory_order_relaxed);
  atomic_store_explicit(&m->seq, s + 1, memory_order_relaxed);
  for (int i = 0; i < NF_PUB_NFIELDS; i++) atomic_store_explicit(&m->v[i], v[i], memory_order_release);
  atomic_store_explicit(&m->seq, s + 2, memory_order_release);
  p->pub_mapped = p->gran_mapped;
  p->pub_created = p->gran_created;
}

