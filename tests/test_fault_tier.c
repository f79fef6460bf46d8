// Backend failures in the tier layer (src/tier/: offload, prefetch, their
// finish and rollback), on the fault backend over the host backend or a spy
// backend: every call failing in turn, several in a row, disk I/O errors.
// A failing call reports an error naming what failed; every block's data is
// verified (intact, or its loss reported), the pool stays consistent and
// usable, and destroy leaves nothing behind. The core's faults: test_fault.c;
// deferred failures and undrained copies: test_fault_deferred.c.
#include "core/core.h" // white box: nft_unready
#include "nf_test.h"

#define G (64 * 1024ull)

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
  nft_destroy_all(p, be, inner);
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
typedef struct { int ok, intact, copied, lost, noaccess, unit_back, unit_fwd; } tally_t;
typedef uint64_t (*multi_fn)(uint64_t off, uint64_t mask, tally_t *t);

static void sweep_multi(multi_fn fn, tally_t *t) {
  uint64_t total = fn(0, 0, t), rng = nft_env_seed(0x5EED);
  if (getenv("NF_DEBUG")) fprintf(stderr, "total %llu\n", (unsigned long long)total);
  assert_true(total > 5);
  for (uint64_t off = 1; off <= total; off++) {
    for (int len = 1; len <= 9; len++) fn(off, (1ull << len) - 1, t);
    for (int a = 1; a <= 4; a++)
      for (int b = a + 3; b <= 20; b++) fn(off, 1 | 7ull << a | 1ull << b, t);
    // A call retried 3 times between two others (a remap: unmap, map, map
    // back) failing for good, then the cleanup's retried call (set access).
    for (int a = 0; a < 3; a++) fn(off, 0x49ull << a | 7ull << (a + 8), t);
    for (int k = 0; k < 24; k++) {
      uint64_t m = (nft_rand(&rng) & nft_rand(&rng) & 0xFFFF) | 1; // ~1 call in 4 fails
      if (nft_longest_run(m) <= 9) fn(off, m, t);
    }
  }
}

// The finish sweep runs on single granules, then (test_finish_unit_faults)
// on a block whose interior is two mapping units.
static const char *fault_conf = "limit:1MiB,views:0";
static uint64_t fin_granules = 4;

static nf_pool_t *fault_pool(nf_backend_t **inner, nf_backend_t **be) {
  assert_int_equal(nf_backend_host_create(inner, 1ull << 30, G), NF_OK);
  assert_int_equal(nf_backend_fault_create(be, *inner, 0, 0, 1), NF_OK);
  return nft_pool_on(*be, fault_conf);
}

// The pool is consistent and counts as offloaded exactly the host granules
// of block a (the only block on the host); `what` names the case. One
// exception, returned false: a set access that failed 3 times in a row
// leaves the block's remapped granules without access (not ready) until its
// next prefetch sets it; `msg`, the operation's error, must say so.
static bool offloaded_is(nf_pool_t *p, void *a, const char *what, const char *msg, tally_t *t) {
  bool access = !nft_unready(p, a);
  if (!access && !strstr(msg, "without access")) fail_msg("%s: without access, not said: %s", what, msg);
  t->noaccess += !access;
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: %s", what, nf_last_error());
  nf_stats_t s;
  uint64_t tb[3];
  nf_stats_get(p, &s);
  nft_tiers(p, a, tb);
  if (s.offloaded != tb[NF_TIER_HOST])
    fail_msg("%s: offloaded %llu B, block's host bytes %llu", what, (unsigned long long)s.offloaded,
             (unsigned long long)tb[NF_TIER_HOST]);
  return access;
}

// Every other case of the sweeps ends with the block freed as the failure
// left it (nofrag.h allows the free of any live block), not prefetched: the
// next block of its size, on its stream, must be whole and accessible (a
// block left without access was parked and handed out again as it was).
static int sweep_nth;
static void free_then_reuse(nf_pool_t *p, void *a, size_t n, nf_stream_t s, const char *what) {
  assert_int_equal(nf_set_limit(p, 64ull << 20), NF_OK); // the bins take blocks up to limit/16: this one too
  assert_int_equal(nf_free(p, a), NF_OK);
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: freed as it was: %s", what, nf_last_error());
  void *b = nf_alloc(p, n, s);
  if (!b) fail_msg("%s: freed as it was, then alloc: %s", what, nf_last_error());
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: freed as it was, new block %p: %s", what, b, nf_last_error());
  nft_fill(b, n, 23);
  if (!nft_check(b, n, 23)) fail_msg("%s: freed as it was, new block %p", what, b);
  assert_int_equal(nf_free(p, b), NF_OK);
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
  if (sweep_nth++ & 1) {
    free_then_reuse(p, a, 4 * G, A, what);
    nft_destroy_after(p, be, inner, mask);
    return calls - base;
  }
  if (nf_prefetch(p, a, S) != NF_OK) fail_msg("%s: then prefetch: %s", what, nf_last_error()); // usable
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: then prefetch: %s", what, nf_last_error());
  if (!lost && !nft_check(a, 4 * G, 21)) fail_msg("%s: data lost once back", what);
  assert_int_equal(nf_free(p, a), NF_OK);
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: after free: %s", what, nf_last_error());
  nft_destroy_after(p, be, inner, mask);
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
// With units, a unit is swapped whole (one unmap, then a map per host
// granule); where a map fails it is put back whole, and where that fails
// too each granule takes its host granule (*_back, *_fwd in the tally).
// Only there can a granule end with nothing mapped (a map failing 3 times,
// then the unit's 3 times, then 4 more), and the error must say so.
static uint64_t finish_multi(uint64_t off, uint64_t mask, tally_t *t) {
  nf_backend_t *inner, *be;
  nf_pool_t *p = fault_pool(&inner, &be);
  nf_backend_host_set_manual_events(inner, 1);
  size_t n = fin_granules * G;
  void *a = nf_alloc(p, n, NULL);
  assert_non_null(a);
  nft_fill(a, n, 22);
  nf_stats_t s0;
  nf_stats_get(p, &s0);
  if (strstr(fault_conf, "units") && s0.units != 2) fail_msg("the block lies on %llu units, not 2", (unsigned long long)s0.units);
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
  bool lost = r != NF_OK && strstr(msg, "are lost");
  if (lost && (!strstr(fault_conf, "units") || !strstr(msg, addr))) fail_msg("%s: a loss", what);
  bool access = offloaded_is(p, a, what, msg, t);
  if (access && !lost && !nft_check(a, n, 22)) fail_msg("%s: data lost", what);
  t->unit_back += strstr(msg, "the unit is mapped back whole") != NULL;
  t->unit_fwd += strstr(msg, "unit could not be mapped again") != NULL;
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
  t->intact += r != NF_OK && !lost;
  t->lost += lost;
  if (lost) { // a hole in the block: it goes as it is
    nf_free(p, a);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
    nf_backend_destroy(inner);
    return calls - base;
  }
  if (sweep_nth++ & 1) {
    free_then_reuse(p, a, n, NULL, what);
    nf_backend_host_set_manual_events(inner, 0);
    nft_destroy_after(p, be, inner, mask);
    return calls - base;
  }
  if (nf_prefetch(p, a, NULL) != NF_OK) fail_msg("%s: then prefetch: %s", what, nf_last_error());
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: then prefetch: %s", what, nf_last_error());
  if (!nft_check(a, n, 22)) fail_msg("%s: data lost once back", what);
  assert_int_equal(nf_free(p, a), NF_OK);
  if (nf_pool_check(p) != NF_OK) fail_msg("%s: after free: %s", what, nf_last_error());
  nf_backend_host_set_manual_events(inner, 0);
  nft_destroy_after(p, be, inner, mask);
  return calls - base;
}

static void test_finish_rollback_faults(void **state) {
  (void)state;
  tally_t t = {0};
  sweep_multi(finish_multi, &t);
  if (getenv("NF_DEBUG")) fprintf(stderr, "ok %d intact %d noaccess %d\n", t.ok, t.intact, t.noaccess);
  if (!t.ok || !t.intact) fail_msg("outcomes: ok %d, failed %d", t.ok, t.intact);
}

// The same over a 10-granule block whose interior is two units of 4
// (units:4): every outcome of a whole-unit swap happens, and the pool is
// consistent after each.
static void test_finish_unit_faults(void **state) {
  (void)state;
  tally_t t = {0};
  fault_conf = "limit:1MiB,views:0,units:4";
  fin_granules = 10;
  sweep_multi(finish_multi, &t);
  fault_conf = "limit:1MiB,views:0";
  fin_granules = 4;
  if (getenv("NF_DEBUG"))
    fprintf(stderr, "ok %d intact %d back %d fwd %d lost %d noaccess %d\n", t.ok, t.intact, t.unit_back, t.unit_fwd,
            t.lost, t.noaccess);
  if (!t.ok || !t.intact || !t.unit_back || !t.unit_fwd)
    fail_msg("outcomes: ok %d, failed %d (unit back %d, forward %d)", t.ok, t.intact, t.unit_back, t.unit_fwd);
}

// A host granule mapped at the host window whose set-access failed, and
// whose unmap then failed too, stays mapped there without access. The next
// detached offload through it must set the access, not copy into memory it
// cannot reach (CUDA: an illegal-address fault of the copy). Spy backend:
// nft_winspy_t (nf_test.h).
static void test_window_without_access(void **state) {
  (void)state;
  nft_winspy_t *w = calloc(1, sizeof *w);
  assert_non_null(w);
  nft_spy_init(&w->be, &w->ops, 1ull << 30, G);
  w->ops.set_access = nft_ws_acc;
  w->ops.unmap = nft_ws_unmap;
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

// Creating host granules fails in the backend (out of pinned memory, well
// below spill_limit): the offload fails with the backend's message, not
// "the host tier limit (spill_limit) is reached" (before the fix, any OOM
// there was reported as the limit). The block stays intact and usable. The
// limit really reached still says so.
static void test_host_granule_oom_message(void **state) {
  (void)state;
  nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED};
  for (int t = 0; t < 2; t++) {
    int seen = 0;
    for (uint64_t off = 1; off <= 16 && !seen; off++) { // each call in turn, up to the mem_create
      nf_backend_t *inner, *be;
      assert_int_equal(nf_backend_host_create(&inner, 1024 * G, G), NF_OK);
      assert_int_equal(nf_backend_fault_create(&be, inner, 0, 0, 1), NF_OK); // first mem_create fault: OOM
      nf_pool_t *p = nft_pool_on(be, "limit:1MiB,spill_limit:4MiB,views:0");
      void *a = nf_alloc(p, 4 * G, NULL);
      assert_non_null(a);
      nft_fill(a, 4 * G, 51);
      uint64_t base, failed, ta[3];
      nf_backend_fault_counts(be, &base, &failed);
      nf_backend_fault_set(be, base + off, 0);
      nf_status_t r = nf_offload(p, a, NULL, tiers[t]);
      char msg[768];
      snprintf(msg, sizeof msg, "%s", r ? nf_last_error() : "");
      nf_backend_fault_set(be, 0, 0);
      if (r == NF_ERR_OOM) {
        seen = 1;
        if (strstr(msg, "spill_limit) is reached") || !strstr(msg, "host granule") ||
            !strstr(msg, "injected fault in mem_create"))
          fail_msg("tier %d call %llu: the backend's OOM reported as \"%s\"", (int)tiers[t], (unsigned long long)off,
                   msg);
      }
      assert_int_equal(nf_pool_check(p), NF_OK);
      assert_true(nft_check(a, 4 * G, 51));
      if (r != NF_OK) { // failed: the block stays on the device, and can go later
        nft_tiers(p, a, ta);
        assert_true(ta[NF_TIER_DEVICE] == 4 * G);
        assert_int_equal(nf_offload(p, a, NULL, tiers[t]), NF_OK);
      }
      assert_int_equal(nf_offload_wait(p), NF_OK);
      assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
      assert_true(nft_check(a, 4 * G, 51));
      assert_int_equal(nf_free(p, a), NF_OK);
      assert_int_equal(nf_pool_check(p), NF_OK);
      nft_destroy_all(p, be, inner);
    }
    assert_true(seen); // some call in turn was the host granule's mem_create
    // spill_limit of one granule, a block of 4: the limit is what stops it.
    nf_backend_t *be;
    nf_pool_t *p = nft_pool(&be, 1024 * G, G, "limit:1MiB,spill_limit:64KiB,views:0");
    assert_non_null(p);
    void *a = nf_alloc(p, 4 * G, NULL);
    assert_non_null(a);
    nft_fill(a, 4 * G, 52);
    assert_int_equal(nf_offload(p, a, NULL, tiers[t]), NF_ERR_OOM);
    if (!strstr(nf_last_error(), "spill_limit) is reached")) fail_msg("tier %d: \"%s\"", (int)tiers[t], nf_last_error());
    assert_true(nft_check(a, 4 * G, 52));
    assert_int_equal(nf_pool_check(p), NF_OK);
    assert_int_equal(nf_free(p, a), NF_OK);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
  }
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  if (getenv("NF_FILTER")) cmocka_set_test_filter(getenv("NF_FILTER"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_offload_paths_fail_once), cmocka_unit_test(test_prefetch_rollback_faults),
      cmocka_unit_test(test_finish_rollback_faults),  cmocka_unit_test(test_finish_unit_faults),
      cmocka_unit_test(test_window_without_access),   cmocka_unit_test(test_disk_short_write),
      cmocka_unit_test(test_host_granule_oom_message),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
