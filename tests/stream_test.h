// Helpers of the stream tests (test_stream.c, test_stream_order.c): white box
// (core.h's stream records), on the host backend with manual events, which
// stand in for GPU work in flight.
#ifndef NF_STREAM_TEST_H
#define NF_STREAM_TEST_H

#include "nf_test.h"
#include "core/core.h"
#include "backend/backend.h"

#define KB 1024ull
#define G (64 * KB)

static inline nf_pool_t *pool(nf_backend_t **be) {
  nf_pool_t *p = nft_pool(be, 1ull << 30, G, "limit:64MiB,small_max:8KiB");
  assert_non_null(p);
  nf_backend_host_set_manual_events(*be, 1);
  return p;
}

// Stream s's slot (made on first use).
static inline uint32_t sidx(nf_pool_t *p, nf_stream_t s) {
  uint32_t x = UINT32_MAX;
  assert_int_equal(nf__stream_index(p, s, &x), NF_OK);
  return x;
}

static inline nf_stats_t stats(nf_pool_t *p) {
  nf_stats_t s;
  nf_stats_get(p, &s);
  return s;
}

// n alloc/free pairs of a small cached block on stream s: n frees (ticks).
static inline void pairs(nf_pool_t *p, nf_stream_t s, int n) {
  for (int i = 0; i < n; i++) {
    void *x = nf_alloc(p, 4 * KB, s);
    assert_non_null(x);
    assert_int_equal(nf_free(p, x), NF_OK);
  }
}

static const nf_stream_t A = (nf_stream_t)1, B = (nf_stream_t)2;

// The pool's end: no unordered reuse, every event completes, the pool checks out.
static inline void done(nf_pool_t *p, nf_backend_t *be) {
  assert_int_equal(nf_backend_host_violations(be), 0);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

#endif
