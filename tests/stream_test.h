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

#endif
