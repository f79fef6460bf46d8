// Private pools (src/core/private_pool.c) under capture and replay. A spying
// backend checks the capture rules (no event call at all while a stream
// route exists) and the order between streams: a graph replays on any
// stream, unseen by the pool, so what a released or trimmed pool hands on
// must come after every stream's work. The randomized test mixes pools,
// routes, captures, hand-back and trim with replays writing junk over each
// pool's freed ranges, and verifies every other live block's pattern.
// The basic cases of private pools are in test_private.c.
#include "nf_test.h"

#include "backend/backend.h"

#define G (64 * 1024)
#define S(x) ((nf_stream_t)(uintptr_t)(x))

// ------------------------------------------------------------ spy backend
// Forwards to the host backend; counts event calls made while `capturing`.
// It also numbers event records and keeps, per stream S(0..7), the newest
// record of each stream it waited on and of each known complete (ordered()).
typedef struct { nf_event_t e; int s, seq; } spy_ev;
typedef struct {
  nf_backend_t be;
  nf_backend_ops_t ops;
  int capturing;
  int events_in_capture, events_total;
  int seq, nev, fail_sync; // fail_sync: syncs of events on stream S(fail_sync) fail (0: none)
  spy_ev ev[128];
  int waited[8][8], done[8];
} spy_t;

#define IN(be) ((be)->inner)
#define FWD(call) return nft_fwd(be, (call))
static void ev_seen(nf_backend_t *be) {
  spy_t *s = (spy_t *)be;
  s->events_total++;
  if (s->capturing) s->events_in_capture++;
}
static spy_ev *ev_of(spy_t *s, nf_event_t e) { // its latest record (a spare slot if none)
  for (int i = 0; i < s->nev; i++)
    if (s->ev[i].e == e) return &s->ev[i];
  return &s->ev[s->nev < 127 ? s->nev++ : 127];
}
static void raise_to(int *x, int v) { *x = v > *x ? v : *x; }
static nf_status_t sp_evr(nf_backend_t *be, nf_event_t e, nf_stream_t s) {
  ev_seen(be);
  *ev_of((spy_t *)be, e) = (spy_ev){e, (int)((uintptr_t)s & 7), ++((spy_t *)be)->seq};
  FWD(IN(be)->ops->event_record(IN(be), e, s));
}
static nf_status_t ev_end(nf_backend_t *be, nf_event_t e, bool sync) { // query or sync
  spy_t *sp = (spy_t *)be;
  spy_ev *v = ev_of(sp, e);
  nf_status_t st = !sync ? IN(be)->ops->event_query(IN(be), e)
                   : sp->fail_sync && v->s == sp->fail_sync ? NF_ERR_BACKEND : IN(be)->ops->event_sync(IN(be), e);
  if (st == NF_OK) raise_to(&sp->done[v->s], v->seq);
  ev_seen(be);
  FWD(st);
}
static nf_status_t sp_evq(nf_backend_t *be, nf_event_t e) { return ev_end(be, e, false); }
static nf_status_t sp_evs(nf_backend_t *be, nf_event_t e) { return ev_end(be, e, true); }
static nf_status_t sp_sw(nf_backend_t *be, nf_stream_t s, nf_event_t e) {
  spy_ev *v = ev_of((spy_t *)be, e);
  raise_to(&((spy_t *)be)->waited[(uintptr_t)s & 7][v->s], v->seq);
  ev_seen(be);
  FWD(IN(be)->ops->stream_wait(IN(be), s, e));
}
// Stream w's work from now on runs after stream x's work before record number `mark`.
static bool ordered(const spy_t *s, nf_stream_t w, nf_stream_t x, int mark) {
  return s->waited[(uintptr_t)w & 7][(uintptr_t)x & 7] > mark || s->done[(uintptr_t)x & 7] > mark;
}
static spy_t *spy_new(uint64_t capacity) {
  spy_t *s = calloc(1, sizeof *s);
  assert_non_null(s);
  nft_spy_init(&s->be, &s->ops, capacity, G);
  s->ops.event_record = sp_evr;
  s->ops.event_query = sp_evq;
  s->ops.event_sync = sp_evs;
  s->ops.stream_wait = sp_sw;
  return s;
}

static nf_pool_t *spy_pool(spy_t *s, const char *conf) { return nft_pool_on(&s->be, conf); }

// During a capture: no event record, query, synchronize or wait -- even with
// blocks freed on other streams, record_stream, and stitching at the limit.
// The same steps outside a capture do make event calls (the spy can see them).
static void test_capture_no_events(void **state) {
  (void)state;
  spy_t *s = spy_new(256ull << 20);
  nf_pool_t *p = spy_pool(s, "limit:2M");
  void *b1 = nf_alloc(p, 300000, S(2));
  void *b2 = nf_alloc(p, 300000, S(2));
  nf_free(p, b1); // freed on stream 2: reusing it on stream 1 needs an event
  assert_int_equal(nf_private_incref(p, 1), NF_OK);
  assert_int_equal(nf_private_begin(p, 1, S(1)), NF_OK);
  s->capturing = 1;
  void *c1 = nf_alloc(p, 300000, S(1)); // private: fresh range
  void *g1 = nf_alloc(p, 300000, S(3)); // general, another stream: must not order after stream 2 by an event
  assert_non_null(c1);
  assert_int_equal(nf_record_stream(p, c1, S(3)), NF_OK);
  assert_int_equal(nf_free(p, c1), NF_OK); // record_stream'd free: records deferred
  void *c2 = nf_alloc(p, 1000000, S(1)); // at the limit: stitching without waits
  nf_free(p, b2);
  void *c3 = nf_alloc(p, 100000, S(1));
  s->capturing = 0;
  assert_int_equal(s->events_in_capture, 0);
  assert_int_equal(nf_private_end(p, 1), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  int before = s->events_total;
  assert_int_equal(nf_trim(p), NF_OK); // the deferred record_stream record happens now
  assert_true(s->events_total > before);
  if (g1) nf_free(p, g1);
  if (c2) nf_free(p, c2);
  if (c3) nf_free(p, c3);
  // Control: cross-stream reuse outside a capture does use events.
  void *x = nf_alloc(p, 300000, S(2));
  nf_free(p, x);
  before = s->events_total;
  void *y = nf_alloc(p, 300000, S(4));
  assert_true(s->events_total > before);
  nf_free(p, y);
  assert_int_equal(nf_private_release(p, 1), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(&s->be);
}

// A 65th stream during a capture: giving slots back takes a host wait for
// the whole device, which a capture forbids (CUDA: it invalidates the
// capture). The new stream is refused with the reason and no wait; after the
// capture it comes in (slots given back after one device wait).
static void test_capture_refuses_the_65th_stream(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 256ull << 20, G, NULL);
  assert_int_equal(nf_private_incref(p, 1), NF_OK);
  assert_int_equal(nf_private_begin(p, 1, S(0x100)), NF_OK); // captured: its slot is named
  for (int i = 1; i < 64; i++) nf_free(p, nf_alloc(p, 512, S(0x100 + i))); // nothing names these
  uint64_t syncs = nft_stats_of(p).calls.event_sync;
  assert_null(nf_alloc(p, 512, S(0x5000)));
  assert_int_equal(nf_last_status(), NF_ERR_UNSUPPORTED);
  nft_last_error_has("being captured");
  assert_int_equal(nft_stats_of(p).calls.event_sync, syncs); // no device wait
  assert_int_equal(nf_private_end(p, 1), NF_OK);
  void *y = nf_alloc(p, 512, S(0x5000));
  assert_non_null(y);
  assert_int_equal(nft_stats_of(p).calls.event_sync, syncs + 1);
  nf_free(p, y);
  assert_int_equal(nf_private_release(p, 1), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// ------------------------------------------------------------ replays on other streams
// A graph replays on any stream, unseen by the pool: what a released or
// trimmed pool hands on must come after every stream's work. Streams: A
// captures, R replays, B uses the memory later. The pool knows R and B, and
// their work so far is complete.
enum { SA = 1, SR = 2, SB = 3 };
static void streams_known(nf_pool_t *p) {
  nf_free(p, nf_alloc(p, 512, S(SR)));
  nf_free(p, nf_alloc(p, 512, S(SB)));
  assert_int_equal(nf_trim(p), NF_OK);
}

// Hand-back with views: granules of a freed private range taken back by a
// parked view elsewhere order the taker after the replays too (the
// granules' last users), not only after the stream that freed the range.
static void test_hand_back_views_ordered(void **state) {
  spy_t *s = spy_new(256ull << 20);
  nf_pool_t *p = spy_pool(s, "limit:576KiB"); // 9 granules
  streams_known(p);
  void *v = nf_alloc(p, 3 * G, S(SA)), *w = nf_alloc(p, 5 * G, S(SA));
  nf_free(p, v);
  assert_int_equal(nf_private_incref(p, 1), NF_OK);
  void *tmp = nf_alloc_private(p, 1, 3 * G - 512, S(SA)); // at the limit: 2 of v's granules move here
  void *keep = nf_alloc_private(p, 1, 512, S(SA));       // tmp's range stays below 3 G
  nf_free(p, tmp);
  int mark = s->seq; // a replay on R writes into tmp
  assert_int_equal(nf_private_release(p, 1), NF_OK);
  uint64_t r0 = nft_stats_of(p).view_reuses;
  void *b = nf_alloc(p, 3 * G, S(SB)); // at v: its views take their granules back from tmp's range
  assert_true(b == v && nft_stats_of(p).view_reuses > r0);
  if (!ordered(s, S(SB), S(SR), mark)) fail_msg("B uses granules the replay on R writes, with no ordering");
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_free(p, b), nf_free(p, w), nf_free(p, keep);
  nf_pool_destroy(p);
  nf_backend_destroy(&s->be);
  (void)state;
}

// nf_private_trim unmaps a free range only after every stream's work, also
// of streams whose own frees are all known complete.
static void test_private_trim_waits_for_replays(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 256ull << 20, G, NULL);
  assert_int_equal(nf_private_incref(p, 1), NF_OK);
  assert_int_equal(nf_private_begin(p, 1, S(SA)), NF_OK);
  void *tmp = nf_alloc(p, 4 * G, S(SA));
  assert_int_equal(nf_free(p, tmp), NF_OK);
  assert_int_equal(nf_private_end(p, 1), NF_OK);
  streams_known(p); // A's work on tmp complete too
  nf_backend_host_set_manual_events(be, 1);
  nf_backend_host_use(be, S(SR), tmp, 4 * G); // a replay on R, in flight
  uint64_t m0 = nft_stats_of(p).mapped;
  assert_int_equal(nf_private_trim(p, 1), NF_OK);
  assert_true(nft_stats_of(p).mapped < m0);
  if (nf_backend_host_violations(be))
    fail_msg("%llu unmaps under the replay's work", (unsigned long long)nf_backend_host_violations(be));
  nf_backend_host_set_manual_events(be, 0);
  assert_int_equal(nf_private_release(p, 1), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  (void)state;
}

// Hand-back of blocks still pending (record_stream): replays wrote there
// too. A pending block is freed only by a blocking poll, which a settle of
// every stream follows, unless the poll fails half-way: here the spy fails
// the sync of S(4), after y (S(5)) is freed and before x.
static void test_hand_back_pending(void **state) {
  spy_t *s = spy_new(256ull << 20);
  nf_pool_t *p = spy_pool(s, NULL);
  streams_known(p);
  assert_int_equal(nf_private_incref(p, 1), NF_OK);
  void *x = nf_alloc_private(p, 1, 3 * G, S(SA)), *y = nf_alloc_private(p, 1, 5 * G, S(SA));
  void *keep = nf_alloc_private(p, 1, 512, S(SA)); // y stays between non-free blocks
  assert_int_equal(nf_record_stream(p, x, S(4)), NF_OK);
  assert_int_equal(nf_record_stream(p, y, S(5)), NF_OK);
  nf_free(p, x), nf_free(p, y);
  int mark = s->seq; // a replay on R writes into y
  assert_int_equal(nf_private_release(p, 1), NF_OK);
  s->fail_sync = 4;
  assert_int_not_equal(nf_trim(p), NF_OK);
  void *b = nf_alloc(p, 5 * G, S(SB));
  assert_ptr_equal(b, y);
  if (!ordered(s, S(SB), S(SR), mark)) fail_msg("B reuses y, where the replay on R writes, with no ordering");
  s->fail_sync = 0;
  nf_free(p, b), nf_free(p, keep);
  assert_int_equal(nf_trim(p), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(&s->be);
  (void)state;
}

// ------------------------------------------------------------ randomized

enum { NSLOT = 48, NPOOL = 3, NSTREAM = 3 };
typedef struct { void *p; size_t n; uint64_t tag, owner; } rslot_t;
typedef struct { uintptr_t a; size_t n; } range_t;

static void randomized(uint64_t seed) {
  spy_t *s = spy_new(512ull << 20);
  nf_pool_t *p = spy_pool(s, seed & 1 ? "limit:6M" : "limit:6M,spill:host,spill_limit:2M");
  uint64_t rng = seed;
  rslot_t sl[NSLOT] = {{0}};
  uint64_t uses[NPOOL + 1] = {0};
  int routed[NPOOL + 1] = {0}; // stream routes per pool
  range_t *held[NPOOL + 1] = {0}; // freed ranges a "graph" of the pool may replay into
  size_t nheld[NPOOL + 1] = {0}, capheld[NPOOL + 1] = {0};
  uint64_t tag = 1;
  for (int it = 0; it < 3000; it++) {
    uint64_t r = nft_rand(&rng);
    uint64_t id = 1 + r / 7 % NPOOL;
    switch (r % 16) {
    case 0: // a pool gains a user
      assert_int_equal(nf_private_incref(p, id), NF_OK);
      uses[id]++;
      break;
    case 1: // ... or loses one; at zero its graphs are gone
      if (!uses[id] || routed[id]) break;
      assert_int_equal(nf_private_release(p, id), NF_OK);
      if (!--uses[id]) { // handed back: its tensors are general ones now
        nheld[id] = 0;
        for (int i = 0; i < NSLOT; i++)
          if (sl[i].p && sl[i].owner == id) sl[i].owner = 0;
      }
      break;
    case 2: // a capture begins on a stream
      if (!uses[id]) break;
      assert_int_equal(nf_private_begin(p, id, S(r / 101 % NSTREAM)), NF_OK);
      routed[id]++;
      break;
    case 3:
      if (!routed[id]) break;
      assert_int_equal(nf_private_end(p, id), NF_OK);
      routed[id] = 0;
      break;
    case 4: // replay every live pool's graph: junk over its freed ranges
      for (uint64_t q = 1; q <= NPOOL; q++) {
        for (size_t k = 0; k < nheld[q]; k++) memset((void *)held[q][k].a, 0xA5, held[q][k].n);
        for (int i = 0; i < NSLOT; i++) // the pool's own tensors are the graph's to overwrite
          if (sl[i].p && sl[i].owner == q) nft_fill(sl[i].p, sl[i].n, sl[i].tag);
      }
      break;
    case 5:
      if (!nf_capturing(p)) {
        assert_int_equal(nf_trim(p), NF_OK);
      } else {
        assert_int_equal(nf_trim(p), NF_ERR_INVALID);
      }
      break;
    default: {
      int i = (int)(r / 13 % NSLOT);
      nf_stream_t st = S(r / 1009 % NSTREAM);
      if (sl[i].p) {
        assert_true(nft_check(sl[i].p, sl[i].n, sl[i].tag));
        if (r / 3 % 5 == 0) assert_int_equal(nf_record_stream(p, sl[i].p, S((r >> 20) % NSTREAM)), NF_OK);
        uint64_t q = sl[i].owner;
        assert_int_equal(nf_private_of(p, sl[i].p), q);
        assert_int_equal(nf_free(p, sl[i].p), NF_OK);
        if (q) {
          if (nheld[q] == capheld[q]) {
            capheld[q] = capheld[q] ? capheld[q] * 2 : 16;
            held[q] = realloc(held[q], capheld[q] * sizeof *held[q]);
          }
          held[q][nheld[q]++] = (range_t){(uintptr_t)sl[i].p, sl[i].n};
        }
        sl[i].p = NULL;
      } else {
        size_t n = r >> 40 & 1 ? 1 + (r >> 20) % 4096 : 1 + (r >> 20) % (12 * G);
        bool expl = (r >> 45) % 4 == 0 && uses[id];
        void *q = expl ? nf_alloc_private(p, id, n, st) : nf_alloc(p, n, st);
        if (!q) {
          if (nf_last_status() != NF_ERR_OOM) fail_msg("seed %llu it %d: %s", (unsigned long long)seed, it, nf_last_error());
          break;
        }
        uint64_t owner = nf_private_of(p, q);
        if (expl) assert_int_equal(owner, id);
        // The block must not lie over a range another pool's graph replays into.
        for (uint64_t o = 1; o <= NPOOL; o++)
          for (size_t k = 0; o != owner && k < nheld[o]; k++)
            if (nft_overlaps((uintptr_t)q, n, held[o][k].a, held[o][k].n))
              fail_msg("seed %llu it %d: block %p (pool %llu) over a range held by pool %llu", (unsigned long long)seed,
                       it, q, (unsigned long long)owner, (unsigned long long)o);
        sl[i] = (rslot_t){q, n, tag++, owner};
        nft_fill(q, n, sl[i].tag);
      }
    }
    }
    if (s->capturing != nf_capturing(p)) s->capturing = nf_capturing(p);
    assert_int_equal(s->events_in_capture, 0);
    if (it % 97 == 0 && nf_pool_check(p) != NF_OK) fail_msg("seed %llu it %d: %s", (unsigned long long)seed, it, nf_last_error());
  }
  for (int i = 0; i < NSLOT; i++) {
    if (!sl[i].p) continue;
    assert_true(nft_check(sl[i].p, sl[i].n, sl[i].tag));
    nf_free(p, sl[i].p);
  }
  for (uint64_t q = 1; q <= NPOOL; q++) {
    if (routed[q]) assert_int_equal(nf_private_end(p, q), NF_OK);
    while (uses[q]--) assert_int_equal(nf_private_release(p, q), NF_OK);
    free(held[q]);
  }
  s->capturing = 0;
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_int_equal(nf_trim(p), NF_OK);
  nf_stats_t st;
  nf_stats_get(p, &st);
  assert_int_equal(st.live, 0);
  assert_int_equal(st.mapped, 0);
  nf_pool_destroy(p);
  nf_backend_destroy(&s->be);
}

static void test_randomized(void **state) {
  (void)state;
  uint64_t seeds[] = {1, 2, 3, 4, 0x5eed, nft_env_seed(77)};
  for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) randomized(seeds[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capture_no_events),
      cmocka_unit_test(test_capture_refuses_the_65th_stream),
      cmocka_unit_test(test_hand_back_views_ordered),
      cmocka_unit_test(test_private_trim_waits_for_replays),
      cmocka_unit_test(test_hand_back_pending),
      cmocka_unit_test(test_randomized),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
