// What a failing backend leaves behind in the tier layer (src/tier/), and
// how the pool stays consistent and recovers: a block left without access
// (never parked, given access before it is copied out), a staging range that
// cannot be unmapped (kept, released later), a rollback whose unmaps fail
// (granules left at an away block, without access). Spy backends over the
// host backend. Found by the tier mutation study and the soak's fault bursts
// (NF_SOAK_BURSTS); the tier's other rules: test_tier_rules.c.
#include "nf_test.h"

#define G (64 * 1024ull)

// A spy on which, once armed, map calls 1, 3 and 5 fail (a remap that fails
// for good, each restore of the old granule succeeding) and then set access
// fails 3 times: an offload's finish that leaves the block on the device with
// a granule mapped without access ("until nf_prefetch").
typedef struct { nf_backend_t be; nf_backend_ops_t ops; int arm, maps, accs; } accspy_t;
static nf_status_t as_map(nf_backend_t *be, uintptr_t v, size_t n, nf_handle_t h) {
  accspy_t *w = (accspy_t *)be;
  if (w->arm && w->maps < 6 && (w->maps++ & 1) == 0) return NF_ERR_BACKEND;
  return nft_f_map(be, v, n, h);
}
static nf_status_t as_acc(nf_backend_t *be, uintptr_t v, size_t n) {
  accspy_t *w = (accspy_t *)be;
  if (w->arm && w->maps >= 6 && w->accs < 3) return w->accs++, NF_ERR_BACKEND;
  return nft_f_acc(be, v, n);
}

// That block is freed (nofrag.h allows the free of any live block), or
// prefetched and then freed, or offloaded again (to each tier; then brought
// back, its data intact): the next block of its size must be fully
// accessible, and an offload must not copy out of memory it cannot read (an
// illegal address on a GPU; nofrag.c set access first). Found by the tier mutation study (a real bug, not a planted
// one): the freed block was parked in its bin and the next allocation popped
// it as it was (a pop right after the park does not look at the granules),
// with a granule still without access: a new block that faults when touched
// (here SIGSEGV; on a GPU an illegal address).
static void test_block_left_without_access(void **state) {
  (void)state;
  static const nf_tier_t again[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED, NF_TIER_DISK};
  for (int prefetch = 0; prefetch < 5; prefetch++) {
    accspy_t *w = calloc(1, sizeof *w);
    assert_non_null(w);
    nft_spy_init(&w->be, &w->ops, 1024 * G, G);
    w->ops.map = as_map;
    w->ops.set_access = as_acc;
    nf_pool_t *p = nft_pool_on(&w->be, "limit:32MiB"); // bins hold blocks up to limit/16
    uint64_t t[3];
    void *a = nf_alloc(p, 4 * G, NULL);
    assert_non_null(a);
    nft_fill(a, 4 * G, 3);
    nf_backend_host_set_manual_events(w->be.inner, 1);
    assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_OK);
    nf_backend_host_complete_events(w->be.inner);
    w->arm = 1;
    assert_int_equal(nf_offload_wait(p), NF_ERR_BACKEND);
    w->arm = 0;
    nft_last_error_has("without access until nf_prefetch");
    nf_backend_host_set_manual_events(w->be.inner, 0);
    assert_int_equal(nf_pool_check(p), NF_OK); // a reported state, marked as such
    if (prefetch == 2) { // setting the access fails: nothing moves, the block stays marked
      w->arm = 1, w->accs = 2;
      assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_ERR_BACKEND);
      w->arm = 0;
      nft_last_error_has("without access since an earlier failure");
      assert_int_equal(nf_pool_check(p), NF_OK);
      nft_tiers(p, a, t);
      assert_true(t[NF_TIER_DEVICE] == 4 * G);
    }
    if (prefetch >= 2) {
      if (nf_offload(p, a, NULL, again[prefetch - 2]) != NF_OK) fail_msg("offload again: %s", nf_last_error());
      assert_int_equal(nf_offload_wait(p), NF_OK);
      assert_int_equal(nf_pool_check(p), NF_OK);
    }
    if (prefetch) {
      assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
      assert_int_equal(nf_pool_check(p), NF_OK); // ready again, and known to be
      assert_true(nft_check(a, 4 * G, 3));
    }
    assert_int_equal(nf_free(p, a), NF_OK);
    void *b = nf_alloc(p, 4 * G, NULL);
    assert_non_null(b);
    if (nf_pool_check(p) != NF_OK) fail_msg("new block %p (a was %p): %s", b, a, nf_last_error());
    nft_fill(b, 4 * G, 4);
    assert_true(nft_check(b, 4 * G, 4));
    nf_free(p, b);
    nf_pool_destroy(p);
    nf_backend_destroy(&w->be);
  }
}

// A spy whose unmaps of `size` bytes fail while `fails` > 0.
typedef struct { nf_backend_t be; nf_backend_ops_t ops; size_t size; int fails; } unspy_t;
static nf_status_t us_unmap(nf_backend_t *be, uintptr_t v, size_t n) {
  unspy_t *w = (unspy_t *)be;
  if (n == w->size && w->fails > 0) return w->fails--, NF_ERR_BACKEND;
  return nft_f_unmap(be, v, n);
}

// An offload's staging range (4 granules, the only 4-granule unmaps here)
// that cannot be unmapped 3 times in a row is kept and released by a later
// tier call (nf_offload_wait), or at the latest by the pool's end: no
// mapping or address range is left behind. Found by the soak's fault
// bursts (NF_SOAK_BURSTS): the range was forgotten, mapped, for good.
static void test_staging_range_released_later(void **state) {
  (void)state;
  for (int until_end = 0; until_end < 2; until_end++) {
    unspy_t *w = calloc(1, sizeof *w);
    assert_non_null(w);
    nft_spy_init(&w->be, &w->ops, 1024 * G, G);
    w->ops.unmap = us_unmap;
    w->size = 4 * G;
    nf_pool_t *p = nft_pool_on(&w->be, "limit:1MiB,views:0");
    void *a = nf_alloc(p, 4 * G, NULL);
    assert_non_null(a);
    nft_fill(a, 4 * G, 5);
    uint64_t gr, maps0, maps;
    nf_backend_host_usage(w->be.inner, &gr, &maps0);
    assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_OK);
    w->fails = until_end ? 1000 : 3;
    assert_int_equal(nf_offload_wait(p), NF_OK); // the finish: the block is offloaded, its staging range stays
    nf_backend_host_usage(w->be.inner, &gr, &maps);
    assert_true(maps == maps0 + 4);
    if (!until_end) {
      assert_int_equal(nf_offload_wait(p), NF_OK); // tried again: released
      nf_backend_host_usage(w->be.inner, &gr, &maps);
      if (maps != maps0) fail_msg("%llu mappings, %llu before", (unsigned long long)maps, (unsigned long long)maps0);
    }
    assert_true(nft_check(a, 4 * G, 5));
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_free(p, a);
    w->fails = 0;
    nf_pool_destroy(p);
    nf_backend_host_usage(w->be.inner, &gr, &maps);
    if (gr || maps) fail_msg("after destroy: %llu granules, %llu mappings", (unsigned long long)gr, (unsigned long long)maps);
    nf_backend_destroy(&w->be);
  }
}

// A spy whose third map after `arm` fails, and whose unmaps fail while
// `unmaps` > 0.
typedef struct { nf_backend_t be; nf_backend_ops_t ops; int arm, maps, unmaps; } stuckspy_t;
static nf_status_t ss_map(nf_backend_t *be, uintptr_t v, size_t n, nf_handle_t h) {
  stuckspy_t *w = (stuckspy_t *)be;
  if (w->arm && ++w->maps == 3) return NF_ERR_BACKEND;
  return nft_f_map(be, v, n, h);
}
static nf_status_t ss_unmap(nf_backend_t *be, uintptr_t v, size_t n) {
  stuckspy_t *w = (stuckspy_t *)be;
  if (w->unmaps > 0) return w->unmaps--, NF_ERR_BACKEND;
  return nft_f_unmap(be, v, n);
}

// A prefetch of a disk or detached block fails (a map), and so do the
// unmaps of its rollback: the granules it mapped stay at the block, without
// access, and the pool is consistent (the block is still away); the next
// prefetch maps around them and brings the block back intact, or its free
// leaves them as cache. Found by the soak's fault bursts: nf_pool_check
// failed ("offloaded (unmapped) block still mapped").
static void test_prefetch_rollback_unmaps_fail(void **state) {
  (void)state;
  nf_tier_t tiers[] = {NF_TIER_DISK, NF_TIER_HOST_DETACHED};
  for (int k = 0; k < 4; k++) {
    stuckspy_t *w = calloc(1, sizeof *w);
    assert_non_null(w);
    nft_spy_init(&w->be, &w->ops, 1024 * G, G);
    w->ops.map = ss_map;
    w->ops.unmap = ss_unmap;
    nf_pool_t *p = nft_pool_on(&w->be, "limit:1MiB,views:0");
    void *a = nft_offloaded(p, 4 * G, tiers[k & 1], 6);
    w->arm = 1, w->unmaps = 1000;
    assert_int_equal(nf_prefetch(p, a, NULL), NF_ERR_BACKEND);
    w->arm = 0, w->unmaps = 0;
    if (nf_pool_check(p) != NF_OK) fail_msg("tier %d: %s", (int)tiers[k & 1], nf_last_error());
    if (k < 2) {
      assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
      assert_int_equal(nf_pool_check(p), NF_OK);
      assert_true(nft_check(a, 4 * G, 6));
    }
    assert_int_equal(nf_free(p, a), NF_OK);
    assert_int_equal(nf_pool_check(p), NF_OK);
    void *b = nf_alloc(p, 4 * G, NULL);
    assert_non_null(b);
    nft_fill(b, 4 * G, 7);
    assert_true(nft_check(b, 4 * G, 7));
    nf_free(p, b);
    nf_pool_destroy(p);
    nf_backend_destroy(&w->be);
  }
}


int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_block_left_without_access),
      cmocka_unit_test(test_staging_range_released_later),
      cmocka_unit_test(test_prefetch_rollback_unmaps_fail),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
