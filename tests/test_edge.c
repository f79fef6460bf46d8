// Edge sharing (src/core/edge.c): at the limit, a request that would fail
// starts (or ends, or both) inside another block's partly used granule,
// mapped a second time. Each scenario leaves the pool exactly one or two
// granules short, checks that the request fits only with `edges:1`, that the
// shared granule really is one physical granule (bytes written through the
// new block appear at the other place, under its shadow), that no live byte
// is touched through either place, and that the pair ends cleanly.
#include "edge_test.h"

// The request's first bytes live in granule 1's free tail: one granule fewer.
static void test_edge_head(void **state) {
  (void)state;
  for (int on = 0; on < 2; on++) {
    scen_t s;
    pool_on(&s, on ? "edges:1" : "edges:0", false);
    uintptr_t x = head_lender(&s, G / 2, 5); // 5 granules cached, the request needs 6 on a boundary
    char *c = nf_alloc(s.p, 5 * G + G / 4, 0);
    if (!on) { // the reference: out of memory
      assert_null(c);
      assert_int_equal(st(&s).edges_made, 0);
      pool_off(&s);
      continue;
    }
    assert_non_null(c);
    assert_int_equal(st(&s).edges, 1);
    assert_int_equal(st(&s).live_granules, 8); // distinct granules: the shared one counts once
    assert_int_equal(((uintptr_t)c + G / 4) & (G - 1), 0); // its first G/4 bytes end a granule
    assert_int_equal(nf_pool_check(s.p), NF_OK);
    char *snap = nf_snapshot(s.p); // the pair as the snapshot shows it
    assert_non_null(snap);
    assert_non_null(strstr(snap, "\"state\":\"shadow\""));
    assert_non_null(strstr(snap, "\"shared_first_granule\":true"));
    nf_snapshot_free(snap);
    // One physical granule: what the block writes appears at granule 1's own
    // place, in the shadow's bytes (read through that mapping), and nowhere else.
    memset(c, 0x5A, G / 4);
    for (uint64_t i = 0; i < G / 4; i += 4096) assert_int_equal(((unsigned char *)x)[3 * G / 4 + i], 0x5A);
    nft_check_all(s.l, s.n);
    nft_fill(c, 5 * G + G / 4, 7);
    s.l[s.n++] = (nft_live_t){.p = c, .n = 5 * G + G / 4, .tag = 7};
    // The rest of granule 1's free tail is still usable at its own place.
    char *d = take(&s, G / 4, true);
    assert_ptr_equal(d, (char *)x + G / 2);
    nft_check_all(s.l, s.n);
    assert_int_equal(nf_pool_check(s.p), NF_OK);
    // The pair ends with the block: the second mapping stays as a parked view.
    uint64_t views = st(&s).views;
    give(&s, c);
    s.l[s.n - 2].p = NULL;
    assert_int_equal(st(&s).edges, 0);
    assert_int_equal(st(&s).views, views + 1);
    assert_int_equal(nf_pool_check(s.p), NF_OK);
    nft_check_all(s.l, s.n);
    // And again, now that the shadow's bytes came back to granule 1's place.
    c = take(&s, 5 * G + G / 4, true);
    assert_int_equal(st(&s).edges, 1);
    assert_int_equal(st(&s).edges_made, 2);
    nft_check_all(s.l, s.n);
    pool_off(&s);
  }
}

static void test_edge_tail(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1", false);
  uintptr_t x = tail_lender(&s, 1, G / 2);
  give(&s, take(&s, 6 * G, false)); // granules 2..7 cached
  char *c = nf_alloc(s.p, 6 * G + G / 4, 0);
  assert_non_null(c);
  assert_int_equal(st(&s).edges, 1);
  assert_int_equal((uintptr_t)c & (G - 1), 0); // starts on a boundary, ends G/4 into the shared granule
  memset(c + 6 * G, 0xA5, G / 4);
  for (uint64_t i = 0; i < G / 4; i += 4096) assert_int_equal(((unsigned char *)x)[i], 0xA5);
  nft_check_all(s.l, s.n);
  nft_fill(c, 6 * G + G / 4, 9);
  s.l[s.n++] = (nft_live_t){.p = c, .n = 6 * G + G / 4, .tag = 9};
  char *d = take(&s, G / 4, true); // the free head's rest, at its own place
  assert_ptr_equal(d, (char *)x + G / 4);
  nft_check_all(s.l, s.n);
  pool_off(&s);
}

// Two granules short: both ends shared, h + t = r + G bytes in the two.
static void test_edge_both(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1", false);
  char *a1 = take(&s, 5 * G / 4, true), *a2 = take(&s, 3 * G / 4, false), *a3 = take(&s, G, true);
  char *p = take(&s, 3 * G / 4, false), *q = take(&s, G / 4, true);
  assert_ptr_equal(q, a1 + 3 * G + 3 * G / 4);
  (void)a3;
  give(&s, a2);
  give(&s, p);
  give(&s, take(&s, 4 * G, false)); // granules 4..7 cached
  // 5 G + G/4 needs 6 granules on a boundary, 5 with one end shared: only 4 are there.
  assert_null(nf_alloc(s.p, 5 * G + 3 * G / 4, 0)); // r = 3G/4: h + t = 7G/4 > the 3G/2 lent
  char *c = nf_alloc(s.p, 5 * G + G / 4, 0);
  assert_non_null(c);
  assert_int_equal(st(&s).edges, 2);
  assert_int_equal(nf_pool_check(s.p), NF_OK);
  nft_fill(c, 5 * G + G / 4, 11);
  s.l[s.n++] = (nft_live_t){.p = c, .n = 5 * G + G / 4, .tag = 11};
  nft_check_all(s.l, s.n);
  // Its first 3G/4 bytes are granule 1's last, its last G/2 granule 3's first.
  assert_int_equal(memcmp(c, a1 + 5 * G / 4, 3 * G / 4), 0);
  assert_int_equal(memcmp(c + 5 * G + G / 4 - G / 2, a1 + 3 * G, G / 2), 0);
  give(&s, c);
  s.l[s.n - 1].p = NULL;
  assert_int_equal(st(&s).edges, 0);
  assert_int_equal(nf_pool_check(s.p), NF_OK);
  pool_off(&s);
}

// Short by more than sharing can give: out of memory, and nothing changed.
static void test_edge_refused(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1", false);
  head_lender(&s, G / 2, 5);
  nf_stats_t a = st(&s);
  assert_null(nf_alloc(s.p, 6 * G + G / 4, 0)); // needs 6 with a shared end: 5 are there
  nf_stats_t b = st(&s);
  assert_int_equal(b.edges_made, 0);
  assert_int_equal(b.calls.map, a.calls.map);
  assert_int_equal(nf_pool_check(s.p), NF_OK);
  pool_off(&s);
}

// A block freed behind a record_stream: the pair ends when its event completes.
static void test_edge_pending(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1", false);
  nf_backend_host_set_manual_events(s.host, 1);
  head_lender(&s, G / 2, 5);
  char *c = take(&s, 5 * G + G / 4, false);
  assert_int_equal(st(&s).edges, 1);
  assert_int_equal(nf_record_stream(s.p, c, (nf_stream_t)0x100), NF_OK);
  give(&s, c);
  assert_int_equal(st(&s).edges, 1); // its shared granule waits with it
  assert_int_equal(nf_pool_check(s.p), NF_OK);
  nf_backend_host_complete_events(s.host);
  assert_int_equal(nf_trim(s.p), NF_OK);
  assert_int_equal(st(&s).edges, 0);
  assert_int_equal(nf_pool_check(s.p), NF_OK);
  pool_off(&s);
}

// Stream order through both places of the shared granule (host backend with
// manual events: it counts any use of physical memory not ordered after the
// previous user's work, whichever mapping either went through). Either end
// shared, the request's other granules cached or still to be created: the
// sharing block (on s2) takes bytes of granule 1 last used on s1 through
// their own place, and after its free a block on s1 takes them again there.
static void test_edge_stream_order(void **state) {
  (void)state;
  for (int tail = 0; tail < 2; tail++)
    for (int cached = 0; cached < 2; cached++) {
      scen_t s;
      pool_on(&s, "edges:1", false);
      nf_backend_host_set_manual_events(s.host, 1);
      nf_stream_t s1 = (nf_stream_t)0x100, s2 = (nf_stream_t)0x200;
      // head: granule 1's last half lent, 5 granules left; tail: its first half, 6 left
      uint64_t before = tail ? G : 3 * G / 2, after = tail ? G / 2 : G, k = tail ? 6 : 5, n = k * G + G / 4;
      char *a = take(&s, before, true);
      char *l = nf_alloc(s.p, G / 2, s1);
      assert_ptr_equal(l, a + before);
      nf_backend_host_use_new(s.be, s1, l, G / 2);
      nf_backend_host_use(s.be, s1, l, G / 2);
      take(&s, after, true);
      if (cached) give(&s, take(&s, k * G, false));
      give(&s, l);
      char *c = nf_alloc(s.p, n, s2);
      assert_non_null(c);
      assert_int_equal(st(&s).edges, 1);
      assert_int_equal(((uintptr_t)c + (tail ? 0 : G / 4)) & (G - 1), 0);
      nf_backend_host_use_new(s.be, s2, c, n);
      nf_backend_host_use(s.be, s2, c, n);
      assert_int_equal(nf_backend_host_violations(s.be), 0);
      assert_int_equal(nf_free(s.p, c), NF_OK);
      char *e = nf_alloc(s.p, G / 2, s1);
      assert_ptr_equal(e, l);
      nf_backend_host_use_new(s.be, s1, e, G / 2);
      assert_int_equal(nf_backend_host_violations(s.be), 0);
      nf_backend_host_complete_events(s.host);
      give(&s, e);
      pool_off(&s);
    }
}

// Offloaded to the host tier and back: its own granules move, the shared one
// stays, and every byte comes back.
static void test_edge_offload(void **state) {
  (void)state;
  scen_t s;
  pool_on(&s, "edges:1,spill_limit:1MiB", false);
  head_lender(&s, G / 2, 5);
  char *c = take(&s, 5 * G + G / 4, true);
  assert_int_equal(st(&s).edges, 1);
  assert_int_equal(nf_offload(s.p, c, 0, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_offload_wait(s.p), NF_OK);
  assert_int_equal(nf_pool_check(s.p), NF_OK);
  nft_check_all(s.l, s.n);
  assert_int_equal(nf_prefetch(s.p, c, 0), NF_OK);
  assert_int_equal(nf_offload_wait(s.p), NF_OK);
  nft_check_all(s.l, s.n);
  pool_off(&s);
}

// Every backend call of the shared placement fails in turn: the request
// either fails with the pool as it was, or succeeds whole.
static void head_layout(scen_t *s) { head_lender(s, G / 2, 5); }
static void test_edge_faults(void **state) {
  (void)state;
  fault_sweep(head_layout, 0, 13);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1); // the refusals below are expected
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_edge_head),
      cmocka_unit_test(test_edge_tail),
      cmocka_unit_test(test_edge_both),
      cmocka_unit_test(test_edge_refused),
      cmocka_unit_test(test_edge_pending),
      cmocka_unit_test(test_edge_offload),
      cmocka_unit_test(test_edge_stream_order),
      cmocka_unit_test(test_edge_faults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
