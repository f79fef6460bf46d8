// Deferred failures in the tier layer (src/tier/), on the fault backend over
// the host backend or a spy backend: a finish that fails under another
// block's call (reported by nf_offload_wait, naming its block, the first one
// kept), a poll that fails (returned at once), a prefetch rollback whose drop
// of the staging range is deferred, and disk offloads whose wait for their
// copy failed (drained, or the block's free waits for the copy's stream).
// Every block's data is verified and the pool stays consistent. The other
// tier faults, and offloaded_is (test_finish_failure_deferred names it):
// test_fault_tier.c.
#include "core/core.h" // white box: nft_unready
#include "nf_test.h"

#define G (64 * 1024ull)

// A pool of 16 granules on the fault backend over a host backend with manual
// events, holding two 4-granule blocks a and b.
static nf_pool_t *two_blocks(nf_backend_t **inner, nf_backend_t **be, void **a, void **b) {
  assert_int_equal(nf_backend_host_create(inner, 1024 * G, G), NF_OK);
  assert_int_equal(nf_backend_fault_create(be, *inner, 0, 0, 1), NF_OK);
  nf_pool_t *p = nft_pool_on(*be, "limit:1MiB,views:0");
  nf_backend_host_set_manual_events(*inner, 1);
  *a = nf_alloc(p, 4 * G, NULL);
  *b = nf_alloc(p, 4 * G, NULL);
  assert_true(*a && *b);
  return p;
}

// A block's offload whose copy completed is finished by whichever pool call
// polls next, a call about another block maybe. Its finish fails here (the
// remap of a's host granules at a, or the detached unmap: each backend call
// of it fails 3 times in a row in turn). Before the fix, nf_offload or
// nf_prefetch of block b then failed with a's error, and b's work was not
// done. Now b's call does b's work; nf_offload_wait reports a's failure,
// naming a, once; a stays intact and usable (on the device, or offloaded in
// part), and prefetch brings it back.
static void test_finish_failure_deferred(void **state) {
  (void)state;
  nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED};
  int deferred = 0;
  for (int t = 0; t < 2; t++)
    for (int op = 0; op < 2; op++) // the call on b: offload, prefetch
      for (uint64_t off = 1; off <= 12; off++) {
        nf_backend_t *inner, *be;
        void *a, *b;
        nf_pool_t *p = two_blocks(&inner, &be, &a, &b);
        nft_fill(a, 4 * G, 31);
        nft_fill(b, 4 * G, 32);
        if (op == 1) {
          assert_int_equal(nf_offload(p, b, NULL, NF_TIER_HOST), NF_OK);
          nf_backend_host_complete_events(inner);
          assert_int_equal(nf_offload_wait(p), NF_OK);
        }
        assert_int_equal(nf_offload(p, a, NULL, tiers[t]), NF_OK);
        nf_backend_host_complete_events(inner); // a's copy is done: the next poll finishes it
        uint64_t base, failed, ta[3], tb[3];
        nf_backend_fault_counts(be, &base, &failed);
        nf__backend_fault_mask(be, base + off, 7);
        nf_status_t r = op ? nf_prefetch(p, b, NULL) : nf_offload(p, b, NULL, NF_TIER_HOST);
        char msg[768], addr[32], what[900];
        snprintf(msg, sizeof msg, "%s", r ? nf_last_error() : "");
        nf_backend_fault_set(be, 0, 0);
        snprintf(addr, sizeof addr, "%p", a);
        snprintf(what, sizeof what, "tier %d op %d call %llu: %d \"%s\"", (int)tiers[t], op, (unsigned long long)off,
                 r, msg);
        if (strstr(msg, addr)) fail_msg("%s: the call on b failed with a's error", what);
        nf_backend_host_complete_events(inner);
        nf_status_t w = nf_offload_wait(p);
        char wmsg[768];
        snprintf(wmsg, sizeof wmsg, "%s", w ? nf_last_error() : "");
        // Consistent; a set access that failed 3 times in a row leaves a's
        // granules without access until its prefetch, which the wait says.
        if (nf_pool_check(p) != NF_OK) fail_msg("%s: %s (wait: %s)", what, nf_last_error(), wmsg);
        bool access = !nft_unready(p, a);
        if (!access && !strstr(wmsg, "without access")) fail_msg("%s: without access, not said (wait: %s)", what, wmsg);
        nft_tiers(p, a, ta);
        nft_tiers(p, b, tb);
        if (ta[NF_TIER_DEVICE] || !access) { // a's finish failed: a keeps device granules, or lacks access
          if (w == NF_OK || !strstr(wmsg, addr) || !strstr(wmsg, "intact"))
            fail_msg("%s: wait did not report a's failure: %d \"%s\"", what, w, wmsg);
          assert_int_equal(nf_offload_wait(p), NF_OK); // reported once
          if (access) assert_true(nft_check(a, 4 * G, 31)); // in place: on the device or the host
          deferred += r == NF_OK;
        } else if (w != NF_OK) {
          fail_msg("%s: wait failed, a is offloaded: \"%s\"", what, wmsg);
        }
        if (r == NF_OK && tb[op ? NF_TIER_DEVICE : NF_TIER_HOST] != 4 * G) fail_msg("%s: b's work not done", what);
        assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
        assert_int_equal(nf_prefetch(p, b, NULL), NF_OK);
        assert_true(nft_check(a, 4 * G, 31) && nft_check(b, 4 * G, 32));
        assert_int_equal(nf_pool_check(p), NF_OK);
        nf_backend_host_set_manual_events(inner, 0);
        nf_pool_destroy(p);
        nf_backend_destroy(be);
      }
  assert_true(deferred >= 4); // each tier and call had a's finish fail under b's successful call
}

// What makes b's call unsafe is still returned at once: the event query
// that tells whether a's copy is done fails (a broken backend). b is left
// as it was; a's copy finishes later.
static void test_poll_failure_returned(void **state) {
  (void)state;
  nf_backend_t *inner, *be;
  void *a, *b;
  nf_pool_t *p = two_blocks(&inner, &be, &a, &b);
  nft_fill(a, 4 * G, 33);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_OK);
  uint64_t base, failed, tb[3];
  nf_backend_fault_counts(be, &base, &failed);
  nf_backend_fault_set(be, base + 1, 0); // the poll's query of a's copy
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_HOST), NF_ERR_BACKEND);
  assert_non_null(strstr(nf_last_error(), "event query failed"));
  nft_tiers(p, b, tb);
  assert_true(tb[NF_TIER_DEVICE] == 4 * G);
  nf_backend_host_complete_events(inner);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  assert_true(nft_check(a, 4 * G, 33));
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_backend_host_set_manual_events(inner, 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// Two offloads whose finishes fail in two different polls: nf_offload_wait
// reports the first (naming its block) and counts the later one; it does
// not replace the first by the last.
static void test_deferred_failures_keep_the_first(void **state) {
  (void)state;
  nft_winspy_t *w = calloc(1, sizeof *w);
  assert_non_null(w);
  nft_spy_init(&w->be, &w->ops, 1024 * G, G);
  w->ops.unmap = nft_ws_unmap;
  nf_pool_t *p = nft_pool_on(&w->be, "limit:1MiB,views:0");
  nf_backend_host_set_manual_events(w->be.inner, 1);
  void *a1 = nf_alloc(p, 4 * G, NULL), *a2 = nf_alloc(p, 4 * G, NULL);
  assert_true(a1 && a2);
  nft_fill(a1, 4 * G, 61);
  nft_fill(a2, 4 * G, 62);
  char addr1[32], addr2[32];
  snprintf(addr1, sizeof addr1, "%p", a1);
  snprintf(addr2, sizeof addr2, "%p", a2);
  assert_int_equal(nf_offload(p, a1, NULL, NF_TIER_HOST_DETACHED), NF_OK);
  nf_backend_host_complete_events(w->be.inner);
  w->fail_unmap = 1000;                                                    // every unmap fails from here
  assert_int_equal(nf_offload(p, a2, NULL, NF_TIER_HOST_DETACHED), NF_OK); // its poll finishes a1: fails
  nf_backend_host_complete_events(w->be.inner);
  assert_int_equal(nf_prefetch(p, a2, NULL), NF_OK); // its poll finishes a2: fails too (a2 stays on the device)
  w->fail_unmap = 0;
  nf_status_t r = nf_offload_wait(p);
  char msg[768];
  snprintf(msg, sizeof msg, "%s", r ? nf_last_error() : "");
  if (r == NF_OK || !strstr(msg, addr1) || strstr(msg, addr2) || !strstr(msg, "and 1 more"))
    fail_msg("wait: %d \"%s\" (first failure: %s, later: %s)", r, msg, addr1, addr2);
  assert_int_equal(nf_offload_wait(p), NF_OK); // reported once
  assert_true(nft_check(a1, 4 * G, 61) && nft_check(a2, 4 * G, 62));
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_free(p, a1);
  nf_free(p, a2);
  nf_backend_host_set_manual_events(w->be.inner, 0);
  nf_pool_destroy(p);
  nf_backend_destroy(&w->be);
}

// A prefetch whose copy back fails, whose rollback then cannot put one host
// granule back (its map fails 3 times: that granule's data is copied from
// the staging range into the device granule instead) and whose wait for
// that copy fails: the staging range and that host granule wait for the
// copy (a deferred drop), the others are back at the block. nf_pool_check
// counts every granule once meanwhile: those back at the block are not
// also counted as held by the copies in flight. Spy backend, scripted.
typedef struct { nf_backend_t be; nf_backend_ops_t ops; int arm, maps; } pfspy_t;
static nf_status_t pf_copy(nf_backend_t *be, uintptr_t d, uintptr_t s, size_t n, nf_stream_t st) {
  pfspy_t *w = (pfspy_t *)be;
  if (w->arm == 1) { // the prefetch's copy back
    w->arm = 2;
    return NF_ERR_BACKEND;
  }
  return nft_f_copy(be, d, s, n, st);
}
static nf_status_t pf_map(nf_backend_t *be, uintptr_t v, size_t n, nf_handle_t h) {
  pfspy_t *w = (pfspy_t *)be;
  if (w->arm == 2 && w->maps < 6 && (w->maps++ & 1) == 0) return NF_ERR_BACKEND; // the first remap back, 3 times
  return nft_f_map(be, v, n, h);
}
static nf_status_t pf_evr(nf_backend_t *be, nf_event_t e, nf_stream_t s) {
  pfspy_t *w = (pfspy_t *)be;
  return w->arm == 2 && w->maps >= 6 ? NF_ERR_BACKEND : nft_f_evr(be, e, s);
}
static nf_status_t pf_evs(nf_backend_t *be, nf_event_t e) {
  pfspy_t *w = (pfspy_t *)be;
  return w->arm == 2 && w->maps >= 6 ? NF_ERR_BACKEND : nft_f_evs(be, e);
}

static void test_prefetch_deferred_rollback_check(void **state) {
  (void)state;
  pfspy_t *w = calloc(1, sizeof *w);
  assert_non_null(w);
  nft_spy_init(&w->be, &w->ops, 1024 * G, G);
  w->ops.copy = pf_copy;
  w->ops.map = pf_map;
  w->ops.event_record = pf_evr;
  w->ops.event_sync = pf_evs;
  nf_pool_t *p = nft_pool_on(&w->be, "limit:1MiB,views:0");
  void *a = nf_alloc(p, 4 * G, NULL);
  assert_non_null(a);
  nft_fill(a, 4 * G, 71);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  w->arm = 1;
  assert_int_equal(nf_prefetch(p, a, NULL), NF_ERR_BACKEND);
  assert_true(w->arm == 2 && w->maps == 6); // the script ran as planned
  w->arm = 0;
  uint64_t t[3];
  nft_tiers(p, a, t);
  assert_true(t[NF_TIER_DEVICE] == G && t[NF_TIER_HOST] == 3 * G); // one granule copied, three back
  if (nf_pool_check(p) != NF_OK) fail_msg("with the drop deferred: %s", nf_last_error());
  assert_true(nft_check(a, 4 * G, 71));
  assert_int_equal(nf_offload_wait(p), NF_OK); // the deferred drop goes
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  assert_true(nft_check(a, 4 * G, 71));
  assert_int_equal(nf_free(p, a), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(&w->be);
}

// A disk offload whose copy out was queued and whose wait then failed: the
// copy may still read the block, so a retry (on another stream) must not
// unmap the range under it. Each call of the first offload fails in turn;
// the host backend counts an unmap under a copy in flight as a violation.
static void test_disk_offload_failed_wait_drains(void **state) {
  (void)state;
  int failed_waits = 0;
  for (int k = 1; k <= 12; k++) {
    nf_backend_t *host = nft_host(1024 * G, G), *be;
    assert_int_equal(nf_backend_fault_create(&be, host, 0, 0, 1), NF_OK);
    nf_pool_t *p = nft_pool_on(be, "limit:1MiB,views:0");
    assert_non_null(p);
    nf_backend_host_set_manual_events(host, 1);
    nf_stream_t A = (nf_stream_t)1, B = (nf_stream_t)2;
    void *b = nf_alloc(p, 4 * G, A);
    assert_non_null(b);
    nft_fill(b, 4 * G, 40 + k);
    uint64_t base, failed;
    nf_backend_fault_counts(be, &base, &failed);
    nf_backend_fault_set(be, base + k, 0);
    nf_status_t r = nf_offload(p, b, B, NF_TIER_DISK);
    if (r != NF_OK) {
      assert_true(nf_last_error()[0] != '\0');
      failed_waits += strstr(nf_last_error(), "waiting for the copy failed") != NULL;
    }
    nf_backend_fault_set(be, 0, 0);
    if (r != NF_OK) assert_int_equal(nf_offload(p, b, A, NF_TIER_DISK), NF_OK); // the retry
    nf_backend_host_complete_events(host);
    assert_int_equal(nf_prefetch(p, b, A), NF_OK);
    assert_int_equal(nf_backend_host_violations(host), 0);
    assert_true(nft_check(b, 4 * G, 40 + k));
    assert_int_equal(nf_free(p, b), NF_OK);
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_pool_destroy(p);
    nf_backend_destroy(be); // and host, which it owns
  }
  assert_true(failed_waits >= 2); // the event record and the event sync after the copy
}

// The same where the drain fails too (the wait and its 3 retries: a run of
// failing calls): the copy may still be reading the block when the offload
// returns, so the block's free (on its own stream A) must wait for the
// copy's stream B: its range is not unmapped or reused under the copy.
static void test_disk_offload_undrained_guards_free(void **state) {
  (void)state;
  int undrained = 0;
  for (int k = 1; k <= 12; k++) {
    nft_undrained_t u;
    nf_status_t r = nft_undrained(&u, G, (uint64_t)k, NF_TIER_DISK, 50 + (uint64_t)k); // 8 calls in a row fail
    if (r == NF_OK) { // the faults hit something else: bring it back
      assert_int_equal(nf_prefetch(u.p, u.b, NFT_A), NF_OK);
    } else {
      undrained += strstr(nf_last_error(), "waiting for the copy failed") != NULL;
    }
    assert_true(nft_check(u.b, 4 * G, 50 + (uint64_t)k));
    char what[32];
    snprintf(what, sizeof what, "call %d", k);
    nft_undrained_end(&u, G, what);
  }
  assert_true(undrained >= 1);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  if (getenv("NF_FILTER")) cmocka_set_test_filter(getenv("NF_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_finish_failure_deferred),
      cmocka_unit_test(test_poll_failure_returned),
      cmocka_unit_test(test_deferred_failures_keep_the_first),
      cmocka_unit_test(test_prefetch_deferred_rollback_check),
      cmocka_unit_test(test_disk_offload_failed_wait_drains),
      cmocka_unit_test(test_disk_offload_undrained_guards_free),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
