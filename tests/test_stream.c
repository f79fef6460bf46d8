// Streams (src/core/stream.c): the per-stream ring of event records, host
// waits on the oldest record that covers what they need (so that the GPU
// keeps the work queued after it), frees recording only after a host wait,
// and cross-stream waits on the oldest covering record; a block freed on
// one stream reaches another only through one lazily recorded event, whose
// wait covers every earlier free there. White box: the stream records
// (core.h) show which record a wait took. The host backend's manual events
// stand in for GPU work in flight.
#include "stream_test.h"

// One free on s, then a host wait for it (on a fresh record): from here on
// frees record as they go. *x: s's index.
static nf_stream_rec_t *heat(nf_pool_t *p, nf_stream_t s, uint32_t *x) {
  pairs(p, s, 1);
  *x = sidx(p, s);
  nf_stream_rec_t *r = &p->streams[*x];
  assert_int_equal(nf__stream_wait(p, *x, r->last_free), NF_OK);
  return r;
}

// No eviction wait yet: frees record nothing (a steady state stays
// call-free), not even after nf_trim's wait for every stream (which needs the
// newest record anyway: older ones would not help it).
static void test_cold_frees_record_nothing(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  pairs(p, A, 2000);
  nf_stats_t s = stats(p);
  assert_int_equal(s.calls.event_record, 0);
  assert_int_equal(s.calls.event_create, 0);
  assert_int_equal(nf_trim(p), NF_OK);
  uint64_t r0 = stats(p).calls.event_record;
  assert_true(stats(p).calls.event_sync >= 1);
  pairs(p, A, 2000);
  assert_int_equal(stats(p).calls.event_record, r0);
  done(p, be);
}

// After a host wait, frees record every NF_EV_GAP ticks; a wait for older
// work then synchronizes on the oldest record after it, and the work
// recorded later stays in flight.
static void test_wait_takes_oldest_covering_record(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  uint32_t a;
  nf_stream_rec_t *r = heat(p, A, &a); // nothing covered the free: a fresh record, waited on
  uint64_t t1 = r->last_free;
  nf_stats_t s0 = stats(p);
  assert_int_equal(s0.calls.event_record, 1);
  assert_int_equal(s0.calls.event_sync, 1);
  assert_true(r->done_tick > t1);
  // Waiting again for what is known complete costs nothing.
  assert_int_equal(nf__stream_wait(p, a, t1), NF_OK);
  assert_int_equal(stats(p).calls.event_sync, 1);
  // Hot: frees record as they go.
  pairs(p, A, 100);
  uint64_t need = r->last_free;
  pairs(p, A, 100);
  nf_stats_t s1 = stats(p);
  uint64_t recs = s1.calls.event_record - s0.calls.event_record;
  assert_true(recs >= 200 / (NF_EV_GAP + 1) - 1 && recs <= 200 / NF_EV_GAP + 1);
  assert_int_equal(s1.calls.event_sync, 1);
  uint64_t newest = r->rec_tick;
  assert_int_equal(nf__stream_wait(p, a, need), NF_OK);
  assert_int_equal(stats(p).calls.event_sync, 2);
  assert_int_equal(stats(p).calls.event_record, s1.calls.event_record); // no fresh record
  assert_true(r->done_tick > need && r->done_tick <= need + NF_EV_GAP + 1);
  assert_true(r->done_tick < newest);
  // What was recorded after it is still in flight (the GPU keeps that work).
  bool ok = true;
  assert_int_equal(nf__stream_done(p, a, newest, false, &ok), NF_OK);
  assert_false(ok);
  done(p, be);
}

// The ring keeps the last NF_EVENTS records: a wait for work older than
// all of them takes the oldest kept, still not the newest.
static void test_ring_keeps_the_last_records(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  uint32_t a;
  nf_stream_rec_t *r = heat(p, A, &a);
  pairs(p, A, 1);
  uint64_t need = r->last_free;
  pairs(p, A, (NF_EVENTS + 4) * (NF_EV_GAP + 1));
  uint64_t oldest = UINT64_MAX;
  int kept = 0;
  for (int h = 0; h < NF_EVENTS; h++)
    if (r->ev[h]) { kept++; if (r->ev_tick[h] < oldest) oldest = r->ev_tick[h]; }
  assert_int_equal(kept, NF_EVENTS);
  assert_true(oldest > need + NF_EV_GAP + 1); // the records right after `need` were overwritten
  assert_int_equal(stats(p).calls.event_create, NF_EVENTS); // created once, reused
  assert_int_equal(nf__stream_wait(p, a, need), NF_OK);
  assert_int_equal(r->done_tick, oldest);
  assert_true(r->done_tick < r->rec_tick);
  done(p, be);
}

// Frees stop recording NF_EV_HOT ticks after the last host wait.
static void test_recording_ends_without_waits(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  uint32_t a;
  heat(p, A, &a);
  pairs(p, A, NF_EV_HOT + 64);
  uint64_t r0 = stats(p).calls.event_record;
  assert_true(r0 > 1);
  pairs(p, A, 4 * NF_EV_HOT);
  assert_int_equal(stats(p).calls.event_record, r0);
  done(p, be);
}

// A block freed on A and taken on B: B waits (GPU-side) on the oldest A
// record after the block's free, not on the newest.
static void test_cross_stream_waits_on_covering_record(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  uint32_t a;
  nf_stream_rec_t *r = heat(p, A, &a);
  uint32_t b = sidx(p, B);
  void *x = nf_alloc(p, 8 * G, A), *guard = nf_alloc(p, G, A); // the guard keeps x from merging
  assert_true(x && guard);
  nft_fill(guard, G, 7);
  assert_int_equal(nf_free(p, x), NF_OK);
  uint64_t tx = r->last_free;
  pairs(p, A, 100); // small arena: x's range untouched
  uint64_t w0 = stats(p).calls.stream_wait;
  void *y = nf_alloc(p, 8 * G, B);
  assert_ptr_equal(y, x);
  assert_int_equal(stats(p).calls.stream_wait, w0 + 1);
  assert_true(p->waited[b][a] > tx && p->waited[b][a] <= tx + NF_EV_GAP + 1);
  assert_true(p->waited[b][a] < r->rec_tick);
  nft_fill(y, 8 * G, 8);
  assert_true(nft_check(guard, G, 7));
  assert_int_equal(nf_free(p, y), NF_OK);
  assert_int_equal(nf_free(p, guard), NF_OK);
  done(p, be);
}

// A block many streams used in turn names them all (free blocks merge). With
// their work in flight, the next stream waits on each (the host backend counts
// any reuse not ordered after it). Once that work is done (a stream per step,
// each step synchronized, as CuPy code does), a query per stream tells it to
// every stream after: each new stream waits on at most the two before it,
// where it waited on every stream before (31 waits per allocation in run 76's
// PyTorch loop of 128 streams; here 210 waits before the change).
static nf_status_t query_fails(nf_backend_t *be, nf_event_t ev) {
  (void)be, (void)ev;
  return nf__error(NF_ERR_BACKEND, "injected: event query");
}

// N streams in turn on one block with their work in flight, then N more with
// each step's work done before it (queries failing when `bad_query`).
static void streams_in_turn(bool bad_query) {
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  void *guard = nf_alloc(p, G, A); // ends the chunk: the block below merges with nothing past it
  assert_non_null(guard);
  nft_fill(guard, G, 3);
  enum { N = 12 };
  void *first = NULL;
  for (int i = 0; i < N; i++) { // in flight: every stream's work still runs
    nf_stream_t s = (nf_stream_t)(uintptr_t)(0x100 + i);
    char *x = nf_alloc(p, 8 * G, s);
    assert_non_null(x);
    if (!first) first = x;
    assert_ptr_equal(x, first);
    nf_backend_host_use_new(be, s, x, 8 * G);
    nft_fill(x, 8 * G, (uint64_t)i);
    assert_int_equal(nf_free(p, x), NF_OK);
  }
  assert_int_equal(nf_backend_host_violations(be), 0);
  assert_true(stats(p).calls.event_query <= N); // in flight: one query each at most
  const nf_backend_ops_t *ops = be->ops;
  nf_backend_ops_t failing = *ops;
  failing.event_query = query_fails;
  if (bad_query) be->ops = &failing;
  uint64_t w0 = stats(p).calls.stream_wait, q0 = stats(p).calls.event_query;
  for (int i = 0; i < N; i++) {
    nf_backend_host_complete_events(be); // the steps before this one are done
    nf_stream_t s = (nf_stream_t)(uintptr_t)(0x200 + i);
    char *x = nf_alloc(p, 8 * G, s);
    if (!x) fail_msg("stream %d: %s", i, nf_last_error());
    assert_ptr_equal(x, first);
    nf_backend_host_use_new(be, s, x, 8 * G);
    nft_fill(x, 8 * G, 50 + (uint64_t)i);
    assert_true(nft_check(x, 8 * G, 50 + (uint64_t)i));
    assert_int_equal(nf_free(p, x), NF_OK);
  }
  be->ops = ops;
  nf_stats_t st = stats(p);
  assert_true(st.calls.event_query - q0 >= N - 1 && st.calls.event_query - q0 <= 3 * N);
  if (bad_query) // every query failed: the waits ordered each stream, as without queries
    assert_true(st.calls.stream_wait - w0 > 2 * N);
  else
    assert_true(st.calls.stream_wait - w0 <= 2 * N);
  assert_int_equal(nf_backend_host_violations(be), 0);
  assert_true(nft_check(guard, G, 3));
  assert_int_equal(nf_free(p, guard), NF_OK);
  done(p, be);
}

static void test_many_streams_query_first(void **state) {
  (void)state;
  streams_in_turn(false);
}

// The query is a shortcut: where the backend fails it, the stream waits as it
// would have without it, and the allocation succeeds.
static void test_failed_query_falls_back_to_the_wait(void **state) {
  (void)state;
  streams_in_turn(true);
}

// A free's record is optional: when the backend fails it, the free still
// succeeds and leaves the pool and the live data as they were.
static void test_failed_records_do_not_fail_frees(void **state) {
  (void)state;
  nf_backend_t *host, *fb;
  assert_int_equal(nf_backend_host_create(&host, 1ull << 30, G), NF_OK);
  nf_backend_host_set_manual_events(host, 1);
  assert_int_equal(nf_backend_fault_create(&fb, host, 0, 0.0, 3), NF_OK);
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[128];
  assert_int_equal(nf_config_parse(&cfg, "limit:64MiB,small_max:8KiB", err, sizeof err), NF_OK);
  nf_pool_t *p;
  assert_int_equal(nf_pool_create(&p, fb, &cfg), NF_OK);
  uint32_t a;
  heat(p, A, &a);
  void *keep[64];
  for (int i = 0; i < 64; i++) { keep[i] = nf_alloc(p, 4 * KB, A); assert_non_null(keep[i]); nft_fill(keep[i], 4 * KB, i); }
  pairs(p, A, 1); // its granule mapped before the faults start
  nf_backend_fault_set(fb, 0, 0.5);
  for (int i = 0; i < 64 * (NF_EV_GAP + 1); i++) {
    void *x = nf_alloc(p, 4 * KB, A); // cached: no backend call
    assert_non_null(x);
    assert_int_equal(nf_free(p, x), NF_OK);
  }
  uint64_t calls, failed;
  nf_backend_fault_counts(fb, &calls, &failed);
  assert_true(failed > 0);
  nf_backend_fault_set(fb, 0, 0.0);
  for (int i = 0; i < 64; i++) { assert_true(nft_check(keep[i], 4 * KB, i)); assert_int_equal(nf_free(p, keep[i]), NF_OK); }
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_backend_host_complete_events(host);
  nf_pool_destroy(p);
  nf_backend_destroy(fb); // and host, which it owns
}

// A block freed on stream A is used by stream B only after B waits on an
// event recorded on A; the event is recorded lazily, and one wait covers all
// earlier frees on A.
static void test_cross_stream(void **state) {
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:8MiB");
  void *x = nf_alloc(p, 8192, A), *y = nf_alloc(p, 8192, A);
  assert_int_equal(nf_free(p, x), NF_OK);
  assert_int_equal(nf_free(p, y), NF_OK);
  nf_stats_t s = stats(p);
  assert_int_equal(s.calls.event_record, 0); // nothing recorded at free
  void *z = nf_alloc(p, 8192, A); // same stream: at once, no event
  assert_int_equal(stats(p).calls.event_record, 0);
  void *w = nf_alloc(p, 8192, B); // cross-stream: record + wait once
  s = stats(p);
  assert_int_equal(s.calls.event_record, 1);
  assert_int_equal(s.calls.stream_wait, 1);
  assert_int_equal(s.cross_stream_reuses, 1);
  void *v = nf_alloc(p, 8192, B); // covered by the same wait
  assert_int_equal(stats(p).calls.stream_wait, 1);
  assert_true(z && w && v);
  nf_free(p, z); nf_free(p, w); nf_free(p, v);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// Blocks freed with record_stream go back once their extra streams' work is
// done, found by event queries before a request maps memory: a loop freeing
// every block with a record_stream grew the pool to its limit before (the
// whole device uncapped), since only stitching's blocking poll released them.
// Not before that work is done: while B's work is in flight the block stays
// pending and the pool grows instead.
static void test_record_stream_blocks_come_back(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:512MiB");
  for (int i = 0; i < 200; i++) { // events complete at once
    void *x = nf_alloc(p, 4 * G, A);
    assert_non_null(x);
    assert_int_equal(nf_record_stream(p, x, B), NF_OK);
    assert_int_equal(nf_free(p, x), NF_OK);
  }
  nf_stats_t s = stats(p);
  assert_true(s.physical <= 8 * G); // was 200 x 4 granules
  assert_true(s.calls.event_query > 0);
  // B's work in flight: the block is not reused (the pool maps other memory).
  nf_backend_host_set_manual_events(be, 1);
  char *x = nf_alloc(p, 4 * G, A);
  assert_non_null(x);
  assert_int_equal(nf_record_stream(p, x, B), NF_OK);
  nf_backend_host_use_new(be, B, x, 4 * G); // B's kernel on x, in flight
  assert_int_equal(nf_free(p, x), NF_OK);
  for (int i = 0; i < 3; i++) {
    char *y = nf_alloc(p, 4 * G, A);
    assert_non_null(y);
    nf_backend_host_use_new(be, A, y, 4 * G);
    assert_true(y + 4 * G <= x || x + 4 * G <= y);
    assert_int_equal(nf_free(p, y), NF_OK);
  }
  assert_int_equal(nf_backend_host_violations(be), 0);
  nf_backend_host_complete_events(be);
  nf_backend_host_set_manual_events(be, 0);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// A backend that refuses a stream (CUDA: another context's, e.g. another
// device's): the call bringing it fails with the reason and changes nothing;
// the pool never records on it (the record would fail in a later free).
static const nf_stream_t FOREIGN = (nf_stream_t)0xf0;
static int checks_made;
static nf_status_t refuse_foreign(nf_backend_t *be, nf_stream_t s) {
  checks_made++;
  return s == FOREIGN ? nf__backend_fail(be, NF_ERR_INVALID, "the stream belongs to another context (test)") : NF_OK;
}

static void test_refused_stream(void **state) {
  (void)state;
  struct { nf_backend_t be; nf_backend_ops_t ops; } *w = calloc(1, sizeof *w);
  nft_spy_init(&w->be, &w->ops, 1ull << 30, G);
  w->ops.stream_check = refuse_foreign;
  nf_pool_t *p = nft_pool_on(&w->be, "limit:64MiB,small_max:8KiB");
  checks_made = 0;
  void *x = nf_alloc(p, 4 * KB, A);
  assert_non_null(x);
  nft_fill(x, 4 * KB, 3);
  assert_int_equal(checks_made, 1);
  nf_stats_t s0 = stats(p);
  assert_null(nf_alloc(p, 4 * KB, FOREIGN));
  assert_int_equal(nf_last_status(), NF_ERR_INVALID);
  nft_last_error_has("another context (test)");
  assert_int_equal(nf_record_stream(p, x, FOREIGN), NF_ERR_INVALID);
  nft_last_error_has("cannot be used with this pool");
  nf_stats_t s1 = stats(p);
  assert_int_equal(s1.live_blocks, s0.live_blocks);
  assert_int_equal(s1.calls.event_record, s0.calls.event_record);
  assert_int_equal(p->nstreams, 1); // not in the table
  void *y = nf_alloc(p, 4 * KB, A); // known streams: no new check
  assert_int_equal(checks_made, 3);
  assert_int_equal(nf_free(p, y), NF_OK);
  assert_true(nft_check(x, 4 * KB, 3));
  assert_int_equal(nf_free(p, x), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(&w->be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cold_frees_record_nothing),
      cmocka_unit_test(test_wait_takes_oldest_covering_record),
      cmocka_unit_test(test_ring_keeps_the_last_records),
      cmocka_unit_test(test_recording_ends_without_waits),
      cmocka_unit_test(test_cross_stream_waits_on_covering_record),
      cmocka_unit_test(test_many_streams_query_first),
      cmocka_unit_test(test_failed_query_falls_back_to_the_wait),
      cmocka_unit_test(test_failed_records_do_not_fail_frees),
      cmocka_unit_test(test_cross_stream),
      cmocka_unit_test(test_refused_stream),
      cmocka_unit_test(test_record_stream_blocks_come_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
