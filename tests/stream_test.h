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

#define S(x) ((nf_stream_t)(uintptr_t)(x))

// 64 streams 0x100.. each allocate one live block of n bytes (slots 0..63),
// filled with their index; be non-NULL: each stream's kernel on it, in flight.
static inline void fill64(nf_pool_t *p, nf_backend_t *be, char **x, size_t n) {
  for (int i = 0; i < 64; i++) {
    x[i] = nf_alloc(p, n, S(0x100 + i));
    assert_non_null(x[i]);
    if (be) nf_backend_host_use_new(be, S(0x100 + i), x[i], n);
    nft_fill(x[i], n, (uint64_t)i);
  }
}

// fill64's blocks checked and freed.
static inline void free64(nf_pool_t *p, char **x, size_t n) {
  for (int i = 0; i < 64; i++) {
    assert_true(nft_check(x[i], n, (uint64_t)i));
    assert_int_equal(nf_free(p, x[i]), NF_OK);
  }
}

// Every event recorded so far completes, and the offloads' copies with them.
static inline void copies_done(nf_pool_t *p, nf_backend_t *be) {
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
}

// A backend whose event records and stream waits count those on a stream
// the pool has given back (its handle may be a destroyed stream's; CUDA
// fails or crashes on it), white box: the host backend's ops, wrapped
// (gone_watch); gone()->uses counts them.
typedef struct {
  const nf_backend_ops_t *inner;
  nf_backend_ops_t ops;
  nf_pool_t *pool;
  int uses;
} nft_gone_t;
static inline nft_gone_t *gone(void) {
  static nft_gone_t g;
  return &g;
}
static inline bool gone_given_back(nf_stream_t s) {
  const nf_pool_t *p = gone()->pool;
  for (uint32_t i = 0; i < p->nstreams; i++)
    if (p->stream_free >> i & 1 && p->streams[i].handle == s) return true;
  return false;
}
static inline nf_status_t gone_record(nf_backend_t *be, nf_event_t ev, nf_stream_t s) {
  gone()->uses += gone_given_back(s);
  return gone()->inner->event_record(be, ev, s);
}
static inline nf_status_t gone_wait(nf_backend_t *be, nf_stream_t s, nf_event_t ev) {
  gone()->uses += gone_given_back(s);
  return gone()->inner->stream_wait(be, s, ev);
}
static inline void gone_watch(nf_pool_t *p, nf_backend_t *be) {
  nft_gone_t *g = gone();
  g->inner = be->ops;
  g->ops = *be->ops;
  g->ops.event_record = gone_record;
  g->ops.stream_wait = gone_wait;
  be->ops = &g->ops;
  g->pool = p;
  g->uses = 0;
}
static inline void gone_unwatch(nf_backend_t *be) { be->ops = gone()->inner; }

#endif
