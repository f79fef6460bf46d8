// Introspection: nf_snapshot's JSON against the allocator's actual state (a
// small JSON parser below reads it back), and the OOM report: its content,
// the unchanged one-line message, and printing once per burst to stderr.
#include "nf_test.h"

#include <unistd.h>

#define G (64 * 1024) // small granule: many granules, fast tests

// ------------------------------------------------------------------ JSON
// Just enough JSON for the snapshot: objects, arrays, strings without
// escapes other than \" and \\, non-negative integers, true/false/null.
// Anything else fails the parse (and the test).
enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
typedef struct jv {
  int type;
  uint64_t num;
  char *str;
  struct jv **items; // array elements or object values
  char **keys;       // object keys
  size_t n;
} jv;

static const char *jp; // parse cursor

static void jws(void) { while (*jp == ' ' || *jp == '\n' || *jp == '\t' || *jp == '\r') jp++; }

static char *jstr(void) {
  if (*jp != '"') return NULL;
  const char *s = ++jp;
  while (*jp && *jp != '"') jp += *jp == '\\' && jp[1] ? 2 : 1;
  if (*jp != '"') return NULL;
  char *o = strndup(s, (size_t)(jp - s));
  jp++;
  return o;
}

static void jfree(jv *v) {
  if (!v) return;
  for (size_t i = 0; i < v->n; i++) { jfree(v->items[i]); if (v->keys) free(v->keys[i]); }
  free(v->items); free(v->keys); free(v->str); free(v);
}

static jv *jparse(void) {
  jws();
  jv *v = calloc(1, sizeof *v);
  if (*jp == '{' || *jp == '[') {
    int obj = *jp++ == '{';
    v->type = obj ? J_OBJ : J_ARR;
    jws();
    if (*jp == (obj ? '}' : ']')) { jp++; return v; }
    for (;;) {
      v->items = realloc(v->items, (v->n + 1) * sizeof *v->items);
      if (obj) {
        v->keys = realloc(v->keys, (v->n + 1) * sizeof *v->keys);
        jws();
        char *k = jstr();
        jws();
        if (!k || *jp++ != ':') { free(k); jfree(v); return NULL; }
        v->keys[v->n] = k;
      }
      jv *e = jparse();
      if (!e) { if (obj) free(v->keys[v->n]); jfree(v); return NULL; }
      v->items[v->n++] = e;
      jws();
      if (*jp == ',') { jp++; continue; }
      if (*jp++ == (obj ? '}' : ']')) return v;
      jfree(v);
      return NULL;
    }
  }
  if (*jp == '"') { v->type = J_STR; if (!(v->str = jstr())) { free(v); return NULL; } return v; }
  if (*jp >= '0' && *jp <= '9') { v->type = J_NUM; v->num = strtoull(jp, (char **)&jp, 10); return v; }
  if (!strncmp(jp, "true", 4)) { v->type = J_BOOL; v->num = 1; jp += 4; return v; }
  if (!strncmp(jp, "false", 5)) { v->type = J_BOOL; jp += 5; return v; }
  if (!strncmp(jp, "null", 4)) { v->type = J_NULL; jp += 4; return v; }
  free(v);
  return NULL;
}

static jv *jdoc(const char *s) {
  jp = s;
  jv *v = jparse();
  jws();
  if (v && *jp) { jfree(v); return NULL; } // trailing garbage
  return v;
}

static jv *jget(const jv *o, const char *k) {
  if (!o || o->type != J_OBJ) fail_msg("not an object looking for \"%s\"", k);
  for (size_t i = 0; i < o->n; i++) if (!strcmp(o->keys[i], k)) return o->items[i];
  fail_msg("missing key \"%s\"", k);
  return NULL;
}
static uint64_t jnum(const jv *o, const char *k) {
  jv *v = jget(o, k);
  if (v->type != J_NUM) fail_msg("\"%s\" is not a number", k);
  return v->num;
}
static const char *js(const jv *o, const char *k) {
  jv *v = jget(o, k);
  if (v->type != J_STR) fail_msg("\"%s\" is not a string", k);
  return v->str;
}
static int jhas(const jv *o, const char *k) {
  for (size_t i = 0; i < o->n; i++) if (!strcmp(o->keys[i], k)) return 1;
  return 0;
}
static uint64_t jhex(const jv *o, const char *k) {
  const char *s = js(o, k);
  if (strncmp(s, "0x", 2)) fail_msg("\"%s\" = %s is not hex", k, s);
  return strtoull(s, NULL, 16);
}

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
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:8MiB");
  assert_non_null(p);
  nf_backend_host_set_manual_events(be, 1);
  void *a = nf_alloc(p, 3 * G, (void *)1);
  assert_non_null(a);
  assert_int_equal(nf_record_stream(p, a, (void *)2), NF_OK);
  assert_int_equal(nf_free(p, a), NF_OK);
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
      cmocka_unit_test(test_oom_report),
      cmocka_unit_test(test_oom_print_once_per_burst),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
