// Allocator models (src/replay/model.h), one rule of PyTorch's
// CUDACachingAllocator at a time, at its edges, on synthetic traces whose
// outcome follows by hand from the rule: size-class boundaries, the limit
// check on the segment size, free-and-retry over both pools and for
// oversized requests, the expandable split rule and best-fit walk, unmapping
// whole pages only, streams kept apart, the bisection's reported run.
// (test_models.c has the shared real traces and the broader cases; these
// were each found missing by a mutation study of src/replay.)
#include "model_test.h"

// get_allocation_size at its boundaries: kSmallSize (1 MiB) itself is small
// (a 2 MiB segment); kMinLargeAlloc (10 MiB) itself is not below it (its own
// 10 MiB segment), 512 B less shares a 20 MiB one.
static void test_native_size_class_edges(void **state) {
  (void)state;
  static const struct { uint64_t req, reserved; } c[] = {
      {1 * MiB, 2 * MiB}, {10 * MiB - 512, 20 * MiB}, {10 * MiB, 10 * MiB}, {10 * MiB + 1, 12 * MiB}};
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    syn_t s;
    syn_init(&s);
    syn_alloc(&s, 0, c[i].req, 0);
    nf__model_result r = syn_run(&s, NF_MODEL_NATIVE, 0);
    assert_int_equal(r.status, NF_OK);
    if (r.peak_reserved != c[i].reserved)
      fail_msg("%llu B: reserved %llu, want %llu", (unsigned long long)c[i].req,
               (unsigned long long)r.peak_reserved, (unsigned long long)c[i].reserved);
    assert_int_equal(r.segments_peak, 1);
  }
}

// alloc_block checks the limit against the segment it would reserve
// (alloc_size: 20 MiB for a 3 MiB request), not the request; the
// expandable path checks the same alloc_size.
static void test_limit_checks_alloc_size(void **state) {
  (void)state;
  for (int k = 0; k < NF_MODEL_NKINDS; k++) {
    syn_t s;
    syn_init(&s);
    syn_alloc(&s, 0, 3 * MiB, 0);
    nf__model_result r = syn_run(&s, k, 10 * MiB);
    assert_int_equal(r.status, NF_ERR_OOM);
    assert_int_equal(r.alloc_retries, 1);
    assert_int_equal(r.peak_reserved, 0);
    r = syn_run(&s, k, 20 * MiB);
    assert_int_equal(r.status, NF_OK);
    assert_int_equal(r.peak_reserved, 20 * MiB);
  }
}

// release_cached_blocks frees both pools: a cached small segment (2 MiB) is
// given back to make room for a large request under the limit.
static void test_retry_releases_small_pool(void **state) {
  (void)state;
  for (int k = 0; k < NF_MODEL_NKINDS; k++) {
    syn_t s;
    syn_init(&s);
    syn_alloc(&s, 0, 1000, 0); // small pool: 2 MiB segment / page
    syn_free(&s, 0);
    syn_alloc(&s, 1, 12 * MiB, 0); // 2 + 12 > 12: release, retry
    nf__model_result r = syn_run(&s, k, 12 * MiB);
    if (r.status != NF_OK) fail_msg("%s: %s", nf__model_name(k), r.error);
    assert_int_equal(r.alloc_retries, 1);
    assert_int_equal(r.device_frees, 1);
    assert_int_equal(r.segments_end, 1);
    // native: a 12 MiB segment; expandable: one 20 MiB page (the check is on
    // alloc_size, the map is whole pages).
    assert_int_equal(r.reserved_end, k == NF_MODEL_NATIVE ? 12 * MiB : 20 * MiB);
  }
}

// A request no segment can hold still goes through free-and-retry before
// the OOM, as PyTorch's does (cudaMalloc / the map fails, the cache is
// released, the alloc retried): the cache is empty when it is raised.
static void test_oversized_releases_cache(void **state) {
  (void)state;
  static const uint64_t huge[] = {(uint64_t)200 << 30, (uint64_t)1 << 51};
  for (int k = 0; k < NF_MODEL_NKINDS; k++) {
    for (size_t i = 0; i < 2; i++) {
      if (k == NF_MODEL_NATIVE && i == 0) continue; // 200 GiB is a valid cudaMalloc for the native model
      syn_t s;
      syn_init(&s);
      syn_alloc(&s, 0, 30 * MiB, 0);
      syn_free(&s, 0);
      syn_alloc(&s, 1, huge[i], 0);
      nf__model_result r = syn_run(&s, k, 0);
      assert_int_equal(r.status, NF_ERR_OOM);
      assert_int_equal(r.fail_event, 3);
      assert_int_equal(r.alloc_retries, 1);
      assert_int_equal(r.device_frees, 1);
      assert_int_equal(r.reserved_end, 0);
      assert_int_equal(r.segments_end, 0); // the emptied expandable segment is released too
    }
  }
}

// should_split with expandable segments: every pool splits when at least
// 512 B remain (the large pool's "more than 1 MiB" is native only).
static void test_expandable_split_rule(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, 3 * MiB, 0);             // one 20 MiB page: 3 | 17 free
  syn_alloc(&s, 1, 16 * MiB + MiB / 2, 0);  // 0.5 MiB remain: split all the same
  nf__model_result r = syn_run(&s, NF_MODEL_EXPANDABLE, 0);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.peak_reserved, 20 * MiB);
  assert_int_equal(r.peak_allocated, 19 * MiB + MiB / 2);
  r = syn_run(&s, NF_MODEL_NATIVE, 0); // native: the 17 MiB block whole
  assert_int_equal(r.peak_allocated, 20 * MiB);
}

// get_free_block with expandable segments walks on from the best fit while
// the next block can grow less: the segment's growable tail is the last
// choice. Page 0 [A 20], page 1 [B 20], page 2 [C 6 | tail 14]; A freed; a
// 12 MiB request skips the 14 MiB tail for A; 16 MiB then fits nowhere and
// grows the tail by a page (80 MiB). Taking the tail for 12 MiB would have
// left A whole for the 16 MiB (60 MiB).
static void test_expandable_best_fit_walk(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, 20 * MiB, 0);
  syn_alloc(&s, 1, 20 * MiB, 0);
  syn_alloc(&s, 2, 6 * MiB, 0);
  syn_free(&s, 0);
  syn_alloc(&s, 3, 12 * MiB, 0);
  syn_alloc(&s, 4, 16 * MiB, 0);
  nf__model_result r = syn_run(&s, NF_MODEL_EXPANDABLE, 0);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.peak_reserved, 80 * MiB);
}

// The walk stops at equal expandable sizes: of two free 10 MiB blocks that
// cannot grow, the first in (size, address) order is taken. Pages of 20 MiB:
// [a0 | a1] [a2 | a3] [a4 | tail]; a0 and a2 freed; b takes a0's place; a1
// freed merges with a2's: a free [10, 30) MiB that holds no whole page.
// Under an 80 MiB limit a 30 MiB request (60 + 30 > 80) finds no page to
// unmap and fails. (Taking a2's place leaves [0, 20) free: page 0 is unmapped
// and the retry succeeds.)
static void test_expandable_best_fit_ties(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  for (uint32_t i = 0; i < 5; i++) syn_alloc(&s, i, 10 * MiB, 0);
  syn_free(&s, 0);
  syn_free(&s, 2);
  syn_alloc(&s, 5, 10 * MiB, 0);
  syn_free(&s, 1);
  syn_alloc(&s, 6, 30 * MiB, 0);
  nf__model_result r = syn_run(&s, NF_MODEL_EXPANDABLE, 0);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.peak_reserved, 80 * MiB);
  r = syn_run(&s, NF_MODEL_EXPANDABLE, 80 * MiB);
  assert_int_equal(r.status, NF_ERR_OOM);
  assert_int_equal(r.alloc_retries, 1);
  assert_int_equal(r.device_frees, 0);
  assert_int_equal(r.reserved_end, 60 * MiB);
}

// unmap_block unmaps only the whole pages inside a free block: a free block
// [10, 50) MiB of 20 MiB pages gives back page [20, 40) alone; the slivers
// stay mapped (their pages hold live blocks).
static void test_expandable_unmap_whole_pages(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, 10 * MiB, 0); // page 0: [0, 10)
  syn_alloc(&s, 1, 40 * MiB, 0); // [10, 50): pages 1 and 2 mapped for it
  syn_alloc(&s, 2, 10 * MiB, 0); // [50, 60)
  syn_free(&s, 1);
  syn_alloc(&s, 3, 45 * MiB, 0); // 60 + 46 > 90: unmap what can go (40 + 46 fits), retry
  nf__model_result r = syn_run(&s, NF_MODEL_EXPANDABLE, 90 * MiB);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.alloc_retries, 1);
  assert_int_equal(r.device_frees, 1);
  // 40 MiB stay mapped, then 60 MiB mapped for the 45 MiB request.
  assert_int_equal(r.peak_reserved, 100 * MiB);
  assert_int_equal(r.reserved_end, 100 * MiB);
  assert_int_equal(r.device_allocs, 3); // one map per alloc that needed pages
}

// A block cached on the side stream is not taken for the default stream
// either (the stream with the smaller handle: the lower_bound lands on the
// other stream's block).
static void test_native_streams_apart(void **state) {
  (void)state;
  for (int k = 0; k < NF_MODEL_NKINDS; k++) {
    syn_t s;
    syn_init(&s);
    syn_alloc(&s, 0, 3 * MiB, 1);
    syn_free(&s, 0);
    syn_alloc(&s, 1, 3 * MiB, 0);
    nf__model_result r = syn_run(&s, k, 0);
    assert_int_equal(r.status, NF_OK);
    assert_int_equal(r.peak_reserved, 40 * MiB);
    assert_int_equal(r.segments_peak, 2);
  }
}

// nf__model_min_capacity reports the completed run at the limit it answers.
static void test_bisect_at_min(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, 3 * MiB, 0);
  syn_alloc(&s, 1, 18 * MiB, 0);
  syn_alloc(&s, 2, 30 * MiB, 0);
  syn_free(&s, 1);
  syn_alloc(&s, 3, 40 * MiB, 0);
  nf__model_bisect b;
  char err[256] = "";
  assert_int_equal(nf__model_min_capacity(NF_MODEL_NATIVE, &s.o, 0, 0, &b, err, sizeof err), NF_OK);
  assert_true(b.probes > 2);
  assert_int_equal(b.at_min.status, NF_OK);
  assert_int_equal(b.at_min.limit, b.min_capacity);
  assert_true(b.at_min.peak_reserved <= b.min_capacity);
  nf__model_result r = syn_run(&s, NF_MODEL_NATIVE, b.min_capacity);
  assert_int_equal(r.peak_reserved, b.at_min.peak_reserved);
  assert_int_equal(r.alloc_retries, b.at_min.alloc_retries);
}

// peak_op is the first op after which reserved reached its peak (the state
// the hotspots inspect): here op 1; op 3 reaches the same 30 MiB again after
// the OOM retry gave the first segment back.
static void test_peak_op_first(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, 30 * MiB, 0);
  syn_free(&s, 0);
  syn_alloc(&s, 1, 30 * MiB, 1); // another stream: 30 + 30 > 50, release, retry
  nf__model_result r = syn_run(&s, NF_MODEL_NATIVE, 50 * MiB);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.alloc_retries, 1);
  assert_int_equal(r.peak_reserved, 30 * MiB);
  assert_int_equal(r.reserved_end, 30 * MiB);
  assert_int_equal(r.peak_op, 1);
}

// find_expandable_block takes a run of free and unmapped blocks that holds
// the request exactly. A limit's retry unmaps page 1 out of the free
// [10, 40) MiB (the sliver [10, 20) stays mapped) and releases the side
// stream's segment; the 30 MiB request then fits the sliver plus the hole
// exactly and maps 20 MiB (120 MiB), rather than 40 MiB at the end (140).
static void test_expandable_exact_fit_hole(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  syn_alloc(&s, 0, 10 * MiB, 0); // page 0: [0, 10) | free [10, 20)
  syn_alloc(&s, 1, 30 * MiB, 0); // [10, 40): page 1 mapped
  syn_alloc(&s, 2, 20 * MiB, 0); // page 2
  syn_alloc(&s, 3, 40 * MiB, 1); // side stream: its own segment, 40 MiB
  syn_free(&s, 3);
  syn_free(&s, 1);
  syn_alloc(&s, 4, 60 * MiB, 0); // 100 + 60 > 140: release, retry (40 + 60)
  syn_alloc(&s, 5, 30 * MiB, 0); // 100 + 30: the sliver and the hole
  nf__model_result r = syn_run(&s, NF_MODEL_EXPANDABLE, 140 * MiB);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.alloc_retries, 1);
  assert_int_equal(r.device_frees, 2);
  assert_int_equal(r.segments_end, 1);
  assert_int_equal(r.peak_reserved, 120 * MiB);
  assert_int_equal(r.reserved_end, 120 * MiB);
}

// The retry unmaps every free block of the pool, not the first alone: two
// free pages, both needed.
static void test_expandable_release_all_free(void **state) {
  (void)state;
  syn_t s;
  syn_init(&s);
  for (uint32_t i = 0; i < 3; i++) syn_alloc(&s, i, 20 * MiB, 0); // pages 0, 1, 2
  syn_free(&s, 0);
  syn_free(&s, 2);
  syn_alloc(&s, 3, 50 * MiB, 0); // 60 + 50 > 70: unmap pages 0 and 2, then 20 + 50
  nf__model_result r = syn_run(&s, NF_MODEL_EXPANDABLE, 70 * MiB);
  assert_int_equal(r.status, NF_OK);
  assert_int_equal(r.alloc_retries, 1);
  assert_int_equal(r.device_frees, 2);
  assert_int_equal(r.device_allocs, 4); // pages 0, 1, 2, then 60 MiB for the 50
  assert_int_equal(r.reserved_end, 80 * MiB);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_native_size_class_edges),  cmocka_unit_test(test_limit_checks_alloc_size),
      cmocka_unit_test(test_retry_releases_small_pool), cmocka_unit_test(test_oversized_releases_cache),
      cmocka_unit_test(test_expandable_split_rule),    cmocka_unit_test(test_expandable_best_fit_walk),
      cmocka_unit_test(test_expandable_best_fit_ties), cmocka_unit_test(test_expandable_unmap_whole_pages),
      cmocka_unit_test(test_native_streams_apart),     cmocka_unit_test(test_bisect_at_min),
      cmocka_unit_test(test_peak_op_first),            cmocka_unit_test(test_expandable_exact_fit_hole),
      cmocka_unit_test(test_expandable_release_all_free),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
