// Introspection: nf_snapshot's JSON against the allocator's actual state (a
// small JSON parser below reads it back), and the OOM report: its content,
// the unchanged one-line message, and printing once per burst to stderr.
#include "nf_test.h"

#include "base/base.h"   // nf__fmt_bytes, as the report formats sizes

#include <unistd.h>

#define G (64 * 1024) // small granule: many granules, fast tests

#include "json_test.h"

// ------------------------------------------------------------------ checks

typedef struct { void *p; size_t n; nf_stream_t s; } live_t;

// Parse the snapshot and check it against nf_stats_get and the live blocks
// the test knows of: every one present with its size, request and stream,
// nothing else live; blocks tile each chunk in address order; mapped runs add
// up to stats.mapped and name each physical granule once. Returns the number
// of pending blocks seen.
static int verify(nf_pool_t *p, const live_t *l, int nl) {
  nf_stats_t st;
  nf_stats_get(p, &st);
  char *s = nf_snapshot(p);
  assert_non_null(s);
  jv *d = jdoc(s);
  if (!d) fail_msg("snapshot is not valid JSON near: %.80s", jp);
  const jv *t = jget(d, "totals");
  assert_int_equal(jnum(d, "version"), 1);
  nf_config_t cfg;
  nf_pool_config(p, &cfg);
  assert_int_equal(jnum(d, "device"), cfg.device);
  assert_int_equal(jnum(t, "live"), st.live);
  assert_int_equal(jnum(t, "live_rounded"), st.live_rounded);
  assert_int_equal(jnum(t, "mapped"), st.mapped);
  assert_int_equal(jnum(t, "physical"), st.physical);
  assert_int_equal(jnum(t, "limit"), st.limit);
  assert_int_equal(jnum(t, "granule"), G);
  assert_int_equal(jnum(t, "cached"), st.cached);
  assert_int_equal(jnum(t, "live_blocks"), st.live_blocks);
  const jv *gr = jget(d, "granules");
  assert_int_equal(jnum(gr, "created") * G, st.physical);
  assert_int_equal(jnum(gr, "mapped") * G, st.mapped);
  assert_int_equal(jnum(gr, "mapped") + jnum(gr, "free"), jnum(gr, "created"));
  assert_int_equal(jnum(jget(gr, "tiers"), "device"), jnum(gr, "created"));
  const jv *streams = jget(d, "streams");
  const jv *chunks = jget(d, "chunks");
  int nlive = 0, npending = 0;
  uint64_t live = 0, mapped_gr = 0, prev_base = 0;
  unsigned char *seen = calloc(jnum(gr, "created") + jnum(gr, "unused_slots") + 1, 1);
  for (size_t ci = 0; ci < chunks->n; ci++) {
    const jv *c = chunks->items[ci];
    uint64_t base = jhex(c, "base"), at = base;
    assert_true(base > prev_base); // chunks in address order
    prev_base = base;
    const jv *blocks = jget(c, "blocks");
    for (size_t bi = 0; bi < blocks->n; bi++) {
      const jv *b = blocks->items[bi];
      assert_int_equal(jhex(b, "addr"), at); // tiles the chunk: no gap, no overlap
      uint64_t size = jnum(b, "size");
      at += size;
      const char *state = js(b, "state");
      if (!strcmp(state, "free")) { assert_true(jhas(b, "stream_mask") && !jhas(b, "requested")); continue; }
      if (!strcmp(state, "pending")) { npending++; assert_true(jhas(b, "stream_mask")); continue; }
      assert_string_equal(state, "live");
      nlive++;
      live += jnum(b, "requested");
      int k = 0;
      while (k < nl && (uintptr_t)l[k].p != jhex(b, "addr")) k++;
      if (k == nl) fail_msg("snapshot has a live block at 0x%llx the test did not allocate",
                            (unsigned long long)jhex(b, "addr"));
      assert_int_equal(jnum(b, "requested"), l[k].n);
      assert_int_equal(size, (l[k].n + 511) & ~(size_t)511);
      assert_int_equal(jhex(b, "stream"), (uintptr_t)l[k].s);
      // The stream is also listed in "streams" (bit i of a mask is streams[i]).
      int found = 0;
      for (size_t i = 0; i < streams->n; i++) found |= strtoull(streams->items[i]->str, NULL, 16) == (uintptr_t)l[k].s;
      assert_true(found);
    }
    assert_int_equal(at, base + jnum(c, "size"));
    const jv *runs = jget(c, "mapped");
    uint64_t prev_end = 0;
    for (size_t ri = 0; ri < runs->n; ri++) {
      const jv *r = runs->items[ri];
      uint64_t g = jnum(r, "granule"), n = jnum(r, "count");
      assert_int_equal(jhex(r, "addr"), base + g * G);
      assert_true(g >= prev_end && n > 0);
      prev_end = g + n;
      const jv *phys = jget(r, "phys");
      assert_int_equal(phys->n, n);
      for (size_t i = 0; i < n; i++) {
        uint64_t x = phys->items[i]->num;
        assert_true(x < jnum(gr, "created") + jnum(gr, "unused_slots"));
        assert_false(seen[x]); // one physical granule mapped once
        seen[x] = 1;
      }
      mapped_gr += n;
    }
  }
  assert_int_equal(mapped_gr * G, st.mapped);
  assert_int_equal(nlive, nl);
  assert_int_equal(nlive, st.live_blocks);
  assert_int_equal(live, st.live);
  free(seen);
  jfree(d);
  nf_snapshot_free(s);
  return npending;
}

static void test_snapshot_known(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:16MiB");
  assert_non_null(p);
  verify(p, NULL, 0); // empty pool: no chunk, no granule
  live_t l[5] = {{NULL, 1000, NULL}, {NULL, 3 * G + 5, NULL}, {NULL, 200 * 1024, (void *)7},
                 {NULL, 5000, (void *)7}, {NULL, 2 * 1024 * 1024, (void *)9}};
  for (int i = 0; i < 5; i++) assert_non_null(l[i].p = nf_alloc(p, l[i].n, l[i].s));
  assert_int_equal(nf_free(p, l[2].p), NF_OK); // a free block with a stream mask
  l[2] = l[4];
  verify(p, l, 4);
  // The exact text of one block, as documented.
  char *s = nf_snapshot(p), want[160];
  snprintf(want, sizeof want, "{\"addr\":\"0x%llx\",\"size\":1024,\"state\":\"live\",\"requested\":1000,",
           (unsigned long long)(uintptr_t)l[0].p);
  assert_non_null(strstr(s, want));
  nf_snapshot_free(s);
  assert_null(nf_snapshot(NULL));
  assert_int_equal(nf_last_status(), NF_ERR_INVALID);
  for (int i = 0; i < 4; i++) assert_int_equal(nf_free(p, l[i].p), NF_OK);
  verify(p, NULL, 0);
  assert_int_equal(nf_trim(p), NF_OK);
  verify(p, NULL, 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// The pool's device is in the document: an export to PyTorch's format labels
// segments with it (a device 3 pool's snapshot read as device 0's).
static void test_snapshot_device(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:16MiB,device:3");
  assert_non_null(p);
  void *b = nf_alloc(p, 1000, NULL);
  assert_non_null(b);
  live_t l[1] = {{b, 1000, NULL}};
  verify(p, l, 1);
  char *s = nf_snapshot(p);
  assert_non_null(strstr(s, "{\"version\":1,\"device\":3,"));
  nf_snapshot_free(s);
  assert_int_equal(nf_free(p, b), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// Random allocations and frees on several streams, under a limit that forces
// stitching: the snapshot matches after every phase.
static void test_snapshot_random(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:8MiB");
  assert_non_null(p);
  uint64_t seed = nft_env_seed(42);
  live_t l[64] = {{0}};
  int n = 0;
  for (int phase = 0; phase < 6; phase++) {
    for (int op = 0; op < 300; op++) {
      int i = (int)(nft_rand(&seed) % 64);
      if (l[i].p) { assert_int_equal(nf_free(p, l[i].p), NF_OK); l[i].p = NULL; continue; }
      size_t sz = nft_rand(&seed) % 4 ? 1 + nft_rand(&seed) % (2 * G) : nft_rand(&seed) % (12 * G) + 1;
      l[i].s = (void *)(uintptr_t)(nft_rand(&seed) % 3);
      l[i].n = sz;
      l[i].p = nf_alloc(p, sz, l[i].s);
    }
    live_t compact[64];
    n = 0;
    for (int i = 0; i < 64; i++) if (l[i].p) compact[n++] = l[i];
    verify(p, compact, n);
    assert_int_equal(nf_pool_check(p), NF_OK);
  }
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A block freed while recorded on another stream whose work is not done.
static void test_snapshot_pending(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pending_pool(&be, G);
  assert_int_equal(verify(p, NULL, 0), 1);
  char *s = nf_snapshot(p);
  assert_non_null(strstr(s, "\"state\":\"pending\",\"requested\":196608,\"stream\":\"0x1\",\"extra_streams\":\"0x2\""));
  nf_snapshot_free(s);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_trim(p), NF_OK);
  assert_int_equal(verify(p, NULL, 0), 0);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// Host memory in the document: spill and an offload to host put host
// granules under the pool's addresses. The totals match nf_stats_get's (the
// offloaded granules are not "spilled"), granules.created counts both tiers,
// mapped runs split where the tier changes (their host granules are exactly
// the spilled and offloaded ones), and each chunk names its own arena.
static void test_snapshot_tiers(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:1MiB,spill:host,spill_limit:4MiB,small_max:4KiB");
  assert_non_null(p);
  void *small = nf_alloc(p, 1000, NULL), *a = nf_alloc(p, 10 * G, NULL), *b = nf_alloc(p, 8 * G, NULL); // b: spilled in part
  void *c = nf_alloc(p, 2 * G, NULL);
  assert_true(small && a && b && c);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nf_stats_t st;
  nf_stats_get(p, &st);
  assert_true(st.spilled > 0 && st.offloaded > 0);
  char *s = nf_snapshot(p);
  assert_non_null(s);
  jv *d = jdoc(s);
  assert_non_null(d);
  const jv *t = jget(d, "totals"), *gr = jget(d, "granules");
  assert_int_equal(jnum(t, "spilled"), st.spilled);
  assert_int_equal(jnum(t, "offloaded"), st.offloaded);
  assert_int_equal(jnum(t, "host_physical"), st.host_physical);
  assert_int_equal(jnum(gr, "created") * G, st.physical + st.host_physical);
  assert_int_equal(jnum(jget(gr, "tiers"), "host") * G, st.host_physical);
  const jv *chunks = jget(d, "chunks");
  uint64_t host_gr = 0;
  int seen_small = 0, seen_large = 0;
  for (size_t ci = 0; ci < chunks->n; ci++) {
    const jv *ch = chunks->items[ci], *runs = jget(ch, "mapped");
    uint64_t base = jhex(ch, "base"), end = base + jnum(ch, "size");
    const char *arena = js(ch, "arena");
    if ((uintptr_t)small >= base && (uintptr_t)small < end) { assert_string_equal(arena, "small"); seen_small = 1; }
    if ((uintptr_t)b >= base && (uintptr_t)b < end) { assert_string_equal(arena, "large"); seen_large = 1; }
    for (size_t ri = 0; ri < runs->n; ri++)
      if (!strcmp(js(runs->items[ri], "tier"), "host")) host_gr += jnum(runs->items[ri], "count");
  }
  assert_true(seen_small && seen_large);
  assert_int_equal(host_gr * G, st.spilled + st.offloaded);
  jfree(d);
  nf_snapshot_free(s);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  nf_free(p, a);
  nf_free(p, b);
  nf_free(p, c);
  nf_free(p, small);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// ------------------------------------------------------------------ OOM report

static void test_oom_report(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:1MiB");
  assert_non_null(p);
  // Too large: nothing tried, the one-line message as before.
  assert_null(nf_alloc(p, 2 * 1024 * 1024, (void *)3));
  assert_non_null(strstr(nf_last_error(), "more than the whole limit"));
  const char *r = nf_last_oom_report();
  assert_non_null(strstr(r, "request:   2.000 MiB (2097152 B) on stream 0x3"));
  assert_non_null(strstr(r, "reclaim:   not tried"));
  assert_non_null(strstr(r, "live memory alone exceeds the limit by 1.000 MiB"));
  assert_non_null(strstr(r, "largest live blocks: none"));
  // Live memory alone: 768 KiB live, 512 KiB more asked.
  void *big = nf_alloc(p, 8 * G, NULL), *mid = nf_alloc(p, 4 * G, (void *)5);
  assert_non_null(big);
  assert_non_null(mid);
  assert_null(nf_alloc(p, 8 * G, NULL));
  assert_non_null(strstr(nf_last_error(), "tried to allocate"));
  assert_non_null(strstr(nf_last_error(), "limit "));
  r = nf_last_oom_report();
  assert_non_null(strstr(r, "OOM #2 of this pool"));
  assert_non_null(strstr(r, "live memory alone exceeds the limit by 256.0 KiB") ||
                  strstr(r, "live memory alone exceeds the limit by 262144 B"));
  char want[128];
  snprintf(want, sizeof want, "1. 512.0 KiB (524288 B) at %p, stream (nil)", big);
  if (!strstr(r, want)) snprintf(want, sizeof want, "1. 524288 B (524288 B) at %p", big);
  assert_non_null(strstr(r, want));
  snprintf(want, sizeof want, "(262144 B) at %p, stream 0x5", mid);
  assert_non_null(strstr(r, want));
  assert_non_null(strstr(r, "reclaim:   waited"));
  // A request near SIZE_MAX (a negative size cast) with memory live: the
  // excess must not wrap around into the fragmentation suggestion (which
  // named a limit of a few MiB as enough for it).
  assert_null(nf_alloc(p, SIZE_MAX, NULL));
  r = nf_last_oom_report();
  assert_non_null(strstr(r, "reclaim:   not tried"));
  assert_null(strstr(r, "fragmentation"));
  assert_non_null(strstr(r, "suggestion: live memory alone exceeds the limit by 16777216.000 TiB"));
  assert_int_equal(nf_free(p, big), NF_OK);
  assert_int_equal(nf_free(p, mid), NF_OK);
  // Fragmentation: 40 KiB blocks packed into 64 KiB granules, every other
  // one freed: half the bytes are free yet every granule is pinned.
  void *v[26] = {0};
  int n = 0;
  while (n < 26 && (v[n] = nf_alloc(p, 40 * 1024, NULL))) n++;
  for (int i = 0; i < n; i += 2) assert_int_equal(nf_free(p, v[i]), NF_OK);
  assert_null(nf_alloc(p, 4 * G, NULL));
  assert_int_equal(nf_last_status(), NF_ERR_OOM);
  r = nf_last_oom_report();
  assert_non_null(strstr(r, "suggestion: fragmentation: the largest free range is"));
  assert_non_null(strstr(r, "a limit of"));
  // Top five only, largest first (all 40 KiB here).
  assert_non_null(strstr(r, "5. 40960 B"));
  assert_null(strstr(r, "6. "));
  for (int i = 1; i < n; i += 2) assert_int_equal(nf_free(p, v[i]), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  // With spill, a request over limit + spill_limit: the host tier is empty,
  // so the report must not say it is full.
  p = nft_pool(&be, 1ull << 30, G, "limit:1MiB,spill:host,spill_limit:1MiB");
  assert_non_null(p);
  assert_null(nf_alloc(p, 3 * 1024 * 1024, NULL));
  r = nf_last_oom_report();
  assert_non_null(strstr(r, "reclaim:   not tried"));
  assert_null(strstr(r, "host tier is full"));
  assert_non_null(strstr(r, "suggestion: the request alone exceeds the limit plus spill_limit (1.000 MiB + 1.000 MiB)"));
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// The report's figures: reclaim counts since the previous OOM (not since the
// pool began), pending blocks by their size (what they hold), the limit that
// guarantees a fragmented request (live granules + its granules + 1, nofrag.h);
// with spill, a request whose size wraps live + size - limit to 0 (a negative
// size cast) is still "the request alone exceeds", not fragmentation; stranded
// units are named for a request that fits the limit only.
static void test_oom_report_figures(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:1MiB,small_max:4KiB,views:0");
  assert_non_null(p);
  // 8 granules cached before k: a 10-granule request takes 7 unused ones
  // and reclaims (unmaps) cached ones for the rest (views:0: no cached view
  // serves it instead).
  void *a = nf_alloc(p, 8 * G, NULL), *k = nf_alloc(p, G, NULL);
  assert_true(a && k);
  assert_int_equal(nf_free(p, a), NF_OK);
  void *b = nf_alloc(p, 10 * G, NULL);
  assert_non_null(b);
  nf_stats_t st;
  nf_stats_get(p, &st);
  assert_true(st.reclaims > 0);
  assert_null(nf_alloc(p, 8 * G, NULL));
  assert_null(nf_alloc(p, 8 * G, NULL)); // nothing reclaimed since the first OOM
  nf_stats_get(p, &st);
  const char *r = nf_last_oom_report();
  char want[256];
  snprintf(want, sizeof want, "0 reclaims unmapped 0 granules since the previous OOM (%llu / %llu in all)",
           (unsigned long long)st.reclaims, (unsigned long long)st.reclaimed_granules);
  if (!strstr(r, want)) fail_msg("report:\n%s\nwithout '%s'", r, want);
  assert_int_equal(nf_free(p, b), NF_OK);
  assert_int_equal(nf_free(p, k), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  // Fragmentation (as in test_oom_report): the limit that guarantees it.
  p = nft_pool(&be, 1ull << 30, G, "limit:1MiB");
  assert_non_null(p);
  void *v[26] = {0};
  int n = 0;
  while (n < 26 && (v[n] = nf_alloc(p, 40 * 1024, NULL))) n++;
  for (int i = 0; i < n; i += 2) assert_int_equal(nf_free(p, v[i]), NF_OK);
  assert_null(nf_alloc(p, 4 * G, NULL));
  nf_stats_get(p, &st);
  char lim[32];
  nf__fmt_bytes(lim, sizeof lim, (st.live_granules + 4 + 1) * G);
  snprintf(want, sizeof want, "the request needs 4 more: a limit of %s guarantees it", lim);
  r = nf_last_oom_report();
  if (!strstr(r, want)) fail_msg("report:\n%s\nwithout '%s'", r, want);
  for (int i = 1; i < n; i += 2) assert_int_equal(nf_free(p, v[i]), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);

  // Pending: a freed block whose recorded stream's work is not done.
  p = nft_pool(&be, 1ull << 30, G, "limit:1MiB");
  assert_non_null(p);
  nf_backend_host_set_manual_events(be, 1);
  void *x = nf_alloc(p, 3 * G + 5, (void *)1);
  assert_non_null(x);
  assert_int_equal(nf_record_stream(p, x, (void *)2), NF_OK);
  assert_int_equal(nf_free(p, x), NF_OK);
  assert_null(nf_alloc(p, 2 * NF_MiB, NULL)); // too large: no reclaim, so no wait for the work
  char held[32];
  nf__fmt_bytes(held, sizeof held, 3 * G + 512); // the block's size: requests round up to 512 B
  snprintf(want, sizeof want, "pending:   1 freed blocks (%s) wait on record_stream work", held);
  r = nf_last_oom_report();
  if (!strstr(r, want)) fail_msg("report:\n%s\nwithout '%s'", r, want);
  nf_backend_host_complete_events(be);
  nf_pool_destroy(p);
  nf_backend_destroy(be);

  // Spill: live above the limit, and a request of 2^64 - (live - limit).
  p = nft_pool(&be, 1ull << 30, G, "limit:1MiB,spill:host,spill_limit:4MiB");
  assert_non_null(p);
  void *s1 = nf_alloc(p, 12 * G, NULL), *s2 = nf_alloc(p, 8 * G, NULL);
  assert_true(s1 && s2);
  nf_stats_get(p, &st);
  assert_true(st.live > st.limit);
  assert_null(nf_alloc(p, (size_t)0 - (size_t)(st.live - st.limit), NULL));
  r = nf_last_oom_report();
  assert_null(strstr(r, "fragmentation"));
  assert_non_null(strstr(r, "suggestion: the request alone exceeds the limit plus spill_limit"));
  nf_free(p, s1);
  nf_free(p, s2);
  nf_pool_destroy(p);
  nf_backend_destroy(be);

  // Units stranded by a block over part of one (test_unit's run_stranded):
  // they explain a request that fits the limit, not one larger than it.
  p = nft_pool(&be, 1ull << 30, G, "units:16,limit:4MiB,small_max:8KiB");
  assert_non_null(p);
  void *u1 = nf_alloc(p, 16 * G, NULL), *u2 = nf_alloc(p, 16 * G, NULL), *u3 = nf_alloc(p, 4 * G, NULL);
  assert_true(u1 && u2 && u3);
  assert_int_equal(nf_free(p, u1), NF_OK);
  void *part = nf_alloc(p, 3 * G, NULL); // over part of u1's unit
  assert_ptr_equal(part, u1);
  assert_null(nf_alloc(p, 35 * G, NULL));
  assert_non_null(strstr(nf_last_oom_report(), "sit in mapping units")); // the fitting request's report
  assert_null(nf_alloc(p, 5 * NF_MiB, NULL));
  r = nf_last_oom_report();
  assert_non_null(strstr(r, "reclaim:   not tried"));
  assert_null(strstr(r, "units:"));
  nf_free(p, part);
  nf_free(p, u2);
  nf_free(p, u3);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

typedef struct { nf_pool_t *p; int ooms; } oom_arg;
static void fail_allocs(void *arg) {
  oom_arg *a = arg;
  for (int i = 0; i < a->ooms; i++) assert_null(nf_alloc(a->p, 64 * G, NULL));
}

// Count the printed reports in what a call wrote to stderr.
static int stderr_reports(nf_pool_t *p, int ooms) {
  oom_arg a = {p, ooms};
  char *buf = nft_capture_stderr(fail_allocs, &a);
  int k = 0;
  for (const char *s = buf; (s = strstr(s, "nofrag: out of memory (OOM #")); s++) k++;
  if (k) assert_non_null(strstr(buf, "NOFRAG_QUIET_OOM=1 silences it"));
  if (strstr(buf, "2 more in the previous burst")) k += 100; // flag for the caller
  free(buf);
  return k;
}

static void test_oom_print_once_per_burst(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:1MiB");
  assert_non_null(p);
  setenv("NOFRAG_QUIET_OOM", "0", 1);
  assert_int_equal(stderr_reports(p, 3), 1); // one burst: printed once
  usleep(1100 * 1000);
  assert_int_equal(stderr_reports(p, 2), 101); // a new burst, naming the 2 held back
  usleep(1100 * 1000);
  setenv("NOFRAG_QUIET_OOM", "1", 1);
  assert_int_equal(stderr_reports(p, 2), 0); // quiet: built, not printed
  assert_non_null(strstr(nf_last_oom_report(), "OOM #7 of this pool"));
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1); // keep the logs clean; one test turns it off
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_snapshot_known),
      cmocka_unit_test(test_snapshot_device),
      cmocka_unit_test(test_snapshot_random),
      cmocka_unit_test(test_snapshot_pending),
      cmocka_unit_test(test_snapshot_tiers),
      cmocka_unit_test(test_oom_report),
      cmocka_unit_test(test_oom_report_figures),
      cmocka_unit_test(test_oom_print_once_per_burst),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
