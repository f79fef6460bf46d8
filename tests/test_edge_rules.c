// Edge sharing's placement rules (src/core/edge.c), each test written by a
// mutation study and failing with its mutant: the best-fitting lender, the
// tighter side, a request still short with both ends refused with no call,
// small-arena lenders, requests of one granule or less, none during a capture,
// host-tier granules never gathered, the
// parked view keeping the work through it, faults in a both-ends placement,
// a map retried after unmapping idle views.
#include "edge_test.h"

// A backend whose next `fail_map` map calls fail.
typedef struct {
  nf_backend_t be;
  nf_backend_ops_t ops;
  int fail_map;
} mapspy_t;
static nf_status_t ms_map(nf_backend_t *be, uintptr_t v, size_t n, nf_handle_t h) {
  if (((mapspy_t *)be)->fail_map > 0 && ((mapspy_t *)be)->fail_map--) return NF_ERR_BACKEND;
  return nft_f_map(be, v, n, h);
}

// Two granule tails fit the request's head: the tighter one is lent (granule
// 3's last quarter, exactly the G/4 needed), and the other (granule 1's free
// half) stays whole, usable at its own place.
static void test_edge_best_fit(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1", false);
  char *a1 = take(&s, 3 * G / 2, true), *a2 = take(&s, G / 2, false);
  char *a3 = take(&s, 7 * G / 4, true), *a4 = take(&s, G / 4, false);
  take(&s, G, true);
  assert_ptr_equal(a2, a1 + 3 * G / 2);
  assert_ptr_equal(a4, a3 + 7 * G / 4);
  give(&s, a2);
  give(&s, a4);
  give(&s, take(&s, 3 * G, false)); // granules 5..7 cached
  char *c = nf_alloc(s.p, 3 * G + G / 4, 0);
  assert_non_null(c);
  assert_int_equal(st(&s).edges, 1);
  memset(c, 0x5A, G / 4);
  for (uint64_t i = 0; i < G / 4; i += 512) assert_int_equal(((unsigned char *)a4)[i], 0x5A);
  nft_fill(c, 3 * G + G / 4, 15);
  s.l[s.n++] = (nft_live_t){.p = c, .n = 3 * G + G / 4, .tag = 15};
  assert_ptr_equal(take(&s, G / 2, true), a2);
  nft_check_all(s.l, s.n);
  pool_off(&s);
}

// A granule tail and a granule head both fit: the tighter side is lent (the
// request's tail in granule 3's free first quarter), the looser lender's
// granule 1 half stays whole.
static void test_edge_tighter_side(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1", false);
  char *a1 = take(&s, 3 * G / 2, true), *a2 = take(&s, G / 2, false);
  take(&s, G, true);
  char *x = take(&s, G / 4, false); // granule 3: G/4 free, then live
  take(&s, 3 * G / 4, true);
  assert_ptr_equal(a2, a1 + 3 * G / 2);
  assert_ptr_equal(x, a1 + 3 * G);
  give(&s, a2);
  give(&s, x);
  give(&s, take(&s, 4 * G, false)); // granules 4..7 cached
  char *c = nf_alloc(s.p, 4 * G + G / 4, 0);
  assert_non_null(c);
  assert_int_equal(st(&s).edges, 1);
  assert_int_equal((uintptr_t)c & (G - 1), 0);
  memset(c + 4 * G, 0xA5, G / 4);
  for (uint64_t i = 0; i < G / 4; i += 512) assert_int_equal(((unsigned char *)x)[i], 0xA5);
  nft_fill(c, 4 * G + G / 4, 17);
  s.l[s.n++] = (nft_live_t){.p = c, .n = 4 * G + G / 4, .tag = 17};
  assert_ptr_equal(take(&s, G / 2, true), a2);
  nft_check_all(s.l, s.n);
  pool_off(&s);
}

// Three granules short of a granule-aligned placement, where sharing both
// ends saves two: refused before any backend call (no mapping made, no view
// left behind).
static void test_edge_both_refused(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1", false);
  both_lenders(&s);
  take(&s, G, true); // granule 4
  give(&s, take(&s, 3 * G, false)); // granules 5..7 cached
  nf_stats_t a = st(&s);
  assert_null(nf_alloc(s.p, 5 * G + G / 4, 0)); // both ends shared: 4 needed, 3 there
  nf_stats_t b = st(&s);
  assert_int_equal(b.edges_made, 0);
  assert_int_equal(b.calls.map, a.calls.map);
  assert_int_equal(b.views, a.views);
  assert_int_equal(nf_pool_check(s.p), NF_OK);
  pool_off(&s);
}

// A lender of the small arena: a granule of small blocks whose last quarter
// is free lends it to a large request's head.
static void test_edge_small_lender(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1", false);
  char *sm[32];
  for (int i = 0; i < 32; i++) { // two granules of 4 KiB blocks, in address order
    sm[i] = take(&s, 4096, i == 11 || i == 16); // (the lent quarter's neighbours keep patterns)
    assert_ptr_equal(sm[i], sm[0] + i * 4096);
  }
  assert_int_equal((uintptr_t)sm[0] & (G - 1), 0);
  for (int i = 12; i < 16; i++) give(&s, sm[i]); // granule 0's last quarter free
  take(&s, G, true);
  give(&s, take(&s, 5 * G, false)); // the rest cached
  char *c = nf_alloc(s.p, 5 * G + G / 4, 0); // 6 granules on a boundary, 5 there
  assert_non_null(c);
  assert_int_equal(st(&s).edges, 1);
  memset(c, 0x5A, G / 4);
  for (uint64_t i = 0; i < G / 4; i += 512) assert_int_equal(((unsigned char *)sm[12])[i], 0x5A);
  nft_fill(c, 5 * G + G / 4, 19);
  s.l[s.n++] = (nft_live_t){.p = c, .n = 5 * G + G / 4, .tag = 19};
  nft_check_all(s.l, s.n);
  pool_off(&s);
}

// During a capture (a stream route of a private pool) the general pool's
// requests on other streams do not share: no event call may be made (the
// lender's bytes were last used on another stream), so the request fails as
// without sharing, with no backend call; after the capture it fits.
static void test_edge_not_in_capture(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1", false);
  nf_stream_t s1 = (nf_stream_t)0x100, s2 = (nf_stream_t)0x200;
  char *a1 = take(&s, 3 * G / 2, true);
  char *a2 = nf_alloc(s.p, G / 2, s1); // granule 1's second half, last used on s1
  assert_ptr_equal(a2, a1 + 3 * G / 2);
  take(&s, G, true);
  give(&s, take(&s, 5 * G, false)); // granules 3..7 cached
  give(&s, a2);
  assert_null(nf_alloc(s.p, 6 * G + G / 4, 0)); // stitching at the limit: views on, as in a steady state
  assert_int_equal(nf_private_incref(s.p, 1), NF_OK);
  assert_int_equal(nf_private_begin(s.p, 1, s2), NF_OK);
  nf_stats_t a = st(&s);
  assert_null(nf_alloc(s.p, 5 * G + G / 4, 0));
  nf_stats_t b = st(&s);
  assert_int_equal(b.edges_made, 0);
  assert_int_equal(b.calls.map, a.calls.map);
  assert_int_equal(b.calls.event_record + b.calls.stream_wait + b.calls.event_sync + b.calls.event_query,
                   a.calls.event_record + a.calls.stream_wait + a.calls.event_sync + a.calls.event_query);
  assert_int_equal(nf_private_end(s.p, 1), NF_OK);
  assert_int_equal(nf_private_release(s.p, 1), NF_OK);
  take(&s, 5 * G + G / 4, true);
  assert_int_equal(st(&s).edges, 1);
  pool_off(&s);
}

// The smallest requests that share: one granule of its own between (k = 1,
// head shared) and none at all (k = 1, both ends shared: the block is two
// second mappings only, 3G/4 + G/2 bytes).
static void test_edge_small_requests(void **state) {
  (void)state;
  for (int both = 0; both < 2; both++) {
    scen_t s;
    pool_on(&s, "edges:1", false);
    if (both) both_lenders(&s);
    else head_lender(&s, G / 2, 0);
    take(&s, 4 * G, true); // 1 granule left (head), none (both)
    char *c = nf_alloc(s.p, G + G / 4, 0);
    assert_non_null(c);
    assert_int_equal(st(&s).edges, both ? 2 : 1);
    assert_int_equal(nf_pool_check(s.p), NF_OK);
    nft_fill(c, G + G / 4, 25);
    s.l[s.n++] = (nft_live_t){.p = c, .n = G + G / 4, .tag = 25};
    nft_check_all(s.l, s.n);
    give(&s, c);
    s.l[s.n - 1].p = NULL;
    assert_int_equal(st(&s).edges, 0);
    pool_off(&s);
  }
}

// Host-tier granules cached (an offloaded block freed while its stream's
// work is in flight) are not granules a request can gather: two device
// granules are left for a request of 3 granules and G/4, so both ends are
// shared (one end would need three).
static void test_edge_host_granules_not_gathered(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1,spill_limit:1MiB", false);
  nf_backend_host_set_manual_events(s.host, 1);
  nf_stream_t s1 = (nf_stream_t)0x100;
  both_lenders(&s);
  char *o = nf_alloc(s.p, 2 * G, s1);
  assert_non_null(o);
  assert_int_equal(nf_offload(s.p, o, s1, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_offload_wait(s.p), NF_OK); // its device granules are free again
  take(&s, 2 * G, true);
  give(&s, o); // its host granules stay mapped there, cached: s1's work is in flight
  char *c = nf_alloc(s.p, 3 * G + G / 4, 0);
  assert_non_null(c);
  assert_int_equal(st(&s).edges, 2);
  nft_fill(c, 3 * G + G / 4, 27);
  s.l[s.n++] = (nft_live_t){.p = c, .n = 3 * G + G / 4, .tag = 27};
  nft_check_all(s.l, s.n);
  nf_backend_host_complete_events(s.host);
  pool_off(&s);
}

// The pair ends while the block's work (on s2) is in flight: its second
// mapping stays as a parked view whose work is that of the block. A block
// placed over that view while the granule is still owned by live data at its
// own place unmaps the view, only after that work (a host wait).
static void test_edge_view_keeps_the_work(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1", false);
  nf_backend_host_set_manual_events(s.host, 1);
  nf_stream_t s2 = (nf_stream_t)0x200;
  head_lender(&s, G / 2, 5);
  char *c = nf_alloc(s.p, 5 * G + G / 4, s2);
  assert_non_null(c);
  assert_int_equal(st(&s).edges, 1);
  nf_backend_host_use_new(s.be, s2, c, 5 * G + G / 4);
  nf_backend_host_use(s.be, s2, c, 5 * G + G / 4);
  uint64_t views = st(&s).views;
  give(&s, c); // s2's work through the second mapping still in flight
  assert_int_equal(st(&s).views, views + 1);
  char *j = c + G / 4 - G; // the second mapping
  char *e = nf_alloc_at(s.p, 0, j, G, 0);
  assert_ptr_equal(e, j);
  assert_int_equal(nf_backend_host_violations(s.be), 0);
  nft_fill(e, G, 23);
  s.l[s.n++] = (nft_live_t){.p = e, .n = G, .tag = 23};
  nft_check_all(s.l, s.n);
  nf_backend_host_complete_events(s.host);
  pool_off(&s);
}

// The same with both ends shared: a fault at the second end's mapping (or
// its set-access) must also undo the first end's second mapping (parked as a
// view: no byte of it reachable through a block).
static void both_layout(scen_t *s) {
  both_lenders(s);
  give(s, take(s, 4 * G, false)); // granules 4..7 cached
}
static void test_edge_faults_both(void **state) {
  (void)state;
  fault_sweep(both_layout, 2, 21);
}

// The second mapping fails once (on CUDA the driver may refuse a mapping; on
// the host backend, vm.max_map_count): the idle parked views are unmapped and
// the map is tried again, as stitching does.
static void test_edge_map_retry(void **state) {
  (void)state;
  scen_t s = {0};
  mapspy_t *m = calloc(1, sizeof *m);
  assert_non_null(m);
  nft_spy_init(&m->be, &m->ops, 1024 * G, G);
  m->ops.map = ms_map;
  s.be = &m->be;
  s.host = m->be.inner;
  s.p = nft_pool_on(s.be, LIMIT ",edges:1");
  head_lender(&s, G / 2, 5);
  give(&s, take(&s, 5 * G + G / 4, false)); // a pair made and ended: views parked
  uint64_t views = st(&s).views;
  assert_true(views > 0);
  m->fail_map = 1;
  take(&s, 5 * G + G / 4, true);
  assert_int_equal(m->fail_map, 0);
  assert_int_equal(st(&s).edges, 1);
  assert_true(st(&s).views < views);
  pool_off(&s);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1); // the refusals below are expected
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_edge_best_fit),
      cmocka_unit_test(test_edge_tighter_side),
      cmocka_unit_test(test_edge_both_refused),
      cmocka_unit_test(test_edge_small_lender),
      cmocka_unit_test(test_edge_not_in_capture),
      cmocka_unit_test(test_edge_small_requests),
      cmocka_unit_test(test_edge_host_granules_not_gathered),
      cmocka_unit_test(test_edge_view_keeps_the_work),
      cmocka_unit_test(test_edge_faults_both),
      cmocka_unit_test(test_edge_map_retry),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
