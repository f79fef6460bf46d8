// The pool under backend failures (fault-injection wrapper around the host
// backend): every backend call of a workload is made to fail once in turn;
// the failing request reports an error, the pool stays consistent and usable,
// no live block loses data, and after destroy nothing is left behind.
#include "nf_test.h"

#define G (64 * 1024)
enum { SLOTS = 16 };

typedef struct { void *p; size_t n; uint64_t tag; } slot_t;

// A fixed workload that exercises creation, mapping, stitching, streams,
// record_stream, the release policy, trim and limit changes. Returns the
// number of operations that failed.
static int workload(nf_pool_t *p, nf_backend_t *be, uint64_t seed) {
  slot_t l[SLOTS] = {{0}};
  uint64_t rng = seed;
  int failed = 0;
  for (int it = 0; it < 400; it++) {
    int i = (int)(nft_rand(&rng) % SLOTS);
    nf_stream_t s = (nf_stream_t)(uintptr_t)(nft_rand(&rng) % 3);
    if (l[i].p) {
      if (!nft_check(l[i].p, l[i].n, l[i].tag)) fail_msg("seed %llu: data lost", (unsigned long long)seed);
      if (nft_rand(&rng) % 5 == 0 && nf_record_stream(p, l[i].p, s) != NF_OK) failed++;
      if (nf_free(p, l[i].p) != NF_OK) {
        // A failed free leaves the block live and intact; free it later.
        failed++;
        if (!nft_check(l[i].p, l[i].n, l[i].tag)) fail_msg("data lost after failed free");
        continue;
      }
      l[i].p = NULL;
    } else {
      uint64_t r = nft_rand(&rng);
      size_t n = r % 2 ? 1 + r % 4096 : 1 + r % (10 * G);
      void *q = nf_alloc(p, n, s);
      if (!q) {
        assert_int_not_equal(nf_last_status(), NF_OK);
        assert_true(nf_last_error()[0] != 0);
        failed++;
      } else {
        nft_fill(q, n, r);
        l[i] = (slot_t){q, n, r};
      }
    }
    if (it == 200 && nf_trim(p) != NF_OK) failed++;
    if (it == 300 && nf_set_limit(p, 24 * G) != NF_OK) failed++;
    if (it % 50 == 0) {
      if (nf_pool_check(p) != NF_OK) fail_msg("seed %llu it %d: %s", (unsigned long long)seed, it, nf_last_error());
      for (int k = 0; k < SLOTS; k++)
        if (l[k].p && !nft_check(l[k].p, l[k].n, l[k].tag)) fail_msg("data lost at it %d", it);
    }
  }
  // Stop failing, then everything must still work and come back.
  nf_backend_fault_set(be, 0, 0);
  for (int k = 0; k < SLOTS; k++)
    if (l[k].p) {
      if (!nft_check(l[k].p, l[k].n, l[k].tag)) fail_msg("data lost at the end");
      assert_int_equal(nf_free(p, l[k].p), NF_OK);
    }
  assert_int_equal(nf_pool_check(p), NF_OK);
  void *big = nf_alloc(p, 20 * G, NULL);
  assert_non_null(big);
  nft_fill(big, 20 * G, 1);
  assert_true(nft_check(big, 20 * G, 1));
  assert_int_equal(nf_free(p, big), NF_OK);
  return failed;
}

// Destroy the pool and the fault backend; whatever failed on the way, the
// host backend under it must hold no granule and no mapping.
static void destroy_all(nf_pool_t *p, nf_backend_t *be, nf_backend_t *inner) {
  nf_pool_destroy(p);
  uint64_t gr = 1, mp = 1;
  nf_backend_host_usage(inner, &gr, &mp);
  assert_int_equal(gr, 0);
  assert_int_equal(mp, 0);
  nf_backend_destroy(be);
}

static nf_stats_t last_stats; // of the latest run, before destroy

static void run(uint64_t fail_at, double prob, uint64_t seed, uint64_t *calls_out) {
  nf_backend_t *inner, *be;
  assert_int_equal(nf_backend_host_create(&inner, 1ull << 30, G), NF_OK);
  assert_int_equal(nf_backend_fault_create(&be, inner, 0, 0, seed), NF_OK);
  nf_config_t c;
  nf_config_default(&c);
  c.limit = 32 * G;
  c.small_max = 8192;
  c.release_threshold = 12 * G;
  c.release_after = 8;
  c.views = 4; // views (view.c) made, taken back and evicted all the time
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, be, &c), NF_OK);
  uint64_t base = 0, failed = 0;
  nf_backend_fault_counts(be, &base, &failed);
  nf_backend_fault_set(be, fail_at ? base + fail_at : 0, prob);
  workload(p, be, seed);
  nf_backend_fault_counts(be, calls_out, &failed);
  *calls_out -= base;
  nf_stats_get(p, &last_stats);
  destroy_all(p, be, inner);
}

static void test_each_call_fails_once(void **state) {
  uint64_t total = 0;
  run(0, 0, 5, &total); // reference run: how many calls the workload makes
  assert_true(total > 50);
  // The sweep covers the views' calls: moves (map), eviction (unmap).
  assert_true(last_stats.view_moves > 0 && last_stats.view_evictions > 0 && last_stats.view_reuses > 0);
  for (uint64_t n = 1; n <= total; n++) {
    uint64_t calls;
    run(n, 0, 5, &calls);
  }
}

static void test_random_faults(void **state) {
  uint64_t calls;
  for (uint64_t seed = 1; seed <= 20; seed++) run(0, 0.05, seed, &calls);
  run(0, 0.2, nft_env_seed(77), &calls);
}

// Views' own paths (src/core/view.c) fail once each in turn: moving cached
// granules across streams (map + set access), a view whose granule is live
// elsewhere unmapped after a host wait, take-backs, eviction at destroy.
// Every live block keeps its data; the pool stays consistent and usable.
static int view_scenario(nf_pool_t *p) {
  nf_stream_t A = (nf_stream_t)1, B = (nf_stream_t)2;
  int failed = 0;
  for (int rep = 0; rep < 3; rep++) {
    void *x = nf_alloc(p, 100 * G, A), *y = nf_alloc(p, 100 * G, A);
    if (y) nft_fill(y, 100 * G, 11);
    nf_free(p, x); // cached
    void *z = nf_alloc(p, 101 * G, B); // elsewhere: x's granules move (views at x)
    if (z) nft_fill(z, 101 * G, 12);
    if (y && !nft_check(y, 100 * G, 11)) fail_msg("rep %d: y lost its data", rep);
    nf_free(p, y);
    void *w = nf_alloc(p, 100 * G, A); // x's place: views of z's granules unmapped first
    if (w) nft_fill(w, 100 * G, 13);
    if (z && !nft_check(z, 101 * G, 12)) fail_msg("rep %d: z lost its data", rep);
    if (w && !nft_check(w, 100 * G, 13)) fail_msg("rep %d: w lost its data", rep);
    failed += !x + !y + !z + !w;
    nf_free(p, w);
    nf_free(p, z);
    if (nf_pool_check(p) != NF_OK) fail_msg("rep %d: %s", rep, nf_last_error());
  }
  return failed;
}

static void run_views(uint64_t fail_at, uint64_t *calls_out, nf_stats_t *st_out) {
  nf_backend_t *inner, *be;
  assert_int_equal(nf_backend_host_create(&inner, 1ull << 30, G), NF_OK);
  assert_int_equal(nf_backend_fault_create(&be, inner, 0, 0, 1), NF_OK);
  nf_config_t c;
  nf_config_default(&c);
  c.limit = 256 * G;
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, be, &c), NF_OK);
  uint64_t base = 0, failed = 0;
  nf_backend_fault_counts(be, &base, &failed);
  nf_backend_fault_set(be, fail_at ? base + fail_at : 0, 0);
  view_scenario(p);
  nf_backend_fault_counts(be, calls_out, &failed);
  *calls_out -= base;
  nf_backend_fault_set(be, 0, 0);
  assert_int_equal(view_scenario(p), 0); // no faults: everything works again
  nf_stats_get(p, st_out);
  destroy_all(p, be, inner);
}

static void test_view_paths_fail_once(void **state) {
  uint64_t total = 0;
  nf_stats_t s;
  run_views(0, &total, &s);
  // The reference run takes every view path that calls the backend: moves
  // (map, set access, B's wait on A's event), unmapping busy views after a
  // host wait. (Take-backs call nothing but the same ordering as moves.)
  assert_true(s.view_moves > 0 && s.view_evictions > 0 && s.calls.event_sync > 0 && s.calls.stream_wait > 0);
  for (uint64_t n = 1; n <= total; n++) {
    uint64_t calls;
    run_views(n, &calls, &s);
  }
}

// A placement that fails after views moved a cached granule into its range
// leaves that granule there, in a free range again. The stream whose work
// last used it (X, still in flight) must still order the next user: a block
// placed there on another stream waits for X (before the fix the granule's
// last users were dropped at the move and the next block got none).
static void test_failed_placement_keeps_last_users(void **state) {
  int checked = 0;
  for (uint64_t off = 1; off <= 16; off++) {
    nf_backend_t *inner, *be;
    assert_int_equal(nf_backend_host_create(&inner, 1ull << 30, G), NF_OK);
    assert_int_equal(nf_backend_fault_create(&be, inner, 0, 0, 1), NF_OK);
    nf_config_t c;
    nf_config_default(&c);
    assert_int_equal(nf_config_parse(&c, "limit:256KiB,views:1000,small_max:4KiB", NULL, 0), NF_OK);
    nf_pool_t *p = NULL;
    assert_int_equal(nf_pool_create(&p, be, &c), NF_OK);
    nf_backend_host_set_manual_events(inner, 1);
    nf_stream_t S0 = (nf_stream_t)0x10, X = (nf_stream_t)0x20, S = (nf_stream_t)0x30, S2 = (nf_stream_t)0x40;
    void *l1 = nf_alloc(p, G, S0), *a = nf_alloc(p, G, X), *l2 = nf_alloc(p, G, S0);
    assert_true(l1 && a && l2);
    nf_free(p, a); // X's work on a still in flight (manual events)
    nf_stats_t s0, s1, s2;
    nf_stats_get(p, &s0);
    uint64_t calls = 0, failed = 0;
    nf_backend_fault_counts(be, &calls, &failed);
    nf_backend_fault_set(be, calls + off, 0);
    void *big = nf_alloc(p, 2 * G, S); // room for 1 new granule: a's cached one moves here, then call `off` fails
    nf_backend_fault_set(be, 0, 0);
    nf_stats_get(p, &s1);
    if (!big && s1.view_moves > s0.view_moves) {
      void *q = nf_alloc(p, 2 * G, S2);
      assert_non_null(q);
      nf_stats_get(p, &s2);
      assert_true(s2.calls.stream_wait + s2.calls.event_sync > s1.calls.stream_wait + s1.calls.event_sync);
      checked++;
      nf_free(p, q);
    }
    if (big) nf_free(p, big);
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_free(p, l1);
    nf_free(p, l2);
    nf_backend_host_set_manual_events(inner, 0);
    destroy_all(p, be, inner);
  }
  assert_true(checked > 0); // some offset failed the placement after the move
}

// Offload and prefetch (src/tier/) fail at each backend call in turn: host,
// detached and disk tiers, copies in flight (manual events), prefetch on
// another stream, free while offloaded, trim. A failing call reports an
// error and leaves its block where it was; the pool stays consistent; every
// block keeps its data (checked where it is mapped, and once brought back
// after the faults stop); destroy leaves nothing behind.
typedef struct { void *p; size_t n; uint64_t tag; int where; } oblk_t;

static void offload_step(nf_pool_t *p, oblk_t *b, int op, nf_stream_t s) {
  nf_status_t r;
  if (op < 3 && !b->where) {
    nf_tier_t t = op == 0 ? NF_TIER_HOST : op == 1 ? NF_TIER_HOST_DETACHED : NF_TIER_DISK;
    if ((r = nf_offload(p, b->p, s, t)) == NF_OK) b->where = t;
    else if (!nf_last_error()[0]) fail_msg("offload of %p to %d failed (%d) with no message", b->p, (int)t, r);
  } else if (op < 3 || op == 3) {
    if ((r = nf_prefetch(p, b->p, s)) == NF_OK) b->where = 0;
    else if (!nf_last_error()[0]) fail_msg("prefetch of %p failed (%d) with no message", b->p, r);
  } else {
    nf_offload_wait(p);
  }
}

static void run_offload(uint64_t fail_at, uint64_t *calls_out) {
  nf_backend_t *inner, *be;
  assert_int_equal(nf_backend_host_create(&inner, 1ull << 30, G), NF_OK);
  assert_int_equal(nf_backend_fault_create(&be, inner, 0, 0, 1), NF_OK);
  nf_config_t c;
  nf_config_default(&c);
  assert_int_equal(nf_config_parse(&c, "limit:1MiB,spill:host,spill_limit:2MiB,views:4", NULL, 0), NF_OK);
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, be, &c), NF_OK);
  nf_backend_host_set_manual_events(inner, 1);
  nf_stream_t A = (nf_stream_t)1, B = (nf_stream_t)2;
  oblk_t b[6] = {{0}};
  for (int i = 0; i < 6; i++) {
    b[i].n = (size_t)(3 + i % 3) * G + 1000 * (size_t)i;
    b[i].tag = 40 + (uint64_t)i;
    assert_non_null(b[i].p = nf_alloc(p, b[i].n, i % 2 ? B : A));
    nft_fill(b[i].p, b[i].n, b[i].tag);
  }
  uint64_t base = 0, failed = 0;
  nf_backend_fault_counts(be, &base, &failed);
  nf_backend_fault_set(be, fail_at ? base + fail_at : 0, 0);
  static const int plan[][3] = { // block, op (0 host, 1 detached, 2 disk, 3 prefetch, 4 wait), stream
      {0, 0, 0}, {1, 1, 0}, {2, 2, 1}, {3, 1, 1}, {4, 0, 1}, {9, 4, 0}, {0, 3, 1}, {1, 3, 0}, {3, 3, 1},
      {5, 1, 0}, {5, 3, 0}, {2, 3, 0}, {0, 1, 0}, {9, 4, 0}, {4, 3, 0}, {0, 3, 1}, {1, 0, 1}, {3, 2, 0}};
  for (size_t k = 0; k < sizeof plan / sizeof plan[0]; k++) {
    if (plan[k][0] == 9) {
      nf_backend_host_complete_events(inner);
      nf_offload_wait(p);
    } else {
      offload_step(p, &b[plan[k][0]], plan[k][1], plan[k][2] ? B : A);
    }
    if (k == 8) { // one block dies while offloaded, another while its copy is in flight
      assert_int_equal(nf_free(p, b[2].p), NF_OK);
      b[2].p = NULL;
      b[2] = (oblk_t){nf_alloc(p, 4 * G, A), 4 * G, 77, 0};
      if (b[2].p) nft_fill(b[2].p, b[2].n, b[2].tag);
      else b[2].n = 0;
    }
    if (k == 13 && nf_trim(p) != NF_OK) assert_true(nf_last_error()[0] != 0);
    nf_backend_fault_set(be, 0, 0);
    if (nf_pool_check(p) != NF_OK) fail_msg("fail_at %llu step %zu: %s", (unsigned long long)fail_at, k, nf_last_error());
    nf_backend_fault_counts(be, calls_out, &failed);
    nf_backend_fault_set(be, fail_at && base + fail_at > *calls_out ? base + fail_at : 0, 0);
    for (int i = 0; i < 6; i++)
      if (b[i].p && (b[i].where == 0 || b[i].where == NF_TIER_HOST) && !nft_check(b[i].p, b[i].n, b[i].tag))
        fail_msg("fail_at %llu step %zu: block %d (where %d) lost its data", (unsigned long long)fail_at, k, i,
                 b[i].where);
  }
  nf_backend_fault_counts(be, calls_out, &failed);
  *calls_out -= base;
  nf_backend_fault_set(be, 0, 0);
  nf_backend_host_complete_events(inner);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  for (int pass = 0; pass < 2; pass++) // everything comes back intact (resident blocks go first: room)
    for (int i = 0; i < 6; i++) {
      if (!b[i].p || (pass == 0) != !b[i].where) continue;
      if (b[i].where && nf_prefetch(p, b[i].p, A) != NF_OK)
        fail_msg("fail_at %llu: block %d: %s", (unsigned long long)fail_at, i, nf_last_error());
      if (!nft_check(b[i].p, b[i].n, b[i].tag)) fail_msg("fail_at %llu: block %d lost its data", (unsigned long long)fail_at, i);
      assert_int_equal(nf_free(p, b[i].p), NF_OK);
    }
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_backend_host_set_manual_events(inner, 0);
  destroy_all(p, be, inner);
}

static void test_offload_paths_fail_once(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  uint64_t total = 0;
  run_offload(0, &total);
  assert_true(total > 40);
  for (uint64_t n = 1; n <= total; n++) {
    uint64_t calls;
    run_offload(n, &calls);
  }
}

// Several faults in one call (nf__backend_fault_mask): a failure, then the
// retries of its rollback. Patterns, each from every call of the operation
// in turn: runs of 1..9 failing calls (10 map calls in a row failing can
// leave a granule with nothing mapped: the pool cannot be made consistent
// then), a failure then a run of 3 then one more (a copy, the retries of
// a remap back, the copy that replaces it), and seeded random 16-call masks.
// `fn` runs one pattern (off 0: none) and returns the calls it made.
typedef struct { int ok, intact, copied, lost, noaccess; } tally_t;
typedef uint64_t (*multi_fn)(uint64_t off, uint64_t mask, tally_t *t);

static int longest_run(uint64_t m) {
  int run = 0;
  for (; m; run++) m &= m << 1;
  return run;
}

static void sweep_multi(multi_fn fn, tally_t *t) {
  uint64_t total = fn(0, 0, t), rng = nft_env_seed(0x5EED);
  if (getenv("NF_DEBUG")) fprintf(stderr, "total %llu\n", (unsigned long long)total);
  assert_true(total > 5);
  for (uint64_t off = 1; off <= total; off++) {
    for (int len = 1; len <= 9; len++) fn(off, (1ull << len) - 1, t);
    for (int a = 1; a <= 4; a++)
      for (int b = a + 3; b <= 20; b++) fn(off, 1 | 7ull << a | 1ull << b, t);
    for (int k = 0; k < 24; k++) {
      uint64_t m = (nft_rand(&rng) & nft_rand(&rng) & 0xFFFF) | 1; // ~1 call in 4 fails
      if (longest_run(m) <= 9) fn(off, m, t);
    }
  }
}

// Cleanup calls are retried 3 times: more failures in a row may leak a
// staging range or mapping (by design); fewer must leave nothing behind.
static void multi_destroy(nf_pool_t *p, nf_backend_t *be, nf_backend_t *inner, uint64_t mask) {
  if (longest_run(mask) <= 2) {
    destroy_all(p, be, inner);
    return;
  }
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

static nf_pool_t *fault_pool(nf_backend_t **inner, nf_backend_t **be) {
  assert_int_equal(nf_backend_host_create(inner, 1ull << 30, G), NF_OK);
  assert_int_equal(nf_backend_fault_create(be, *inner, 0, 0, 1), NF_OK);
  return nft_pool_on(*be, "limit:1MiB,views:0");
}

// The pool is consistent and counts as offloaded exactly the host granules
// of block a (the only block on the host); `what` names the case. One
// exception, returned false: a set access that failed 3 times in a row
// leaves the block's remapped granules without access (not ready) until its
// next prefetch sets it; `msg`, the operation's error, must say so.
static bool offloaded_is(nf_pool_t *p, void *a, const char *what, const char *msg, tally_t *t) {
  bool access = true;
  if (nf_pool_check(p) != NF_OK) {
    if (!strstr(nf_last_error(), "not fully mapped") || !strstr(msg, "without access"))
      fail_msg("%s: %s", what, nf_last_error());
    access = false;
    t->noaccess++;
  }
  nf_stats_t s;
  uint64_t tb[3];
  nf_stats_get(p, &s);
  nft_tiers(p, a, tb);
  if (s.offloaded != tb[NF_TIER_HOST])
    fail_msg("%s: offloaded %llu B, block's host bytes %llu", what, (unsigned long long)s.offloaded,
             (unsigned long long)tb[NF_TIER_HOST]);
  return access;
}

// nf_prefetch of a host-offloaded block fails after its granules were
// swapped for device ones (the copy back, its event record), and putting
// the host granules back fails too. Before the fix, host granules that could
// not go back were freed and the call returned the copy's error: the block's
// bytes there were gone, silently. Now the data is never lost silently:
// either the block is intact (where a host granule could not go back, its
// data was copied into the device granule at the block), or the error says
// that data was lost, naming the block. The pool stays consistent; the
// offloaded counter follows the granules that stayed on the host.
static uint64_t prefetch_multi(uint64_t off, uint64_t mask, tally_t *t) {
  nf_backend_t *inner, *be;
  nf_pool_t *p = fault_pool(&inner, &be);
  nf_stream_t A = (nf_stream_t)1, S = (nf_stream_t)2;
  void *a = nf_alloc(p, 4 * G, A);
  assert_non_null(a);
  nft_fill(a, 4 * G, 21);
  assert_int_equal(nf_offload(p, a, A, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  uint64_t base, calls, failed, t0[3], t1[3];
  nft_tiers(p, a, t0);
  nf_backend_fault_counts(be, &base, &failed);
  nf__backend_fault_mask(be, off ? base + off : 0, mask);
  nf_status_t r = nf_prefetch(p, a, S);
  char msg[768], what[900], addr[32];
  snprintf(msg, sizeof msg, "%s", r ? nf_last_error() : "");
  nf_backend_fault_counts(be, &calls, &failed);
  nf_backend_fault_set(be, 0, 0);
  snprintf(what, sizeof what, "prefetch, call %llu mask %#llx: %d \"%s\"", (unsigned long long)off,
           (unsigned long long)mask, r, msg);
  snprintf(addr, sizeof addr, "%p", a);
  bool access = offloaded_is(p, a, what, msg, t);
  nft_tiers(p, a, t1);
  bool lost = r != NF_OK && strstr(msg, "LOST");
  if (lost && !strstr(msg, addr)) fail_msg("%s: the loss does not name the block %s", what, addr);
  if (!lost && access && !nft_check(a, 4 * G, 21)) fail_msg("%s: data lost silently", what);
  t->ok += r == NF_OK;
  t->intact += r != NF_OK && !lost;
  t->copied += r != NF_OK && !lost && t1[NF_TIER_DEVICE] > t0[NF_TIER_DEVICE] && t1[NF_TIER_HOST];
  t->lost += lost;
  if (lost && getenv("NF_DEBUG")) fprintf(stderr, "%s\n", what);
  if (nf_prefetch(p, a, S) != NF_OK) fail_msg("%s: then prefetch: %s", what, nf_last_error()); // usable
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: then prefetch: %s", what, nf_last_error());
  if (!lost && !nft_check(a, 4 * G, 21)) fail_msg("%s: data lost once back", what);
  assert_int_equal(nf_free(p, a), NF_OK);
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: after free: %s", what, nf_last_error());
  multi_destroy(p, be, inner, mask);
  return calls - base;
}

static void test_prefetch_rollback_faults(void **state) {
  (void)state;
  tally_t t = {0};
  sweep_multi(prefetch_multi, &t);
  // Every outcome happened: success, a failure with the block intact (some
  // granules by the copy from the staging range), a loss reported.
  if (getenv("NF_DEBUG")) fprintf(stderr, "ok %d intact %d copied %d lost %d noaccess %d\n", t.ok, t.intact, t.copied, t.lost, t.noaccess);
  if (!t.ok || !t.intact || !t.copied || !t.lost)
    fail_msg("outcomes: ok %d, intact %d (copied %d), lost %d", t.ok, t.intact, t.copied, t.lost);
}

// The finish of a host offload (host granules remapped at the block once
// the copy completed) fails, and its rollback too. The block is never left
// with a hole (before the fix, a remap whose restore failed left the granule
// unmapped, its device granule freed): it stays intact, offloaded or on the
// device, and prefetch brings it back. nf_offload_wait's error names it.
static uint64_t finish_multi(uint64_t off, uint64_t mask, tally_t *t) {
  nf_backend_t *inner, *be;
  nf_pool_t *p = fault_pool(&inner, &be);
  nf_backend_host_set_manual_events(inner, 1);
  void *a = nf_alloc(p, 4 * G, NULL);
  assert_non_null(a);
  nft_fill(a, 4 * G, 22);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_OK);
  nf_backend_host_complete_events(inner);
  uint64_t base, calls, failed;
  nf_backend_fault_counts(be, &base, &failed);
  nf__backend_fault_mask(be, off ? base + off : 0, mask);
  nf_status_t r = nf_offload_wait(p);
  char msg[768], what[900], addr[32];
  snprintf(msg, sizeof msg, "%s", r ? nf_last_error() : "");
  nf_backend_fault_counts(be, &calls, &failed);
  nf_backend_fault_set(be, 0, 0);
  snprintf(what, sizeof what, "finish, call %llu mask %#llx: %d \"%s\"", (unsigned long long)off,
           (unsigned long long)mask, r, msg);
  snprintf(addr, sizeof addr, "%p", a);
  bool access = offloaded_is(p, a, what, msg, t);
  if (access && !nft_check(a, 4 * G, 22)) fail_msg("%s: data lost", what);
  // A failed event call leaves the copy to finish at the next wait; a
  // failed finish is reported once, naming the block, which keeps device
  // granules.
  if (nf_offload_wait(p) != NF_OK) fail_msg("%s: then wait: %s", what, nf_last_error());
  uint64_t tb[3];
  nft_tiers(p, a, tb);
  if (tb[NF_TIER_DEVICE] && (r == NF_OK || !strstr(msg, addr)))
    fail_msg("%s: the finish failed, the error does not name the block", what);
  if (access) offloaded_is(p, a, what, msg, t);
  t->ok += r == NF_OK;
  t->intact += r != NF_OK;
  if (nf_prefetch(p, a, NULL) != NF_OK) fail_msg("%s: then prefetch: %s", what, nf_last_error());
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: then prefetch: %s", what, nf_last_error());
  if (!nft_check(a, 4 * G, 22)) fail_msg("%s: data lost once back", what);
  assert_int_equal(nf_free(p, a), NF_OK);
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: after free: %s", what, nf_last_error());
  nf_backend_host_set_manual_events(inner, 0);
  multi_destroy(p, be, inner, mask);
  return calls - base;
}

static void test_finish_rollback_faults(void **state) {
  (void)state;
  tally_t t = {0};
  sweep_multi(finish_multi, &t);
  if (getenv("NF_DEBUG")) fprintf(stderr, "ok %d intact %d noaccess %d\n", t.ok, t.intact, t.noaccess);
  if (!t.ok || !t.intact) fail_msg("outcomes: ok %d, failed %d", t.ok, t.intact);
}

// A host granule mapped at the host window whose set-access failed, and
// whose unmap then failed too, stays mapped there without access. The next
// detached offload through it must set the access, not copy into memory it
// cannot reach (CUDA: an illegal-address fault of the copy). Spy backend:
// the next `fail_acc` set-access calls and `fail_unmap` unmap calls fail.
typedef struct { nf_backend_t be; nf_backend_ops_t ops; int fail_acc, fail_unmap; } winspy_t;
static nf_status_t ws_acc(nf_backend_t *be, uintptr_t v, size_t n) {
  if (((winspy_t *)be)->fail_acc > 0 && ((winspy_t *)be)->fail_acc--) return NF_ERR_BACKEND;
  return nft_f_acc(be, v, n);
}
static nf_status_t ws_unmap(nf_backend_t *be, uintptr_t v, size_t n) {
  if (((winspy_t *)be)->fail_unmap > 0 && ((winspy_t *)be)->fail_unmap--) return NF_ERR_BACKEND;
  return nft_f_unmap(be, v, n);
}

static void test_window_without_access(void **state) {
  (void)state;
  winspy_t *w = calloc(1, sizeof *w);
  assert_non_null(w);
  nft_spy_init(&w->be, &w->ops, 1ull << 30, G);
  w->ops.set_access = ws_acc;
  w->ops.unmap = ws_unmap;
  nf_pool_t *p = nft_pool_on(&w->be, "limit:1MiB");
  void *a = nf_alloc(p, 4 * G, NULL);
  assert_non_null(a);
  nft_fill(a, 4 * G, 3);
  w->fail_acc = 1, w->fail_unmap = 3; // the window's first set-access, then its unmaps
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST_DETACHED), NF_ERR_BACKEND);
  assert_true(w->fail_acc == 0 && w->fail_unmap == 0);
  assert_true(nft_check(a, 4 * G, 3));
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST_DETACHED), NF_OK); // same host granules
  assert_int_equal(nf_offload_wait(p), NF_OK);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  assert_true(nft_check(a, 4 * G, 3));
  assert_int_equal(nf_free(p, a), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(&w->be);
}

// Disk tier I/O errors: the file may take fewer bytes than asked (a full
// disk, a file size limit) and then fail, or hold fewer than were written.
// The offload or prefetch fails with the reason (not a stale errno's), the
// block stays where it was, and a later offload within the limit works.
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
static void test_disk_short_write(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:1MiB");
  void *a = nf_alloc(p, 4 * G, NULL), *b = nf_alloc(p, G, NULL);
  assert_true(a && b);
  nft_fill(a, 4 * G, 8);
  nft_fill(b, G, 9);
  struct rlimit old, lim;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  lim = old;
  lim.rlim_cur = 2 * G + 4096; // a's 4 granules do not fit, b's one does
  void (*sig)(int) = signal(SIGXFSZ, SIG_IGN);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
  nf_status_t r1 = nf_offload(p, a, NULL, NF_TIER_DISK);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", nf_last_error());
  nf_status_t r2 = nf_offload(p, b, NULL, NF_TIER_DISK);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, sig);
  assert_int_equal(r1, NF_ERR_BACKEND);
  if (!strstr(msg, strerror(EFBIG))) fail_msg("message: %s", msg);
  assert_int_equal(r2, NF_OK);
  assert_true(nft_check(a, 4 * G, 8));
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_int_equal(nf_prefetch(p, b, NULL), NF_OK);
  assert_true(nft_check(b, G, 9));
  // The file loses its data (cut short): prefetch fails with a reason, the
  // block stays on disk (unmapped), the pool stays consistent.
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_DISK), NF_OK);
  int cut = 0;
  for (int fd = 3; fd < 1024 && !cut; fd++) {
    char lp[64], target[512] = "";
    snprintf(lp, sizeof lp, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(lp, target, sizeof target - 1);
    if (k > 0 && (target[k] = 0, strstr(target, "nofrag-offload-"))) cut = ftruncate(fd, 0) == 0;
  }
  assert_true(cut);
  assert_int_equal(nf_prefetch(p, b, NULL), NF_ERR_BACKEND);
  if (!strstr(nf_last_error(), "end of file")) fail_msg("message: %s", nf_last_error());
  uint64_t t[3];
  assert_int_equal(nf_block_tiers(p, b, t), NF_OK);
  assert_true(t[NF_TIER_DISK] == G);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_free(p, a);
  nf_free(p, b);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// nf_set_limit that fails (the backend refuses the unmap or the release of
// the granules above the new limit) leaves the limit as it was: a failing
// call changes nothing the caller can see (nofrag.h, nf_status_t).
static void test_failed_set_limit_keeps_the_limit(void **state) {
  (void)state;
  for (uint64_t off = 1; off <= 2; off++) { // the unmap, then the release
    nf_backend_t *inner, *be;
    assert_int_equal(nf_backend_host_create(&inner, 1ull << 30, G), NF_OK);
    assert_int_equal(nf_backend_fault_create(&be, inner, 0, 0, 1), NF_OK);
    nf_pool_t *p = nft_pool_on(be, "limit:1MiB,views:0"); // 16 granules
    void *a = nf_alloc(p, 8 * G, NULL);
    assert_non_null(a);
    assert_int_equal(nf_free(p, a), NF_OK); // 8 cached granules
    uint64_t calls, failed;
    nf_backend_fault_counts(be, &calls, &failed);
    nf_backend_fault_set(be, calls + off, 0);
    assert_int_equal(nf_set_limit(p, 4 * G), NF_ERR_BACKEND);
    nf_backend_fault_set(be, 0, 0);
    nf_config_t c;
    nf_pool_config(p, &c);
    assert_int_equal(c.limit, 16 * G);
    assert_int_equal(nf_pool_check(p), NF_OK);
    void *b = nf_alloc(p, 12 * G, NULL); // the old limit holds
    assert_non_null(b);
    nf_free(p, b);
    assert_int_equal(nf_set_limit(p, 4 * G), NF_OK);
    nf_pool_config(p, &c);
    assert_int_equal(c.limit, 4 * G);
    destroy_all(p, be, inner);
  }
}

int main(void) {
  if (getenv("NF_FILTER")) cmocka_set_test_filter(getenv("NF_FILTER"));
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_each_call_fails_once),
                                     cmocka_unit_test(test_random_faults),
                                     cmocka_unit_test(test_view_paths_fail_once),
                                     cmocka_unit_test(test_failed_placement_keeps_last_users),
                                     cmocka_unit_test(test_offload_paths_fail_once),
                                     cmocka_unit_test(test_prefetch_rollback_faults),
                                     cmocka_unit_test(test_finish_rollback_faults),
                                     cmocka_unit_test(test_window_without_access),
                                     cmocka_unit_test(test_disk_short_write),
                                     cmocka_unit_test(test_failed_set_limit_keeps_the_limit)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
