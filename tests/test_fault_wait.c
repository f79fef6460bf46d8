// Backend failures of the waits a tier makes for its own copies (src/tier/:
// nf__xfer_drain, nf__xfer_defer). When an offload or prefetch fails after
// queueing copies, it waits for them before giving their memory back; here
// that wait fails too (its event records and synchronizes). On a GPU the
// copies may then still run: unmapping what they read or write faults, and a
// granule handed to another stream is overwritten by them. The host backend
// in manual-event mode keeps each copy's ranges as its stream's work in
// flight until an event behind it completes, and counts as a violation an
// unmap under such work, or memory under it handed to another stream
// (nf_backend_host_use_new). Every pattern of failing calls at every call of
// the operation: no violation, the pool consistent, the block intact or its
// loss reported, and once the work completes everything comes back.
#include "nf_test.h"

#define G (64 * 1024ull)

enum { OFF_HOST, OFF_DETACHED, PRE_HOST, PRE_DETACHED, PRE_DISK, KINDS };
static const char *kind_name[KINDS] = {"offload host", "offload detached", "prefetch host", "prefetch detached",
                                       "prefetch disk"};

typedef struct { int ok, failed, lost, deferred; } tally_t;

// One operation of kind k on block a (stream S), failing the calls marked in
// `mask` from call `off` of it on (off 0: none). Returns the calls it made.
// The disk tier copies back through a 64 MiB bounce buffer, a copy per
// 64 MiB: only a larger block has a copy queued when a later one fails.
static uint64_t wait_case(int k, uint64_t off, uint64_t mask, tally_t *t) {
  nf_backend_t *inner, *be;
  uint64_t gran = k == PRE_DISK ? 1ull << 20 : G, n = k == PRE_DISK ? (64ull << 20) + 3 * gran : 4 * G;
  assert_int_equal(nf_backend_host_create(&inner, 1ull << 30, gran), NF_OK);
  assert_int_equal(nf_backend_fault_create(&be, inner, 0, 0, 1), NF_OK);
  nf_pool_t *p = nft_pool_on(be, k == PRE_DISK ? "limit:80MiB,views:0" : "limit:1MiB,views:0");
  nf_backend_host_set_manual_events(inner, 1);
  nf_stream_t A = (nf_stream_t)1, S = (nf_stream_t)2, B = (nf_stream_t)3;
  void *a = nf_alloc(p, n, A);
  assert_non_null(a);
  nft_fill(a, n, 61);
  nf_tier_t tier = k == OFF_HOST || k == PRE_HOST ? NF_TIER_HOST : k == PRE_DISK ? NF_TIER_DISK : NF_TIER_HOST_DETACHED;
  if (k >= PRE_HOST) { // offloaded first, no faults
    assert_int_equal(nf_offload(p, a, A, tier), NF_OK);
    nf_backend_host_complete_events(inner);
    assert_int_equal(nf_offload_wait(p), NF_OK);
  }
  uint64_t base, calls, failed;
  nf_backend_fault_counts(be, &base, &failed);
  nf__backend_fault_mask(be, off ? base + off : 0, mask);
  nf_status_t r = k < PRE_HOST ? nf_offload(p, a, S, tier) : nf_prefetch(p, a, S);
  char msg[768], what[900];
  snprintf(msg, sizeof msg, "%s", r ? nf_last_error() : "");
  nf_backend_fault_counts(be, &calls, &failed);
  nf_backend_fault_set(be, 0, 0);
  snprintf(what, sizeof what, "%s, call %llu mask %#llx: %d \"%s\"", kind_name[k], (unsigned long long)off,
           (unsigned long long)mask, r, msg);
  if (r != NF_OK && !msg[0]) fail_msg("%s: an error with no message", what);
  if (nf_backend_host_violations(inner)) fail_msg("%s: memory unmapped under its copies", what);
  // (Known, not this test's: a set access or a detached range's unmap failing
  // 3 times in a row leaves granules without access, or mapped, until the
  // block's next prefetch.)
  if (nf_pool_check(p) != NF_OK && !strstr(msg, "without access") && !strstr(nf_last_error(), "still mapped"))
    fail_msg("%s: %s", what, nf_last_error());
  bool lost = r != NF_OK && strstr(msg, "LOST");
  // Another stream's new block, trim (unmaps and releases what lies free),
  // and the operation's block freed and allocated again: none may take
  // memory the copies still use.
  void *c = nf_alloc(p, 8 * gran, B);
  if (c) nf_backend_host_use_new(inner, B, c, 8 * gran);
  nf_trim(p);
  if (nf_backend_host_violations(inner)) fail_msg("%s: memory under its copies reused or unmapped", what);
  // The copies' work completes: everything waiting for it goes back.
  nf_backend_host_complete_events(inner);
  if (nf_offload_wait(p) != NF_OK && !strstr(nf_last_error(), "finishing it failed"))
    fail_msg("%s: then wait: %s", what, nf_last_error());
  uint64_t tb[3];
  assert_int_equal(nf_block_tiers(p, a, tb), NF_OK);
  if ((tb[NF_TIER_HOST] || tb[NF_TIER_DISK]) && nf_prefetch(p, a, A) != NF_OK)
    fail_msg("%s: then prefetch: %s", what, nf_last_error());
  nf_backend_host_complete_events(inner);
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: then: %s", what, nf_last_error());
  if (!lost && !nft_check(a, n, 61)) fail_msg("%s: data lost silently", what);
  assert_int_equal(nf_free(p, a), NF_OK);
  if (c) assert_int_equal(nf_free(p, c), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: after free: %s", what, nf_last_error());
  t->ok += r == NF_OK;
  t->failed += r != NF_OK && !lost;
  t->lost += lost;
  nf_backend_host_set_manual_events(inner, 0);
  nft_destroy_after(p, be, inner, mask); // deferred drops included: nothing left behind
  return calls - base;
}

// Runs of 1..9 failing calls from every call of the operation, and runs with
// one call between them (a failure, then a wait's record and sync failing).
// The disk prefetch: from its last two calls, the copies (the mapping before
// them is test_fault_tier's), runs only (each case moves 64 MiB).
static void sweep(int k, tally_t *t) {
  uint64_t total = wait_case(k, 0, 0, t);
  assert_true(total >= 3);
  for (uint64_t off = k == PRE_DISK ? total - 1 : 1; off <= total; off++) {
    for (int len = 1; len <= 9; len++) wait_case(k, off, (1ull << len) - 1, t);
    for (int len = 2; len <= 8 && k != PRE_DISK; len++) wait_case(k, off, 1 | (((1ull << len) - 1) << 2), t);
  }
}

// Kinds k0..k1; both outcomes must occur (success, a failure with the block
// intact); a loss report only where `lost_ok` (a prefetch's rollback may
// still lose what neither a host granule nor a copy can hold: test_fault_tier).
static void sweep_kinds(int k0, int k1, bool lost_ok) {
  for (int k = k0; k <= k1; k++) {
    tally_t t = {0};
    sweep(k, &t);
    if (getenv("NF_DEBUG")) fprintf(stderr, "%s: ok %d failed %d lost %d\n", kind_name[k], t.ok, t.failed, t.lost);
    if (!t.ok || !t.failed || (t.lost && !lost_ok))
      fail_msg("%s: outcomes ok %d failed %d lost %d", kind_name[k], t.ok, t.failed, t.lost);
  }
}

static void test_offload_wait_fails(void **state) {
  (void)state;
  sweep_kinds(OFF_HOST, OFF_DETACHED, false);
}

static void test_prefetch_wait_fails(void **state) {
  (void)state;
  sweep_kinds(PRE_HOST, PRE_DISK, true);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  if (getenv("NF_FILTER")) cmocka_set_test_filter(getenv("NF_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_offload_wait_fails),
      cmocka_unit_test(test_prefetch_wait_fails),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
