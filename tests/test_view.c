// Views (src/core/view.c): a granule stays mapped where it served before, so
// that a block landing there again takes it back with no backend call. These
// tests hold the aliasing to account: patterns in every live block survive
// view reuse, moves, eviction, spill, offload, trim and limit changes; the
// pool checker (no granule owned at two places, no view under a live block)
// runs throughout; a repeating workload at the limit converges to zero calls.
// A reused granule ordered after its last users: test_view_order.c.
#include "nf_test.h"

#include "backend/backend.h"

#define G (64 * 1024)

// This test binary links with -Wl,--wrap=calloc (tests/CMakeLists.txt): the
// next calloc of a view tick array (n >= 1024 entries of 8 bytes) fails when
// armed, the library's calls stay unchanged otherwise.
void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);
static int fail_tick_calloc, fail_map_calloc;
void *__wrap_calloc(size_t n, size_t size) {
  if (fail_tick_calloc && size == 8 && n >= 1024) {
    fail_tick_calloc = 0;
    return NULL;
  }
  if (fail_map_calloc && size == 2 * sizeof(void *) && n >= 2048) { // the block map growing (blockmap.c)
    fail_map_calloc = 0;
    return NULL;
  }
  return __real_calloc(n, size);
}

// The pool's statistics (nft_stats_of, nf_test.h).
static nf_stats_t stats(nf_pool_t *p) { return nft_stats_of(p); }

// The host backend maps one granule at two places: writes through one show
// through the other, and unmapping one leaves the other intact (the property
// views rest on; CUDA maps one handle at any number of ranges alike).
static void test_backend_maps_a_granule_twice(void **state) {
  nf_backend_t *be;
  assert_int_equal(nf_backend_host_create(&be, 64 * G, G), NF_OK);
  uintptr_t va = 0;
  nf_handle_t h;
  assert_int_equal(be->ops->va_reserve(be, 8 * G, 0, &va), NF_OK);
  assert_int_equal(be->ops->mem_create(be, NF_TIER_DEVICE, G, &h), NF_OK);
  uintptr_t a = va + G, b = va + 5 * G;
  assert_int_equal(be->ops->map(be, a, G, h), NF_OK);
  assert_int_equal(be->ops->map(be, b, G, h), NF_OK);
  assert_int_equal(be->ops->set_access(be, a, G), NF_OK);
  assert_int_equal(be->ops->set_access(be, b, G), NF_OK);
  nft_fill((void *)a, G, 7);
  assert_true(nft_check((void *)b, G, 7));
  nft_fill((void *)b, G, 8);
  assert_true(nft_check((void *)a, G, 8));
  assert_int_equal(be->ops->unmap(be, a, G), NF_OK);
  assert_true(nft_check((void *)b, G, 8));
  assert_int_equal(be->ops->mem_release(be, h), NF_OK); // deferred: b still maps it
  assert_true(nft_check((void *)b, G, 8));
  assert_int_equal(be->ops->unmap(be, b, G), NF_OK);
  assert_int_equal(be->ops->va_release(be, va, 8 * G), NF_OK);
  uint64_t gr = 1, mp = 1;
  nf_backend_host_usage(be, &gr, &mp);
  assert_int_equal(gr, 0);
  assert_int_equal(mp, 0);
  nf_backend_destroy(be);
}

// One "training step": layers A are allocated, every other one freed, then
// two larger blocks B (they fit in no hole: their granules come from the
// holes), then everything is freed. Each block is filled at allocation and
// checked at its free. False (everything freed) when an allocation fails.
enum { STEP_A = 8, STEP_B = 2 };
static bool step(nf_pool_t *p, int it, nf_stream_t s) {
  void *a[STEP_A] = {0}, *b[STEP_B] = {0};
  size_t na = 5 * G - 300, nb = 10 * G - 2000;
  bool ok = true;
  for (int i = 0; i < STEP_A && ok; i++)
    if ((ok = (a[i] = nf_alloc(p, na, s)) != NULL)) nft_fill(a[i], na, (uint64_t)it * 100 + (uint64_t)i);
  for (int i = 0; i < STEP_A && ok; i += 2) {
    assert_true(nft_check(a[i], na, (uint64_t)it * 100 + (uint64_t)i));
    assert_int_equal(nf_free(p, a[i]), NF_OK);
    a[i] = NULL;
  }
  for (int i = 0; i < STEP_B && ok; i++)
    if ((ok = (b[i] = nf_alloc(p, nb, s)) != NULL)) nft_fill(b[i], nb, (uint64_t)it * 100 + 50 + (uint64_t)i);
  for (int i = 0; i < STEP_A; i++)
    if (a[i]) {
      assert_true(nft_check(a[i], na, (uint64_t)it * 100 + (uint64_t)i));
      assert_int_equal(nf_free(p, a[i]), NF_OK);
    }
  for (int i = 0; i < STEP_B; i++)
    if (b[i]) {
      assert_true(nft_check(b[i], nb, (uint64_t)it * 100 + 50 + (uint64_t)i));
      assert_int_equal(nf_free(p, b[i]), NF_OK);
    }
  return ok;
}

static nf_pool_t *step_pool(nf_backend_t **be, uint64_t limit_granules, int views) {
  char conf[96];
  snprintf(conf, sizeof conf, "limit:%llu,views:%d", (unsigned long long)(limit_granules * G), views);
  nf_pool_t *p = nft_pool(be, 1ull << 30, G, conf);
  assert_non_null(p);
  return p;
}

// At the smallest limit the steps fit in (one granule above it), the first
// steps stitch (views are made); from then on every step takes its views
// back: zero calls. With views off the same steps keep unmapping and mapping.
static void test_steady_state_makes_no_calls(void **state) {
  nf_backend_t *be;
  uint64_t lim = 1;
  for (bool ok = false; !ok && lim < 200; lim++) { // the smallest limit 3 steps fit in, views off
    nf_pool_t *p = step_pool(&be, lim, 0);
    ok = step(p, 0, NULL) && step(p, 1, NULL) && step(p, 2, NULL);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
  }
  for (int views = 0; views < 2; views++) {
    nf_pool_t *p = step_pool(&be, lim, views ? 1000 : 0);
    uint64_t last = 0;
    for (int it = 0; it < 12; it++) {
      uint64_t c0 = stats(p).backend_calls;
      assert_true(step(p, it, NULL));
      last = stats(p).backend_calls - c0;
      assert_int_equal(nf_pool_check(p), NF_OK);
    }
    nf_stats_t s = stats(p);
    if (views) {
      assert_int_equal(last, 0);
      assert_true(s.view_reuses > 0 && s.view_moves > 0);
    } else {
      assert_true(last > 0); // the same steps without views: calls every step
      assert_int_equal(s.view_reuses + s.view_moves + s.views, 0);
    }
    // Every view is unmapped at destroy; nothing is left in the backend.
    nf_pool_destroy(p);
    uint64_t gr = 1, mp = 1;
    nf_backend_host_usage(be, &gr, &mp);
    assert_int_equal(gr + mp, 0);
    nf_backend_destroy(be);
  }
}

typedef struct { void *p; size_t n; uint64_t tag; int off; } slot_t;

static void check_all(const slot_t *l, int n, const char *when, uint64_t seed, int it) {
  for (int k = 0; k < n; k++)
    if (l[k].p && !l[k].off && !nft_check(l[k].p, l[k].n, l[k].tag))
      fail_msg("seed %llu it %d (%s): block %d (%zu B at %p) lost its data", (unsigned long long)seed, it, when, k,
               l[k].n, l[k].p);
}

// Randomized, at the limit, three streams, a tiny view budget (eviction all
// the time), manual events (stream work held in flight), record_stream,
// spill, offload / prefetch, trim and limit changes. After every operation
// the live blocks are checked; the pool checker runs every 16 operations.
// With manual events each block is declared in use on its streams (as a
// kernel would be): the host backend counts any unmap of it before an event
// after that use completed, and there must be none.
static void run_random(uint64_t seed, const char *conf, bool manual) {
  enum { SLOTS = 40 };
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, conf);
  assert_non_null(p);
  if (manual) nf_backend_host_set_manual_events(be, 1);
  slot_t l[SLOTS] = {{0}};
  uint64_t rng = seed;
  for (int it = 0; it < 3000; it++) {
    int i = (int)(nft_rand(&rng) % SLOTS);
    nf_stream_t s = (nf_stream_t)(uintptr_t)(1 + nft_rand(&rng) % 3);
    uint64_t r = nft_rand(&rng);
    if (l[i].p && r % 11 == 0) { // offload / prefetch instead of a free
      // The caller orders its work on the block before the offload's stream
      // (nf_offload's contract); the host model has no cross-stream order.
      if (manual) nf_backend_host_complete_events(be);
      if (!l[i].off) {
        if (nf_offload(p, l[i].p, s, r % 2 ? NF_TIER_HOST : NF_TIER_HOST_DETACHED) == NF_OK) l[i].off = 1;
      } else {
        if (nf_prefetch(p, l[i].p, s) == NF_OK) {
          l[i].off = 0;
          if (!nft_check(l[i].p, l[i].n, l[i].tag)) fail_msg("seed %llu it %d: data lost by offload", (unsigned long long)seed, it);
        }
      }
    } else if (l[i].p) {
      if (!l[i].off && !nft_check(l[i].p, l[i].n, l[i].tag))
        fail_msg("seed %llu it %d: block lost its data before its free", (unsigned long long)seed, it);
      if (r % 7 == 0) {
        assert_int_equal(nf_record_stream(p, l[i].p, s), NF_OK);
        if (!l[i].off) nf_backend_host_use(be, s, l[i].p, l[i].n);
      }
      assert_int_equal(nf_free(p, l[i].p), NF_OK);
      l[i].p = NULL;
      l[i].off = 0;
    } else {
      size_t n = r % 3 == 0 ? 1 + r % 4096 : 1 + r % (9 * G);
      void *q = nf_alloc(p, n, s);
      if (q) {
        nft_fill(q, n, r);
        nf_backend_host_use(be, s, q, n);
        l[i] = (slot_t){q, n, r, 0};
      } else {
        assert_int_equal(nf_last_status(), NF_ERR_OOM);
      }
    }
    if (manual && r % 5 == 0) nf_backend_host_complete_events(be);
    if (it % 997 == 500) assert_int_equal(nf_trim(p), NF_OK);
    if (it == 1500) nf_set_limit(p, 40 * G); // may fail (live above it): must stay consistent
    if (it == 2200) assert_int_equal(nf_set_limit(p, 64 * G), NF_OK);
    check_all(l, SLOTS, "after an operation", seed, it);
    if (it % 16 == 0 && nf_pool_check(p) != NF_OK)
      fail_msg("seed %llu it %d: %s", (unsigned long long)seed, it, nf_last_error());
  }
  nf_backend_host_complete_events(be);
  for (int k = 0; k < SLOTS; k++)
    if (l[k].p) {
      if (l[k].off) assert_int_equal(nf_prefetch(p, l[k].p, NULL), NF_OK);
      assert_true(nft_check(l[k].p, l[k].n, l[k].tag));
      assert_int_equal(nf_free(p, l[k].p), NF_OK);
    }
  nf_stats_t s = stats(p);
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_true(s.view_reuses > 0 && s.view_moves > 0 && s.view_evictions > 0);
  if (nf_backend_host_violations(be))
    fail_msg("seed %llu: %llu unmaps of ranges still in use", (unsigned long long)seed,
             (unsigned long long)nf_backend_host_violations(be));
  nf_pool_destroy(p);
  uint64_t gr = 1, mp = 1;
  nf_backend_host_usage(be, &gr, &mp);
  assert_int_equal(gr + mp, 0);
  nf_backend_destroy(be);
}

static void test_random_patterns(void **state) {
  const char *conf = "limit:48MiB,views:6,spill:host,spill_limit:32MiB,small_max:8KiB";
  for (uint64_t seed = 1; seed <= 6; seed++) run_random(seed, conf, seed % 2);
  for (uint64_t seed = 7; seed <= 12; seed++) run_random(seed, conf, true); // work in flight all along
  run_random(nft_env_seed(99), "limit:48MiB,views:64,tight:1", true);
}

// views:N bounds the mappings views add (the host backend's mmap count is
// bounded by vm.max_map_count): idle views are evicted beyond it.
static void test_view_budget(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:4MiB,views:8");
  uint64_t rng = 5;
  for (int it = 0; it < 400; it++) {
    void *a = nf_alloc(p, (1 + nft_rand(&rng) % 40) * G, NULL);
    void *b = nf_alloc(p, (1 + nft_rand(&rng) % 20) * G, NULL);
    nf_free(p, a);
    nf_free(p, b);
    assert_true(stats(p).views <= 8 + 64); // evicted down to 4 once above 8 (+ one request's moves)
  }
  nf_stats_t s = stats(p);
  assert_true(s.view_evictions > 0);
  uint64_t gr, mp;
  nf_backend_host_usage(be, &gr, &mp);
  assert_true(mp <= s.mapped / G + s.views);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A chunk's park ticks (view.c, park) are allocated at its first park; when
// that allocation fails, the views parked then must still be unmapped only
// after the work through them, also once a later park has allocated the
// ticks (before the fix they read tick 0 there: no wait at all).
static void test_park_ticks_out_of_memory(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:256KiB,views:1000,small_max:4KiB");
  nf_backend_host_set_manual_events(be, 1);
  nf_stream_t S0 = (nf_stream_t)0x10, X = (nf_stream_t)0x20, Y = (nf_stream_t)0x28, S = (nf_stream_t)0x30,
              S3 = (nf_stream_t)0x40;
  // Earlier work on X and Y, known complete (their done ticks are above 0).
  nf_free(p, nf_alloc(p, G, X));
  nf_free(p, nf_alloc(p, G, Y));
  assert_int_equal(nf_trim(p), NF_OK);
  void *a = nf_alloc(p, G, X), *l1 = nf_alloc(p, G, S0), *b = nf_alloc(p, G, Y), *l2 = nf_alloc(p, G, S0);
  assert_true(a && l1 && b && l2);
  nf_backend_host_use(be, X, a, G); // X's work on a, in flight
  nf_free(p, a);
  nf_backend_host_use(be, Y, b, G);
  nf_free(p, b);
  nf_stats_t s0 = stats(p);
  fail_tick_calloc = 1; // the first park's tick array: out of memory; the second park's allocates it
  void *n1 = nf_alloc(p, 2 * G, S); // a's and b's granules move here; views stay at a and b
  fail_tick_calloc = 0;
  assert_non_null(n1);
  assert_int_equal(stats(p).view_moves - s0.view_moves, 2);
  assert_int_equal(nf_set_limit(p, 8 * G), NF_OK); // room: the next blocks land on a's and b's places
  for (int k = 0; k < 2; k++) assert_non_null(nf_alloc(p, G, S3));
  assert_true(stats(p).view_evictions - s0.view_evictions >= 2);
  assert_int_equal(nf_backend_host_violations(be), 0); // neither view unmapped under X's or Y's work
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_backend_host_set_manual_events(be, 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A stream that only ever allocates (a long-lived block, never a free) is
// named in every granule's last users once views start (views_on is
// conservative); it has no work on freed memory, so it must not pin the
// free ranges those marks reach: trim unmaps them, and stitching can take
// them (it once waited for a record on that stream that nothing made).
// Trim also unmaps parked views where `retain` keeps every granule.
static void test_allocating_only_stream_pins_nothing(void **state) {
  for (int retain = 0; retain < 2; retain++) {
    nf_backend_t *be;
    nf_pool_t *p = nft_pool(&be, 1ull << 30, G, retain ? "limit:256KiB,views:4,small_max:8KiB,retain:256KiB"
                                                        : "limit:256KiB,views:4,small_max:8KiB"); // 4 granules
    assert_non_null(p);
    nf_stream_t A = (nf_stream_t)0x100, S = NULL;
    void *a = nf_alloc(p, 4096, A); // A never frees
    void *p1 = nf_alloc(p, G, S), *p2 = nf_alloc(p, G, S), *p3 = nf_alloc(p, G, S);
    assert_true(a && p1 && p2 && p3);
    nft_fill(a, 4096, 9);
    nf_free(p, p1);
    nf_free(p, p3);
    void *q = nf_alloc(p, 2 * G - 512, S); // at the limit: a cached granule moves (views start)
    assert_non_null(q);
    assert_true(stats(p).view_moves > 0);
    nf_free(p, q);
    nf_free(p, p2);
    assert_int_equal(nf_trim(p), NF_OK);
    nf_stats_t s = stats(p);
    assert_int_equal(s.mapped, G); // only a's granule
    assert_int_equal(s.views, 0);
    assert_int_equal(s.physical, retain ? 4 * G : G);
    void *r = nf_alloc(p, 3 * G - 4096, S); // live 1 + 3 <= 4 granules: nofrag.h's guarantee
    assert_non_null(r);
    assert_true(nft_check(a, 4096, 9));
    nf_free(p, r);
    nf_free(p, a);
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
  }
}

// Out of host memory for the block map's growth: the allocation fails before
// anything is placed or mapped (it used to place the block -- mapping, moving
// views and forgetting their granules' last users -- and then give it back),
// so the pool is exactly as before, backend calls included.
static void test_map_growth_failure_changes_nothing(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  void *b[512];
  for (int i = 0; i < 512; i++) assert_non_null(b[i] = nf_alloc(p, G, NULL)); // half the map's 1,024 slots
  nf_stats_t s0 = stats(p);
  fail_map_calloc = 1;
  assert_null(nf_alloc(p, 3 * G, NULL)); // the 513th entry grows the map
  assert_int_equal(nf_last_status(), NF_ERR_NOMEM);
  fail_map_calloc = 0;
  nf_stats_t s1 = stats(p);
  assert_int_equal(s1.backend_calls, s0.backend_calls);
  assert_int_equal(s1.mapped, s0.mapped);
  assert_int_equal(s1.physical, s0.physical);
  assert_int_equal(nf_pool_check(p), NF_OK);
  void *x = nf_alloc(p, 3 * G, NULL);
  assert_non_null(x);
  nf_free(p, x);
  for (int i = 0; i < 512; i++) nf_free(p, b[i]);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_map_growth_failure_changes_nothing),
      cmocka_unit_test(test_allocating_only_stream_pins_nothing),
      cmocka_unit_test(test_backend_maps_a_granule_twice), cmocka_unit_test(test_steady_state_makes_no_calls),
      cmocka_unit_test(test_random_patterns),             cmocka_unit_test(test_view_budget),
      cmocka_unit_test(test_park_ticks_out_of_memory)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
