// Spill (src/core/vmm.c: host granules mapped where the device has none
// left, spill_limit, spill_reserve) and offload/prefetch of blocks that are
// spilled wholly or in part, on the host backend: its "host" tier is a second
// memfd, its copies are synchronous, and manual events keep copies "in
// flight". Every block carries a pattern that is verified across every move.
#include "nf_test.h"

#define G (64 * 1024ull)

typedef struct { void *p; size_t n; uint64_t tag; } blk_t;

static void test_spill_basic(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:512KiB,spill:host,spill_limit:1MiB"); // 8 device granules, 16 host
  blk_t b[6];
  for (int i = 0; i < 6; i++) { // 6 x 2 granules = 1.5 x the limit
    b[i].n = 2 * G;
    b[i].tag = 100 + (uint64_t)i;
    b[i].p = nf_alloc(p, b[i].n, NULL);
    assert_non_null(b[i].p);
    nft_fill(b[i].p, b[i].n, b[i].tag);
  }
  nf_stats_t s;
  nft_stats(p, &s);
  assert_true(s.spilled == 4 * G);
  assert_true(s.physical == 8 * G);
  assert_true(s.spills >= 2);
  uint64_t t[3];
  nft_tiers(p, b[0].p, t);
  assert_true(t[0] == 2 * G && t[1] == 0);
  nft_tiers(p, b[5].p, t);
  assert_true(t[1] == 2 * G && t[0] == 0);
  for (int i = 0; i < 6; i++) assert_true(nft_check(b[i].p, b[i].n, b[i].tag));
  // Past spill_limit: a clear OOM, nothing changed.
  assert_null(nf_alloc(p, 14 * G, NULL));
  assert_int_equal(nf_last_status(), NF_ERR_OOM);
  assert_non_null(strstr(nf_last_oom_report(), "raise spill_limit"));
  nft_stats(p, &s);
  assert_true(s.spilled == 4 * G);
  // Spilled memory does not stay cached: free the spilled blocks and the
  // device blocks; the next blocks land on the device.
  for (int i = 0; i < 6; i++) assert_int_equal(nf_free(p, b[i].p), NF_OK);
  void *c = nf_alloc(p, 6 * G, NULL);
  assert_non_null(c);
  nft_tiers(p, c, t);
  assert_true(t[0] == 6 * G && t[1] == 0);
  nft_stats(p, &s);
  assert_true(s.spilled == 0);
  nf_free(p, c);
  nf_pool_destroy(p);
  uint64_t gr, maps;
  nf_backend_host_usage(be, &gr, &maps);
  assert_true(gr == 0 && maps == 0);
  nf_backend_destroy(be);

  // The same requests without spill fail at the limit.
  p = nft_pool64k(&be, "limit:512KiB");
  void *q[6];
  int got = 0;
  for (int i = 0; i < 6; i++) got += (q[i] = nf_alloc(p, 2 * G, NULL)) != NULL;
  assert_int_equal(got, 4);
  assert_int_equal(nf_last_status(), NF_ERR_OOM);
  assert_non_null(strstr(nf_last_oom_report(), "set spill:host"));
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

static void test_spill_config_errors(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_config_t cfg;
  nf_config_default(&cfg);
  assert_int_equal(nf_config_parse(&cfg, "spill:host,spill_limit:1KiB", NULL, 0), NF_OK);
  assert_int_equal(nf_backend_host_create(&be, 64 * G, G), NF_OK);
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, be, &cfg), NF_ERR_CONFIG);
  assert_non_null(strstr(nf_last_error(), "spill_limit is below one granule"));
  nf_backend_destroy(be);
}

// spill_reserve: host granules made at creation, used by the first spill
// without creating any, kept by trim; more than spill_limit is an error.
static void test_spill_reserve(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:512KiB,spill:host,spill_limit:1MiB,spill_reserve:256KiB");
  nf_stats_t s;
  nft_stats(p, &s);
  assert_true(s.host_physical == 4 * G && s.spilled == 0);
  void *a = nf_alloc(p, 12 * G, NULL); // 8 device + 4 host granules
  assert_non_null(a);
  nft_stats(p, &s);
  assert_true(s.spilled == 4 * G && s.host_physical == 4 * G && s.calls.create == 8 + 4);
  nft_fill(a, 12 * G, 5);
  assert_true(nft_check(a, 12 * G, 5));
  nf_free(p, a);
  assert_int_equal(nf_trim(p), NF_OK);
  nft_stats(p, &s);
  assert_true(s.host_physical == 4 * G && s.physical == 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  nf_config_t cfg;
  nf_config_default(&cfg);
  assert_int_equal(nf_config_parse(&cfg, "spill:host,spill_limit:256KiB,spill_reserve:1MiB", NULL, 0), NF_OK);
  assert_int_equal(nf_backend_host_create(&be, 64 * G, G), NF_OK);
  p = NULL;
  assert_int_equal(nf_pool_create(&p, be, &cfg), NF_ERR_CONFIG); // before anything is created, as reserve > limit
  assert_non_null(strstr(nf_last_error(), "spill_reserve 1.000 MiB (1048576 B) exceeds the host tier's limit 262144 B"));
  uint64_t gr, maps;
  nf_backend_host_usage(be, &gr, &maps);
  assert_true(gr == 0 && maps == 0); // nothing left behind
  nf_backend_destroy(be);
}

// A block whose owned granules are all spilled: nf_offload to the host tier
// has nothing to move, so it queues no copy ordered after the block's work.
// nf_prefetch must then still wait for that work (queued before the offload,
// which the caller may do) before remapping the block onto device granules,
// as for any spilled block; and the offload moved nothing, so it is not
// counted as one.
static void test_offload_spilled_block(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:512KiB,spill:host,views:0"); // 8 device granules
  nf_stream_t A = (nf_stream_t)(uintptr_t)1, S = (nf_stream_t)(uintptr_t)2;
  void *d = nf_alloc(p, 8 * G, A), *b = nf_alloc(p, 2 * G, A);
  assert_true(d && b);
  uint64_t t[3];
  nft_tiers(p, b, t);
  assert_true(t[NF_TIER_HOST] == 2 * G); // wholly spilled
  nft_fill(b, 2 * G, 9);
  nf_backend_host_set_manual_events(be, 1);
  nf_stats_t s0, s;
  nft_stats(p, &s0);
  assert_int_equal(nf_offload(p, b, A, NF_TIER_HOST), NF_OK);
  nft_stats(p, &s);
  assert_true(s.offloads == s0.offloads && s.offloaded == 0 && s.spilled == 2 * G); // nothing moved: still spilled
  assert_int_equal(nf_free(p, d), NF_OK);
  nf_backend_host_complete_events(be); // d's work
  assert_int_equal(nf_trim(p), NF_OK);  // d's granules unmapped now: the prefetch waits for nothing to get them
  nf_backend_host_use(be, A, b, 2 * G); // work on b queued on A before the offload, in flight
  assert_int_equal(nf_prefetch(p, b, S), NF_OK);
  if (nf_backend_host_violations(be)) fail_msg("b's range remapped under its own stream's work");
  nft_tiers(p, b, t);
  assert_true(t[NF_TIER_DEVICE] == 2 * G);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  assert_true(nft_check(b, 2 * G, 9));
  nft_stats(p, &s);
  assert_int_equal(nf_free(p, b), NF_OK);
  nf_backend_host_set_manual_events(be, 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// The sequence fuzz_api found its own model wrong on: a wholly spilled block
// offloaded to the host tier stays a spilled block (NF_OK, nothing moved), so
// it is not offloaded, and a later offload to another tier moves it (disk:
// its range unmapped, its bytes in the file) instead of NF_ERR_INVALID; the
// prefetch brings it back intact.
static void test_spilled_block_host_then_disk(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:512KiB,spill:host,views:0"); // 8 device granules
  void *d = nf_alloc(p, 8 * G, NULL), *b = nf_alloc(p, 2 * G, NULL);
  assert_true(d && b);
  nft_fill(b, 2 * G, 13);
  uint64_t t[3];
  nft_tiers(p, b, t);
  assert_true(t[NF_TIER_HOST] == 2 * G); // wholly spilled
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_HOST), NF_OK);
  nf_stats_t s;
  nft_stats(p, &s);
  assert_true(s.offloaded == 0 && s.offloaded_disk == 0 && s.spilled == 2 * G); // not offloaded
  assert_true(nft_check(b, 2 * G, 13));                                       // readable in place
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_DISK), NF_OK);               // not "another tier"
  nft_stats(p, &s);
  nft_tiers(p, b, t);
  assert_true(s.offloaded_disk == 2 * G && s.spilled == 0 && t[NF_TIER_DISK] == 2 * G);
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_HOST), NF_ERR_INVALID); // now it is: another tier
  assert_int_equal(nf_free(p, d), NF_OK);
  assert_int_equal(nf_prefetch(p, b, NULL), NF_OK);
  nft_tiers(p, b, t);
  assert_true(t[NF_TIER_DEVICE] == 2 * G && nft_check(b, 2 * G, 13));
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_int_equal(nf_free(p, b), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A partly spilled block offloaded to the host: all of its owned granules
// then hold an offloaded block, the spilled ones too ("spilled" counts host
// granules of blocks that are not offloaded).
static void test_offload_partly_spilled(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:512KiB,spill:host,views:0"); // 8 device granules
  void *d = nf_alloc(p, 6 * G, NULL), *b = nf_alloc(p, 4 * G, NULL); // b: 2 device + 2 spilled granules
  assert_true(d && b);
  nft_fill(b, 4 * G, 4);
  nf_stats_t s;
  nft_stats(p, &s);
  assert_true(s.spilled == 2 * G && s.offloaded == 0);
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nft_stats(p, &s);
  assert_true(s.offloaded == 4 * G && s.spilled == 0);
  assert_int_equal(nf_free(p, d), NF_OK);
  assert_int_equal(nf_prefetch(p, b, NULL), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nft_stats(p, &s);
  assert_true(s.offloaded == 0 && s.spilled == 0 && nft_check(b, 4 * G, 4));
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_free(p, b), NF_OK); // in flight
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nft_stats(p, &s);
  assert_true(s.offloaded == 0 && s.spilled == 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A block wholly spilled when offloaded to the host tier needs no copy: it is
// "offloaded" at once, with nothing ordering the work queued on its stream
// before nf_offload (which the contract allows). nf_prefetch must then wait
// for that work before it swaps device granules in under the block, as for
// any spilled block (before the fix it swapped at once, under the work).
static void test_prefetch_spilled_offload_waits(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:512KiB,spill:host,spill_limit:1MiB"); // 8 device granules
  nf_stream_t S = (nf_stream_t)(uintptr_t)7;
  nf_backend_host_set_manual_events(be, 1);
  void *a = nf_alloc(p, 8 * G, NULL), *b = nf_alloc(p, 4 * G, S);
  assert_true(a && b);
  uint64_t t[3];
  nft_tiers(p, b, t);
  assert_true(t[NF_TIER_HOST] == 4 * G); // all spilled
  nft_fill(b, 4 * G, 9);
  nf_backend_host_use(be, S, b, 4 * G); // a kernel on S, in flight
  assert_int_equal(nf_offload(p, b, S, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_free(p, a), NF_OK);
  assert_int_equal(nf_prefetch(p, b, S), NF_OK);
  if (nf_backend_host_violations(be)) fail_msg("b's host granules unmapped under S's work");
  nft_tiers(p, b, t);
  assert_true(t[NF_TIER_DEVICE] == 4 * G && nft_check(b, 4 * G, 9));
  nf_free(p, b);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_backend_host_set_manual_events(be, 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A spilled block used on a record_stream stream R: nf_prefetch moves its
// spilled granules (it may be in use), so it waits for every stream of the
// block first, R included, not only its own and the prefetch's.
static void test_prefetch_spilled_waits_record_stream(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:512KiB,spill:host,views:0"); // 8 device granules
  nf_stream_t A = (nf_stream_t)(uintptr_t)1, R = (nf_stream_t)(uintptr_t)3;
  void *d = nf_alloc(p, 8 * G, A), *b = nf_alloc(p, 2 * G, A);
  assert_true(d && b);
  uint64_t t[3];
  nft_tiers(p, b, t);
  assert_true(t[NF_TIER_HOST] == 2 * G); // wholly spilled
  nft_fill(b, 2 * G, 17);
  assert_int_equal(nf_record_stream(p, b, R), NF_OK);
  assert_int_equal(nf_free(p, d), NF_OK);
  assert_int_equal(nf_trim(p), NF_OK); // d's granules unmapped: the prefetch waits for nothing to get them
  nf_backend_host_set_manual_events(be, 1);
  nf_backend_host_use(be, R, b, 2 * G); // a kernel on R reads b, in flight
  assert_int_equal(nf_prefetch(p, b, A), NF_OK);
  if (nf_backend_host_violations(be)) fail_msg("b's spilled granules remapped under its record_stream stream's work");
  nft_tiers(p, b, t);
  assert_true(t[NF_TIER_DEVICE] == 2 * G);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  assert_true(nft_check(b, 2 * G, 17));
  assert_int_equal(nf_free(p, b), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_backend_host_set_manual_events(be, 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// The first spill of a pool warns once on stderr, unless NOFRAG_QUIET_SPILL
// is on; "0" means off, as for every on/off variable (it silenced the
// warning before, as any value did).
static void spill_twice(void *arg) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:256KiB,spill:host"); // 4 device granules
  void *a = nf_alloc(p, 6 * G, NULL), *b = nf_alloc(p, 2 * G, NULL); // both spill
  *(int *)arg = a && b;
  nf_free(p, a);
  nf_free(p, b);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

static int spill_warnings(const char *quiet) {
  if (quiet) setenv("NOFRAG_QUIET_SPILL", quiet, 1);
  else unsetenv("NOFRAG_QUIET_SPILL");
  int ok = 0;
  char *err = nft_capture_stderr(spill_twice, &ok);
  assert_true(ok);
  int k = 0;
  for (const char *s = err; (s = strstr(s, "are backed by host memory instead")); s++) k++;
  free(err);
  return k;
}

static void test_spill_warning_and_quiet(void **state) {
  (void)state;
  assert_int_equal(spill_warnings(NULL), 1); // once per pool, not per spill
  assert_int_equal(spill_warnings("0"), 1);
  assert_int_equal(spill_warnings(""), 1);
  assert_int_equal(spill_warnings("1"), 0);
  assert_int_equal(spill_warnings("yes"), 0);
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spill_basic),           cmocka_unit_test(test_spill_config_errors),
      cmocka_unit_test(test_spill_reserve),         cmocka_unit_test(test_offload_spilled_block),
      cmocka_unit_test(test_spilled_block_host_then_disk),
      cmocka_unit_test(test_offload_partly_spilled), cmocka_unit_test(test_prefetch_spilled_offload_waits),
      cmocka_unit_test(test_prefetch_spilled_waits_record_stream),
      cmocka_unit_test(test_spill_warning_and_quiet),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
