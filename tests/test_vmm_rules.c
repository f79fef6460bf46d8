// Rules of the mapping layer (src/core/vmm.c, chunk.c, granule.c) that a
// mutation study of it found no test pinning down: what the counters say
// (granules created and released, stitching's reclaims), that an address
// range holds the request it was made for, that the release policy gives
// empty handed-back ranges back and keeps a range while views are parked
// there, that spilled granules waiting for their streams are swept once
// their work is done, that `tight` moves cached granules as views (no unmap)
// at its soft limit, and that a live block keeps access to the granules
// around one its offload's finish could not map again. Each test names the
// planted bug (mutant id of the study) it catches.
#include "nf_test.h"

#include "core/core.h"

#define G (64 * 1024)


// physical == physical_created - physical_released: every device granule
// created is counted once, and trim's releases show as released (the
// PyTorch adapter's segment counts). Catches V3 (granules made by growth
// not counted: created stayed 0 and released wrapped around).
static void test_physical_created_and_released(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:8MiB");
  assert_non_null(p);
  void *a = nf_alloc(p, 3 * G, NULL);
  assert_non_null(a);
  nf_stats_t s = nft_stats_of(p);
  assert_int_equal(s.physical, 3 * G);
  assert_int_equal(s.physical_created, 3 * G);
  assert_int_equal(s.physical_released, 0);
  assert_int_equal(nf_free(p, a), NF_OK);
  assert_int_equal(nf_trim(p), NF_OK);
  s = nft_stats_of(p);
  assert_int_equal(s.physical, 0);
  assert_int_equal(s.physical_created, 3 * G);
  assert_int_equal(s.physical_released, 3 * G);
  nft_done(p, be);
}

// Stitching that unmaps a single cached granule for a request is a reclaim
// like any other (stats: reclaims, reclaimed_granules). Catches V27 (only
// reclaims of two granules or more were counted).
static void test_single_granule_reclaim_counted(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:192KiB,views:0"); // 3 granules, no views
  assert_non_null(p);
  char *a = nf_alloc(p, G, NULL), *b = nf_alloc(p, G, NULL);
  assert_true(a && b && b == a + G);
  assert_int_equal(nf_free(p, a), NF_OK); // a's granule cached, in a 1-granule hole
  void *c = nf_alloc(p, 2 * G, NULL);     // one granule created, a's unmapped and mapped again
  assert_non_null(c);
  nf_stats_t s = nft_stats_of(p);
  assert_int_equal(s.reclaims, 1);
  assert_int_equal(s.reclaimed_granules, 1);
  assert_int_equal(s.physical, 3 * G);
  nf_free(p, b), nf_free(p, c);
  nft_done(p, be);
}

// A request larger than va_chunk gets an address range of its own, its size
// rounded up to whole granules: the block fits in it. Catches C1 (the size
// rounded down: the fresh range was too small, "internal error: fresh range
// not found").
static void test_range_rounded_up_for_a_large_request(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB,va_chunk:1MiB");
  assert_non_null(p);
  size_t n = (1u << 20) + 4096; // 16 granules and a page
  char *a = nf_alloc(p, n, NULL);
  if (!a) fail_msg("%s", nf_last_error());
  nft_fill(a, n, 3);
  assert_true(nft_check(a, n, 3));
  assert_int_equal(nft_stats_of(p).mapped, 17 * G);
  nf_free(p, a);
  nft_done(p, be);
}

// The release policy gives back a range a private pool handed back once it
// has unmapped the range's last granules (nf_trim does too): kept, every
// CUDA graph's range stayed reserved. Catches V23 (the release policy never
// dropped empty handed-back ranges).
static void test_release_policy_drops_handed_back_range(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G,
                          "limit:8MiB,small_max:4KiB,release_threshold:0,release_after:0,release_idle_ms:0");
  assert_non_null(p);
  assert_int_equal(nf_private_incref(p, 1), NF_OK);
  void *x = nf_alloc_private(p, 1, 2 * G, NULL);
  assert_non_null(x);
  assert_int_equal(nf_free(p, x), NF_OK);
  nf_stats_t s0 = nft_stats_of(p);
  assert_int_equal(nf_private_release(p, 1), NF_OK); // handed back untrimmed: its granules stay mapped
  assert_int_equal(nft_stats_of(p).calls.va_release, s0.calls.va_release);
  assert_int_equal(nft_stats_of(p).mapped, 2 * G);
  void *y = nf_alloc(p, G, NULL);
  assert_non_null(y);
  assert_int_equal(nf_free(p, y), NF_OK); // the release policy: everything cached is unmapped
  nf_stats_t s1 = nft_stats_of(p);
  assert_int_equal(s1.mapped, 0);
  assert_int_equal(s1.calls.va_release - s0.calls.va_release, 1); // the handed-back range went back
  nft_done(p, be);
}

// A handed-back range stays while parked views lie in it (they are
// mappings of granules owned elsewhere): only once they are unmapped does
// the range go back. Catches C3 (a range whose only mappings were parked
// views counted as empty: released under them, the view counts wrong).
static void test_range_with_parked_views_kept(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:192KiB,small_max:4KiB"); // 3 granules
  assert_non_null(p);
  char *g = nf_alloc(p, G, NULL); // the general pool's range
  assert_non_null(g);
  assert_int_equal(nf_private_incref(p, 1), NF_OK);
  void *x = nf_alloc_private(p, 1, 2 * G, NULL);
  assert_non_null(x);
  assert_int_equal(nf_free(p, x), NF_OK);
  assert_int_equal(nf_private_release(p, 1), NF_OK); // handed back, its 2 granules cached there
  nf_stats_t s0 = nft_stats_of(p);
  char *z = nf_alloc_at(p, 0, g + G, 2 * G, NULL); // at the limit: the 2 granules move here
  assert_non_null(z);
  nft_fill(z, 2 * G, 5);
  nf_stats_t s1 = nft_stats_of(p);
  assert_int_equal(s1.view_moves - s0.view_moves, 2);
  assert_int_equal(s1.views, 2); // parked at the handed-back range, nothing mapped there
  // Another hand-back looks for empty ranges: this one is not.
  assert_int_equal(nf_private_incref(p, 2), NF_OK);
  assert_int_equal(nf_private_release(p, 2), NF_OK);
  nf_stats_t s2 = nft_stats_of(p);
  assert_int_equal(s2.calls.va_release, s1.calls.va_release);
  assert_int_equal(s2.views, 2);
  if (nf_pool_check(p) != NF_OK) fail_msg("%s", nf_last_error());
  assert_true(nft_check(z, 2 * G, 5));
  // Once trim unmaps the views, the range goes back.
  nf_free(p, z);
  assert_int_equal(nf_trim(p), NF_OK);
  nf_stats_t s3 = nft_stats_of(p);
  assert_int_equal(s3.views, 0);
  assert_int_equal(s3.calls.va_release - s2.calls.va_release, 1);
  nf_free(p, g);
  nft_done(p, be);
}

// Spilled granules left in a free range while its stream work is in flight
// cannot be swept yet: the sweep stays due and unmaps them once the work is
// done, before the next placement, so that new blocks land on the device
// again. Catches V22 (the sweep flag dropped although spilled granules
// remained: the next block landed on host memory with the device free).
static void test_spilled_granules_swept_once_done(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:256KiB,small_max:4KiB,spill:host,spill_limit:1MiB");
  assert_non_null(p);
  nf_backend_host_set_manual_events(be, 1);
  nf_stream_t A = (nf_stream_t)1, B = (nf_stream_t)2;
  char *d = nf_alloc(p, 4 * G, A), *s = nf_alloc(p, 2 * G, A); // s: device full, spilled
  assert_true(d && s && s == d + 4 * G);
  assert_int_equal(nft_stats_of(p).spilled, 2 * G);
  nf_backend_host_use(be, A, s, 2 * G); // A's work on s, in flight
  assert_int_equal(nf_free(p, s), NF_OK);
  assert_int_equal(nf_set_limit(p, 16 * G), NF_OK); // the device has room now
  void *e = nf_alloc_at(p, 0, s + 3 * G, G, B); // a sweep runs first: s's work is in flight, nothing goes
  assert_non_null(e);
  assert_int_equal(nft_stats_of(p).spilled, 2 * G);
  nf_backend_host_complete_events(be);
  void *f = nf_alloc(p, 2 * G, B); // the sweep, due still, unmaps s's host granules first
  assert_non_null(f);
  uint64_t t[3];
  nft_tiers(p, f, t);
  assert_int_equal(t[NF_TIER_HOST], 0);
  assert_int_equal(nft_stats_of(p).spilled, 0);
  assert_int_equal(nf_backend_host_violations(be), 0);
  nf_free(p, d), nf_free(p, e), nf_free(p, f);
  nf_backend_host_set_manual_events(be, 0);
  nft_done(p, be);
}

// `tight` (no hard limit): a request that would grow the pool past the live
// peak plus the slack while granules sit cached takes them as views (mapped
// at the new place too, no unmap, no wait), as far as the soft limit
// requires, and creates the rest. Catches V14 (the soft limit ignored in the
// room the views are given: nothing moved, stitching unmapped the cached
// granules instead).
static void test_tight_moves_cached_granules_as_views(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB,tight:1,small_max:4KiB");
  assert_non_null(p);
  char *x = nf_alloc(p, 10 * G, NULL), *g = nf_alloc(p, G, NULL);
  assert_true(x && g && g == x + 10 * G);
  assert_int_equal(nf_free(p, x), NF_OK); // 10 granules cached in a hole too small for the next request
  nf_stats_t s0 = nft_stats_of(p);
  // Peak 12 granules (guard + request) + slack (12/64 + 8): 20 may exist, 11
  // do, 11 are needed: 2 move as views, 9 are created.
  void *y = nf_alloc(p, 11 * G, NULL);
  assert_non_null(y);
  nf_stats_t s1 = nft_stats_of(p);
  assert_int_equal(s1.view_moves - s0.view_moves, 2);
  assert_int_equal(s1.calls.unmap - s0.calls.unmap, 0);
  assert_int_equal(s1.physical, 20 * G);
  nft_fill(y, 11 * G, 4);
  assert_true(nft_check(y, 11 * G, 4));
  nf_free(p, y), nf_free(p, g);
  nft_done(p, be);
}

// A spy whose map calls, once armed, succeed `ok` times, then fail `fail`
// times in a row.
typedef struct { nf_backend_t be; nf_backend_ops_t ops; int ok, fail; } mapspy_t;
static nf_status_t mapspy_map(nf_backend_t *be, uintptr_t v, size_t n, nf_handle_t h) {
  mapspy_t *m = (mapspy_t *)be;
  if (m->ok > 0) m->ok--;
  else if (m->fail > 0 && m->fail--) return NF_ERR_BACKEND;
  return nft_f_map(be, v, n, h);
}

// Granule g of the chunk holding address a is mapped with access (ready).
static bool ready_at(nf_pool_t *p, const char *a) {
  for (const nf_chunk_t *c = p->chunks; c; c = c->next)
    if ((uintptr_t)a >= c->base && (uintptr_t)a < c->base + c->size)
      return nf__bit(NF_READY(c), ((uintptr_t)a - c->base) >> p->gshift);
  return false;
}

// The finish of a host offload swapped the block's first granule for its
// host granule, then lost the second (the map failed, and every map back:
// 10 in a row). The error says the data there is lost; the rest of the
// block keeps access: access is set on the runs of mapped granules only,
// never over the hole. Catches V16 (the access run went on over the
// unmapped granule: the call failed, every retry too, and the swapped first
// granule, holding the block's data, stayed without access).
static void test_offload_hole_leaves_the_rest_accessible(void **state) {
  (void)state;
  mapspy_t *spy = calloc(1, sizeof *spy);
  assert_non_null(spy);
  nft_spy_init(&spy->be, &spy->ops, 1ull << 30, G);
  spy->ops.map = mapspy_map;
  nf_backend_t *inner = spy->be.inner;
  nf_pool_t *p = nft_pool_on(&spy->be, "limit:1MiB,views:0");
  nf_backend_host_set_manual_events(inner, 1);
  char *a = nf_alloc(p, 4 * G, NULL);
  assert_non_null(a);
  nft_fill(a, 4 * G, 22);
  uint64_t w0, w1;
  memcpy(&w0, a, 8);
  memcpy(&w1, a + 4096, 8);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_OK);
  nf_backend_host_complete_events(inner);
  spy->ok = 1, spy->fail = 10;
  nf_status_t r = nf_offload_wait(p);
  spy->ok = spy->fail = 0;
  assert_int_equal(r, NF_ERR_BACKEND);
  if (!strstr(nf_last_error(), "are lost")) fail_msg("%s", nf_last_error());
  uint64_t t[3];
  nft_tiers(p, a, t);
  assert_int_equal(t[NF_TIER_HOST], G); // the first granule: swapped
  assert_false(ready_at(p, a + G));     // the hole
  if (!ready_at(p, a)) fail_msg("the block's first granule, swapped for its host granule, has no access");
  uint64_t v0, v1;
  memcpy(&v0, a, 8);
  memcpy(&v1, a + 4096, 8);
  assert_true(v0 == w0 && v1 == w1);
  assert_true(ready_at(p, a + 2 * G) && ready_at(p, a + 3 * G));
  nf_backend_host_set_manual_events(inner, 0);
  nf_free(p, a); // a hole in the block: it goes as it is
  nf_pool_destroy(p);
  nf_backend_destroy(&spy->be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_physical_created_and_released),
      cmocka_unit_test(test_single_granule_reclaim_counted),
      cmocka_unit_test(test_range_rounded_up_for_a_large_request),
      cmocka_unit_test(test_release_policy_drops_handed_back_range),
      cmocka_unit_test(test_range_with_parked_views_kept),
      cmocka_unit_test(test_spilled_granules_swept_once_done),
      cmocka_unit_test(test_tight_moves_cached_granules_as_views),
      cmocka_unit_test(test_offload_hole_leaves_the_rest_accessible),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
