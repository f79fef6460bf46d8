// The pool under backend failures (fault-injection wrapper around the host
// backend): every backend call of a workload is made to fail once in turn;
// the failing request reports an error, the pool stays consistent and usable,
// no live block loses data, and after destroy nothing is left behind. The
// tier layer's faults (offload, prefetch): test_fault_tier.c.
#include "nf_test.h"

#define G (64 * 1024)
enum { SLOTS = 16 };

typedef struct { void *p; size_t n; uint64_t tag; } slot_t;

// A fixed workload that exercises creation, mapping, stitching, streams,
// record_stream, the release policy, trim and limit changes. Returns the
// number of operations that failed.
static int workload(nf_pool_t *p, nf_backend_t *be, uint64_t seed) {
  slot_t l[SLOTS] = {{0}};
  uint64_t rng = seed;
  int failed = 0;
  for (int it = 0; it < 400; it++) {
    int i = (int)(nft_rand(&rng) % SLOTS);
    nf_stream_t s = (nf_stream_t)(uintptr_t)(nft_rand(&rng) % 3);
    if (l[i].p) {
      if (!nft_check(l[i].p, l[i].n, l[i].tag)) fail_msg("seed %llu: data lost", (unsigned long long)seed);
      if (nft_rand(&rng) % 5 == 0 && nf_record_stream(p, l[i].p, s) != NF_OK) failed++;
      if (nf_free(p, l[i].p) != NF_OK) {
        // A failed free leaves the block live and intact; free it later.
        failed++;
        if (!nft_check(l[i].p, l[i].n, l[i].tag)) fail_msg("data lost after failed free");
        continue;
      }
      l[i].p = NULL;
    } else {
      uint64_t r = nft_rand(&rng);
      size_t n = r % 2 ? 1 + r % 4096 : 1 + r % (10 * G);
      void *q = nf_alloc(p, n, s);
      if (!q) {
        assert_int_not_equal(nf_last_status(), NF_OK);
        assert_true(nf_last_error()[0] != 0);
        failed++;
      } else {
        nft_fill(q, n, r);
        l[i] = (slot_t){q, n, r};
      }
    }
    if (it == 200 && nf_trim(p) != NF_OK) failed++;
    if (it == 300 && nf_set_limit(p, 24 * G) != NF_OK) failed++;
    if (it % 50 == 0) {
      if (nf_pool_check(p) != NF_OK) fail_msg("seed %llu it %d: %s", (unsigned long long)seed, it, nf_last_error());
      for (int k = 0; k < SLOTS; k++)
        if (l[k].p && !nft_check(l[k].p, l[k].n, l[k].tag)) fail_msg("data lost at it %d", it);
    }
  }
  // Stop failing, then everything must still work and come back.
  nf_backend_fault_set(be, 0, 0);
  for (int k = 0; k < SLOTS; k++)
    if (l[k].p) {
      if (!nft_check(l[k].p, l[k].n, l[k].tag)) fail_msg("data lost at the end");
      assert_int_equal(nf_free(p, l[k].p), NF_OK);
    }
  assert_int_equal(nf_pool_check(p), NF_OK);
  void *big = nf_alloc(p, 20 * G, NULL);
  assert_non_null(big);
  nft_fill(big, 20 * G, 1);
  assert_true(nft_check(big, 20 * G, 1));
  assert_int_equal(nf_free(p, big), NF_OK);
  return failed;
}

static nf_stats_t last_stats; // of the latest run, before destroy

static void run(uint64_t fail_at, double prob, uint64_t seed, uint64_t *calls_out) {
  nf_backend_t *inner, *be;
  assert_int_equal(nf_backend_host_create(&inner, 1ull << 30, G), NF_OK);
  assert_int_equal(nf_backend_fault_create(&be, inner, 0, 0, seed), NF_OK);
  nf_config_t c;
  nf_config_default(&c);
  c.limit = 32 * G;
  c.small_max = 8192;
  c.release_threshold = 12 * G;
  c.release_after = 8;
  c.release_idle_ms = 0;
  c.views = 4; // views (view.c) made, taken back and evicted all the time
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, be, &c), NF_OK);
  uint64_t base = 0, failed = 0;
  nf_backend_fault_counts(be, &base, &failed);
  nf_backend_fault_set(be, fail_at ? base + fail_at : 0, prob);
  workload(p, be, seed);
  nf_backend_fault_counts(be, calls_out, &failed);
  *calls_out -= base;
  nf_stats_get(p, &last_stats);
  nft_destroy_all(p, be, inner);
}

static void test_each_call_fails_once(void **state) {
  uint64_t total = 0;
  run(0, 0, 5, &total); // reference run: how many calls the workload makes
  assert_true(total > 50);
  // The sweep covers the views' calls: moves (map), eviction (unmap).
  assert_true(last_stats.view_moves > 0 && last_stats.view_evictions > 0 && last_stats.view_reuses > 0);
  for (uint64_t n = 1; n <= total; n++) {
    uint64_t calls;
    run(n, 0, 5, &calls);
  }
}

static void test_random_faults(void **state) {
  uint64_t calls;
  for (uint64_t seed = 1; seed <= 20; seed++) run(0, 0.05, seed, &calls);
  run(0, 0.2, nft_env_seed(77), &calls);
}

// Views' own paths (src/core/view.c) fail once each in turn: moving cached
// granules across streams (map + set access), a view whose granule is live
// elsewhere unmapped after a host wait, take-backs, eviction at destroy.
// Every live block keeps its data; the pool stays consistent and usable.
static int view_scenario(nf_pool_t *p) {
  nf_stream_t A = (nf_stream_t)1, B = (nf_stream_t)2;
  int failed = 0;
  for (int rep = 0; rep < 3; rep++) {
    void *x = nf_alloc(p, 100 * G, A), *y = nf_alloc(p, 100 * G, A);
    if (y) nft_fill(y, 100 * G, 11);
    nf_free(p, x); // cached
    void *z = nf_alloc(p, 101 * G, B); // elsewhere: x's granules move (views at x)
    if (z) nft_fill(z, 101 * G, 12);
    if (y && !nft_check(y, 100 * G, 11)) fail_msg("rep %d: y lost its data", rep);
    nf_free(p, y);
    void *w = nf_alloc(p, 100 * G, A); // x's place: views of z's granules unmapped first
    if (w) nft_fill(w, 100 * G, 13);
    if (z && !nft_check(z, 101 * G, 12)) fail_msg("rep %d: z lost its data", rep);
    if (w && !nft_check(w, 100 * G, 13)) fail_msg("rep %d: w lost its data", rep);
    failed += !x + !y + !z + !w;
    nf_free(p, w);
    nf_free(p, z);
    if (nf_pool_check(p) != NF_OK) fail_msg("rep %d: %s", rep, nf_last_error());
  }
  return failed;
}

static void run_views(uint64_t fail_at, uint64_t *calls_out, nf_stats_t *st_out) {
  nf_backend_t *inner, *be;
  assert_int_equal(nf_backend_host_create(&inner, 1ull << 30, G), NF_OK);
  assert_int_equal(nf_backend_fault_create(&be, inner, 0, 0, 1), NF_OK);
  nf_config_t c;
  nf_config_default(&c);
  c.limit = 256 * G;
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, be, &c), NF_OK);
  uint64_t base = 0, failed = 0;
  nf_backend_fault_counts(be, &base, &failed);
  nf_backend_fault_set(be, fail_at ? base + fail_at : 0, 0);
  view_scenario(p);
  nf_backend_fault_counts(be, calls_out, &failed);
  *calls_out -= base;
  nf_backend_fault_set(be, 0, 0);
  assert_int_equal(view_scenario(p), 0); // no faults: everything works again
  nf_stats_get(p, st_out);
  nft_destroy_all(p, be, inner);
}

static void test_view_paths_fail_once(void **state) {
  uint64_t total = 0;
  nf_stats_t s;
  run_views(0, &total, &s);
  // The reference run takes every view path that calls the backend: moves
  // (map, set access, B's wait on A's event), unmapping busy views after a
  // host wait. (Take-backs call nothing but the same ordering as moves.)
  assert_true(s.view_moves > 0 && s.view_evictions > 0 && s.calls.event_sync > 0 && s.calls.stream_wait > 0);
  for (uint64_t n = 1; n <= total; n++) {
    uint64_t calls;
    run_views(n, &calls, &s);
  }
}

// A placement that fails after views moved a cached granule into its range
// leaves that granule there, in a free range again. The stream whose work
// last used it (X, still in flight) must still order the next user: a block
// placed there on another stream waits for X (before the fix the granule's
// last users were dropped at the move and the next block got none).
static void test_failed_placement_keeps_last_users(void **state) {
  int checked = 0;
  for (uint64_t off = 1; off <= 16; off++) {
    nf_backend_t *inner, *be;
    assert_int_equal(nf_backend_host_create(&inner, 1ull << 30, G), NF_OK);
    assert_int_equal(nf_backend_fault_create(&be, inner, 0, 0, 1), NF_OK);
    nf_config_t c;
    nf_config_default(&c);
    assert_int_equal(nf_config_parse(&c, "limit:256KiB,views:1000,small_max:4KiB", NULL, 0), NF_OK);
    nf_pool_t *p = NULL;
    assert_int_equal(nf_pool_create(&p, be, &c), NF_OK);
    nf_backend_host_set_manual_events(inner, 1);
    nf_stream_t S0 = (nf_stream_t)0x10, X = (nf_stream_t)0x20, S = (nf_stream_t)0x30, S2 = (nf_stream_t)0x40;
    void *l1 = nf_alloc(p, G, S0), *a = nf_alloc(p, G, X), *l2 = nf_alloc(p, G, S0);
    assert_true(l1 && a && l2);
    nf_free(p, a); // X's work on a still in flight (manual events)
    nf_stats_t s0, s1, s2;
    nf_stats_get(p, &s0);
    uint64_t calls = 0, failed = 0;
    nf_backend_fault_counts(be, &calls, &failed);
    nf_backend_fault_set(be, calls + off, 0);
    void *big = nf_alloc(p, 2 * G, S); // room for 1 new granule: a's cached one moves here, then call `off` fails
    nf_backend_fault_set(be, 0, 0);
    nf_stats_get(p, &s1);
    if (!big && s1.view_moves > s0.view_moves) {
      void *q = nf_alloc(p, 2 * G, S2);
      assert_non_null(q);
      nf_stats_get(p, &s2);
      assert_true(s2.calls.stream_wait + s2.calls.event_sync > s1.calls.stream_wait + s1.calls.event_sync);
      checked++;
      nf_free(p, q);
    }
    if (big) nf_free(p, big);
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_free(p, l1);
    nf_free(p, l2);
    nf_backend_host_set_manual_events(inner, 0);
    nft_destroy_all(p, be, inner);
  }
  assert_true(checked > 0); // some offset failed the placement after the move
}

// nf_set_limit that fails (the backend refuses the unmap or the release of
// the granules above the new limit) leaves the limit as it was: a failing
// call changes nothing the caller can see (nofrag.h, nf_status_t).
static void test_failed_set_limit_keeps_the_limit(void **state) {
  (void)state;
  for (uint64_t off = 1; off <= 2; off++) { // the unmap, then the release
    nf_backend_t *inner, *be;
    assert_int_equal(nf_backend_host_create(&inner, 1ull << 30, G), NF_OK);
    assert_int_equal(nf_backend_fault_create(&be, inner, 0, 0, 1), NF_OK);
    nf_pool_t *p = nft_pool_on(be, "limit:1MiB,views:0"); // 16 granules
    void *a = nf_alloc(p, 8 * G, NULL);
    assert_non_null(a);
    assert_int_equal(nf_free(p, a), NF_OK); // 8 cached granules
    uint64_t calls, failed;
    nf_backend_fault_counts(be, &calls, &failed);
    nf_backend_fault_set(be, calls + off, 0);
    assert_int_equal(nf_set_limit(p, 4 * G), NF_ERR_BACKEND);
    nf_backend_fault_set(be, 0, 0);
    nf_config_t c;
    nf_pool_config(p, &c);
    assert_int_equal(c.limit, 16 * G);
    assert_int_equal(nf_pool_check(p), NF_OK);
    void *b = nf_alloc(p, 12 * G, NULL); // the old limit holds
    assert_non_null(b);
    nf_free(p, b);
    assert_int_equal(nf_set_limit(p, 4 * G), NF_OK);
    nf_pool_config(p, &c);
    assert_int_equal(c.limit, 4 * G);
    nft_destroy_all(p, be, inner);
  }
}

// A driver that refuses memory below the limit (another process holds the
// GPU's memory: here a second pool on the same backend) is an OOM whose
// message keeps the backend's reason after the pool's figures: the limit did
// not refuse it. At the limit itself there is no such clause.
static void test_oom_below_limit_says_why(void **state) {
  (void)state;
  nf_backend_t *be;
  assert_int_equal(nf_backend_host_create(&be, 16 * G, G), NF_OK);
  nf_pool_t *other = nft_pool_on(be, "views:0"), *p = nft_pool_on(be, "views:0");
  void *a = nf_alloc(other, 12 * G, NULL); // 4 granules of the backend's 16 left
  assert_non_null(a);
  assert_null(nf_alloc(p, 8 * G, NULL));
  assert_int_equal(nf_last_status(), NF_ERR_OOM);
  const char *m = nf_last_error();
  if (!strstr(m, "limit 1.000 MiB") || !strstr(m, "; not the limit: nofrag: creating a 65536 B device granule failed"))
    fail_msg("'%s'", m);
  assert_int_equal(nf_free(other, a), NF_OK);
  assert_int_equal(nf_trim(other), NF_OK);
  void *b = nf_alloc(p, 8 * G, NULL);
  assert_non_null(b);
  assert_null(nf_alloc(p, 16 * G, NULL)); // 8 + 16 granules: past the limit
  assert_null(strstr(nf_last_error(), "not the limit"));
  assert_int_equal(nf_free(p, b), NF_OK);
  nf_pool_destroy(p);
  nf_pool_destroy(other);
  nf_backend_destroy(be);
}

int main(void) {
  if (getenv("NF_FILTER")) cmocka_set_test_filter(getenv("NF_FILTER"));
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_each_call_fails_once),
                                     cmocka_unit_test(test_random_faults),
                                     cmocka_unit_test(test_view_paths_fail_once),
                                     cmocka_unit_test(test_failed_placement_keeps_last_users),
                                     cmocka_unit_test(test_failed_set_limit_keeps_the_limit),
                                     cmocka_unit_test(test_oom_below_limit_says_why)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
