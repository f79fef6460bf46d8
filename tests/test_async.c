// Async access (src/core/async.c, config async:1): the access calls of an
// allocation are recorded and made by a worker thread; the allocating stream
// waits for them (on the host backend: the caller waits, as its "streams" run
// nothing). Maps and unmaps stay synchronous, and an unmap first waits for
// every job. These tests hold the ordering to account: patterns in every live
// block survive moves, evictions, stitching, trim and limit changes; the pool
// checker runs throughout (it waits for the worker first); a call that fails
// on the worker turns into a clear error, not a hang.
#include "nf_test.h"

#include "backend/backend.h"

#include <pthread.h>

#define G (64 * 1024)

static nf_stats_t stats(nf_pool_t *p) {
  nf_stats_t s;
  nf_stats_get(p, &s);
  return s;
}

typedef struct { void *p; size_t n; uint64_t tag; } slot_t;

// Randomized at a tight limit with three streams, manual events (stream work
// held in flight, so views are busy and unmapping needs the worker to wait),
// a small view budget, record_stream, trim and limit changes. Returns the
// stats at the end.
static nf_stats_t run_random(uint64_t seed, const char *conf) {
  enum { SLOTS = 40 };
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, conf);
  assert_non_null(p);
  nf_backend_host_set_manual_events(be, 1);
  slot_t l[SLOTS] = {{0}};
  uint64_t rng = seed;
  for (int it = 0; it < 2500; it++) {
    int i = (int)(nft_rand(&rng) % SLOTS);
    nf_stream_t s = (nf_stream_t)(uintptr_t)(1 + nft_rand(&rng) % 3);
    uint64_t r = nft_rand(&rng);
    if (l[i].p) {
      if (!nft_check(l[i].p, l[i].n, l[i].tag))
        fail_msg("seed %llu it %d: block lost its data before its free", (unsigned long long)seed, it);
      if (r % 7 == 0) assert_int_equal(nf_record_stream(p, l[i].p, s), NF_OK);
      assert_int_equal(nf_free(p, l[i].p), NF_OK);
      l[i].p = NULL;
    } else {
      size_t n = r % 3 == 0 ? 1 + r % 4096 : 1 + r % (9 * G);
      void *q = nf_alloc(p, n, s);
      if (q) {
        nft_fill(q, n, r);
        l[i] = (slot_t){q, n, r};
      } else {
        assert_int_equal(nf_last_status(), NF_ERR_OOM);
      }
    }
    if (r % 5 == 0) nf_backend_host_complete_events(be);
    if (it % 997 == 500) assert_int_equal(nf_trim(p), NF_OK);
    if (it == 1200) nf_set_limit(p, 40 * G); // may fail (live above it): must stay consistent
    if (it == 1800) assert_int_equal(nf_set_limit(p, 64 * G), NF_OK);
    for (int k = 0; k < SLOTS; k++)
      if (l[k].p && !nft_check(l[k].p, l[k].n, l[k].tag))
        fail_msg("seed %llu it %d: block %d (%zu B at %p) lost its data", (unsigned long long)seed, it, k, l[k].n,
                 l[k].p);
    if (it % 16 == 0 && nf_pool_check(p) != NF_OK)
      fail_msg("seed %llu it %d: %s", (unsigned long long)seed, it, nf_last_error());
  }
  nf_backend_host_complete_events(be);
  for (int k = 0; k < SLOTS; k++)
    if (l[k].p) {
      assert_true(nft_check(l[k].p, l[k].n, l[k].tag));
      assert_int_equal(nf_free(p, l[k].p), NF_OK);
    }
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_stats_t s = stats(p);
  // What the backend holds is what the metadata says (the worker is done).
  uint64_t gr = 0, mp = 0;
  nf_backend_host_usage(be, &gr, &mp);
  assert_int_equal(gr, s.physical / G);
  nf_pool_destroy(p);
  nf_backend_host_usage(be, &gr, &mp);
  assert_int_equal(gr + mp, 0);
  nf_backend_destroy(be);
  return s;
}

static void test_random_patterns(void **state) {
  for (uint64_t seed = 1; seed <= 4; seed++) {
    nf_stats_t s = run_random(seed, "limit:48MiB,views:6,small_max:8KiB,async:1");
    // Views were moved (access set by the worker) and evicted.
    assert_true(s.view_moves > 0 && s.view_evictions > 0);
    assert_true(s.calls.stream_wait > 0);
  }
  run_random(nft_env_seed(77), "limit:48MiB,views:64,tight:1,async:1");
  run_random(5, "limit:48MiB,views:0,async:1"); // no views: stitching unmaps (after the worker's jobs)
}

// The same workload with and without async:1 makes the same VMM calls: the
// worker makes exactly the access calls the synchronous path would have.
static void test_same_calls(void **state) {
  uint64_t m[2], u[2], a[2], c[2];
  for (int async = 0; async < 2; async++) {
    nf_backend_t *be;
    nf_pool_t *p = nft_pool(&be, 1ull << 30, G, async ? "limit:24MiB,views:32,async:1" : "limit:24MiB,views:32");
    assert_non_null(p);
    uint64_t rng = 3;
    void *held[8] = {0};
    for (int it = 0; it < 600; it++) {
      int i = (int)(nft_rand(&rng) % 8);
      if (held[i]) {
        nf_free(p, held[i]);
        held[i] = NULL;
      } else {
        size_t n = 1 + nft_rand(&rng) % (40 * G);
        held[i] = nf_alloc(p, n, (nf_stream_t)(uintptr_t)(1 + it % 2));
        if (held[i]) nft_fill(held[i], n < 4096 ? n : 4096, (uint64_t)it);
      }
    }
    for (int i = 0; i < 8; i++) nf_free(p, held[i]);
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_stats_t s = stats(p);
    m[async] = s.calls.map;
    u[async] = s.calls.unmap;
    a[async] = s.calls.set_access;
    c[async] = s.calls.create;
    nf_pool_destroy(p);
    nf_backend_destroy(be);
  }
  assert_true(m[0] > 100);
  assert_int_equal(m[0], m[1]);
  assert_int_equal(u[0], u[1]);
  assert_int_equal(a[0], a[1]);
  assert_int_equal(c[0], c[1]);
}

// An access call that fails on the worker is reported by the call on the
// pool that waits for it, with the failing call named; later calls fail too
// (the pool's state no longer matches the backend's), nothing hangs, and the
// pool can still be destroyed.
static void test_worker_failure(void **state) {
  nf_backend_t *host, *be;
  assert_int_equal(nf_backend_host_create(&host, 1ull << 30, G), NF_OK);
  assert_int_equal(nf_backend_fault_create(&be, host, 0, 0.0, 1), NF_OK);
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256];
  assert_int_equal(nf_config_parse(&cfg, "limit:64MiB,async:1", err, sizeof err), NF_OK);
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, be, &cfg), NF_OK);
  void *a = nf_alloc(p, 20 * G, NULL);
  assert_non_null(a);
  nft_fill(a, 20 * G, 1);
  nf_backend_fault_only(be, "set_access"); // only the worker sets access
  nf_backend_fault_set(be, 0, 1.0);
  void *b = nf_alloc(p, 30 * G, NULL);
  nf_backend_fault_set(be, 0, 0.0);
  assert_null(b);
  assert_int_equal(nf_last_status(), NF_ERR_BACKEND);
  assert_non_null(strstr(nf_last_error(), "async access: set access on"));
  assert_non_null(strstr(nf_last_error(), "injected fault"));
  assert_non_null(strstr(nf_last_error(), "unusable"));
  assert_null(nf_alloc(p, 100, NULL));
  assert_int_equal(nf_last_status(), NF_ERR_BACKEND);
  assert_true(nft_check(a, 20 * G, 1)); // what was mapped before stays
  nf_free(p, a);
  uint64_t calls = 0, failed = 0;
  nf_backend_fault_counts(be, &calls, &failed);
  assert_int_equal(failed, 1);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// Without flags in the backend (a backend that cannot hold a stream), or
// with a bad value, async:1 is refused with a clear message.
static void test_config(void **state) {
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256];
  assert_int_equal(cfg.async, 0);
  assert_int_equal(nf_config_parse(&cfg, "async:2", err, sizeof err), NF_ERR_CONFIG);
  assert_non_null(strstr(err, "async"));
  assert_int_equal(nf_config_parse(&cfg, "async:1", err, sizeof err), NF_OK);
  assert_int_equal(cfg.async, 1);
  char buf[1024];
  nf_config_format(&cfg, buf, sizeof buf);
  assert_non_null(strstr(buf, "async:1"));
}

// Two threads allocate and free on their own streams at the limit (TSan
// covers the worker, the flag and the pool lock).
typedef struct { nf_pool_t *p; uint64_t seed; int bad; } thr_t;
static void *thr_main(void *arg) {
  thr_t *t = arg;
  uint64_t rng = t->seed;
  void *held[6] = {0};
  size_t sz[6] = {0};
  for (int it = 0; it < 800; it++) {
    int i = (int)(nft_rand(&rng) % 6);
    if (held[i]) {
      t->bad += !nft_check(held[i], sz[i], (uint64_t)(uintptr_t)held[i] ^ t->seed);
      nf_free(t->p, held[i]);
      held[i] = NULL;
    } else {
      sz[i] = 1 + nft_rand(&rng) % (12 * G);
      held[i] = nf_alloc(t->p, sz[i], (nf_stream_t)(uintptr_t)(t->seed));
      if (held[i]) nft_fill(held[i], sz[i], (uint64_t)(uintptr_t)held[i] ^ t->seed);
    }
  }
  for (int i = 0; i < 6; i++)
    if (held[i]) {
      t->bad += !nft_check(held[i], sz[i], (uint64_t)(uintptr_t)held[i] ^ t->seed);
      nf_free(t->p, held[i]);
    }
  return NULL;
}

static void test_threads(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:12MiB,views:16,async:1");
  assert_non_null(p);
  pthread_t th[2];
  thr_t t[2] = {{p, 1, 0}, {p, 2, 0}};
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, thr_main, &t[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  assert_int_equal(t[0].bad + t[1].bad, 0);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_random_patterns), cmocka_unit_test(test_same_calls),
                                     cmocka_unit_test(test_worker_failure), cmocka_unit_test(test_config),
                                     cmocka_unit_test(test_threads)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
