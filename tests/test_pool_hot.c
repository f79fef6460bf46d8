// The hot path (src/core/pool.c), continued from test_pool.c (kept under its
// size): cases a mutation study of pool.c found no test for, each failing
// with one planted bug. Bins and the hot pair: the pop of a parked block of
// another size, the merged order a pop leaves on the run's rest, routes
// that must win over the hot block; record_stream and double frees.
#include "nf_test.h"
#include "core/core.h" // white box: p->hot, block streams and ticks

#define G (64 * 1024)
#define S(x) ((nf_stream_t)(uintptr_t)(x))

// Bins are direct-mapped by a hash of the size: 1 unit (512 B) and 56 units
// (28 KiB) share one. A parked 512-byte block must not be popped for a
// 28 KiB request (it would run over the live block after it).
static void test_bin_pop_checks_size(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  assert_int_equal(nf__bin_of(1), nf__bin_of(56));
  char *x = nf_alloc(p, 512, NULL), *y = nf_alloc(p, 4096, NULL);
  assert_true(x && y == x + 512);
  nft_fill(y, 4096, 1);
  assert_int_equal(nf_free(p, x), NF_OK); // parked (hot, parked at the next request)
  char *z = nf_alloc(p, 56 * 512, NULL);
  assert_non_null(z);
  nft_fill(z, 56 * 512, 2);
  assert_false(nft_overlaps((uintptr_t)z, 56 * 512, (uintptr_t)y, 4096));
  assert_true(nft_check(y, 4096, 1));
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_free(p, y), nf_free(p, z);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// The pop of a hot block whose run's rest was freed on another stream: the
// rest gets both streams, as coalescing (merge_order) would have given the
// run placement carves from (test_pool.c covers the same-stream case).
static void test_popped_run_rest_gets_both_streams(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:8MiB");
  nf_backend_host_set_manual_events(be, 1); // nothing known complete: no stream drops out
  char *b = nf_alloc(p, 4096, S(1)), *c = nf_alloc(p, 8192, S(2)), *d = nf_alloc(p, 4096, S(1)), *x[NF_BIN_MAX];
  assert_true(b && c == b + 4096 && d == c + 8192);
  for (int i = 0; i < NF_BIN_MAX; i++) assert_non_null(x[i] = nf_alloc(p, 8192, S(1)));
  for (int i = 0; i < NF_BIN_MAX; i++) assert_int_equal(nf_free(p, x[i]), NF_OK); // c's bin full
  uint64_t sa = 1ull << nf__map_find(p, (uintptr_t)b)->stream, sb = 1ull << nf__map_find(p, (uintptr_t)c)->stream;
  assert_true(sa != sb);
  assert_int_equal(nf_free(p, c), NF_OK); // indexed, freed on S(2)
  nf_block_t *cb = nf__map_find(p, (uintptr_t)b)->next;
  assert_true(cb->state == NF_BLK_FREE && !cb->parked && cb->smask == sb);
  assert_int_equal(nf_free(p, b), NF_OK); // on S(1): the hot block
  assert_non_null(p->hot);
  assert_ptr_equal(nf_alloc(p, 4096, S(1)), b);
  assert_int_equal(cb->smask, sa | sb);
  assert_int_equal(cb->tick, p->tick);
  nf_free(p, b), nf_free(p, d);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A general block freed on a stream that is now routed to a private pool
// becomes the hot block; the next allocation of its size on that stream must
// still go to the private pool (a graph's memory), not take the hot block.
static void test_route_beats_hot_block(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  void *x = nf_alloc(p, 4096, S(1));
  assert_non_null(x);
  assert_int_equal(nf_private_incref(p, 5), NF_OK);
  assert_int_equal(nf_private_begin(p, 5, S(1)), NF_OK);
  assert_int_equal(nf_free(p, x), NF_OK);
  assert_non_null(p->hot); // the case: a hot block while a route exists
  void *y = nf_alloc(p, 4096, S(1));
  assert_non_null(y);
  assert_int_equal(nf_private_of(p, y), 5);
  assert_int_equal(nf_private_end(p, 5), NF_OK);
  nf_free(p, y);
  assert_int_equal(nf_private_release(p, 5), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A flush releases each bin's blocks oldest first, so that the newest freed
// ends up first in its TLSF class, as when each is released at its free:
// the next placement of that size takes the newest.
static void test_flush_oldest_first(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  char *x1 = nf_alloc(p, 4096, NULL), *s1 = nf_alloc(p, 512, NULL);
  char *x2 = nf_alloc(p, 4096, NULL), *s2 = nf_alloc(p, 512, NULL);
  assert_true(x1 && s1 && x2 && s2);
  assert_int_equal(nf_free(p, x1), NF_OK);
  assert_int_equal(nf_free(p, x2), NF_OK); // both parked, x2 newest
  void *big = nf_alloc(p, 3 * G, NULL); // another size: placement, after a flush
  assert_non_null(big);
  assert_int_equal(p->bin_blocks, 0);
  assert_ptr_equal(nf_alloc(p, 4096, NULL), x2);
  nf_free(p, x2), nf_free(p, s1), nf_free(p, s2), nf_free(p, big);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bin_pop_checks_size),
      cmocka_unit_test(test_popped_run_rest_gets_both_streams),
      cmocka_unit_test(test_route_beats_hot_block),
      cmocka_unit_test(test_flush_oldest_first),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
