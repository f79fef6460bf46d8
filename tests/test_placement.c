// Placement (src/core/placement.c): which free block a request takes. The
// small and large arenas keep their blocks apart yet share the granules, and
// free blocks of a request's size class that are too small do not hide one
// that fits. The free index under it (src/core/freelist.c): level bits kept
// while a level has blocks, a split block's rest keeps its order.
#include "nf_test.h"

#define G (64 * 1024) // small granule: many granules, fast tests

// Small requests are packed apart from large ones, yet the granules are one
// pool: memory freed by small blocks serves large ones and vice versa.
static void test_small_large_share(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:2MiB,small_max:8KiB");
  void *s[256];
  for (int i = 0; i < 256; i++) assert_non_null(s[i] = nf_alloc(p, 8192, NULL)); // all 2 MiB
  assert_null(nf_alloc(p, 512 * 1024, NULL));
  for (int i = 0; i < 256; i++) nf_free(p, s[i]);
  void *l = nf_alloc(p, 2 * NF_MiB - 2 * G, NULL); // large arena, other addresses
  assert_non_null(l);
  assert_true(nft_stats_of(p).reclaims + nft_stats_of(p).view_moves > 0);
  nf_free(p, l);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// Many free blocks of the request's size class that are each too small must
// not hide the free range that fits (found on an H200 run: the scan budget
// was spent on them and the allocation failed as "fresh range not found").
static void test_class_full_of_misfits(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:256MiB");
  enum { N = 120 };
  const size_t want = 600 * 1024, small = want - 4096; // same TLSF class
  void *a[2 * N];
  for (int i = 0; i < 2 * N; i++) assert_non_null(a[i] = nf_alloc(p, i % 2 ? 512 : small, NULL));
  for (int i = 0; i < 2 * N; i += 2) assert_int_equal(nf_free(p, a[i]), NF_OK); // misfits, kept apart
  void *q = nf_alloc(p, want, NULL);
  assert_non_null(q);
  nf_free(p, q);
  for (int i = 1; i < 2 * N; i += 2) nf_free(p, a[i]);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A TLSF class emptied by an allocation clears its first-level bit only when
// the whole first level is empty: a block of another class of that level
// must stay visible to a smaller request that searches upward (a mutation
// study: clearing the bit at once hid it, and the request went elsewhere).
// In a private pool: no bins, so every free goes straight to the index.
static void test_emptied_class_keeps_level(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  assert_int_equal(nf_private_incref(p, 1), NF_OK);
  // a: 64 units (level 2, class 0), b: 96 units (level 2, class 16), live
  // separators between them and before the chunk's free tail.
  void *a = nf_alloc_private(p, 1, 32768, NULL), *s1 = nf_alloc_private(p, 1, 512, NULL);
  void *b = nf_alloc_private(p, 1, 49152, NULL), *s2 = nf_alloc_private(p, 1, 512, NULL);
  assert_true(a && s1 && b && s2);
  assert_int_equal(nf_free(p, a), NF_OK);
  assert_int_equal(nf_free(p, b), NF_OK);
  assert_ptr_equal(nf_alloc_private(p, 1, 32768, NULL), a); // empties class 0 of level 2
  void *q = nf_alloc_private(p, 1, 20480, NULL);           // level 1: nothing there, so up to b
  assert_ptr_equal(q, b);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_free(p, q), nf_free(p, a), nf_free(p, s1), nf_free(p, s2);
  assert_int_equal(nf_private_release(p, 1), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A split free block's rest keeps the block's streams and free tick: a
// request on another stream that takes the rest is ordered after the work
// of the stream that freed it (the host backend counts an unordered reuse).
static void test_split_rest_keeps_order(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  nf_backend_host_set_manual_events(be, 1); // A's work stays in flight
  const nf_stream_t A = (nf_stream_t)1, B = (nf_stream_t)2;
  char *x = nf_alloc(p, 8 * G, A);
  assert_non_null(x);
  nf_backend_host_use(be, A, x, 8 * G);
  assert_int_equal(nf_free(p, x), NF_OK);
  char *f = nf_alloc(p, G, A); // carved from x's front: the rest is split off
  assert_ptr_equal(f, x);
  char *y = nf_alloc(p, 4 * G, B); // in the rest, on B
  assert_non_null(y);
  assert_true(nft_overlaps((uintptr_t)y, 4 * G, (uintptr_t)x, 8 * G));
  nf_backend_host_use_new(be, B, y, 4 * G);
  assert_int_equal(nf_backend_host_violations(be), 0);
  nf_free(p, f), nf_free(p, y);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_large_share),
      cmocka_unit_test(test_class_full_of_misfits),
      cmocka_unit_test(test_emptied_class_keeps_level),
      cmocka_unit_test(test_split_rest_keeps_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
