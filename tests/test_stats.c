// Statistics and the invariant checker (src/core/stats.c): figures nf_stats_get
// derives from the pool's counters, nf_stats_reset_peaks, and corruptions
// nf_pool_check must catch (more in test_pool.c, test_check_detects_corruption).
// Tests written by a mutation study of stats.c: each fails with one planted bug.
#include "nf_test.h"
#include "core/core.h" // white box: corrupt the structures the checker walks

#include <errno.h>
#include <time.h>

#define G (64 * 1024)

// Peaks reset to the current levels, not to zero: a peak below the level
// it tracks would be nonsense (and the next allocation's peak would be low).
static void test_reset_peaks_to_now(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  void *a = nf_alloc(p, 3 * G + 100, NULL), *b = nf_alloc(p, 5 * G, NULL);
  assert_true(a && b);
  assert_int_equal(nf_free(p, b), NF_OK);
  nf_stats_reset_peaks(p);
  nf_stats_t s = nft_stats_of(p);
  assert_int_equal(s.live, 3 * G + 100);
  assert_int_equal(s.live_peak, s.live);
  assert_int_equal(s.live_rounded_peak, s.live_rounded);
  assert_int_equal(s.mapped_peak, s.mapped);
  assert_int_equal(s.physical_peak, s.physical);
  nf_free(p, a);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// physical == physical_created - physical_released (nofrag.h), across a trim
// that gives granules back.
static void test_physical_created_released(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  void *a = nf_alloc(p, 4 * G, NULL), *b = nf_alloc(p, 6 * G, NULL);
  assert_true(a && b);
  assert_int_equal(nf_free(p, b), NF_OK);
  assert_int_equal(nf_trim(p), NF_OK);
  nf_stats_t s = nft_stats_of(p);
  assert_true(s.physical_released > 0 && s.physical > 0);
  assert_int_equal(s.physical, s.physical_created - s.physical_released);
  nf_free(p, a);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// live_granules: granules under live blocks, one shared by two blocks counted
// once (the figure the guarantee of nofrag.h is stated in).
static void test_live_granules_shared_once(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  char *a = nf_alloc(p, 512, NULL), *b = nf_alloc(p, 512, NULL), *c = nf_alloc(p, G, NULL);
  assert_true(a && b == a + 512 && c == b + 512); // a, b in one granule; c over it and the next
  assert_int_equal(nft_stats_of(p).live_granules, 2);
  nf_free(p, a), nf_free(p, b), nf_free(p, c);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// The checker catches each corruption, with its message; each is undone.
static void check_fails(nf_pool_t *p, const char *msg) {
  if (nf_pool_check(p) != NF_ERR_INVALID) fail_msg("not caught: the corruption of \"%s\"", msg);
  nft_last_error_has(msg);
}
// Time in backend calls goes to the call's kind: a backend whose map sleeps
// 2 ms shows it under call_ns.map, not under create (microseconds on memfd),
// nothing under kinds never called, and backend_ns is the sum.
static const nf_backend_ops_t *host_ops;
static nf_status_t slow_map(nf_backend_t *be, uintptr_t va, size_t size, nf_handle_t h) {
  struct timespec t = {0, 2000000};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
  return host_ops->map(be, va, size, h);
}

static void test_call_time_by_kind(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:64MiB");
  host_ops = be->ops;
  nf_backend_ops_t slow = *be->ops;
  slow.map = slow_map;
  be->ops = &slow;
  void *a[4];
  for (int i = 0; i < 4; i++) assert_non_null(a[i] = nf_alloc(p, 3 * G + 100, NULL));
  nf_stats_t s = nft_stats_of(p);
  assert_true(s.calls.map >= 4);
  assert_true(s.call_ns.map >= s.calls.map * 2000000ull);
  assert_true(s.calls.create >= 4);
  assert_true(s.call_ns.create < s.call_ns.map / 4);
  assert_int_equal(s.calls.copy, 0);
  assert_int_equal(s.call_ns.copy, 0);
  assert_int_equal(s.calls.event_sync, 0);
  assert_int_equal(s.call_ns.event_sync, 0);
  const uint64_t *n = &s.call_ns.va_reserve;
  uint64_t sum = 0;
  for (size_t k = 0; k < sizeof s.call_ns / sizeof *n; k++) sum += n[k];
  assert_int_equal(s.backend_ns, sum);
  for (int i = 0; i < 4; i++) nf_free(p, a[i]);
  nf_pool_destroy(p);
  be->ops = host_ops;
  nf_backend_destroy(be);
}

static void test_check_catches(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:8MiB");
  char *a = nf_alloc(p, 2 * G, NULL); // one chunk: a, then its free tail f
  assert_non_null(a);
  nf_block_t *f = nf__map_find(p, (uintptr_t)a)->next;
  assert_true(f && f->state == NF_BLK_FREE && !f->next);
  assert_int_equal(nf_pool_check(p), NF_OK);
  // 1. The free tail moved up by 512 B: a gap after a, and the tail running
  //    512 B past the chunk's end (the sizes still add up to the chunk's).
  f->addr += NF_ALIGN;
  check_fails(p, "gap or overlap");
  f->addr -= NF_ALIGN;
  // 2. An indexed free block marked parked (a bin's block in the TLSF index).
  f->parked = 1;
  check_fails(p, "non-free block in the free index");
  f->parked = 0;
  // 3. Rounded live bytes.
  p->st.live_rounded += NF_ALIGN;
  check_fails(p, "live counters");
  p->st.live_rounded -= NF_ALIGN;
  // 4. A private pool's free index holding a general free block.
  assert_int_equal(nf_private_incref(p, 4), NF_OK);
  nf_priv_t *pv = nf__priv_find(p, 4);
  nf__tlsf_remove(nf__tlsf_of(p, f), f);
  nf__tlsf_insert(&pv->tlsf[f->arena], f);
  check_fails(p, "not its free block");
  nf__tlsf_remove(&pv->tlsf[f->arena], f);
  nf__tlsf_insert(nf__tlsf_of(p, f), f);
  // 5. A private pool's live-block counter.
  pv->live_blocks++;
  check_fails(p, "counts 1 live blocks");
  pv->live_blocks--;
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_int_equal(nf_private_release(p, 4), NF_OK);
  assert_int_equal(nf_free(p, a), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reset_peaks_to_now),
      cmocka_unit_test(test_physical_created_released),
      cmocka_unit_test(test_live_granules_shared_once),
      cmocka_unit_test(test_check_catches),
      cmocka_unit_test(test_call_time_by_kind),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
