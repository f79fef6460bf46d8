// The host backend's events and its checks of stream order (host_event.c):
// events complete with their stream's work (manual mode: when the test says),
// a stream wait orders a stream after another's work transitively, and the
// use checks catch a range unmapped, or memory handed to a stream, while
// work not ordered before it may still use it.
#include "nf_test.h"

#include "backend/backend.h"

#include <math.h>
#include <pthread.h>

// A small granule keeps tests fast; at least a page on any machine.
static size_t G;

static int setup_granule(void **state) {
  (void)state;
  G = nft_small_granule();
  return 0;
}

// Events, created (destroying the backend destroys them): events_new(be, E(&e1, &e2)).
#define E(...) (nf_event_t *[]){__VA_ARGS__}, (int)(sizeof((nf_event_t *[]){__VA_ARGS__}) / sizeof(nf_event_t *))
static void events_new(nf_backend_t *be, nf_event_t **e, int n) {
  for (int i = 0; i < n; i++) assert_int_equal(be->ops->event_create(be, e[i]), NF_OK);
}

// n granules of memory, one handle each, mapped in order at a fresh range.
static uintptr_t granules_map(nf_backend_t *be, nf_handle_t *h, int n) {
  const nf_backend_ops_t *o = be->ops;
  uintptr_t va;
  assert_int_equal(o->va_reserve(be, (size_t)n * G, 0, &va), NF_OK);
  for (int i = 0; i < n; i++) {
    assert_int_equal(o->mem_create(be, NF_TIER_DEVICE, G, &h[i]), NF_OK);
    assert_int_equal(o->map(be, va + (uintptr_t)i * G, G, h[i]), NF_OK);
    assert_int_equal(o->set_access(be, va + (uintptr_t)i * G, G), NF_OK);
  }
  return va;
}

// The memory and the range back, once the test has unmapped them.
static void granules_release(nf_backend_t *be, uintptr_t va, nf_handle_t *h, int n) {
  for (int i = 0; i < n; i++) assert_int_equal(be->ops->mem_release(be, h[i]), NF_OK);
  assert_int_equal(be->ops->va_release(be, va, (size_t)n * G), NF_OK);
}

static void test_host_events(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  const nf_backend_ops_t *o = be->ops;
  nf_stream_t s1 = (nf_stream_t)0x1, s2 = (nf_stream_t)0x2;
  nf_event_t e1, e2, e3, e4;
  events_new(be, E(&e1, &e2, &e3, &e4));
  assert_int_equal(o->event_query(be, e1), NF_OK); // never recorded
  assert_int_equal(o->event_record(be, e1, NULL), NF_OK);
  assert_int_equal(o->event_query(be, e1), NF_OK); // automatic mode: done at once
  assert_int_equal(o->event_sync(be, e1), NF_OK);

  nf_backend_host_set_manual_events(be, 1);
  assert_int_equal(o->event_record(be, e1, s1), NF_OK);
  assert_int_equal(o->event_record(be, e2, s1), NF_OK);
  assert_int_equal(o->event_record(be, e3, s2), NF_OK);
  assert_int_equal(o->event_query(be, e1), NF_ERR_NOT_READY);
  assert_int_equal(o->event_query(be, e2), NF_ERR_NOT_READY);
  assert_int_equal(o->event_query(be, e3), NF_ERR_NOT_READY);
  assert_int_equal(o->event_query(be, e4), NF_OK); // unrecorded
  assert_int_equal(o->stream_wait(be, s2, e2), NF_OK);
  assert_int_equal(o->event_sync(be, e2), NF_OK); // waits: e1 (earlier, same stream) is done too
  assert_int_equal(o->event_query(be, e1), NF_OK);
  assert_int_equal(o->event_query(be, e2), NF_OK);
  assert_int_equal(o->event_query(be, e3), NF_ERR_NOT_READY); // other stream
  nf_backend_host_complete_events(be);
  assert_int_equal(o->event_query(be, e3), NF_OK);
  assert_int_equal(o->event_record(be, e1, s1), NF_OK); // re-recorded: pending again
  assert_int_equal(o->event_query(be, e1), NF_ERR_NOT_READY);
  nf_backend_host_set_manual_events(be, 0); // leaving manual mode completes everything
  assert_int_equal(o->event_query(be, e1), NF_OK);

  assert_int_equal(o->event_query(be, NULL), NF_ERR_INVALID);
  assert_int_equal(o->event_record(be, NULL, s1), NF_ERR_INVALID);
  assert_int_equal(o->stream_wait(be, s1, NULL), NF_ERR_INVALID);
  assert_int_equal(o->event_destroy(be, e1), NF_OK);
  assert_int_equal(o->event_destroy(be, e2), NF_OK);
  assert_int_equal(o->event_destroy(be, e3), NF_OK);
  nf_backend_destroy(be); // e4 leaked: destroy frees it (ASan/valgrind check)
}

// Declared uses (manual events): unmapping a range a stream may still be
// using counts a violation; once an event recorded on that stream after the
// use is complete (synchronized, or every event completed), it does not.
static void test_host_use_violations(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(8 * G, G);
  const nf_backend_ops_t *o = be->ops;
  nf_stream_t s1 = (nf_stream_t)0x1, s2 = (nf_stream_t)0x2;
  nf_handle_t h[4];
  nf_event_t e1, e2;
  events_new(be, E(&e1, &e2));
  uintptr_t va = granules_map(be, h, 4);
#define MAP(i) assert_int_equal(o->map(be, va + (i) * G, G, h[i]), NF_OK)
#define UNMAP(i) assert_int_equal(o->unmap(be, va + (i) * G, G), NF_OK)
  nf_backend_host_use(be, s1, (void *)va, G);               // automatic mode: done at once, not tracked
  UNMAP(0);
  assert_int_equal(nf_backend_host_violations(be), 0);
  nf_backend_host_set_manual_events(be, 1);
  MAP(0);
  nf_backend_host_use(be, s1, (void *)(va + G / 2), G);     // granules 0 and 1, on s1
  assert_int_equal(o->event_record(be, e2, s2), NF_OK);     // another stream's event: no help
  assert_int_equal(o->event_sync(be, e2), NF_OK);
  UNMAP(2);                                                 // not used: fine
  UNMAP(1);                                                 // in use: a violation
  assert_int_equal(nf_backend_host_violations(be), 1);
  assert_int_equal(o->event_record(be, e1, s1), NF_OK);     // recorded after the use, not complete
  UNMAP(0);
  assert_int_equal(nf_backend_host_violations(be), 2);
  MAP(0);
  assert_int_equal(o->event_sync(be, e1), NF_OK);           // now it is
  UNMAP(0);
  assert_int_equal(nf_backend_host_violations(be), 2);
  MAP(0);
  nf_backend_host_use(be, s1, (void *)va, G);               // after e1's record: e1 does not cover it
  assert_int_equal(o->event_sync(be, e1), NF_OK);
  UNMAP(0);
  assert_int_equal(nf_backend_host_violations(be), 3);
  MAP(0);
  nf_backend_host_use(be, s2, (void *)va, G);
  nf_backend_host_complete_events(be);                      // all work done
  UNMAP(0);
  UNMAP(3);
  assert_int_equal(nf_backend_host_violations(be), 3);
#undef MAP
#undef UNMAP
  granules_release(be, va, h, 4);
  nf_backend_destroy(be); // the events too
}

// A stream wait orders one stream after another, as on a GPU: once an event
// recorded on s2 after s2 waited on s1's event e1 is complete, s1's work
// before e1 is complete too (the allocator relies on it: an offload copy
// ordered after the block's streams, then a host wait for the copy). Work
// on s1 after e1, or an s2 event recorded before the wait, proves nothing.
static void test_host_use_stream_wait(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(8 * G, G);
  const nf_backend_ops_t *o = be->ops;
  nf_stream_t s1 = (nf_stream_t)0x1, s2 = (nf_stream_t)0x2, s3 = (nf_stream_t)0x3;
  nf_handle_t h;
  nf_event_t e1, e2, e3;
  events_new(be, E(&e1, &e2, &e3));
  nf_backend_host_set_manual_events(be, 1);
  uintptr_t va = granules_map(be, &h, 1);
#define MAP() assert_int_equal(o->map(be, va, G, h), NF_OK)
#define UNMAP() assert_int_equal(o->unmap(be, va, G), NF_OK)
  nf_backend_host_use(be, s1, (void *)va, G);
  assert_int_equal(o->event_record(be, e2, s2), NF_OK);     // s2's event before the wait: no help
  assert_int_equal(o->event_record(be, e1, s1), NF_OK);
  assert_int_equal(o->stream_wait(be, s2, e1), NF_OK);
  assert_int_equal(o->event_sync(be, e2), NF_OK);
  UNMAP();
  assert_int_equal(nf_backend_host_violations(be), 1);
  MAP();
  assert_int_equal(o->event_record(be, e2, s2), NF_OK);     // after the wait: covers s1's work before e1
  assert_int_equal(o->stream_wait(be, s3, e2), NF_OK);      // and transitively through s3
  assert_int_equal(o->event_record(be, e3, s3), NF_OK);
  nf_backend_host_use(be, s1, (void *)va, G);               // s1's work after e1: not covered
  assert_int_equal(o->event_sync(be, e3), NF_OK);
  UNMAP();
  assert_int_equal(nf_backend_host_violations(be), 2);      // the second use only
  MAP();
  assert_int_equal(o->event_record(be, e1, s1), NF_OK);
  assert_int_equal(o->event_sync(be, e1), NF_OK);
  UNMAP();
  assert_int_equal(nf_backend_host_violations(be), 2);
#undef MAP
#undef UNMAP
  granules_release(be, va, &h, 1);
  nf_backend_destroy(be);
}

// Memory handed to a new stream (nf_backend_host_use_new) while another
// stream's declared use of it is neither complete nor ordered before the new
// stream's work is a violation; a wait on an event recorded after that use
// (directly, or through a third stream's wait) orders it. "It" is the
// address range, or the physical memory mapped there (a granule mapped at
// two places).
static void test_host_use_new_ordering(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(8 * G, G);
  const nf_backend_ops_t *o = be->ops;
  nf_stream_t s1 = (nf_stream_t)0x1, s2 = (nf_stream_t)0x2, s3 = (nf_stream_t)0x3, s4 = (nf_stream_t)0x4;
  nf_event_t e1, e3;
  char buf[1024];
  events_new(be, E(&e1, &e3));
  nf_backend_host_set_manual_events(be, 1);
  nf_backend_host_use_new(be, s1, buf, 512);        // s1 on [0, 512)
  nf_backend_host_use_new(be, s1, buf, 256);        // the same stream again: stream order
  nf_backend_host_use_new(be, s2, buf + 512, 512);  // s2 on [512, 1024): no overlap
  assert_int_equal(nf_backend_host_violations(be), 0);
  assert_int_equal(o->event_record(be, e1, s1), NF_OK);
  nf_backend_host_use_new(be, s2, buf + 384, 64);   // overlaps s1's first use, in flight, unordered
  assert_int_equal(nf_backend_host_violations(be), 1);
  assert_int_equal(o->stream_wait(be, s3, e1), NF_OK);
  nf_backend_host_use_new(be, s3, buf, 256);        // s3 waits for e1, recorded after s1's uses
  assert_int_equal(nf_backend_host_violations(be), 1);
  assert_int_equal(o->event_record(be, e3, s3), NF_OK);
  assert_int_equal(o->stream_wait(be, s4, e3), NF_OK);
  nf_backend_host_use_new(be, s4, buf, 128);        // through s3's wait: s1's and s3's uses ordered
  assert_int_equal(nf_backend_host_violations(be), 1);
  nf_backend_host_use_new(be, s4, buf + 400, 16);   // s2's use at 384 is not
  assert_int_equal(nf_backend_host_violations(be), 2);
  nf_backend_host_complete_events(be);
  nf_backend_host_use_new(be, s2, buf, 1024);       // all done
  assert_int_equal(nf_backend_host_violations(be), 2);
  // One granule mapped at two places (a view): work through one address
  // races work through the other.
  uintptr_t va;
  nf_handle_t h;
  assert_int_equal(o->va_reserve(be, 4 * G, 0, &va), NF_OK);
  assert_int_equal(o->mem_create(be, NF_TIER_DEVICE, G, &h), NF_OK);
  assert_int_equal(o->map(be, va, G, h), NF_OK);
  assert_int_equal(o->map(be, va + 2 * G, G, h), NF_OK);
  nf_backend_host_use(be, s1, (void *)(va + 512), 512);
  nf_backend_host_use_new(be, s2, (void *)(va + 2 * G + 1024), 512); // other bytes: fine
  assert_int_equal(nf_backend_host_violations(be), 2);
  nf_backend_host_use_new(be, s2, (void *)(va + 2 * G), G);         // the same bytes, unordered
  assert_int_equal(nf_backend_host_violations(be), 3);
  assert_int_equal(o->event_record(be, e1, s1), NF_OK);
  assert_int_equal(o->stream_wait(be, s3, e1), NF_OK);
  nf_backend_host_use_new(be, s3, (void *)(va + 2 * G), 1024);      // ordered after s1 (s2's use overlaps: +1)
  assert_int_equal(nf_backend_host_violations(be), 4);
  nf_backend_host_complete_events(be);
  assert_int_equal(o->unmap(be, va, G), NF_OK);
  assert_int_equal(o->unmap(be, va + 2 * G, G), NF_OK);
  assert_int_equal(o->mem_release(be, h), NF_OK);
  assert_int_equal(o->va_release(be, va, 4 * G), NF_OK);
  assert_int_equal(nf_backend_host_violations(be), 4);
  nf_backend_destroy(be);
}

// A stream wait orders only the events its stream records after the wait: an
// s2 event recorded just before s2 waits on e1 (the newest event then, so its
// number is the wait's mark) proves nothing about s1's work before e1, and the
// mark is the newest event of all, not the waited one (e2 came after e1).
static void test_host_wait_marks_newest_event(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  const nf_backend_ops_t *o = be->ops;
  nf_stream_t s1 = (nf_stream_t)0x1, s2 = (nf_stream_t)0x2;
  nf_handle_t h;
  nf_event_t e1, e2, e3;
  events_new(be, E(&e1, &e2, &e3));
  nf_backend_host_set_manual_events(be, 1);
  uintptr_t va = granules_map(be, &h, 1);
  nf_backend_host_use(be, s1, (void *)va, G);
  assert_int_equal(o->event_record(be, e1, s1), NF_OK); // after the use
  assert_int_equal(o->event_record(be, e2, s2), NF_OK); // after e1, but before the wait
  assert_int_equal(o->stream_wait(be, s2, e1), NF_OK);
  assert_int_equal(o->event_sync(be, e2), NF_OK);
  assert_int_equal(o->unmap(be, va, G), NF_OK);
  assert_int_equal(nf_backend_host_violations(be), 1);
  assert_int_equal(o->map(be, va, G, h), NF_OK);
  assert_int_equal(o->event_record(be, e3, s2), NF_OK); // after the wait: covers s1's work before e1
  assert_int_equal(o->event_sync(be, e3), NF_OK);
  assert_int_equal(o->unmap(be, va, G), NF_OK);
  assert_int_equal(nf_backend_host_violations(be), 1);
  granules_release(be, va, &h, 1);
  nf_backend_destroy(be);
}

// A use covers [addr, addr + n) and nothing more: unmapping the granules just
// before and just after a range still in use is no violation (a false alarm
// would fail correct allocator tests); the granule itself is.
static void test_host_use_bounds_exact(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  const nf_backend_ops_t *o = be->ops;
  nf_handle_t h[3];
  uintptr_t va = granules_map(be, h, 3);
  nf_backend_host_set_manual_events(be, 1);
  nf_backend_host_use(be, (nf_stream_t)0x1, (void *)(va + G), G);
  assert_int_equal(o->unmap(be, va, G), NF_OK);
  assert_int_equal(o->unmap(be, va + 2 * G, G), NF_OK);
  assert_int_equal(nf_backend_host_violations(be), 0);
  assert_int_equal(o->unmap(be, va + G, G), NF_OK);
  assert_int_equal(nf_backend_host_violations(be), 1);
  nf_backend_host_complete_events(be);
  granules_release(be, va, h, 3);
  nf_backend_destroy(be);
}

// The bounds of "ordered before": a wait on an event recorded before a use
// does not order that use (e1, then s1's use, then s2 waits on e1); and a
// chain of waits goes only through waits made before the event waited on (s3
// waits on e2, recorded on s2 before s2's wait on e1: s3 is not after s1). The
// same chains with the events recorded after are ordered (no violation).
static void test_host_wait_order_bounds(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  const nf_backend_ops_t *o = be->ops;
  nf_stream_t s1 = (nf_stream_t)0x1, s2 = (nf_stream_t)0x2, s3 = (nf_stream_t)0x3, s4 = (nf_stream_t)0x4;
  nf_event_t e1, e2, e3;
  char buf[1024];
  events_new(be, E(&e1, &e2, &e3));
  nf_backend_host_set_manual_events(be, 1);
  // A wait on the event just before the use.
  assert_int_equal(o->event_record(be, e1, s1), NF_OK);
  nf_backend_host_use(be, s1, buf, 512);
  assert_int_equal(o->stream_wait(be, s2, e1), NF_OK);
  nf_backend_host_use_new(be, s2, buf, 64);
  assert_int_equal(nf_backend_host_violations(be), 1);
  assert_int_equal(o->event_record(be, e2, s1), NF_OK); // after the use: a wait on it orders
  assert_int_equal(o->stream_wait(be, s3, e2), NF_OK);
  nf_backend_host_use_new(be, s3, buf + 128, 64);
  assert_int_equal(nf_backend_host_violations(be), 1);
  nf_backend_host_complete_events(be);
  // A chain through a wait made after the event waited on.
  nf_backend_host_use(be, s1, buf, 512);
  assert_int_equal(o->event_record(be, e1, s1), NF_OK);
  assert_int_equal(o->event_record(be, e2, s2), NF_OK);
  assert_int_equal(o->stream_wait(be, s2, e1), NF_OK);  // s2 waits after recording e2
  assert_int_equal(o->stream_wait(be, s3, e2), NF_OK);
  nf_backend_host_use_new(be, s3, buf, 256);
  assert_int_equal(nf_backend_host_violations(be), 2);
  assert_int_equal(o->event_record(be, e3, s2), NF_OK); // after s2's wait: the chain holds
  assert_int_equal(o->stream_wait(be, s4, e3), NF_OK);
  nf_backend_host_use_new(be, s4, buf + 256, 256);
  assert_int_equal(nf_backend_host_violations(be), 2);
  nf_backend_destroy(be);
}

// A copy's source is the stream's work in flight as much as its destination:
// unmapping either before an event behind the copy completes is a violation.
static void test_host_copy_source_in_flight(void **state) {
  (void)state;
  nf_backend_t *be = nft_host(4 * G, G);
  const nf_backend_ops_t *o = be->ops;
  nf_stream_t s1 = (nf_stream_t)0x1;
  nf_handle_t h[2];
  nf_event_t e;
  events_new(be, E(&e));
  uintptr_t va = granules_map(be, h, 2);
  nf_backend_host_set_manual_events(be, 1);
  assert_int_equal(o->copy(be, va + G, va, G, s1), NF_OK); // granule 0 to granule 1 on s1
  assert_int_equal(o->unmap(be, va, G), NF_OK);            // the source
  assert_int_equal(nf_backend_host_violations(be), 1);
  assert_int_equal(o->unmap(be, va + G, G), NF_OK);        // the destination
  assert_int_equal(nf_backend_host_violations(be), 2);
  assert_int_equal(o->map(be, va, G, h[0]), NF_OK);
  assert_int_equal(o->map(be, va + G, G, h[1]), NF_OK);
  assert_int_equal(o->set_access(be, va, 2 * G), NF_OK);
  assert_int_equal(o->copy(be, va + G, va, G, s1), NF_OK);
  assert_int_equal(o->event_record(be, e, s1), NF_OK);      // behind the copy, then complete
  assert_int_equal(o->event_sync(be, e), NF_OK);
  assert_int_equal(o->unmap(be, va, 2 * G), NF_OK);
  assert_int_equal(nf_backend_host_violations(be), 2);
  granules_release(be, va, h, 2);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_events),
      cmocka_unit_test(test_host_use_violations),
      cmocka_unit_test(test_host_use_stream_wait),
      cmocka_unit_test(test_host_use_new_ordering),
      cmocka_unit_test(test_host_wait_marks_newest_event),
      cmocka_unit_test(test_host_use_bounds_exact),
      cmocka_unit_test(test_host_wait_order_bounds),
      cmocka_unit_test(test_host_copy_source_in_flight),
  };
  return cmocka_run_group_tests(tests, setup_granule, NULL);
}
