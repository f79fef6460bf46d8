// Many threads on one pool: every thread keeps its own live set with
// patterns, under a limit tight enough that stitching runs concurrently with
// other threads' fast paths. Run under TSan in CI.
#include "nf_test.h"

#include <pthread.h>

#define G (64 * 1024)
#define THREADS 4
#define SLOTS 24

static nf_pool_t *pool;
static _Atomic int errors;

static void *worker(void *arg) {
  uint64_t rng = (uint64_t)(uintptr_t)arg * 7919 + nft_env_seed(1);
  struct { void *p; size_t n; uint64_t tag; } l[SLOTS] = {{0}};
  nf_stream_t s = (nf_stream_t)arg;
  for (int it = 0; it < 20000; it++) {
    int i = (int)(nft_rand(&rng) % SLOTS);
    if (l[i].p) {
      if (!nft_check(l[i].p, l[i].n, l[i].tag)) errors++;
      if (nf_free(pool, l[i].p) != NF_OK) errors++;
      l[i].p = NULL;
      continue;
    }
    uint64_t r = nft_rand(&rng);
    size_t n = r % 2 ? 1 + r % 8192 : 1 + r % (6 * G);
    void *p = nf_alloc(pool, n, s);
    if (!p) {
      if (nf_last_status() != NF_ERR_OOM) errors++;
      continue;
    }
    nft_fill(p, n, r);
    l[i].p = p; l[i].n = n; l[i].tag = r;
  }
  for (int i = 0; i < SLOTS; i++)
    if (l[i].p) {
      if (!nft_check(l[i].p, l[i].n, l[i].tag)) errors++;
      nf_free(pool, l[i].p);
    }
  return NULL;
}

static void test_threads_stress(void **state) {
  nf_backend_t *be;
  pool = nft_pool(&be, 1ull << 30, G, "limit:6MiB,small_max:16KiB");
  assert_non_null(pool);
  pthread_t t[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
  // A reader thread too: stats and the checker take the lock like any call.
  for (int k = 0; k < 20; k++) {
    nf_stats_t st;
    nf_stats_get(pool, &st);
    assert_true(st.mapped <= st.physical && st.physical <= st.limit);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  assert_int_equal(errors, 0);
  assert_int_equal(nf_pool_check(pool), NF_OK);
  nf_stats_t st;
  nf_stats_get(pool, &st);
  assert_int_equal(st.live, 0);
  assert_true(st.reclaims > 0);
  nf_pool_destroy(pool);
  uint64_t gr, mp;
  nf_backend_host_usage(be, &gr, &mp);
  assert_int_equal(gr + mp, 0);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_threads_stress)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
