// Rules of the views (src/core/view.c) that a mutation study of the mapping
// layer found no test pinning down: which cached granule stitching moves
// (the one freed last), how placement prices parked views (only those whose
// granule can be taken back are cheap), that a failed map unmaps only idle
// views (no host wait), and that the free rest of an edge granule keeps its
// own last users when it inherits the moved granule's. On the host backend;
// with manual events where work must be in flight. Each test names the
// planted bug (mutant id of the study) it catches.
#include "nf_test.h"

#include "backend/backend.h"

#define G (64 * 1024)


// Of the cached granules stitching may move, the one freed most recently
// goes (in a repeating workload the place freed last is needed again
// furthest ahead): the place freed earlier keeps its granule, and a block
// landing there again costs no call. Catches W33 (the oldest candidate
// moved: the earlier place then needed an unmap and a map).
static void test_most_recently_freed_granule_moves(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:320KiB,small_max:4KiB"); // 5 granules
  assert_non_null(p);
  char *p1 = nf_alloc(p, G, NULL), *g1 = nf_alloc(p, G, NULL), *p2 = nf_alloc(p, G, NULL), *g2 = nf_alloc(p, G, NULL);
  char *t = nf_alloc(p, G, NULL);
  assert_true(p1 && g1 == p1 + G && p2 == p1 + 2 * G && g2 == p1 + 3 * G && t == p1 + 4 * G);
  // Views start (a first move): from here each free stamps its granules.
  assert_int_equal(nf_free(p, t), NF_OK);
  char *r0 = nf_alloc_at(p, 0, p1 + 6 * G, G, NULL);
  assert_non_null(r0);
  assert_int_equal(nf_free(p, p1), NF_OK); // freed first
  assert_int_equal(nf_free(p, p2), NF_OK); // freed last
  nf_stats_t s0 = nft_stats_of(p);
  char *r = nf_alloc_at(p, 0, p1 + 8 * G, G, NULL); // at the limit: one cached granule moves here
  assert_non_null(r);
  nf_stats_t s1 = nft_stats_of(p);
  assert_int_equal(s1.view_moves - s0.view_moves, 1);
  char *q = nf_alloc_at(p, 0, p1, G, NULL); // p1's place kept its granule: no call
  assert_ptr_equal(q, p1);
  nf_stats_t s2 = nft_stats_of(p);
  assert_int_equal(s2.backend_calls, s1.backend_calls);
  nft_fill(q, G, 1), nft_fill(r, G, 2);
  assert_true(nft_check(q, G, 1) && nft_check(r, G, 2));
  nf_free(p, q), nf_free(p, r), nf_free(p, r0), nf_free(p, g1), nf_free(p, g2);
  nft_done(p, be);
}

// Placement prices a parked view as cheap (no map call) only where its
// granule can be taken back: cached, not under live data elsewhere. Of a
// free range's two ends, the one whose views name cached granules wins over
// the one whose views name granules a live block holds (those views must be
// unmapped, after their work, and granules mapped). Catches W35 (every
// parked view counted as cheap: the ends tied, the first one won).
static void test_views_of_live_granules_priced_as_maps(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:512KiB,small_max:4KiB"); // 8 granules
  assert_non_null(p);
  // a [0,2) b [2,4) c [4,6) y [6,7); z and w go to [7,9) and [9,11); guard [11,12).
  char *a = nf_alloc(p, 2 * G, NULL);
  assert_non_null(a);
  char *guard = nf_alloc_at(p, 0, a + 11 * G, G, NULL);
  char *b = nf_alloc_at(p, 0, a + 2 * G, 2 * G, NULL), *c = nf_alloc_at(p, 0, a + 4 * G, 2 * G, NULL);
  char *y = nf_alloc_at(p, 0, a + 6 * G, G, NULL);
  assert_true(guard && b && c && y);
  assert_int_equal(nf_free(p, a), NF_OK);
  char *z = nf_alloc_at(p, 0, a + 7 * G, 2 * G, NULL); // a's granules move here: views at [0,2), live
  assert_non_null(z);
  assert_int_equal(nf_free(p, c), NF_OK);
  char *w = nf_alloc_at(p, 0, a + 9 * G, 2 * G, NULL); // c's granules move here: views at [4,6)
  assert_non_null(w);
  assert_int_equal(nf_free(p, w), NF_OK); // ... whose granules are cached now: takeable
  assert_int_equal(nf_free(p, b), NF_OK); // one free range [0,6): busy views, b's 2 mapped, takeable views
  nft_fill(z, 2 * G, 7);
  assert_int_equal(nft_stats_of(p).views, 4);
  assert_int_equal(nf_set_limit(p, 64 * G), NF_OK); // far from the limit: placement compares costs
  nf_stats_t s0 = nft_stats_of(p);
  char *q = nf_alloc(p, 3 * G, NULL); // [0,3): 2 maps; [3,6): b's granule and 2 views taken back
  assert_ptr_equal(q, a + 3 * G);
  nf_stats_t s1 = nft_stats_of(p);
  assert_int_equal(s1.view_reuses - s0.view_reuses, 2);
  assert_int_equal(s1.backend_calls, s0.backend_calls);
  nft_fill(q, 3 * G, 8);
  assert_true(nft_check(z, 2 * G, 7) && nft_check(q, 3 * G, 8));
  nf_free(p, q), nf_free(p, z), nf_free(p, y), nf_free(p, guard);
  nft_done(p, be);
}

// A spy whose next `fail` map calls fail.
typedef struct { nf_backend_t be; nf_backend_ops_t ops; int fail; } mapspy_t;
static nf_status_t mapspy_map(nf_backend_t *be, uintptr_t v, size_t n, nf_handle_t h) {
  mapspy_t *m = (mapspy_t *)be;
  if (m->fail > 0 && m->fail--) return NF_ERR_BACKEND;
  return nft_f_map(be, v, n, h);
}

// A failed map may be the bound on mappings: the idle parked views (their
// work known complete) are unmapped and the map is tried again, with no
// host wait. Views whose work is in flight stay, and the request fails with
// the map's error. Catches W38 (the eviction waited for every stream first).
static void test_failed_map_evicts_only_idle_views(void **state) {
  (void)state;
  mapspy_t *spy = calloc(1, sizeof *spy);
  assert_non_null(spy);
  nft_spy_init(&spy->be, &spy->ops, 1ull << 30, G);
  spy->ops.map = mapspy_map;
  nf_backend_t *inner = spy->be.inner;
  nf_pool_t *p = nft_pool_on(&spy->be, "limit:192KiB,small_max:4KiB"); // 3 granules
  nf_backend_host_set_manual_events(inner, 1);
  nf_stream_t A = (nf_stream_t)1, B = (nf_stream_t)2;
  char *x = nf_alloc(p, 2 * G, A), *y = nf_alloc(p, G, A);
  assert_true(x && y && y == x + 2 * G);
  nf_backend_host_use(inner, A, x, 2 * G); // A's work on x, in flight
  assert_int_equal(nf_free(p, x), NF_OK);
  char *z = nf_alloc_at(p, 0, y + G, 2 * G, A); // x's granules move here: views at x, its work in flight
  assert_non_null(z);
  assert_int_equal(nft_stats_of(p).views, 2);
  assert_int_equal(nf_set_limit(p, 16 * G), NF_OK);
  nf_stats_t s0 = nft_stats_of(p);
  spy->fail = 1;
  void *q = nf_alloc(p, 4 * G, B); // new granules; the first map fails
  spy->fail = 0;
  assert_null(q);
  assert_int_equal(nf_last_status(), NF_ERR_BACKEND);
  nf_stats_t s1 = nft_stats_of(p);
  assert_int_equal(s1.calls.event_sync, s0.calls.event_sync); // no host wait
  assert_int_equal(s1.views, 2);                              // the views in use stay
  assert_int_equal(nf_backend_host_violations(inner), 0);
  q = nf_alloc(p, 4 * G, B);
  assert_non_null(q);
  nf_free(p, q), nf_free(p, z), nf_free(p, y);
  nf_backend_host_complete_events(inner);
  nf_backend_host_set_manual_events(inner, 0);
  if (nf_pool_check(p) != NF_OK) fail_msg("%s", nf_last_error());
  nf_pool_destroy(p);
  uint64_t gr = 1, mp = 1;
  nf_backend_host_usage(inner, &gr, &mp);
  assert_int_equal(gr + mp, 0);
  nf_backend_destroy(&spy->be);
}

// A cached granule moved under the last, partial granule of a new block:
// the free rest after the block inherits the granule's last users, and
// keeps its own. Here that rest runs on over a granule stream C used (work
// in flight); a block placed there on stream B must still be ordered after
// C. A's record that B may wait on is older than A's own wait on C: only
// C's record orders B after C's work. (Views start first: the granule's
// users are then A's alone, not every stream's.) Catches W28 (the rest's
// streams replaced by the granule's: B waited for A only, and raced C).
static void test_edge_rest_keeps_its_own_users(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64KiB,small_max:4KiB"); // 1 granule, then 6
  assert_non_null(p);
  nf_stream_t A = (nf_stream_t)1, B = (nf_stream_t)2, C = (nf_stream_t)3;
  // Views start (a first move), so that frees stamp their granules' users
  // from then on; the granule comes back to the chunk's start.
  char *t = nf_alloc(p, G, A);
  assert_non_null(t);
  assert_int_equal(nf_free(p, t), NF_OK);
  char *t2 = nf_alloc_at(p, 0, t + 20 * G, G, A);
  assert_non_null(t2);
  assert_int_equal(nf_free(p, t2), NF_OK);
  assert_int_equal(nf_set_limit(p, 6 * G), NF_OK);
  nf_backend_host_set_manual_events(be, 1);
  char *x = nf_alloc_at(p, 0, t, 3 * G, A), *y = nf_alloc_at(p, 0, t + 3 * G, G / 2, A);
  assert_true(x && y);
  char *v = nf_alloc_at(p, 0, x + 7 * G, G, C);
  assert_non_null(v);
  nf_backend_host_use(be, C, v, G); // C's work on granule 7, in flight
  assert_int_equal(nf_free(p, v), NF_OK);
  nf_backend_host_use(be, A, x, 3 * G); // A's work on x, in flight
  assert_int_equal(nf_free(p, x), NF_OK);
  char *z = nf_alloc(p, 4096, C); // the small arena's granule
  assert_non_null(z);
  assert_int_equal(nf_record_stream(p, z, A), NF_OK);
  assert_int_equal(nf_free(p, z), NF_OK); // a record on A, after x's free (z stays pending)
  nf_stats_t s0 = nft_stats_of(p);
  char *b = nf_alloc_at(p, 0, y + G / 2, 3 * G + 512, A); // x's 3 granules move to granules 4-6
  assert_non_null(b);
  assert_int_equal(nft_stats_of(p).view_moves - s0.view_moves, 3);
  char *d = nf_alloc_at(p, 0, x + 7 * G, G, B); // in the free rest after b: granule 7, C's
  assert_non_null(d);
  nf_backend_host_use_new(be, B, d, G);
  if (nf_backend_host_violations(be)) fail_msg("d's stream B is not ordered after C's work on its granule");
  nft_fill(d, G, 1), nft_fill(b, 3 * G + 512, 2);
  assert_true(nft_check(d, G, 1));
  nf_free(p, b), nf_free(p, d), nf_free(p, y);
  nf_backend_host_complete_events(be);
  nf_backend_host_set_manual_events(be, 0);
  nft_done(p, be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_most_recently_freed_granule_moves),
      cmocka_unit_test(test_views_of_live_granules_priced_as_maps),
      cmocka_unit_test(test_failed_map_evicts_only_idle_views),
      cmocka_unit_test(test_edge_rest_keeps_its_own_users),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

