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

// Choices the slow path makes among blocks that fit (a mutation study of
// placement.c: each rule below could be broken with every test passing).
// The pools: views off (no parked mapping lowers a cost) and an explicit
// limit (no release policy); nf_trim leaves mapped only the granules live
// blocks lie on, and flushes the bins (so the request reaches placement).

// A hole of exactly the request's size is not skipped as too small, and it
// wins over the free tail of the chunk when that costs as much: the exact
// class is scanned first, and a later candidate must be strictly cheaper.
// 4 granules (the start of a size class: the tail costs 4 too) and 4 and
// 512 B (inside a class: the upward search starts above it; s1 ends at a
// granule, so the tail costs 5).
static void test_exact_hole_before_tail(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    nf_backend_t *be;
    nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB,views:0");
    size_t n = 4 * G + (k ? 512 : 0);
    char *s0 = nf_alloc(p, G, NULL), *d = nf_alloc(p, n, NULL), *s1 = nf_alloc(p, G - (k ? 512 : 0), NULL);
    assert_true(s0 && d && s1 && d == s0 + G && s1 == d + n);
    assert_int_equal(nf_free(p, d), NF_OK);
    assert_int_equal(nf_trim(p), NF_OK);
    assert_int_equal(nft_stats_of(p).mapped, 2 * G); // s0's and s1's granules
    char *q = nf_alloc(p, n, NULL);
    assert_ptr_equal(q, d);
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_free(p, q), nf_free(p, s0), nf_free(p, s1);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
  }
}

// A block needing no new granule wins, and a placement at a block's end
// counts as such: the run [a, a + 9G) whose first 4 granules were given back
// and whose last 5 are mapped serves 4G at its end, with no backend call,
// over the exact fit d, scanned first (4 granules to map).
// Neither the end's cost nor the larger classes may be skipped.
static void test_mapped_end_wins(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB,views:0");
  char *s0 = nf_alloc(p, G, NULL), *d = nf_alloc(p, 4 * G, NULL), *s1 = nf_alloc(p, G, NULL);
  char *a = nf_alloc(p, 4 * G, NULL), *b = nf_alloc(p, 5 * G, NULL), *s2 = nf_alloc(p, G, NULL);
  assert_true(s0 && d && s1 && a && b && s2 && a == s1 + G && b == a + 4 * G && s2 == b + 5 * G);
  assert_int_equal(nf_free(p, d), NF_OK);
  assert_int_equal(nf_free(p, a), NF_OK);
  assert_int_equal(nf_trim(p), NF_OK); // d's and a's granules go back
  assert_int_equal(nf_free(p, b), NF_OK); // b's stay mapped: the run [a, s2)
  nf_stats_t s0st = nft_stats_of(p);
  char *q = nf_alloc(p, 4 * G, NULL);
  assert_ptr_equal(q, a + 5 * G);
  nf_stats_t s1st = nft_stats_of(p);
  assert_int_equal(s1st.backend_calls, s0st.backend_calls);
  assert_int_equal(s1st.physical, s0st.physical);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_free(p, q), nf_free(p, s0), nf_free(p, s1), nf_free(p, s2);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// The budget of fitting blocks scored (48) is not spent twice on the
// request's own class: for a size at a class's start (4 granules here) the
// upward search starts one class above the exact one, which the first loop
// scanned whole. 24 unmapped exact holes (cost 4 each) come first; a freed
// 8-granule block, still mapped, in a larger class serves the request with
// no backend call. Scoring the holes twice spent the budget before it.
static void test_scan_budget_not_spent_twice(void **state) {
  (void)state;
  enum { HOLES = 24 };
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB,views:0");
  char *sep[HOLES + 2], *hole[HOLES];
  for (int i = 0; i < HOLES; i++) {
    sep[i] = nf_alloc(p, G, NULL), hole[i] = nf_alloc(p, 4 * G, NULL);
    assert_true(sep[i] && hole[i] && hole[i] == sep[i] + G);
  }
  sep[HOLES] = nf_alloc(p, G, NULL);
  char *big = nf_alloc(p, 8 * G, NULL);
  sep[HOLES + 1] = nf_alloc(p, G, NULL);
  assert_true(sep[HOLES] && big && sep[HOLES + 1] && big == sep[HOLES] + G && sep[HOLES + 1] == big + 8 * G);
  for (int i = 0; i < HOLES; i++) assert_int_equal(nf_free(p, hole[i]), NF_OK);
  assert_int_equal(nf_trim(p), NF_OK); // the holes' granules go back
  assert_int_equal(nf_free(p, big), NF_OK); // big's stay mapped
  nf_stats_t st0 = nft_stats_of(p);
  char *q = nf_alloc(p, 4 * G, NULL);
  assert_true(q && nft_overlaps((uintptr_t)q, 4 * G, (uintptr_t)big, 8 * G));
  assert_int_equal(nft_stats_of(p).backend_calls, st0.backend_calls);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_free(p, q);
  for (int i = 0; i < HOLES + 2; i++) nf_free(p, sep[i]);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// The last resort (nf__place_min, at the limit): among holes needing
// equally few granules, the smallest wins. Live blocks of 512 B leave the
// edge granules of holes h1 (5 granules less 1 KiB) and h2 (8 less 1 KiB)
// mapped: 3 granules each for the request, and 3 are left under the limit.
// The first fit, d (4 whole granules, none mapped), runs out of memory, and
// so would the chunk's tail (4); h1 fits as well as h2, and is tighter.
static void test_last_resort_tightest(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB,views:0,small_max:1MiB");
  char *s0 = nf_alloc(p, G, NULL), *d = nf_alloc(p, 4 * G, NULL), *s1 = nf_alloc(p, 512, NULL);
  char *h1 = nf_alloc(p, 5 * G - 1024, NULL), *s2 = nf_alloc(p, 1024, NULL);
  char *h2 = nf_alloc(p, 8 * G - 1024, NULL), *s3 = nf_alloc(p, G + 512, NULL);
  assert_true(s0 && d && s1 && h1 && s2 && h2 && s3);
  assert_true(d == s0 + G && s1 == d + 4 * G && h1 == s1 + 512 && s2 == h1 + 5 * G - 1024);
  assert_true(h2 == s2 + 1024 && s3 == h2 + 8 * G - 1024); // the tail starts at a granule
  assert_int_equal(nf_free(p, d), NF_OK);
  assert_int_equal(nf_free(p, h1), NF_OK);
  assert_int_equal(nf_free(p, h2), NF_OK);
  assert_int_equal(nf_set_limit(p, 9 * G), NF_OK); // live blocks lie on 6 granules
  assert_int_equal(nf_trim(p), NF_OK);
  assert_int_equal(nft_stats_of(p).physical, 6 * G);
  char *q = nf_alloc(p, 3 * G + 512, NULL);
  assert_ptr_equal(q, h1);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_free(p, q), nf_free(p, s0), nf_free(p, s1), nf_free(p, s2), nf_free(p, s3);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_large_share),
      cmocka_unit_test(test_class_full_of_misfits),
      cmocka_unit_test(test_emptied_class_keeps_level),
      cmocka_unit_test(test_split_rest_keeps_order),
      cmocka_unit_test(test_exact_hole_before_tail),
      cmocka_unit_test(test_mapped_end_wins),
      cmocka_unit_test(test_scan_budget_not_spent_twice),
      cmocka_unit_test(test_last_resort_tightest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
