// Stream slots (src/core/stream.c): a pool tracks 64 streams at once. When a
// 65th comes, the slots of streams nothing names are given back after one
// device wait (recycling); when live blocks' allocations name every slot, the
// least recently used stream's slot is taken after one host wait for that
// stream alone (stealing), and its live blocks keep its handle (orphans) until
// they are freed or moved, when they get a slot again. White box (core.h's
// stream records); the host backend's manual events stand in for GPU work in
// flight and count a block handed to a stream while another stream's
// unordered work still uses it (violations).
#include "stream_test.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

// More streams over a pool's life than it has slots (64): a stream nothing
// names any more (no live or pending block, route, capture) gives its slot
// back after one host wait for the whole device, since it may be gone and
// its handle may not be recorded on. Every stream's last block is freed with
// its kernel in flight; the host backend counts a block handed to a stream
// while another stream's unordered work still uses it. Slots named by live
// blocks (an allocation's stream, a record_stream's) are kept throughout.
static void test_streams_recycled(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *held = nf_alloc(p, 8 * KB, A), *rec = nf_alloc(p, 8 * KB, A);
  assert_true(held && rec);
  nft_fill(held, 8 * KB, 1);
  assert_int_equal(nf_record_stream(p, rec, B), NF_OK); // B is named by rec's extra mask
  uint32_t ia = sidx(p, A), ib = sidx(p, B);
  uint64_t syncs0 = stats(p).calls.event_sync;
  nft_live_t keep[8] = {{0}};
  for (int i = 0; i < 400; i++) {
    nf_stream_t s = (nf_stream_t)(uintptr_t)(0x1000 + i);
    size_t n = (size_t)(1 + i % 7) * 4 * KB;
    char *x = nf_alloc(p, n, s);
    if (!x) fail_msg("stream %d: %s", i, nf_last_error());
    nf_backend_host_use_new(be, s, x, n); // s's kernel on x, in flight until an event completes
    nft_fill(x, n, 100 + (uint64_t)i);
    nft_live_t *k = &keep[i % 8];
    if (k->p) assert_int_equal(nf_free(p, k->p), NF_OK); // freed with its stream's work in flight
    *k = (nft_live_t){.p = x, .n = n, .tag = 100 + (uint64_t)i};
    nft_check_all(keep, 8);
    assert_true(nft_check(held, 8 * KB, 1));
    if (i % 40 == 0) assert_int_equal(nf_pool_check(p), NF_OK);
  }
  assert_int_equal(nf_backend_host_violations(be), 0);
  assert_true(p->streams_recycled >= 400 - 64);
  assert_true(stats(p).calls.event_sync > syncs0); // the device waits
  assert_int_equal(sidx(p, A), ia); // never given back: live blocks name them
  assert_int_equal(sidx(p, B), ib);
  for (int i = 0; i < 8; i++) assert_int_equal(nf_free(p, keep[i].p), NF_OK);
  assert_int_equal(nf_free(p, rec), NF_OK);
  assert_int_equal(nf_free(p, held), NF_OK);
  done(p, be);
}

// 64 streams each hold a live block with their kernel in flight, and each
// freed a block with its work in flight; the 65th takes the slot of the
// least recently used one (0x100) after one host wait for that stream alone. Its block keeps its data and its handle; freed, it
// gets a slot again (taking the next least recently used), and the next
// stream to take its memory is ordered after its kernel.
static void test_streams_stolen(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, be, x, 4 * KB);
  for (int i = 0; i < 64; i++) pairs(p, S(0x100 + i), 1); // a free on each, its work in flight
  uint32_t victim = sidx(p, S(0x100));
  for (int i = 1; i < 64; i++) sidx(p, S(0x100 + i)); // 0x100 is the least recently used
  nf_stats_t s0 = stats(p);
  char *y = nf_alloc(p, 4 * KB, S(0x5000));
  assert_non_null(y);
  nf_stats_t s1 = stats(p);
  assert_int_equal(s1.calls.event_sync, s0.calls.event_sync + 1); // one stream's wait, not the device's
  assert_int_equal(s1.calls.event_record, s0.calls.event_record + 1);
  assert_int_equal(p->streams_stolen, 1);
  assert_int_equal(p->orphans, 1);
  assert_int_equal(sidx(p, S(0x5000)), victim);
  assert_int_equal(nf_stream_known(p, S(0x100)), 1); // its live block will record on it
  assert_int_equal(nf_pool_check(p), NF_OK);
  nf_backend_host_use_new(be, S(0x5000), y, 4 * KB);
  nft_fill(y, 4 * KB, 99);
  nf_backend_host_use(be, S(0x100), x[0], 4 * KB); // more work on the orphan, in flight
  assert_int_equal(nf_free(p, x[0]), NF_OK);       // a slot again: 0x101's (the least recently used now)
  assert_int_equal(p->orphans, 1);                 // 0x101's block
  assert_int_equal(p->streams_stolen, 2);
  assert_int_equal(nf_stream_known(p, S(0x101)), 1);
  char *z = nf_alloc(p, 4 * KB, S(0x6000)); // steals again; the freed memory goes after 0x100's work
  assert_non_null(z);
  nf_backend_host_use_new(be, S(0x6000), z, 4 * KB);
  assert_int_equal(nf_backend_host_violations(be), 0);
  for (int i = 1; i < 64; i++) assert_true(nft_check(x[i], 4 * KB, (uint64_t)i));
  assert_true(nft_check(y, 4 * KB, 99));
  for (int i = 1; i < 64; i++) assert_int_equal(nf_free(p, x[i]), NF_OK);
  assert_int_equal(p->orphans, 0);
  assert_int_equal(nf_free(p, y), NF_OK);
  assert_int_equal(nf_free(p, z), NF_OK);
  done(p, be);
}

// Where record_stream'ed blocks name every slot, the 65th stream is refused
// with the reason and nothing changes (no wait, no orphan); once blocks are
// freed and their work is done, their slots come back.
static void test_streams_all_named(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  for (int i = 0; i < 64; i++) { // streams 0x100+i and 0x200+i record on each other's blocks
    nf_stream_t s = S(i < 32 ? 0x100 + i : 0x200 + i - 32), r = S(i < 32 ? 0x200 + i : 0x100 + i - 32);
    x[i] = nf_alloc(p, 4 * KB, s);
    assert_non_null(x[i]);
    nft_fill(x[i], 4 * KB, (uint64_t)i);
    assert_int_equal(nf_record_stream(p, x[i], r), NF_OK);
  }
  nf_stats_t s0 = stats(p);
  assert_null(nf_alloc(p, 4 * KB, S(0x5000)));
  assert_int_equal(nf_last_status(), NF_ERR_UNSUPPORTED);
  nft_last_error_has("no slot can be given back or taken: every stream is named by a record_stream'ed");
  assert_int_equal(nf_record_stream(p, x[0], S(0x5001)), NF_ERR_UNSUPPORTED);
  nf_stats_t s1 = stats(p);
  assert_int_equal(s1.live_blocks, s0.live_blocks);
  assert_int_equal(s1.calls.event_sync, s0.calls.event_sync);
  assert_int_equal(s1.calls.event_record, s0.calls.event_record);
  assert_int_equal(p->orphans, 0);
  assert_int_equal(p->stream_free, 0);
  assert_int_equal(nf_free(p, x[7]), NF_OK);  // pending on 0x207's work
  assert_int_equal(nf_free(p, x[39]), NF_OK); // pending on 0x107's work
  nf_backend_host_complete_events(be);
  char *y = nf_alloc(p, 4 * KB, S(0x5000)); // the pending blocks come back; 0x107 and 0x207 given back
  if (!y) fail_msg("%s", nf_last_error());
  assert_int_equal(p->streams_recycled, 2);
  assert_int_equal(p->streams_stolen, 0);
  for (int i = 0; i < 64; i++)
    if (i != 7 && i != 39) {
      assert_true(nft_check(x[i], 4 * KB, (uint64_t)i));
      assert_int_equal(nf_free(p, x[i]), NF_OK);
    }
  assert_int_equal(nf_free(p, y), NF_OK);
  done(p, be);
}

// An orphan's free needs a slot. Where none can be had, the free waits on
// the host for the orphan's stream instead (its own event) and goes on: a
// deleter cannot handle a failed free. During a capture (no host wait) it
// is refused, and the block stays live and intact. Both ways the memory is
// reused only after the orphan's work.
static void test_orphan_free_no_slot(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, be, x, 4 * KB);
  char *y = nf_alloc(p, 4 * KB, S(0x5000)); // 0x100's block: an orphan
  assert_non_null(y);
  assert_int_equal(p->orphans, 1);
  for (int i = 1; i < 64; i++) // every slot named by an extra: 0x101..0x13f in a cycle, 0x5000
    assert_int_equal(nf_record_stream(p, x[i], S(0x100 + i % 63 + 1)), NF_OK);
  assert_int_equal(nf_record_stream(p, x[1], S(0x5000)), NF_OK);
  nf_backend_host_use(be, S(0x100), x[0], 4 * KB); // the orphan's stream still works on it
  assert_int_equal(nf_private_incref(p, 1), NF_OK);
  assert_int_equal(nf_private_begin(p, 1, S(0x101)), NF_OK);
  uint64_t lb = stats(p).live_blocks;
  assert_int_equal(nf_free(p, x[0]), NF_ERR_UNSUPPORTED);
  nft_last_error_has("being captured");
  assert_int_equal(stats(p).live_blocks, lb);
  assert_int_equal(nf_block_size(p, x[0]), 4 * KB);
  assert_true(nft_check(x[0], 4 * KB, 0));
  assert_int_equal(p->orphans, 1);
  assert_int_equal(nf_pool_check(p), NF_OK);
  assert_int_equal(nf_private_end(p, 1), NF_OK);
  assert_int_equal(nf_private_release(p, 1), NF_OK);
  uint64_t syncs = stats(p).calls.event_sync;
  assert_int_equal(nf_free(p, x[0]), NF_OK); // a host wait for 0x100's work
  assert_int_equal(stats(p).calls.event_sync, syncs + 1);
  assert_int_equal(p->orphans, 0);
  char *z = nf_alloc(p, 4 * KB, S(0x101)); // its memory, maybe: ordered after 0x100's work all the same
  assert_non_null(z);
  nf_backend_host_use_new(be, S(0x101), z, 4 * KB);
  assert_int_equal(nf_backend_host_violations(be), 0);
  assert_int_equal(nf_pool_check(p), NF_OK);
  for (int i = 1; i < 64; i++) assert_int_equal(nf_free(p, x[i]), NF_OK);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_free(p, y), NF_OK);
  assert_int_equal(nf_free(p, z), NF_OK);
  done(p, be);
}

// record_stream on a block whose own stream is the least recently used:
// the new stream never takes the block's slot (it would orphan the block
// whose free must name it), so with every other slot named it is refused.
static void test_record_stream_keeps_the_blocks_slot(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *t = nf_alloc(p, 4 * KB, S(0x100));
  assert_non_null(t);
  for (int i = 1; i < 64; i++) assert_int_equal(nf_record_stream(p, t, S(0x100 + i)), NF_OK);
  sidx(p, S(0x100 + 63)); // 0x100 is the least recently used slot
  assert_int_equal(nf_record_stream(p, t, S(0x5000)), NF_ERR_UNSUPPORTED);
  assert_int_equal(p->orphans, 0);
  assert_int_equal(p->streams_stolen, 0);
  assert_int_equal(nf_free(p, t), NF_OK);
  nf_backend_host_complete_events(be);
  char *u = nf_alloc(p, 4 * KB, S(0x5000)); // the pending block comes back: slots given back
  assert_non_null(u);
  assert_int_equal(nf_free(p, u), NF_OK);
  done(p, be);
}

// The host wait of a steal fails: the allocation fails with the backend's
// error, and nothing changed (no orphan, the victim keeps its slot).
static const nf_backend_ops_t *sync_inner;
static bool sync_fail;
static nf_status_t failing_sync(nf_backend_t *be, nf_event_t ev) {
  if (sync_fail) return NF_ERR_BACKEND;
  return sync_inner->event_sync(be, ev);
}
static void test_steal_wait_fails(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  nf_backend_ops_t ops = *be->ops;
  sync_inner = be->ops;
  ops.event_sync = failing_sync;
  be->ops = &ops;
  char *x[64];
  for (int i = 0; i < 64; i++) assert_non_null(x[i] = nf_alloc(p, 4 * KB, S(0x100 + i)));
  for (int i = 0; i < 64; i++) pairs(p, S(0x100 + i), 1); // a free on each, not known done: a wait is needed
  uint32_t v = sidx(p, S(0x100));
  for (int i = 1; i < 64; i++) sidx(p, S(0x100 + i));
  sync_fail = true;
  assert_null(nf_alloc(p, 4 * KB, S(0x5000)));
  assert_int_equal(nf_last_status(), NF_ERR_BACKEND);
  nft_last_error_has("event synchronize (to take the slot of stream 0x100) failed");
  assert_int_equal(p->orphans, 0);
  assert_int_equal(p->streams_stolen, 0);
  assert_int_equal(sidx(p, S(0x100)), v);
  assert_int_equal(nf_pool_check(p), NF_OK);
  sync_fail = false;
  char *y = nf_alloc(p, 4 * KB, S(0x5000));
  assert_non_null(y);
  assert_int_equal(p->orphans, 1);
  for (int i = 0; i < 64; i++) assert_int_equal(nf_free(p, x[i]), NF_OK);
  assert_int_equal(nf_free(p, y), NF_OK);
  be->ops = sync_inner;
  done(p, be);
}

// An orphan offloaded and prefetched gets a slot first (the tier orders its
// copies by slot), and its data survives the trip.
static void test_orphan_offload(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  char *x[64];
  fill64(p, NULL, x, 256 * KB);
  char *y = nf_alloc(p, 4 * KB, S(0x5000));
  assert_non_null(y);
  assert_int_equal(p->orphans, 1);
  assert_int_equal(nf_offload(p, x[0], S(0x5000), NF_TIER_HOST), NF_OK);
  assert_int_equal(p->orphans, 1); // x[0] got 0x101's slot: 0x101's block is the orphan now
  copies_done(p, be);
  assert_int_equal(nf_prefetch(p, x[0], S(0x5000)), NF_OK);
  copies_done(p, be);
  assert_int_equal(nf_pool_check(p), NF_OK);
  free64(p, x, 256 * KB);
  assert_int_equal(nf_free(p, y), NF_OK);
  done(p, be);
}

// Randomized: 160 streams, up to 3 live blocks each, 200 live at most, with
// kernels in flight, record_stream now and then, and waits completing at
// random. Every block's pattern is checked as it goes; no block is reused
// unordered; the pool checks out (orphans counted) throughout.
static void test_streams_stolen_random(void **state) {
  (void)state;
  uint64_t seed0 = nft_env_seed(0x5107e);
  for (uint64_t seed = seed0; seed < seed0 + 4; seed++) {
    nf_backend_t *be;
    nf_pool_t *p = pool(&be);
    uint64_t rng = seed;
    enum { N = 200 };
    nft_live_t live[N] = {{0}};
    nf_stream_t ls[N] = {0};
    uint64_t tag = 1;
    for (int op = 0; op < 6000; op++) {
      int k = (int)(nft_rand(&rng) % N);
      uint64_t r = nft_rand(&rng);
      if (!live[k].p) {
        nf_stream_t s = S(0x1000 + r % 160);
        size_t n = (size_t)(1 + (r >> 8) % 24) * 4 * KB;
        char *x = nf_alloc(p, n, s);
        if (!x) fail_msg("seed %llu op %d: %s", (unsigned long long)seed, op, nf_last_error());
        nf_backend_host_use_new(be, s, x, n);
        nft_fill(x, n, tag);
        live[k] = (nft_live_t){.p = x, .n = n, .tag = tag++};
        ls[k] = s;
      } else if (r % 8 == 0) {
        nf_stream_t s = S(0x1000 + (r >> 8) % 160);
        nf_status_t st = nf_record_stream(p, live[k].p, s);
        if (st == NF_OK) nf_backend_host_use(be, s, live[k].p, live[k].n);
        else assert_int_equal(st, NF_ERR_UNSUPPORTED);
      } else {
        if (!nft_check(live[k].p, live[k].n, live[k].tag)) fail_msg("seed %llu op %d: lost data", (unsigned long long)seed, op);
        nf_backend_host_use(be, ls[k], live[k].p, live[k].n);
        nf_status_t st = nf_free(p, live[k].p);
        if (st == NF_OK) live[k].p = NULL;
        else assert_int_equal(st, NF_ERR_UNSUPPORTED);
      }
      if (r % 64 == 1) nf_backend_host_complete_events(be);
      if (op % 500 == 0) assert_int_equal(nf_pool_check(p), NF_OK);
    }
    assert_true(p->streams_stolen > 0);
    nft_check_all(live, N);
    for (int k = 0; k < N; k++)
      if (live[k].p) {
        nf_backend_host_complete_events(be);
        assert_int_equal(nf_free(p, live[k].p), NF_OK);
      }
    assert_int_equal(p->orphans, 0);
    done(p, be);
  }
}

// A recycled slot's done_tick is p->tick + 1; the new stream's first free
// must not tick to that same value, or streams_settle takes its frees for
// done (done_tick >= last_free) and never records or waits for them: a
// blocking settle (nf_trim) then leaves its freed memory mapped for good.
static void test_recycled_slot_first_free_settles(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  for (int i = 0; i < 64; i++) pairs(p, (nf_stream_t)(uintptr_t)(0x100 + i), 1);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_trim(p), NF_OK);
  assert_int_equal(stats(p).mapped, 0);
  nf_stream_t s = (nf_stream_t)(uintptr_t)0x5000;
  char *x = nf_alloc(p, 256 * KB, s); // the 65th: slots given back
  assert_non_null(x);
  assert_true(p->streams_recycled > 0);
  nf_backend_host_use_new(be, s, x, 256 * KB); // s's kernel on x, in flight
  assert_int_equal(nf_free(p, x), NF_OK);
  assert_int_equal(nf_trim(p), NF_OK); // waits for s's free, then unmaps
  assert_int_equal(stats(p).mapped, 0);
  assert_int_equal(nf_backend_host_violations(be), 0);
  done(p, be);
}

// A private pool handed back (or trimmed) stamps its free blocks as freed
// on every stream the pool knows: not on the slots given back, whose
// streams may be gone. Else the next settle records on such a slot.
static void test_private_hand_back_skips_given_back_slots(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool(&be);
  gone_watch(p, be);
  for (int i = 0; i < 64; i++) pairs(p, (nf_stream_t)(uintptr_t)(0x100 + i), 1);
  nf_stream_t s = (nf_stream_t)(uintptr_t)0x5000;
  assert_int_equal(nf_private_incref(p, 1), NF_OK);
  void *x = nf_alloc_private(p, 1, 8 * KB, s); // the 65th: slots given back
  assert_non_null(x);
  assert_true(p->stream_free != 0);
  assert_int_equal(nf_free(p, x), NF_OK);
  assert_int_equal(nf_private_trim(p, 1), NF_OK);
  assert_int_equal(nf_private_release(p, 1), NF_OK); // hand-back: stamped on every stream
  assert_int_equal(nf_trim(p), NF_OK);                // settles every stream
  void *y = nf_alloc(p, 8 * KB, s);
  assert_non_null(y);
  assert_int_equal(nf_free(p, y), NF_OK);
  assert_int_equal(nf_trim(p), NF_OK);
  assert_int_equal(gone()->uses, 0);
  assert_int_equal(nf_pool_check(p), NF_OK);
  gone_unwatch(be);
  done(p, be);
}

// nf_offload / nf_prefetch of an orphan on a stream that holds a slot no
// block names: the offload's stream slot s is looked up first, then the
// orphan's stream gets a slot (nf__block_home keeping s). With every slot
// held and none free, that lookup recycles the unnamed slots, s among them,
// unless `keep` covers recycling too: the copy then goes to the orphan's own
// stream (s reused for it) or to a given-back slot's dead handle, not to the
// caller's stream. Every copy must be queued on the stream the caller named.
static const nf_backend_ops_t *copy_inner;
static nf_stream_t copy_want;
static int copy_wrong;
static nf_status_t copy_watch(nf_backend_t *be, uintptr_t dst, uintptr_t src, size_t n, nf_stream_t s) {
  copy_wrong += s != copy_want;
  return copy_inner->copy(be, dst, src, n, s);
}
static void test_orphan_offload_keeps_callers_slot(void **state) {
  (void)state;
  for (int tier = 0; tier < 2; tier++) {
    nf_backend_t *be;
    nf_pool_t *p = pool(&be);
    nf_backend_ops_t ops = *be->ops;
    copy_inner = be->ops;
    ops.copy = copy_watch;
    be->ops = &ops;
    copy_wrong = 0;
    char *x[64];
    for (int i = 0; i < 64; i++) {
      x[i] = nf_alloc(p, 256 * KB, S(0x100 + i));
      assert_non_null(x[i]);
      nft_fill(x[i], 256 * KB, (uint64_t)i);
    }
    char *y = nf_alloc(p, 4 * KB, S(0x5000)); // takes 0x100's slot: x[0] an orphan
    assert_non_null(y);
    assert_int_equal(p->orphans, 1);
    assert_int_equal(nf_free(p, y), NF_OK); // 0x5000's slot: held, named by nothing
    nf_backend_host_complete_events(be);
    copy_want = S(0x5000);
    assert_int_equal(nf_offload(p, x[0], S(0x5000), tier ? NF_TIER_HOST_DETACHED : NF_TIER_HOST), NF_OK);
    assert_int_equal(copy_wrong, 0);
    nf_backend_host_complete_events(be);
    assert_int_equal(nf_offload_wait(p), NF_OK);
    assert_int_equal(nf_pool_check(p), NF_OK);
    copy_want = S(0x6000);
    assert_int_equal(nf_prefetch(p, x[0], S(0x6000)), NF_OK);
    nf_backend_host_complete_events(be);
    assert_int_equal(nf_offload_wait(p), NF_OK);
    assert_int_equal(copy_wrong, 0);
    assert_int_equal(nf_pool_check(p), NF_OK);
    for (int i = 0; i < 64; i++) {
      assert_true(nft_check(x[i], 256 * KB, (uint64_t)i));
      assert_int_equal(nf_free(p, x[i]), NF_OK);
    }
    be->ops = copy_inner;
    done(p, be);
  }
}

// A trace (trace:PATH) row for a free names the stream the block was
// allocated on (observe/record.c). An orphan freed where no slot can be had
// is handed to the last looked-up slot (nf__block_home_any): its row must
// still name the orphan's own stream, not that slot's.
static void test_orphan_free_trace_stream(void **state) {
  (void)state;
  char path[] = "/tmp/nf_orphan_traceXXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  char conf[128];
  snprintf(conf, sizeof conf, "limit:64MiB,small_max:8KiB,trace:%s", path);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, conf);
  assert_non_null(p);
  nf_backend_host_set_manual_events(be, 1);
  char *x[64];
  for (int i = 0; i < 64; i++) assert_non_null(x[i] = nf_alloc(p, 4 * KB, S(0x100 + i)));
  char *y = nf_alloc(p, 4 * KB, S(0x5000)); // 0x100's block: an orphan
  assert_non_null(y);
  for (int i = 1; i < 64; i++) assert_int_equal(nf_record_stream(p, x[i], S(0x100 + i % 63 + 1)), NF_OK);
  assert_int_equal(nf_record_stream(p, x[1], S(0x5000)), NF_OK);
  assert_int_equal(nf_free(p, x[0]), NF_OK); // no slot: a host wait, then the last slot looked up
  for (int i = 1; i < 64; i++) assert_int_equal(nf_free(p, x[i]), NF_OK);
  nf_backend_host_complete_events(be);
  assert_int_equal(nf_free(p, y), NF_OK);
  done(p, be); // flushes the trace
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[256], want[64];
  snprintf(want, sizeof want, ",free,%p,", (void *)x[0]);
  bool found = false;
  while (fgets(line, sizeof line, f))
    if (strstr(line, want)) {
      found = true;
      line[strcspn(line, "\n")] = 0;
      const char *st = strrchr(line, ',') + 1;
      if (strcmp(st, "0x100") != 0) fail_msg("free row of the orphan names stream %s, not 0x100: %s", st, line);
    }
  fclose(f);
  unlink(path);
  assert_true(found);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_streams_recycled),
      cmocka_unit_test(test_streams_stolen),
      cmocka_unit_test(test_streams_all_named),
      cmocka_unit_test(test_orphan_free_no_slot),
      cmocka_unit_test(test_record_stream_keeps_the_blocks_slot),
      cmocka_unit_test(test_steal_wait_fails),
      cmocka_unit_test(test_orphan_offload),
      cmocka_unit_test(test_orphan_free_trace_stream),
      cmocka_unit_test(test_orphan_offload_keeps_callers_slot),
      cmocka_unit_test(test_streams_stolen_random),
      cmocka_unit_test(test_recycled_slot_first_free_settles),
      cmocka_unit_test(test_private_hand_back_skips_given_back_slots),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
