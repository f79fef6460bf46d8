// Slot stealing (src/core/stream.c, streams_steal and its callers), more
// cases: which slots a steal spares, the clock past a stolen slot's
// done_tick, recycling beside orphans and offload copies, the caller's slot
// in nf_prefetch, and nf_pool_check's orphan checks. White box, on the host
// backend with manual events (test_stream_slots.c has the main cases).
#include "stream_test.h"

// A steal resets the slot (done_tick = tick + 1) and the clock must pass it:
// else the new stream's first free ticks at done_tick, streams_settle takes
// it for done and never records or waits for it, and nf_trim leaves its
// memory mapped for good (as test_recycled_slot_first_free_settles).
static void test_stolen_slot_first_free_settles(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, NULL, x, 4 * KB);
  assert_int_equal(nf_trim(p), NF_OK);
  uint64_t mapped = stats(p).mapped;
  nf_stream_t s = S(0x5000);
  char *y = nf_alloc(p, 256 * KB, s); // the 65th: takes 0x100's slot
  assert_non_null(y);
  assert_int_equal(p->streams_stolen, 1);
  nf_backend_host_use_new(be, s, y, 256 * KB); // s's kernel on y, in flight
  assert_int_equal(nf_free(p, y), NF_OK);
  assert_int_equal(nf_trim(p), NF_OK); // waits for s's free, then unmaps
  assert_int_equal(stats(p).mapped, mapped);
  assert_int_equal(nf_backend_host_violations(be), 0);
  free64(p, x, 4 * KB);
  done(p, be);
}

// The least recently used stream is named only by a pending block (freed
// after a record_stream, its work in flight): its slot stays (the pending
// block's events decide when its memory comes back); the steal takes the
// next least recently used stream that only live blocks name.
static void test_steal_spares_pending_blocks_stream(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, NULL, x, 4 * KB);
  assert_int_equal(nf_record_stream(p, x[0], S(0x101)), NF_OK);
  nf_backend_host_use(be, S(0x101), x[0], 4 * KB);
  assert_int_equal(nf_free(p, x[0]), NF_OK); // pending on 0x101's work
  assert_non_null(p->pending);
  uint32_t s0 = sidx(p, S(0x100)); // named by the pending block alone
  for (int i = 1; i < 64; i++) sidx(p, S(0x100 + i)); // 0x100, then 0x101 (an extra: kept), then 0x102
  uint32_t s2 = sidx(p, S(0x102));
  for (int i = 3; i < 64; i++) sidx(p, S(0x100 + i));
  char *y = nf_alloc(p, 4 * KB, S(0x5000));
  assert_non_null(y);
  assert_int_equal(p->streams_stolen, 1);
  assert_int_equal(p->orphans, 1); // 0x102's block
  assert_int_equal(p->streams[s0].handle, S(0x100));
  assert_int_equal(sidx(p, S(0x5000)), s2);
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_backend_host_complete_events(be);
  for (int i = 1; i < 64; i++) assert_int_equal(nf_free(p, x[i]), NF_OK);
  assert_int_equal(nf_free(p, y), NF_OK);
  assert_int_equal(p->orphans, 0);
  done(p, be);
}

// The least recently used stream's block is offloaded: its slot stays (the
// tier orders its copies by slot; an offloaded block is never an orphan).
static void test_steal_spares_offloaded_blocks_stream(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, NULL, x, 256 * KB);
  assert_int_equal(nf_offload(p, x[0], S(0x100), NF_TIER_HOST), NF_OK);
  copies_done(p, be);
  uint32_t s0 = sidx(p, S(0x100));
  for (int i = 1; i < 64; i++) sidx(p, S(0x100 + i)); // 0x100 the least recently used, then 0x101
  char *y = nf_alloc(p, 4 * KB, S(0x5000));
  assert_non_null(y);
  assert_int_equal(p->streams_stolen, 1);
  assert_int_equal(p->orphans, 1); // 0x101's block, not the offloaded one
  assert_int_equal(p->streams[s0].handle, S(0x100));
  assert_int_not_equal(nf__map_find(p, (uintptr_t)x[0])->stream, NF_STREAM_ORPHAN);
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_int_equal(nf_prefetch(p, x[0], S(0x100)), NF_OK);
  copies_done(p, be);
  assert_int_equal(nf_pool_check(p), NF_OK);
  free64(p, x, 256 * KB);
  assert_int_equal(nf_free(p, y), NF_OK);
  done(p, be);
}

// nf_prefetch of an orphan (never offloaded) on a stream whose slot no block
// names: the orphan gets a slot, never the caller's (nf__block_home keeps
// it), so the caller's stream keeps its slot and nothing is given back.
static void test_prefetch_orphan_keeps_callers_slot(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, NULL, x, 256 * KB);
  char *y = nf_alloc(p, 4 * KB, S(0x5000)); // takes 0x100's slot: x[0] an orphan
  assert_non_null(y);
  assert_int_equal(nf_free(p, y), NF_OK); // 0x5000's slot: held, named by nothing
  nf_backend_host_complete_events(be);
  uint32_t s = sidx(p, S(0x5000));
  assert_int_equal(p->orphans, 1);
  assert_int_equal(nf_prefetch(p, x[0], S(0x5000)), NF_OK);
  assert_int_equal(p->streams[s].handle, S(0x5000));
  assert_int_equal(p->streams_recycled, 0);
  assert_int_equal(p->streams_stolen, 2);     // x[0] took 0x101's slot
  assert_int_equal(p->orphans, 1);            // 0x101's block
  assert_int_not_equal(nf__map_find(p, (uintptr_t)x[0])->stream, s);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  assert_int_equal(nf_pool_check(p), NF_OK);
  free64(p, x, 256 * KB);
  done(p, be);
}

// An orphan names no slot: a slot nothing else names is given back
// (recycled) for the next stream, not kept for the orphan (which would make
// the next stream steal one more).
static void test_orphan_names_no_slot(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, NULL, x, 4 * KB);
  char *y = nf_alloc(p, 4 * KB, S(0x5000)); // takes slot 0 (0x100's): x[0] an orphan
  assert_non_null(y);
  assert_int_equal(p->orphans, 1);
  assert_int_equal(nf_free(p, x[63]), NF_OK); // slot 63 (0x13f) named by nothing now
  nf_backend_host_complete_events(be);
  char *z = nf_alloc(p, 4 * KB, S(0x6000));
  assert_non_null(z);
  assert_int_equal(p->streams_recycled, 1);
  assert_int_equal(p->streams_stolen, 1);
  assert_int_equal(sidx(p, S(0x6000)), 63);
  assert_int_equal(nf_pool_check(p), NF_OK);
  for (int i = 0; i < 63; i++) assert_int_equal(nf_free(p, x[i]), NF_OK);
  assert_int_equal(nf_free(p, y), NF_OK);
  assert_int_equal(nf_free(p, z), NF_OK);
  done(p, be);
}

// Recycling with an offload's copy in flight on a stream nothing names: the
// copies are finished after the device wait, before the slots are given
// back; a copy left in the list would later record on its given-back slot.
static void test_recycle_finishes_copies(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  gone_watch(p, be);
  char *a = nf_alloc(p, 256 * KB, A); // slot 0
  assert_non_null(a);
  nft_fill(a, 256 * KB, 7);
  for (int i = 1; i < 64; i++) pairs(p, S(0x100 + i), 1); // slots 1..63, named by nothing
  assert_int_equal(nf_offload(p, a, S(0x13f), NF_TIER_HOST), NF_OK); // the copy on slot 63's stream
  assert_non_null(p->xfers);
  char *y = nf_alloc(p, 4 * KB, S(0x5000)); // recycles slots 1..63, takes slot 1
  assert_non_null(y);
  assert_true(p->streams_recycled > 0);
  assert_null(p->xfers);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  assert_int_equal(nf_prefetch(p, a, A), NF_OK);
  copies_done(p, be);
  assert_int_equal(gone()->uses, 0);
  assert_true(nft_check(a, 256 * KB, 7));
  assert_int_equal(nf_free(p, a), NF_OK);
  assert_int_equal(nf_free(p, y), NF_OK);
  gone_unwatch(be);
  done(p, be);
}

// nf_pool_check counts orphans against p->orphans, and an orphan must be
// live on the device (white box: the state corrupted, then restored).
static void test_check_orphans(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, NULL, x, 4 * KB);
  char *y = nf_alloc(p, 4 * KB, S(0x5000));
  assert_non_null(y);
  assert_int_equal(p->orphans, 1);
  assert_int_equal(nf_pool_check(p), NF_OK);
  p->orphans++;
  assert_int_not_equal(nf_pool_check(p), NF_OK);
  p->orphans--;
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_block_t *b = nf__map_find(p, (uintptr_t)x[0]);
  assert_non_null(b);
  assert_int_equal(b->stream, NF_STREAM_ORPHAN);
  b->where = NF_TIER_HOST_DETACHED; // an orphan that a tier moved: never made
  assert_int_not_equal(nf_pool_check(p), NF_OK);
  b->where = 0;
  assert_int_equal(nf_pool_check(p), NF_OK);
  free64(p, x, 4 * KB);
  assert_int_equal(nf_free(p, y), NF_OK);
  done(p, be);
}

// record_stream on the block's own stream adds nothing: the free is not
// pending, and the memory comes back at once.
static void test_record_stream_own_stream(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x = nf_alloc(p, 4 * KB, A);
  assert_non_null(x);
  assert_int_equal(nf_record_stream(p, x, A), NF_OK);
  assert_int_equal(nf__map_find(p, (uintptr_t)x)->extra, 0);
  assert_int_equal(nf_free(p, x), NF_OK);
  assert_null(p->pending);
  done(p, be);
}

// A MemPool begun inside a capture already under way (the adapter's
// beginAllocateToPool on a capturing stream): the pool's capture mask is
// set only once the route exists, so the route's stream look-up asks the
// backend (stream_capturing) and, for a capturing stream, gives back or
// takes no slot: a host wait would break the capture. Refused with the
// reason, nothing changed; the same begin outside a capture takes a slot.
static nf_stream_t capturing_stream;
static const nf_backend_ops_t *cap_inner;
static nf_status_t cap_query(nf_backend_t *be, nf_stream_t s, int *capturing) {
  (void)be;
  *capturing = s == capturing_stream;
  return NF_OK;
}
static void test_route_on_a_capturing_stream_makes_no_host_wait(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  nf_backend_ops_t ops = *be->ops;
  cap_inner = be->ops;
  ops.stream_capturing = cap_query;
  be->ops = &ops;
  char *x[64];
  fill64(p, NULL, x, 4 * KB); // every slot named by a live allocation only: stealable
  capturing_stream = S(0x5000);
  assert_int_equal(nf_private_incref(p, 1), NF_OK);
  nf_stats_t s0 = stats(p);
  assert_int_equal(nf_private_begin(p, 1, S(0x5000)), NF_ERR_UNSUPPORTED);
  nft_last_error_has("being captured");
  nf_stats_t s1 = stats(p);
  assert_int_equal(s1.calls.event_sync, s0.calls.event_sync);
  assert_int_equal(s1.calls.event_record, s0.calls.event_record);
  assert_int_equal(p->orphans, 0);
  assert_int_equal(p->streams_stolen, 0);
  assert_int_equal(nf_pool_check(p), NF_OK);
  capturing_stream = NULL; // not capturing: the begin takes a slot after one wait
  assert_int_equal(nf_private_begin(p, 1, S(0x5000)), NF_OK);
  assert_int_equal(p->streams_stolen, 1);
  assert_int_equal(nf_private_end(p, 1), NF_OK);
  assert_int_equal(nf_private_release(p, 1), NF_OK);
  free64(p, x, 4 * KB);
  be->ops = cap_inner;
  done(p, be);
}

// Which slot a steal takes, and at what cost: a stream with no free since
// its work was last known done gives its slot up with no event call; one
// whose newest record (covering its last free) a query finds done is taken
// over the least recently used one, whose frees are in flight (where the
// few least recently used are all in flight, the least recently used is
// taken after one host wait: test_streams_stolen). No unordered reuse.
static void test_steal_picks_a_done_stream(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, be, x, 4 * KB); // no frees yet: every stream's frees are trivially done
  nf_stats_t s0 = stats(p);
  char *y = nf_alloc(p, 4 * KB, S(0x5000)); // takes 0x100's slot with no call
  assert_non_null(y);
  nf_stats_t s1 = stats(p);
  assert_int_equal(p->streams_stolen, 1);
  assert_int_equal(s1.calls.event_record + s1.calls.event_sync + s1.calls.event_query,
                   s0.calls.event_record + s0.calls.event_sync + s0.calls.event_query);
  assert_int_equal(nf_free(p, y), NF_OK); // 0x5000's slot named by nothing now, but a free in flight
  for (int i = 1; i < 64; i++) pairs(p, S(0x100 + i), 1); // a free on each of 0x101.., in flight
  nf_backend_host_complete_events(be); // what was recorded so far is done, not the frees after the records
  pairs(p, S(0x101), 1);               // a newer free on 0x101: no record covers it
  uint32_t i102 = sidx(p, S(0x102));
  assert_int_equal(nf__stream_record(p, i102), NF_OK); // 0x102's record covers its free...
  nf_backend_host_complete_events(be);                 // ...and completes; the others have none
  for (int i = 3; i < 64; i++) sidx(p, S(0x100 + i));
  // LRU order now: 0x5000's slot is unnamed (recycling would take it: name it), then 0x101, 0x102, ...
  char *keep5000 = nf_alloc(p, 4 * KB, S(0x5000));
  assert_non_null(keep5000);
  for (int i = 3; i < 64; i++) sidx(p, S(0x100 + i)); // 0x101, then 0x102 the least recently used
  s0 = stats(p);
  char *z = nf_alloc(p, 4 * KB, S(0x6000));
  assert_non_null(z);
  s1 = stats(p);
  assert_int_equal(sidx(p, S(0x6000)), i102); // 0x101 passed over: its free is in flight, no record
  assert_int_equal(s1.calls.event_sync, s0.calls.event_sync);
  assert_true(s1.calls.event_query > s0.calls.event_query); // the steal's one (placement may query too)
  char *w = nf_alloc(p, 4 * KB, S(0x7000)); // another steal (test_streams_stolen: all in flight, one wait)
  assert_non_null(w);
  nf_backend_host_use_new(be, S(0x6000), z, 4 * KB);
  nf_backend_host_use_new(be, S(0x7000), w, 4 * KB);
  assert_int_equal(nf_backend_host_violations(be), 0);
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_int_equal(nf_free(p, z), NF_OK);
  assert_int_equal(nf_free(p, w), NF_OK);
  assert_int_equal(nf_free(p, keep5000), NF_OK);
  free64(p, x, 4 * KB);
  done(p, be);
}

// The stolen stream freed a block with its kernel still running on it; the
// new stream in its slot takes that very block: the steal must have waited
// for the old stream's free (the slot's bit in the block's mask then names
// work that is done), else the new owner races the kernel.
static void test_steal_waits_for_the_victims_frees(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, be, x, 4 * KB);
  for (int i = 0; i < 64; i++) pairs(p, S(0x100 + i), 1); // every stream's frees in flight: no done one to prefer
  char *b = nf_alloc(p, 64 * KB, S(0x100));
  assert_non_null(b);
  nf_backend_host_use_new(be, S(0x100), b, 64 * KB);
  assert_int_equal(nf_free(p, b), NF_OK); // 0x100's kernel still on it
  for (int i = 1; i < 64; i++) sidx(p, S(0x100 + i)); // 0x100 the least recently used
  char *y = nf_alloc(p, 64 * KB, S(0x5000));
  assert_ptr_equal(y, b);
  assert_int_equal(p->streams_stolen, 1);
  nf_backend_host_use_new(be, S(0x5000), y, 64 * KB);
  assert_int_equal(nf_backend_host_violations(be), 0);
  assert_int_equal(nf_free(p, y), NF_OK);
  free64(p, x, 4 * KB);
  done(p, be);
}

// A stream served through the hot pair (the free just before left its block
// un-parked) is used as much as one looked up: a steal passes over it. It
// kept the stream clock of its last lookup, and the steal took the slot of
// the stream allocated on just before.
static void test_hot_pair_counts_as_use(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, NULL, x, 4 * KB);
  uint32_t s0 = sidx(p, S(0x100)), s1 = sidx(p, S(0x101));
  void *h = nf_alloc(p, 8 * KB, S(0x100));
  assert_non_null(h);
  assert_int_equal(nf_free(p, h), NF_OK);
  assert_int_equal(nf__stream_record(p, s0), NF_OK); // 0x100's frees are known done...
  nf_backend_host_complete_events(be);
  for (int i = 1; i < 64; i++) sidx(p, S(0x100 + i)); // ...and every other stream used since
  assert_non_null(p->hot);
  void *h2 = nf_alloc(p, 8 * KB, S(0x100)); // the hot pair: 0x100 is now the most recently used
  assert_ptr_equal(h2, h);
  assert_null(p->hot);
  char *y = nf_alloc(p, 4 * KB, S(0x5000));
  assert_non_null(y);
  assert_int_equal(p->streams_stolen, 1);
  assert_ptr_equal(p->streams[s0].handle, S(0x100));
  assert_int_equal(sidx(p, S(0x5000)), s1);
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_int_equal(nf_free(p, h2), NF_OK);
  assert_int_equal(nf_free(p, y), NF_OK);
  free64(p, x, 4 * KB);
  done(p, be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hot_pair_counts_as_use),
      cmocka_unit_test(test_steal_waits_for_the_victims_frees),
      cmocka_unit_test(test_steal_picks_a_done_stream),
      cmocka_unit_test(test_route_on_a_capturing_stream_makes_no_host_wait),
      cmocka_unit_test(test_stolen_slot_first_free_settles),
      cmocka_unit_test(test_steal_spares_pending_blocks_stream),
      cmocka_unit_test(test_steal_spares_offloaded_blocks_stream),
      cmocka_unit_test(test_prefetch_orphan_keeps_callers_slot),
      cmocka_unit_test(test_orphan_names_no_slot),
      cmocka_unit_test(test_recycle_finishes_copies),
      cmocka_unit_test(test_check_orphans),
      cmocka_unit_test(test_record_stream_own_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
