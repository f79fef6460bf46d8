// Same-address offload/prefetch (src/tier/: host, detached and disk tiers),
// on the host backend: its "host" tier is a
// second memfd, its copies are synchronous, and manual events keep copies
// "in flight" so that the deferred remapping paths run. Every block carries
// a pattern that is verified across every move. Backend failures in the
// tier layer: test_fault_tier.c; the streams of its copies, and a lazy GPU:
// test_offload_order.c.
#include "nf_test.h"

#include <dirent.h>

#include <sys/stat.h>

#define G (64 * 1024ull)

typedef struct { void *p; size_t n; uint64_t tag; int where; } blk_t;

// Offload frees device memory for others; prefetch brings the same bytes
// back at the same address; in-flight copies (manual events) are settled
// by wait, by prefetch (cancel) and by free.
static void test_offload_host(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:1MiB"); // 16 granules
  void *a = nf_alloc(p, 10 * G, NULL);
  assert_non_null(a);
  nft_fill(a, 10 * G, 7);
  assert_null(nf_alloc(p, 10 * G, NULL)); // does not fit beside it
  nf_backend_host_set_manual_events(be, 1);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_OK);
  nf_stats_t s;
  nft_stats(p, &s); // copy in flight: still on the device
  assert_true(s.offloaded == 0 && s.calls.copy >= 1);
  assert_true(nft_check(a, 10 * G, 7));
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nft_stats(p, &s);
  assert_true(s.offloaded == 10 * G && s.offloads == 1 && s.spilled == 0);
  uint64_t t[3];
  nft_tiers(p, a, t);
  assert_true(t[1] == 10 * G && t[0] == 0);
  assert_true(nft_check(a, 10 * G, 7)); // host memory at the same address
  char *snap = nf_snapshot(p);
  assert_non_null(snap);
  assert_non_null(strstr(snap, "\"offloaded\":\"host\"")); // the block
  assert_non_null(strstr(snap, "\"offloaded\":655360,"));    // the totals
  nf_snapshot_free(snap);
  void *b = nf_alloc(p, 10 * G, NULL);  // fits now
  assert_non_null(b);
  nft_fill(b, 10 * G, 8);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_OK); // again: no-op
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_DISK), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "nf_prefetch it first"));
  assert_int_equal(nf_prefetch(p, a, NULL), NF_ERR_OOM); // no device room: stays, intact
  assert_non_null(strstr(nf_last_error(), "stays offloaded"));
  assert_true(nft_check(a, 10 * G, 7));
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_HOST), NF_OK);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK); // b's finished offload made room
  nft_stats(p, &s);
  nft_tiers(p, a, t);
  assert_true(t[0] == 10 * G && t[1] == 0);
  assert_true(nft_check(a, 10 * G, 7) && nft_check(b, 10 * G, 8));
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nft_stats(p, &s);
  assert_true(s.prefetches == 1 && s.offloaded == 10 * G);
  // In flight, then prefetched (cancel) and freed (settle).
  assert_int_equal(nf_prefetch(p, b, NULL), NF_ERR_OOM);
  assert_int_equal(nf_free(p, b), NF_OK); // offloaded block freed: host granules go back
  uint64_t offloads0 = s.offloads;
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK); // the copy out still in flight: cancelled
  nft_stats(p, &s);
  assert_true(s.prefetches == 1 && s.offloads == offloads0); // nothing moved either way: not counted
  assert_true(nft_check(a, 10 * G, 7));
  void *c = nf_alloc(p, 2 * G, NULL);
  assert_int_equal(nf_offload(p, c, NULL, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_free(p, c), NF_OK);
  nf_backend_host_complete_events(be);
  nft_stats(p, &s);
  assert_int_equal(nf_trim(p), NF_OK);
  nft_stats(p, &s);
  assert_true(s.host_physical == 0 && s.offloaded == 0);
  // Bad input changes nothing.
  assert_int_equal(nf_offload(p, (char *)a + 512, NULL, NF_TIER_HOST), NF_ERR_INVALID);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_DEVICE), NF_ERR_INVALID);
  assert_int_equal(nf_prefetch(p, (void *)0x1000, NULL), NF_ERR_INVALID);
  uint64_t tt[3];
  assert_int_equal(nf_block_tiers(p, (char *)a + 1, tt), NF_ERR_INVALID);
  // A block under one granule owns none: nothing moves.
  void *small = nf_alloc(p, 1000, NULL);
  assert_int_equal(nf_offload(p, small, NULL, NF_TIER_HOST), NF_OK);
  nft_tiers(p, small, t);
  assert_true(t[0] == 1024 && t[1] == 0);
  nf_free(p, small);
  nf_free(p, a);
  nft_stats(p, &s);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// At the limit, a request waits for offload copies in flight to get their
// device granules back, rather than failing -- or spilling: the offloaded
// block is bound for the host anyway, a spilled one would stay there. The
// detached tier's copy holds the block's device granules too: they come back
// (the range is unmapped) once it completed.
static void test_offload_wait_at_limit(void **state) {
  (void)state;
  const char *confs[] = {"limit:1MiB", "limit:1MiB,spill:host"}; // 16 granules
  nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED};
  for (int k = 0; k < 4; k++) {
    int i = k & 1;
    nf_tier_t tier = tiers[k >> 1];
    nf_backend_t *be;
    nf_pool_t *p = nft_pool64k(&be, confs[i]);
    void *a = nf_alloc(p, 10 * G, NULL);
    assert_non_null(a);
    nft_fill(a, 10 * G, 3);
    nf_backend_host_set_manual_events(be, 1);
    assert_int_equal(nf_offload(p, a, NULL, tier), NF_OK);
    nf_stats_t s, s0;
    nft_stats(p, &s0);
    assert_true(s0.offloaded == 0); // copy in flight
    void *b = nf_alloc(p, 10 * G, NULL); // fits once the copy is done
    if (!b) fail_msg("tier %d, conf %s: the request did not wait for the copy in flight", (int)tier, confs[i]);
    nft_stats(p, &s);
    assert_true(s.offloaded == 10 * G && s.spilled == 0 && s.physical <= 16 * G);
    assert_true(s.calls.event_sync > s0.calls.event_sync); // it waited
    uint64_t t[3];
    nft_tiers(p, b, t);
    assert_true(t[0] == 10 * G && t[1] == 0);
    nft_fill(b, 10 * G, 4);
    if (tier == NF_TIER_HOST) {
      assert_true(nft_check(a, 10 * G, 3) && nft_check(b, 10 * G, 4));
      // Nothing in flight that holds device granules: a request that does
      // not fit fails (or spills) without waiting for anything.
      s0 = s;
      void *c = nf_alloc(p, 10 * G, NULL);
      nft_stats(p, &s);
      if (i == 0) assert_null(c);
      else assert_true(c && s.spilled == 4 * G);
      assert_int_equal(s.calls.event_sync, s0.calls.event_sync);
      if (c) nf_free(p, c);
    }
    assert_int_equal(nf_free(p, b), NF_OK);
    nf_backend_host_complete_events(be);
    assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
    assert_true(nft_check(a, 10 * G, 3));
    nf_free(p, a);
    nf_backend_host_complete_events(be);
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_backend_host_set_manual_events(be, 0);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
  }
}

// Many copies in flight on one stream: a poll asks that stream once, not
// once per copy (activation offload keeps hundreds in flight).
static void test_offload_poll_cost(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:16MiB");
  void *a[100];
  for (int i = 0; i < 100; i++) assert_non_null(a[i] = nf_alloc(p, 2 * G, NULL));
  nf_backend_host_set_manual_events(be, 1);
  nf_stats_t s0, s1;
  for (int i = 0; i < 99; i++) assert_int_equal(nf_offload(p, a[i], NULL, NF_TIER_HOST), NF_OK);
  nft_stats(p, &s0);
  assert_int_equal(nf_offload(p, a[99], NULL, NF_TIER_HOST), NF_OK); // polls 99 copies in flight
  nft_stats(p, &s1);
  assert_true(s1.calls.event_query - s0.calls.event_query <= 1);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nft_stats(p, &s1);
  assert_true(s1.offloaded == 100 * 2 * G && s1.calls.event_sync - s0.calls.event_sync <= 1);
  for (int i = 0; i < 100; i++) nf_free(p, a[i]);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

static void test_offload_disk(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:1MiB");
  void *a = nf_alloc(p, 10 * G + 4096, NULL); // owned granules + an edge
  nft_fill(a, 10 * G + 4096, 21);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_DISK), NF_OK);
  nf_stats_t s;
  nft_stats(p, &s);
  assert_true(s.offloaded_disk >= 10 * G && s.mapped <= 2 * G);
  uint64_t t[3];
  nft_tiers(p, a, t);
  assert_true(t[2] == 10 * G && t[0] == 4096);
  void *b = nf_alloc(p, 12 * G, NULL); // the device is free for others
  assert_non_null(b);
  nft_fill(b, 12 * G, 22);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_ERR_OOM);
  assert_non_null(strstr(nf_last_error(), "prefetch: no device memory")); // this call's own message
  nf_free(p, b);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  assert_true(nft_check(a, 10 * G + 4096, 21));
  nft_stats(p, &s);
  assert_true(s.offloaded_disk == 0 && s.prefetches == 1);
  // Freed while on disk.
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_DISK), NF_OK);
  assert_int_equal(nf_free(p, a), NF_OK);
  nft_stats(p, &s);
  assert_true(s.offloaded_disk == 0);
  // An unusable directory: a clear error, the block stays.
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  p = nft_pool64k(&be, "limit:1MiB,offload_dir:/nonexistent/nofrag");
  a = nf_alloc(p, 4 * G, NULL);
  nft_fill(a, 4 * G, 3);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_DISK), NF_ERR_BACKEND);
  assert_non_null(strstr(nf_last_error(), "/nonexistent/nofrag"));
  assert_true(nft_check(a, 4 * G, 3));
  nft_stats(p, &s);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// Detached host tier: the range is unmapped once the copy completed, the data
// waits in host granules (reached through the host window) and comes back.
static void test_offload_detached(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:1MiB"); // 16 granules
  void *a = nf_alloc(p, 10 * G + 4096, NULL); // owns 10 granules at most
  assert_non_null(a);
  nft_fill(a, 10 * G + 4096, 5);
  nf_backend_host_set_manual_events(be, 1);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST_DETACHED), NF_OK);
  nf_stats_t s;
  nft_stats(p, &s);
  assert_true(s.offloaded == 0 && s.offloads == 0); // copy in flight: still mapped
  assert_true(nft_check(a, 10 * G + 4096, 5));
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nft_stats(p, &s);
  uint64_t t[3];
  nft_tiers(p, a, t);
  uint64_t moved = t[NF_TIER_HOST];
  assert_true(moved >= 9 * G && s.offloaded == moved && s.offloads == 1 && t[NF_TIER_DISK] == 0);
  char *snap = nf_snapshot(p); // the block says which host tier holds it
  assert_non_null(snap);
  assert_non_null(strstr(snap, "\"offloaded\":\"host_detached\""));
  nf_snapshot_free(snap);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST_DETACHED), NF_OK); // again: no-op
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "detached"));
  void *b = nf_alloc(p, 12 * G, NULL); // the device granules came back
  assert_non_null(b);
  nft_fill(b, 12 * G, 6);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_ERR_OOM); // no room: stays detached, intact
  assert_non_null(strstr(nf_last_error(), "prefetch: no device memory")); // this call's own message
  nft_stats(p, &s);
  assert_int_equal(nf_free(p, b), NF_OK);
  uint64_t calls0 = s.calls.set_access;
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  nft_stats(p, &s);
  assert_true(s.offloaded == 0 && s.prefetches == 1);
  assert_true(s.calls.set_access - calls0 <= 2); // the block's range once (the window is mapped already)
  assert_true(nft_check(a, 10 * G + 4096, 5));
  nft_tiers(p, a, t);
  assert_true(t[NF_TIER_DEVICE] == 10 * G + 4096);
  // Cycles reuse the host granules and their window mappings: no new maps there.
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nft_stats(p, &s);
  uint64_t maps0 = s.calls.map;
  for (int k = 0; k < 3; k++) {
    assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST_DETACHED), NF_OK);
    nf_backend_host_complete_events(be);
    assert_int_equal(nf_offload_wait(p), NF_OK);
    assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
    assert_true(nft_check(a, 10 * G + 4096, 5));
    nf_backend_host_complete_events(be); // the host granules come back once the copy is done
    assert_int_equal(nf_offload_wait(p), NF_OK);
  }
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nft_stats(p, &s);
  assert_true(s.calls.map - maps0 <= 3 * moved / G); // the block's range only
  // Prefetch while the copy is in flight: dropped, the block never left.
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST_DETACHED), NF_OK);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  assert_true(nft_check(a, 10 * G + 4096, 5));
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nft_stats(p, &s);
  nft_tiers(p, a, t);
  assert_true(t[NF_TIER_DEVICE] == 10 * G + 4096 && s.offloaded == 0);
  // Freed while detached, and freed while its copy is in flight.
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST_DETACHED), NF_OK);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  assert_int_equal(nf_free(p, a), NF_OK);
  nft_stats(p, &s);
  assert_true(s.offloaded == 0);
  a = nf_alloc(p, 8 * G, NULL);
  nft_fill(a, 8 * G, 7);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST_DETACHED), NF_OK);
  assert_int_equal(nf_free(p, a), NF_OK);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nft_stats(p, &s);
  // Trim gives every host granule back, window mappings first.
  assert_int_equal(nf_trim(p), NF_OK);
  nft_stats(p, &s);
  assert_true(s.host_physical == 0 && s.offloaded == 0);
  nf_pool_destroy(p);
  uint64_t gr, maps;
  nf_backend_host_usage(be, &gr, &maps);
  assert_true(gr == 0 && maps == 0);
  nf_backend_destroy(be);
}

// Randomized: allocations (spilling past the limit), frees, offloads to the
// three tiers (unmapped ones are checked once back), prefetches, with events completing at random; every live block's
// pattern is verified after every operation that moved memory.
static void run_random(uint64_t seed, double fault_p) {
  nf_backend_t *host, *be;
  assert_int_equal(nf_backend_host_create(&host, 1024 * G, G), NF_OK);
  if (fault_p > 0) assert_int_equal(nf_backend_fault_create(&be, host, 0, 0, seed), NF_OK);
  else be = host;
  nf_config_t cfg;
  nf_config_default(&cfg);
  assert_int_equal(nf_config_parse(&cfg, "limit:2MiB,spill:host,spill_limit:2MiB,release_threshold:256KiB,"
                                         "release_after:8,release_idle_ms:0", NULL, 0), NF_OK);
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, be, &cfg), NF_OK);
  nf_backend_host_set_manual_events(be, 1);
  if (fault_p > 0) nf_backend_fault_set(be, 0, fault_p);
  enum { N = 24 };
  blk_t b[N] = {{0}};
  uint64_t rng = seed, tag = 1, moved = 0;
  nf_stream_t streams[2] = {NULL, (nf_stream_t)0x51};
  for (int step = 0; step < 3000; step++) {
    int i = (int)(nft_rand(&rng) % N), op = (int)(nft_rand(&rng) % 10);
    nf_stream_t st = streams[nft_rand(&rng) & 1];
    if (!b[i].p) {
      size_t n = 512 + nft_rand(&rng) % (6 * G);
      if ((b[i].p = nf_alloc(p, n, st))) {
        b[i].n = n, b[i].tag = tag++, b[i].where = 0;
        nft_fill(b[i].p, n, b[i].tag);
      }
    } else if (op < 3) {
      if (b[i].where == 0 || b[i].where == NF_TIER_HOST) assert_true(nft_check(b[i].p, b[i].n, b[i].tag));
      nf_status_t r = nf_free(p, b[i].p);
      if (r != NF_OK) { // only an injected fault (recording an event) may fail it
        assert_true(fault_p > 0 && r == NF_ERR_BACKEND);
        continue;
      }
      b[i].p = NULL;
    } else if (op < 6 && !b[i].where) {
      nf_tier_t t = op == 5 ? NF_TIER_DISK : op == 4 ? NF_TIER_HOST_DETACHED : NF_TIER_HOST;
      nf_status_t r = nf_offload(p, b[i].p, st, t);
      if (getenv("NF_DEBUG")) fprintf(stderr, "  offload %d -> %d: %d %s\n", i, t, r, r ? nf_last_error() : "");
      if (r == NF_OK) b[i].where = t, moved++;
    } else if (op < 9 && b[i].where) {
      nf_status_t r = nf_prefetch(p, b[i].p, st);
      if (getenv("NF_DEBUG")) fprintf(stderr, "  prefetch %d: %d %s\n", i, r, r ? nf_last_error() : "");
      if (r == NF_OK) b[i].where = 0;
    } else if (op == 9) {
      nf_backend_host_complete_events(be);
      nf_status_t r = nf_offload_wait(p);
      if (getenv("NF_DEBUG") && r) fprintf(stderr, "  wait: %d %s\n", r, nf_last_error());
    }
    if (fault_p == 0 || !(step % 1)) {
      if (fault_p > 0) nf_backend_fault_set(be, 0, 0);
      if (getenv("NF_DEBUG")) fprintf(stderr, "step %d op %d i %d where %d\n", step, op, i, b[i].where);
      if (nf_pool_check(p) != NF_OK && getenv("NF_DEBUG"))
        for (int k = 0; k < N; k++) fprintf(stderr, "  blk %d %p %zu where %d\n", k, b[k].p, b[k].n, b[k].where);
      if (nf_pool_check(p) != NF_OK) fail_msg("seed %llu step %d: %s", (unsigned long long)seed, step, nf_last_error());
      if (fault_p > 0) nf_backend_fault_set(be, 0, fault_p);
    }
    if (!(step % 1))
      for (int k = 0; k < N; k++)
        if (b[k].p && (b[k].where == 0 || b[k].where == NF_TIER_HOST) && !nft_check(b[k].p, b[k].n, b[k].tag))
          fail_msg("seed %llu step %d: block %d (%zu B, where %d) corrupted", (unsigned long long)seed, step, k,
                   b[k].n, b[k].where);
  }
  if (fault_p > 0) nf_backend_fault_set(be, 0, 0);
  nf_backend_host_complete_events(be);
  for (int pass = 0; pass < 2; pass++) // resident blocks first, then the offloaded ones come back
    for (int k = 0; k < N; k++) {
      if (!b[k].p || (pass == 0) != (b[k].where == 0)) continue;
      if (b[k].where) assert_int_equal(nf_prefetch(p, b[k].p, NULL), NF_OK);
      assert_true(nft_check(b[k].p, b[k].n, b[k].tag));
      assert_int_equal(nf_free(p, b[k].p), NF_OK);
    }
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_true(moved > 50);
  // The host backend counted every copy as its stream's work in flight:
  // nothing was unmapped or handed to another stream under one, failures
  // included. (Completed first: destroy unmaps what is left.)
  if (nf_backend_host_violations(be))
    fail_msg("seed %llu: %llu unmaps or reuses under copies in flight", (unsigned long long)seed,
             (unsigned long long)nf_backend_host_violations(be));
  nf_backend_host_complete_events(be);
  nf_pool_destroy(p);
  uint64_t gr, maps;
  nf_backend_host_usage(be, &gr, &maps);
  assert_true(gr == 0 && maps == 0);
  nf_backend_destroy(be);
}

static void test_random(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  uint64_t seeds[] = {1, 2, 3, nft_env_seed(4)};
  for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) run_random(seeds[i], 0);
}

static void test_random_faults(void **state) {
  (void)state;
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  uint64_t seeds[] = {11, 12, nft_env_seed(13)};
  for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) run_random(seeds[i], 0.03);
}

// During a capture (a stream route of nf_private_begin) offload, prefetch and
// offload_wait are refused with a clear error and change nothing: they make
// event calls and queue copies, which a CUDA graph capture forbids.
static void test_offload_refused_in_capture(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1024 * G, G, "limit:512KiB");
  nf_stream_t A = (nf_stream_t)(uintptr_t)1, C = (nf_stream_t)(uintptr_t)2;
  void *b = nf_alloc(p, 4 * G, A), *h = nf_alloc(p, 2 * G, A);
  assert_true(b && h);
  nft_fill(b, 4 * G, 3);
  assert_int_equal(nf_offload(p, h, A, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nf_stats_t s0, s1;
  nf_stats_get(p, &s0);
  assert_int_equal(nf_private_incref(p, 7), NF_OK);
  assert_int_equal(nf_private_begin(p, 7, C), NF_OK);
  assert_int_equal(nf_offload(p, b, A, NF_TIER_HOST), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "captured"));
  assert_int_equal(nf_prefetch(p, h, A), NF_ERR_INVALID);
  assert_int_equal(nf_offload_wait(p), NF_ERR_INVALID);
  nf_stats_get(p, &s1);
  assert_true(s1.offloads == s0.offloads && s1.prefetches == s0.prefetches && s1.offloaded == s0.offloaded);
  assert_int_equal(nf_private_end(p, 7), NF_OK);
  assert_int_equal(nf_prefetch(p, h, A), NF_OK); // after the capture: allowed again
  assert_true(nft_check(b, 4 * G, 3));
  assert_int_equal(nf_free(p, b), NF_OK);
  assert_int_equal(nf_free(p, h), NF_OK);
  assert_int_equal(nf_private_release(p, 7), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// The disk file's extents are not reused while blocks are on disk, but
// once none is, the next offloads start at offset 0 again: a job that moves
// its blocks out and back every step must not run the file's offsets up to
// the file system's size limit (16 TiB on ext4) after some thousand steps.
static void test_offload_disk_offsets(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, "limit:1MiB");
  void *a = nf_alloc(p, 4 * G, NULL);
  assert_non_null(a);
  nft_fill(a, 4 * G, 2);
  for (int step = 0; step < 8; step++) {
    assert_int_equal(nf_offload(p, a, NULL, NF_TIER_DISK), NF_OK);
    assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  }
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_DISK), NF_OK);
  struct stat sb = {0};
  for (int fd = 3; fd < 1024; fd++) {
    char lp[64], target[512] = "";
    snprintf(lp, sizeof lp, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(lp, target, sizeof target - 1);
    if (k > 0 && (target[k] = 0, strstr(target, "nofrag-offload-"))) assert_int_equal(fstat(fd, &sb), 0);
  }
  assert_true(sb.st_size > 0 && sb.st_size <= (off_t)(4 * G)); // one block's extent
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  assert_true(nft_check(a, 4 * G, 2));
  nf_free(p, a);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}


// Host granules are created only for what the free list lacks: an offload
// that needs k granules with f free creates k - f, so the host tier limit
// (spill_limit) is reached only when it really is.
static void test_offload_creates_only_missing_host_granules(void **state) {
  (void)state;
  nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED};
  for (int t = 0; t < 2; t++) {
    nf_backend_t *be;
    nf_pool_t *p = nft_pool64k(&be, "limit:1MiB,spill_limit:512KiB,views:0"); // 8 host granules at most
    void *a = nf_alloc(p, 4 * G, NULL), *b = nf_alloc(p, 6 * G, NULL);
    assert_true(a && b);
    nft_fill(a, 4 * G, 11);
    nft_fill(b, 6 * G, 12);
    assert_int_equal(nf_offload(p, a, NULL, tiers[t]), NF_OK);
    assert_int_equal(nf_offload_wait(p), NF_OK);
    assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
    assert_int_equal(nf_offload_wait(p), NF_OK); // a's 4 host granules are free again
    nf_stats_t s;
    nft_stats(p, &s);
    assert_true(s.host_physical == 4 * G && s.offloaded == 0);
    assert_int_equal(nf_offload(p, b, NULL, tiers[t]), NF_OK); // needs 6: 4 free + 2 new
    assert_int_equal(nf_offload_wait(p), NF_OK);
    nft_stats(p, &s);
    assert_true(s.host_physical == 6 * G && s.offloaded == 6 * G);
    assert_int_equal(nf_prefetch(p, b, NULL), NF_OK);
    assert_true(nft_check(a, 4 * G, 11) && nft_check(b, 6 * G, 12));
    nf_free(p, a);
    nf_free(p, b);
    assert_int_equal(nf_pool_check(p), NF_OK);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
  }
}

// The disk tier's file is unlinked as soon as it is created: nothing is left
// in offload_dir while blocks are on disk, nor once the pool is gone.
static void test_offload_disk_file_unlinked(void **state) {
  (void)state;
  char dir[] = "/tmp/nf_offl_XXXXXX", conf[128];
  assert_non_null(mkdtemp(dir));
  snprintf(conf, sizeof conf, "limit:1MiB,offload_dir:%s", dir);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool64k(&be, conf);
  void *a = nf_alloc(p, 4 * G, NULL);
  assert_non_null(a);
  nft_fill(a, 4 * G, 23);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_DISK), NF_OK);
  DIR *d = opendir(dir);
  assert_non_null(d);
  int entries = 0;
  for (struct dirent *de; (de = readdir(d));) entries += de->d_name[0] != '.';
  closedir(d);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  assert_true(nft_check(a, 4 * G, 23));
  nf_free(p, a);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  if (entries) { // leave nothing behind either way
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -f %s/nofrag-offload-*", dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", dir);
  }
  assert_int_equal(rmdir(dir), 0);
  if (entries) fail_msg("%d file(s) left in offload_dir while a block was on disk", entries);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_offload_poll_cost),     cmocka_unit_test(test_offload_wait_at_limit),
      cmocka_unit_test(test_offload_detached),      cmocka_unit_test(test_offload_host),
      cmocka_unit_test(test_offload_disk),          cmocka_unit_test(test_random),
      cmocka_unit_test(test_random_faults),         cmocka_unit_test(test_offload_disk_offsets),
      cmocka_unit_test(test_offload_refused_in_capture),
      cmocka_unit_test(test_offload_creates_only_missing_host_granules),
      cmocka_unit_test(test_offload_disk_file_unlinked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
