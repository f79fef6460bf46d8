// Rules of the tier layer (src/tier/) that the other tier tests did not pin
// down, written by a mutation study of offload*.c: each test fails with one
// planted bug (named in its comment) and passes on the code as it is. Host
// backend (manual events: its detector counts an unmap under a copy still in
// flight), fault backend, or a spy backend over it. The tiers' main tests:
// test_offload.c, test_offload_order.c, test_fault_tier.c, test_spill.c.
#include "nf_test.h"
#include "tier/tier.h" // white box: the checker's view of a detached block

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define G (64 * 1024ull)

// An offloaded block freed leaves host granules mapped in its free range;
// they are swept like spilled ones, so the next block there lands on the
// device (the pool has no spill here: host memory under a new block would be
// a spill it never allowed). Planted bug: nf__offload_forget not setting
// host_sweep (the free's own test runs before the block's granules stop
// counting as offloaded).
static void test_freed_offload_host_granules_swept(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:1MiB,views:0");
  void *a = nft_offloaded(p, 4 * G, NF_TIER_HOST, 0);
  assert_int_equal(nf_free(p, a), NF_OK);
  void *b = nf_alloc(p, 4 * G, NULL);
  assert_non_null(b);
  uint64_t t[3];
  nft_tiers(p, b, t);
  nf_stats_t s;
  nft_stats(p, &s);
  if (t[NF_TIER_DEVICE] != 4 * G || s.spilled)
    fail_msg("new block %p (a was %p): %llu B on the host, %llu B spilled", b, a, (unsigned long long)t[NF_TIER_HOST],
             (unsigned long long)s.spilled);
  nf_free(p, b);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A spy that counts the address ranges reserved and not yet released.
typedef struct { nf_backend_t be; nf_backend_ops_t ops; int64_t ranges; } vaspy_t;
static nf_status_t vs_reserve(nf_backend_t *be, size_t n, size_t al, uintptr_t *out) {
  nf_status_t st = nft_f_var(be, n, al, out);
  ((vaspy_t *)be)->ranges += st == NF_OK;
  return st;
}
static nf_status_t vs_release(nf_backend_t *be, uintptr_t va, size_t n) {
  nf_status_t st = nft_f_vaf(be, va, n);
  ((vaspy_t *)be)->ranges -= st == NF_OK;
  return st;
}

// A pool destroyed while a block is offloaded (a process ending mid-step)
// gives everything back: granules, mappings, address ranges. Planted bugs:
// nf__offload_destroy not returning a detached block's host granules (they
// are on no free list, so nothing released them); nf__win_destroy not
// releasing the host window's ranges.
static void test_destroy_with_blocks_offloaded(void **state) {
  (void)state;
  nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED, NF_TIER_DISK};
  for (int t = 0; t < 3; t++) {
    vaspy_t *w = calloc(1, sizeof *w);
    assert_non_null(w);
    nft_spy_init(&w->be, &w->ops, 1024 * G, G);
    w->ops.va_reserve = vs_reserve;
    w->ops.va_release = vs_release;
    nf_pool_t *p = nft_pool_on(&w->be, "limit:1MiB,views:0");
    (void)nft_offloaded(p, 4 * G, tiers[t], 0);
    nf_pool_destroy(p);
    uint64_t gr = 1, maps = 1;
    nf_backend_host_usage(&w->be, &gr, &maps);
    if (gr || maps || w->ranges)
      fail_msg("tier %d: %llu granules, %llu mappings, %lld ranges left", (int)tiers[t], (unsigned long long)gr,
               (unsigned long long)maps, (long long)w->ranges);
    nf_backend_destroy(&w->be);
  }
}

// A spy whose map calls 1, 3 and 5 after `arm` fail (a remap's map, then its
// retries; each restore of the old granule succeeds): a remap that fails for
// good, the block intact.
typedef struct { nf_backend_t be; nf_backend_ops_t ops; int arm, maps; } mapspy_t;
static nf_status_t ms_map(nf_backend_t *be, uintptr_t v, size_t n, nf_handle_t h) {
  mapspy_t *w = (mapspy_t *)be;
  if (w->arm && w->maps < 6 && (w->maps++ & 1) == 0) return NF_ERR_BACKEND;
  return nft_f_map(be, v, n, h);
}

// A partly spilled block (2 device + 2 spilled granules) offloaded to the
// host: its spilled granules count as offloaded from the offload on. If the
// finish then moves nothing (every remap fails), the block is not offloaded
// and its spilled granules count as spilled again. Planted bug:
// nf__host_finish dropping the record without taking them out of
// offl_granules (offloaded 2 granules, spilled 0, for a block not offloaded).
static void test_finish_moving_nothing_gives_spill_back(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  mapspy_t *w = calloc(1, sizeof *w);
  assert_non_null(w);
  nft_spy_init(&w->be, &w->ops, 1024 * G, G);
  w->ops.map = ms_map;
  nf_pool_t *p = nft_pool_on(&w->be, "limit:512KiB,spill:host,views:0"); // 8 device granules
  void *d = nf_alloc(p, 6 * G, NULL), *b = nf_alloc(p, 4 * G, NULL);
  assert_true(d && b);
  nft_fill(b, 4 * G, 4);
  nf_backend_host_set_manual_events(w->be.inner, 1);
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_HOST), NF_OK);
  nf_backend_host_complete_events(w->be.inner);
  w->arm = 1;
  assert_int_equal(nf_offload_wait(p), NF_ERR_BACKEND); // the finish failed
  w->arm = 0;
  nft_last_error_has("not offloaded");
  nf_stats_t s;
  nft_stats(p, &s);
  if (s.offloaded || s.spilled != 2 * G)
    fail_msg("offloaded %llu B, spilled %llu B", (unsigned long long)s.offloaded, (unsigned long long)s.spilled);
  assert_true(nft_check(b, 4 * G, 4));
  nf_backend_host_set_manual_events(w->be.inner, 0);
  nf_free(p, b);
  nf_free(p, d);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(&w->be);
}

// An offload (host, detached) on stream B of a block of stream A whose copy
// out was queued and whose wait then failed, drain included (8 calls in a
// row fail from each call in turn): the copy may still read the block, so
// the block's free on A must wait for B (the disk tier's case is in
// test_fault_deferred.c). Planted bug: either tier not marking B a user of
// the block on that path (an unmap under the copy, counted by the detector).
static void test_undrained_offload_guards_free(void **state) {
  (void)state;
  nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED};
  for (int t = 0; t < 2; t++) {
    int undrained = 0;
    for (int k = 1; k <= 24; k++) {
      nft_undrained_t u;
      nf_status_t r = nft_undrained(&u, G, (uint64_t)k, tiers[t], 50 + (uint64_t)k);
      if (r != NF_OK) // the record after the copy (or its event) failed: the undrained path
        undrained += strstr(nf_last_error(), "event record failed") || strstr(nf_last_error(), "event create failed");
      else {
        nf_backend_host_complete_events(u.host);
        assert_int_equal(nf_offload_wait(u.p), NF_OK);
        assert_int_equal(nf_prefetch(u.p, u.b, NFT_A), NF_OK);
      }
      assert_true(nft_check(u.b, 4 * G, 50 + (uint64_t)k));
      char what[64];
      snprintf(what, sizeof what, "tier %d call %d", (int)tiers[t], k);
      nft_undrained_end(&u, G, what);
    }
    if (!undrained) fail_msg("tier %d: no case reached the undrained path", (int)tiers[t]);
  }
}

// The same failure on the block's own stream, right after a wait: the
// latest record on A (at the pool's latest tick) is complete, but the copy
// was queued after it. The deferred drop of the staging range must wait for
// a record made after the copy, not take that one for it. Planted bug:
// nf__xfer_defer giving the drop the pool's current tick (the staging range
// unmapped under the copy at the next poll).
static void test_deferred_drop_waits_for_a_fresh_record(void **state) {
  (void)state;
  int undrained = 0;
  for (int k = 1; k <= 24; k++) {
    nf_backend_t *host = nft_host(1024 * G, G), *be;
    assert_int_equal(nf_backend_fault_create(&be, host, 0, 0, 1), NF_OK);
    nf_pool_t *p = nft_pool_on(be, "limit:1MiB,views:0");
    nf_backend_host_set_manual_events(host, 1);
    nf_stream_t A = (nf_stream_t)1;
    void *a = nf_alloc(p, 4 * G, A), *c = nf_alloc(p, 2 * G, A);
    assert_true(a && c);
    nft_fill(a, 4 * G, 60 + (uint64_t)k);
    assert_int_equal(nf_offload(p, c, A, NF_TIER_HOST), NF_OK); // a record on A, then waited for
    assert_int_equal(nf_offload_wait(p), NF_OK);
    uint64_t base, failed;
    nf_backend_fault_counts(be, &base, &failed);
    nf__backend_fault_mask(be, base + (uint64_t)k, 0xFF);
    nf_status_t r = nf_offload(p, a, A, NF_TIER_HOST);
    nf_backend_fault_set(be, 0, 0);
    if (r != NF_OK)
      undrained += strstr(nf_last_error(), "event record failed") || strstr(nf_last_error(), "event create failed");
    assert_int_equal(nf_offload_wait(p), NF_OK); // drops what the failed offload left
    if (nf_backend_host_violations(host)) fail_msg("call %d: the staging range unmapped under its copy", k);
    if (r == NF_OK) assert_int_equal(nf_prefetch(p, a, A), NF_OK);
    assert_true(nft_check(a, 4 * G, 60 + (uint64_t)k));
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_backend_host_set_manual_events(host, 0);
    nf_pool_destroy(p);
    nf_backend_destroy(be); // and host, which it owns
  }
  assert_true(undrained >= 1);
}

// A spy on which, once armed, the first copy succeeds and then every copy,
// event record and event sync fails (map, unmap, set access still work).
typedef struct { nf_backend_t be; nf_backend_ops_t ops; int arm, copies; } cpspy_t;
static nf_status_t cs_copy(nf_backend_t *be, uintptr_t d, uintptr_t s, size_t n, nf_stream_t st) {
  cpspy_t *w = (cpspy_t *)be;
  if (w->arm && w->copies++ > 0) return NF_ERR_BACKEND;
  return nft_f_copy(be, d, s, n, st);
}
static nf_status_t cs_evr(nf_backend_t *be, nf_event_t e, nf_stream_t s) {
  cpspy_t *w = (cpspy_t *)be;
  return w->arm && w->copies ? NF_ERR_BACKEND : nft_f_evr(be, e, s);
}
static nf_status_t cs_evs(nf_backend_t *be, nf_event_t e) {
  cpspy_t *w = (cpspy_t *)be;
  return w->arm && w->copies ? NF_ERR_BACKEND : nft_f_evs(be, e);
}

// A prefetch of a block spilled host, device, host (two copy runs) whose
// first copy is queued and whose second fails, the waits and the requeues
// too: the copy queued into the first device granule cannot be waited for,
// so that granule stays at the block (filled in stream order); only the
// other goes back to its host granule. Planted bug: prefetch_undo putting
// back every granule, which unmaps the first under its copy (and frees its
// device granule while the copy may still write it).
static void test_prefetch_undo_keeps_granules_under_copies(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  cpspy_t *w = calloc(1, sizeof *w);
  assert_non_null(w);
  nft_spy_init(&w->be, &w->ops, 1024 * G, G);
  w->ops.copy = cs_copy;
  w->ops.event_record = cs_evr;
  w->ops.event_sync = cs_evs;
  nf_pool_t *p = nft_pool_on(&w->be, "limit:512KiB,spill:host,views:0"); // 8 device granules
  // Granules 0 and 2 of [a0, a1, a2] unmapped (disk), the device full: a
  // block placed there gets a1's device granule between two host ones.
  void *a0 = nf_alloc(p, G, NULL), *a1 = nf_alloc(p, G, NULL), *a2 = nf_alloc(p, G, NULL);
  void *y = nf_alloc(p, 5 * G, NULL);
  assert_true(a0 && a1 && a2 && y);
  assert_int_equal(nf_offload(p, a0, NULL, NF_TIER_DISK), NF_OK);
  assert_int_equal(nf_offload(p, a2, NULL, NF_TIER_DISK), NF_OK);
  void *z = nf_alloc(p, 2 * G, NULL);
  assert_non_null(z);
  nf_free(p, a0), nf_free(p, a2), nf_free(p, a1);
  void *b = nf_alloc(p, 3 * G, NULL);
  uint64_t t[3];
  nft_tiers(p, b, t);
  assert_true(b == a0 && t[NF_TIER_DEVICE] == G && t[NF_TIER_HOST] == 2 * G);
  nft_fill(b, 3 * G, 9);
  nf_free(p, z); // room for the prefetch
  nf_backend_host_set_manual_events(w->be.inner, 1);
  w->arm = 1;
  assert_int_equal(nf_prefetch(p, b, NULL), NF_ERR_BACKEND);
  w->arm = 0;
  if (nf_backend_host_violations(w->be.inner)) fail_msg("b's granule unmapped under the copy into it");
  nft_tiers(p, b, t);
  assert_true(t[NF_TIER_DEVICE] == 2 * G && t[NF_TIER_HOST] == G);
  assert_int_equal(nf_offload_wait(p), NF_OK); // the deferred drop goes
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_true(nft_check(b, 3 * G, 9));
  nf_backend_host_set_manual_events(w->be.inner, 0);
  nf_free(p, b), nf_free(p, y);
  nf_pool_destroy(p);
  nf_backend_destroy(&w->be);
}

// nf_pool_check sees a host granule held twice by a detached block (the
// core's counts still add up: only the tier's walk can tell). Planted bug:
// nf__detached_check not looking at seen[].
static void test_check_catches_detached_granule_twice(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:1MiB,views:0");
  void *a = nft_offloaded(p, 4 * G, NF_TIER_HOST_DETACHED, 0);
  nf_offl_t *o = p->offl;
  assert_true(o && !o->next && o->n == 4 && o->hg);
  uint32_t keep = o->hg[1];
  o->hg[1] = o->hg[0];
  nf_status_t st = nf_pool_check(p);
  o->hg[1] = keep;
  assert_int_equal(st, NF_ERR_INVALID);
  nft_last_error_has("detached block");
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_free(p, a);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// The stat of the offload file in `dir` (st_blocks: the disk it takes);
// false when none is open.
static bool offload_file(const char *dir, struct stat *sb) {
  for (int fd = 3; fd < 1024; fd++) {
    char lp[64], target[512] = "";
    snprintf(lp, sizeof lp, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(lp, target, sizeof target - 1);
    if (k > 0 && (target[k] = 0, strstr(target, dir) && strstr(target, "nofrag-offload-"))) return fstat(fd, sb) == 0;
  }
  return false;
}

// Whether the file system of `dir` gives back the space of a punched hole.
static bool can_punch(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/punch_XXXXXX", dir);
  int fd = mkstemp(path);
  if (fd < 0) return false;
  unlink(path);
  static char buf[1 << 16];
  memset(buf, 1, sizeof buf);
  struct stat a, b;
  bool ok = write(fd, buf, sizeof buf) == (ssize_t)sizeof buf && fsync(fd) == 0 && fstat(fd, &a) == 0 &&
            fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, sizeof buf) == 0 && fstat(fd, &b) == 0 &&
            b.st_blocks < a.st_blocks;
  close(fd);
  return ok;
}

// The disk tier gives the file's space back: a block brought back (or
// freed) has its extent punched out while others stay on disk, and once no
// block is on disk the file is cut to nothing. Planted bugs: nf__disk_forget
// without the punch (the file keeps every extent written until no block is
// left on disk), or without the truncate (its size stays at its peak).
static void test_disk_space_given_back(void **state) {
  (void)state;
  char dir[] = "/tmp/nf_space_XXXXXX", conf[128];
  assert_non_null(mkdtemp(dir));
  snprintf(conf, sizeof conf, "limit:1MiB,views:0,offload_dir:%s", dir);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, conf);
  void *a = nf_alloc(p, 8 * G, NULL), *b = nf_alloc(p, 2 * G, NULL);
  assert_true(a && b);
  nft_fill(a, 8 * G, 31);
  nft_fill(b, 2 * G, 32);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_DISK), NF_OK);
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_DISK), NF_OK);
  struct stat sb;
  bool punch = can_punch(dir);
  assert_int_equal(rmdir(dir), 0); // empty: the offload file is unlinked
  assert_true(offload_file(dir, &sb) && sb.st_size == (off_t)(10 * G));
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  assert_true(offload_file(dir, &sb));
  if (punch && (uint64_t)sb.st_blocks * 512 > 2 * G)
    fail_msg("a brought back, b on disk: the file takes %llu B", (unsigned long long)sb.st_blocks * 512);
  assert_int_equal(nf_prefetch(p, b, NULL), NF_OK);
  assert_true(offload_file(dir, &sb) && sb.st_size == 0 && sb.st_blocks == 0);
  assert_true(nft_check(a, 8 * G, 31) && nft_check(b, 2 * G, 32));
  nf_free(p, a);
  nf_free(p, b);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// This binary links with -Wl,--wrap=malloc (tests/CMakeLists.txt): while
// `watch` is set, the largest request is kept.
void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);
static bool watch;
static size_t largest;
void *__wrap_malloc(size_t n) {
  if (watch && n > largest) largest = n;
  return __real_malloc(n);
}

// The disk tier moves a block through a bounded host buffer (64 MiB), not
// one of the block's size: a 96 MiB block goes out and back with no larger
// malloc, its data intact. Planted bug: nf__disk_io's bounce not bounded.
static void test_disk_bounce_bounded(void **state) {
  (void)state;
  const uint64_t M = 1ull << 20, n = 96 * M;
  char dir[] = "/tmp/nf_bounce_XXXXXX", conf[128];
  assert_non_null(mkdtemp(dir));
  snprintf(conf, sizeof conf, "limit:128MiB,views:0,offload_dir:%s", dir);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 256 * M, 2 * M, conf);
  assert_non_null(p);
  void *a = nf_alloc(p, n, NULL);
  assert_non_null(a);
  nft_fill(a, n, 71);
  watch = true, largest = 0;
  nf_status_t out = nf_offload(p, a, NULL, NF_TIER_DISK), back = nf_prefetch(p, a, NULL);
  watch = false;
  assert_int_equal(out, NF_OK);
  assert_int_equal(back, NF_OK);
  if (largest > 64 * M) fail_msg("a malloc of %zu B moving a %llu B block", largest, (unsigned long long)n);
  assert_true(nft_check(a, n, 71));
  nf_free(p, a);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  assert_int_equal(rmdir(dir), 0);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_freed_offload_host_granules_swept),
      cmocka_unit_test(test_destroy_with_blocks_offloaded),
      cmocka_unit_test(test_finish_moving_nothing_gives_spill_back),
      cmocka_unit_test(test_undrained_offload_guards_free),
      cmocka_unit_test(test_deferred_drop_waits_for_a_fresh_record),
      cmocka_unit_test(test_prefetch_undo_keeps_granules_under_copies),
      cmocka_unit_test(test_check_catches_detached_granule_twice),
      cmocka_unit_test(test_disk_space_given_back),
      cmocka_unit_test(test_disk_bounce_bounded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
