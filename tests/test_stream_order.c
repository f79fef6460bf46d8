// Stream ordering (src/core/stream.c), the cases test_stream.c leaves out:
// which record nf__order_after queries and what a done query tells, the
// pending list of record_stream'ed blocks, and the slots given back to the
// 65th stream. White box where the count of backend calls is the point
// (core.h's stream records); the host backend's manual events stand in for
// GPU work in flight and count a block handed to a stream while another
// stream's unordered work still uses it (violations).
#include "stream_test.h"

// An allocation of n bytes on s that s's kernel uses (in flight).
static char *use(nf_pool_t *p, nf_backend_t *be, nf_stream_t s, size_t n, uint64_t tag) {
  char *x = nf_alloc(p, n, s);
  if (!x) fail_msg("alloc: %s", nf_last_error());
  nf_backend_host_use_new(be, s, x, n);
  nft_fill(x, n, tag);
  return x;
}

// k streams (0x100 + i) use adjacent 8-granule blocks x[i], between two
// guards (g[0], g[1], on A); the streams' indexes in ix[].
static void run_of(nf_pool_t *p, nf_backend_t *be, int k, uint32_t *ix, char **g, char **x) {
  g[0] = use(p, be, A, G, 1);
  for (int i = 0; i < k; i++) {
    x[i] = use(p, be, S(0x100 + i), 8 * G, (uint64_t)i);
    assert_ptr_equal(x[i], i ? x[i - 1] + 8 * G : g[0] + G);
    ix[i] = sidx(p, S(0x100 + i));
  }
  g[1] = use(p, be, A, G, 2);
  assert_ptr_equal(g[1], x[k - 1] + 8 * G);
}

// ... and free them with their work in flight: one free block of 8k
// granules that names the k streams. Returns its address.
static char *run_free(nf_pool_t *p, int k, char **x) {
  for (int i = 0; i < k; i++) assert_int_equal(nf_free(p, x[i]), NF_OK);
  return x[0];
}

// The query is for blocks that would make a stream wait on NF_QUERY_FIRST (3)
// streams or more: with two, the waits are the cheaper calls (no query);
// with three, the records made before are queried and their streams skip
// the wait. A fresh record (made for the block: its work is queued) is not
// queried: that query would be spent, and would stop the queries of the
// streams after it.
static void reuse_of_a_run(int k, uint64_t queries, uint64_t waits) {
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  uint32_t ix[8];
  char *g[2], *xs[8];
  run_of(p, be, k, ix, g, xs);
  char *x = run_free(p, k, xs);
  // Every stream but the last has a record covering its free.
  for (int i = 0; i + 1 < k; i++) assert_int_equal(nf__stream_record(p, ix[i]), NF_OK);
  nf_backend_host_complete_events(be); // their work is done (the pool does not know yet)
  nf_stats_t s0 = stats(p);
  char *y = nf_alloc(p, 8 * G * (size_t)k, S(0x200));
  assert_ptr_equal(y, x);
  nf_backend_host_use_new(be, S(0x200), y, 8 * G * (size_t)k);
  nf_stats_t s1 = stats(p);
  assert_int_equal(s1.calls.event_query - s0.calls.event_query, queries);
  assert_int_equal(s1.calls.stream_wait - s0.calls.stream_wait, waits);
  assert_int_equal(s1.calls.event_record - s0.calls.event_record, 1); // the last stream's, fresh
  for (int i = 0; i < k; i++) // the ones waited on are ordered, the ones queried known done
    assert_true(p->waited[sidx(p, S(0x200))][ix[i]] || nf__need_done(&p->streams[ix[i]], p->streams[ix[i]].last_free));
  assert_int_equal(nf_free(p, y), NF_OK);
  assert_int_equal(nf_free(p, g[0]), NF_OK);
  assert_int_equal(nf_free(p, g[1]), NF_OK);
  done(p, be);
}

static void test_two_streams_wait(void **state) {
  (void)state;
  reuse_of_a_run(2, 0, 2);
}

static void test_three_streams_query_kept_records(void **state) {
  (void)state;
  reuse_of_a_run(3, 2, 1);
}

// A done query tells that the record it asked is complete: the work on its
// stream up to that record, not up to the stream's newest record. Here
// stream 0x100 frees y after the record the query takes, and records again
// with y's kernel in flight: a stream taking y must still wait.
static void test_query_tells_only_its_record(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  uint32_t ix[3];
  char *g[2], *xs[3];
  run_of(p, be, 3, ix, g, xs);
  char *y = use(p, be, S(0x100), 5 * G, 9), *g2 = use(p, be, A, G, 3); // g2: y merges with nothing
  char *x = run_free(p, 3, xs);
  nf_stream_rec_t *r = &p->streams[ix[0]];
  assert_int_equal(nf__stream_record(p, ix[0]), NF_OK); // covers x's free, not y's
  uint64_t r1 = r->rec_tick;
  nf_backend_host_complete_events(be);
  nf_backend_host_use(be, S(0x100), y, 5 * G); // a new kernel on y, in flight
  assert_int_equal(nf_free(p, y), NF_OK);
  assert_int_equal(nf__stream_record(p, ix[0]), NF_OK); // after y's free: not complete
  uint64_t q0 = stats(p).calls.event_query;
  char *z = nf_alloc(p, 24 * G, S(0x200)); // the run: 0x100's record r1 is queried, done
  assert_ptr_equal(z, x);
  assert_true(stats(p).calls.event_query > q0);
  assert_int_equal(r->done_tick, r1);
  assert_false(nf__need_done(r, r->last_free)); // y's free: not known complete
  uint64_t w0 = stats(p).calls.stream_wait;
  char *v = nf_alloc(p, 5 * G, S(0x300));
  assert_ptr_equal(v, y);
  nf_backend_host_use_new(be, S(0x300), v, 5 * G); // ordered after 0x100's kernel on y
  assert_int_equal(stats(p).calls.stream_wait, w0 + 1);
  assert_int_equal(nf_backend_host_violations(be), 0);
  assert_int_equal(nf_free(p, v), NF_OK);
  assert_int_equal(nf_free(p, z), NF_OK);
  for (int i = 0; i < 2; i++) assert_int_equal(nf_free(p, g[i]), NF_OK);
  assert_int_equal(nf_free(p, g2), NF_OK);
  done(p, be);
}

// Blocks freed with a record_stream wait on the pending list until their
// extra streams' work is done. A poll asks each stream once: a query that
// finds B's newest record in flight makes the other blocks on B wait for
// the next poll with no query of their own (a poll runs on each allocation
// that maps memory: one query per pending block there would be O(pending)
// backend calls each time). Once B's work is done, one query releases all.
static void test_pending_poll_asks_a_stream_once(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  enum { N = 8 };
  char *x[N];
  for (int i = 0; i < N; i++) {
    x[i] = use(p, be, A, 4 * G, (uint64_t)i);
    assert_int_equal(nf_record_stream(p, x[i], B), NF_OK);
    nf_backend_host_use(be, B, x[i], 4 * G); // B's kernel on it, in flight
  }
  for (int i = 0; i < N; i++) assert_int_equal(nf_free(p, x[i]), NF_OK);
  int pending = 0;
  for (nf_block_t *b = p->pending; b; b = b->fnext) pending++;
  assert_int_equal(pending, N);
  uint64_t q0 = stats(p).calls.event_query;
  assert_int_equal(nf__pending_poll(p, false), NF_OK);
  assert_int_equal(stats(p).calls.event_query, q0 + 1);
  assert_non_null(p->pending);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf__pending_poll(p, false), NF_OK);
  assert_int_equal(stats(p).calls.event_query, q0 + 2);
  assert_null(p->pending);
  done(p, be);
}

// The 65th stream: the slots nothing names are given back after one device
// wait, which completes every stream's work; a given-back slot's done_tick
// passes every tick so far. A free block still names the old streams of
// those slots (their bits stay in its mask): the stream that takes such a
// slot next must not stand for them, or the next stream to take the block
// waits on the newcomer's unrelated work (a record and a wait it never
// needed: the old work is done).
static void test_recycled_slot_stands_for_no_old_work(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *g0 = use(p, be, A, G, 1), *x[63]; // A: slot 0, named by its live guards throughout
  for (int i = 0; i < 63; i++) {
    x[i] = use(p, be, S(0x100 + i), 4 * G, (uint64_t)i);
    assert_ptr_equal(x[i], g0 + G + 4 * G * (size_t)i);
  }
  char *g1 = use(p, be, A, G, 2);
  for (int i = 0; i < 63; i++) assert_int_equal(nf_free(p, x[i]), NF_OK); // one free run naming slots 1..63
  nf_stream_t n = S(0x5000), m = S(0x6000);
  char *y = use(p, be, n, 4 * KB, 3); // the 65th stream: slots 1..63 given back, n takes slot 1
  assert_int_equal(p->streams_recycled, 63);
  assert_int_equal(sidx(p, n), 1);
  assert_int_equal(nf_free(p, y), NF_OK); // n's own free, after the device wait
  nf_stats_t s0 = stats(p);
  char *z = nf_alloc(p, 63 * 4 * G, m);
  assert_ptr_equal(z, x[0]);
  nf_backend_host_use_new(be, m, z, 63 * 4 * G);
  nf_stats_t s1 = stats(p);
  assert_int_equal(s1.calls.event_record, s0.calls.event_record); // nothing on n
  assert_int_equal(s1.calls.stream_wait, s0.calls.stream_wait);
  assert_int_equal(nf_free(p, z), NF_OK);
  assert_int_equal(nf_free(p, g0), NF_OK);
  assert_int_equal(nf_free(p, g1), NF_OK);
  done(p, be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_streams_wait),
      cmocka_unit_test(test_three_streams_query_kept_records),
      cmocka_unit_test(test_query_tells_only_its_record),
      cmocka_unit_test(test_pending_poll_asks_a_stream_once),
      cmocka_unit_test(test_recycled_slot_stands_for_no_old_work),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
