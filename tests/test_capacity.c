// A pool's size (src/core/capacity.c): configurations refused at creation,
// reserve, nf_set_limit, nf_trim, a pool from a config string; the release
// policy (release_threshold, release_after, retain; auto under an explicit
// limit and without one), which nf_free applies and vmm.c carries out.
#include "nf_test.h"

#define G (64 * 1024) // small granule: many granules, fast tests

static void test_limits_and_config(void **state) {
  nf_backend_t *be;
  assert_int_equal(nf_backend_host_create(&be, 1ull << 30, G), NF_OK);
  nf_config_t c;
  nf_config_default(&c);
  c.limit = G / 2; // below one granule
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, be, &c), NF_ERR_CONFIG);
  assert_null(p);
  c.limit = 8 * G;
  c.reserve = 9 * G;
  assert_int_equal(nf_pool_create(&p, be, &c), NF_ERR_CONFIG); // reserve above the limit: refused as a config error, naming both
  c.reserve = 4 * G;
  c.granule = G * 3; // not a power of two
  assert_int_equal(nf_pool_create(&p, be, &c), NF_ERR_CONFIG);
  c.granule = 0;
  assert_int_equal(nf_pool_create(&p, be, &c), NF_OK);
  nf_stats_t s = nft_stats_of(p);
  assert_int_equal(s.physical, 4 * G); // pre-allocated
  assert_int_equal(s.calls.create, 4);
  assert_int_equal(s.mapped, 0);
  assert_int_equal(nf_reserve(p, 6 * G), NF_OK);
  assert_int_equal(nft_stats_of(p).physical, 6 * G);
  assert_int_equal(nf_reserve(p, 9 * G), NF_ERR_OOM);
  void *a = nf_alloc(p, 2 * G, NULL);
  assert_non_null(a);
  assert_int_equal(nft_stats_of(p).calls.create, 6); // used the reserve
  assert_int_equal(nf_set_limit(p, 4 * G), NF_OK);
  assert_true(nft_stats_of(p).physical <= 4 * G);
  assert_null(nf_alloc(p, 3 * G, NULL));
  assert_int_equal(nf_free(p, a), NF_OK);
  assert_int_equal(nf_trim(p), NF_OK);
  s = nft_stats_of(p);
  assert_int_equal(s.mapped, 0);
  assert_int_equal(s.physical, 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  // From a string (own backend).
  assert_int_equal(nf_pool_create_from_string(&p, "limit:1GiB,bogus:1"), NF_ERR_CONFIG);
  assert_non_null(strstr(nf_last_error(), "bogus"));
  assert_int_equal(nf_pool_create_from_string(&p, "backend:host,limit:64MiB,granule:64KiB"), NF_OK);
  a = nf_alloc(p, 100, NULL);
  assert_non_null(a);
  assert_int_equal(nft_stats_of(p).granule, G);
  nf_pool_destroy(p);
}

// Release policy: with a small threshold, mapped memory follows live memory
// without any call from the user; physical above `retain` goes back.
static void test_release_policy(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB,release_threshold:512KiB,retain:128KiB,release_after:0");
  void *a[16];
  for (int i = 0; i < 16; i++) assert_non_null(a[i] = nf_alloc(p, 2 * G, NULL));
  assert_int_equal(nft_stats_of(p).mapped, 32 * G);
  for (int i = 0; i < 16; i++) nf_free(p, a[i]);
  nf_stats_t s = nft_stats_of(p);
  assert_true(s.cached <= 512 * NF_KiB);
  assert_true(s.physical <= 128 * NF_KiB + 512 * NF_KiB);
  assert_true(s.calls.unmap > 0 && s.calls.release > 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  // Decay: memory above the threshold goes back only after staying above it
  // for release_after frees in a row.
  p = nft_pool(&be, 1ull << 30, G, "limit:64MiB,release_threshold:512KiB,release_after:100");
  for (int i = 0; i < 16; i++) a[i] = nf_alloc(p, 2 * G, NULL);
  for (int i = 0; i < 16; i++) nf_free(p, a[i]);
  assert_int_equal(nft_stats_of(p).calls.unmap, 0);
  for (int i = 0; i < 100; i++) nf_free(p, nf_alloc(p, 512, NULL));
  s = nft_stats_of(p);
  assert_true(s.calls.unmap > 0);
  assert_true(s.cached <= 512 * NF_KiB);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  // Default (auto) keeps a training step's swing cached: no calls on reuse.
  p = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  for (int i = 0; i < 16; i++) a[i] = nf_alloc(p, 2 * G, NULL);
  for (int i = 0; i < 8; i++) nf_free(p, a[i]);
  uint64_t calls = nft_stats_of(p).backend_calls;
  for (int i = 0; i < 8; i++) a[i] = nf_alloc(p, 2 * G, NULL);
  assert_int_equal(nft_stats_of(p).backend_calls, calls);
  for (int i = 0; i < 16; i++) nf_free(p, a[i]);
  // Under an explicit limit, auto never gives granules back, however long
  // the cache stays large (at a cap, releasing only to re-create at the next
  // peak made spill runs 3x slower on the H200).
  for (int i = 0; i < 5000; i++) nf_free(p, nf_alloc(p, 512, NULL));
  s = nft_stats_of(p);
  assert_true(s.cached >= 32 * G && s.calls.unmap == 0 && s.calls.release == 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  // Without a limit (the backend's capacity, 4 MiB here), auto is
  // capacity/4 = 1 MiB and does release.
  p = nft_pool(&be, 4 * NF_MiB, G, "release_after:16");
  for (int i = 0; i < 16; i++) a[i] = nf_alloc(p, 2 * G, NULL);
  for (int i = 0; i < 16; i++) nf_free(p, a[i]);
  for (int i = 0; i < 32; i++) nf_free(p, nf_alloc(p, 512, NULL));
  s = nft_stats_of(p);
  assert_true(s.calls.unmap > 0 && s.cached <= NF_MiB);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_limits_and_config),
      cmocka_unit_test(test_release_policy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
