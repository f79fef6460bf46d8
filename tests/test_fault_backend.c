// The fault-injection backend (fault.c): it fails exactly the calls it is
// told to (the N-th, or each with probability p from a seed, reproducibly),
// changes nothing on a failure, and forwards everything else to its inner
// backend.
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

static void test_fault_create_validation(void **state) {
  (void)state;
  nf_backend_t *inner = nft_host(4 * G, G), *f = (nf_backend_t *)&f;
  assert_int_equal(nf_backend_fault_create(&f, NULL, 0, 0, 1), NF_ERR_INVALID);
  assert_null(f);
  assert_non_null(strstr(nf_last_error(), "inner"));
  assert_int_equal(nf_backend_fault_create(&f, inner, 0, -0.1, 1), NF_ERR_INVALID);
  assert_int_equal(nf_backend_fault_create(&f, inner, 0, 1.5, 1), NF_ERR_INVALID);
  assert_int_equal(nf_backend_fault_create(&f, inner, 0, (double)NAN, 1), NF_ERR_INVALID);
  // Not a fault backend: set is a no-op, counts are zero.
  nf_backend_fault_set(inner, 1, 1.0);
  uint64_t calls = 9, failed = 9;
  nf_backend_fault_counts(inner, &calls, &failed);
  assert_int_equal(calls + failed, 0);
  nf_backend_destroy(inner); // failed creates left ownership with us
}

static void test_fault_fail_at(void **state) {
  (void)state;
  nf_backend_t *f;
  assert_int_equal(nf_backend_fault_create(&f, nft_host(8 * G, G), 5, 0.0, 1), NF_OK);
  assert_string_equal(f->ops->name, "fault");
  size_t g;
  for (int i = 1; i <= 10; i++) {
    g = 0;
    nf_status_t st = f->ops->granularity(f, NF_TIER_DEVICE, &g);
    if (i == 5) {
      assert_int_equal(st, NF_ERR_BACKEND);
      assert_int_equal(g, 0); // outputs untouched
      assert_string_equal(nf__backend_err(), "injected fault in granularity (call 5)");
    } else {
      assert_int_equal(st, NF_OK);
      assert_int_equal(g, G);
    }
  }
  uint64_t calls, failed;
  nf_backend_fault_counts(f, &calls, &failed);
  assert_int_equal(calls, 10);
  assert_int_equal(failed, 1);
  // Inner errors pass through with their message.
  assert_int_equal(f->ops->map(f, 0x1000, G, 77), NF_ERR_INVALID);
  nft_err_has(f, "host backend: map");
  // A new plan counts on from the calls so far (absolute call numbers).
  nf_backend_fault_set(f, calls + 3, 0.0);
  nf_handle_t h;
  assert_int_equal(f->ops->mem_create(f, NF_TIER_DEVICE, G, &h), NF_OK); // call 12
  assert_int_equal(f->ops->mem_create(f, NF_TIER_DEVICE, G, &h), NF_ERR_OOM); // call 13, injected
  nft_err_has(f, "injected fault in mem_create (call 13)");
  nft_usage_is(f, 1, 0); // the injected call never reached the host backend
  nf_backend_fault_counts(f, &calls, &failed);
  assert_int_equal(calls, 13);
  assert_int_equal(failed, 2);
  nf_backend_destroy(f); // destroys the inner backend too (leak checkers see it)
}

static void test_fault_p(void **state) {
  (void)state;
  nf_backend_t *f;
  assert_int_equal(nf_backend_fault_create(&f, nft_host(8 * G, G), 0, 1.0, 3), NF_OK);
  nf_handle_t h;
  uintptr_t va;
  nf_event_t ev;
  assert_int_equal(f->ops->mem_create(f, NF_TIER_DEVICE, G, &h), NF_ERR_OOM); // alternates,
  assert_int_equal(f->ops->mem_create(f, NF_TIER_DEVICE, G, &h), NF_ERR_BACKEND); // OOM first
  assert_int_equal(f->ops->mem_create(f, NF_TIER_DEVICE, G, &h), NF_ERR_OOM);
  assert_int_equal(f->ops->va_reserve(f, G, 0, &va), NF_ERR_BACKEND);
  assert_int_equal(f->ops->event_create(f, &ev), NF_ERR_BACKEND);
  assert_int_equal(f->ops->mem_release(f, 1), NF_ERR_BACKEND);
  uint64_t total;
  assert_int_equal(f->ops->capacity(f, NF_TIER_DEVICE, &total, NULL), NF_ERR_BACKEND);
  uint64_t calls, failed;
  nf_backend_fault_counts(f, &calls, &failed);
  assert_int_equal(calls, 7);
  assert_int_equal(failed, 7);
  nft_usage_is(f, 0, 0);

  nf_backend_fault_set(f, 0, 0.0); // p = 0: nothing fails
  for (int i = 0; i < 100; i++) {
    assert_int_equal(f->ops->mem_create(f, NF_TIER_DEVICE, G, &h), NF_OK);
    assert_int_equal(f->ops->mem_release(f, h), NF_OK);
  }
  nf_backend_fault_counts(f, &calls, &failed);
  assert_int_equal(calls, 207);
  assert_int_equal(failed, 7);
  nf_backend_destroy(f);
}

// The same seed gives the same failures; the rate is about p.
static void test_fault_p_reproducible(void **state) {
  (void)state;
  nf_backend_t *f1, *f2;
  assert_int_equal(nf_backend_fault_create(&f1, nft_host(4 * G, G), 0, 0.3, 12345), NF_OK);
  assert_int_equal(nf_backend_fault_create(&f2, nft_host(4 * G, G), 0, 0.3, 12345), NF_OK);
  int fails = 0;
  for (int i = 0; i < 2000; i++) {
    size_t g1, g2;
    nf_status_t s1 = f1->ops->granularity(f1, NF_TIER_DEVICE, &g1);
    nf_status_t s2 = f2->ops->granularity(f2, NF_TIER_DEVICE, &g2);
    assert_int_equal(s1, s2);
    fails += s1 != NF_OK;
  }
  assert_in_range(fails, 450, 750);
  uint64_t calls, failed;
  nf_backend_fault_counts(f1, &calls, &failed);
  assert_int_equal(calls, 2000);
  assert_int_equal(failed, (uint64_t)fails);
  nf_backend_destroy(f1);
  nf_backend_destroy(f2);
}

// Host hooks reach through the fault wrapper; cleanup ops fail too.
static void test_fault_cleanup_ops(void **state) {
  (void)state;
  nf_backend_t *f;
  assert_int_equal(nf_backend_fault_create(&f, nft_host(4 * G, G), 0, 0.0, 1), NF_OK);
  uintptr_t a;
  assert_int_equal(f->ops->va_reserve(f, 2 * G, 0, &a), NF_OK);
  nf_handle_t h;
  assert_int_equal(f->ops->mem_create(f, NF_TIER_DEVICE, G, &h), NF_OK);
  assert_int_equal(f->ops->map(f, a, G, h), NF_OK);
  nf_event_t ev;
  assert_int_equal(f->ops->event_create(f, &ev), NF_OK);
  nf_backend_host_set_manual_events(f, 1);
  assert_int_equal(f->ops->event_record(f, ev, NULL), NF_OK);
  assert_int_equal(f->ops->event_query(f, ev), NF_ERR_NOT_READY); // passes through, not a failure
  nf_backend_host_complete_events(f);
  assert_int_equal(f->ops->event_query(f, ev), NF_OK);
  nf_backend_fault_set(f, 0, 1.0);
  assert_int_equal(f->ops->unmap(f, a, G), NF_ERR_BACKEND);
  assert_int_equal(f->ops->event_destroy(f, ev), NF_ERR_BACKEND);
  assert_int_equal(f->ops->va_release(f, a, 2 * G), NF_ERR_BACKEND);
  nft_usage_is(f, 1, 1); // nothing changed underneath
  nf_backend_fault_set(f, 0, 0.0);
  assert_int_equal(f->ops->unmap(f, a, G), NF_OK);
  nft_usage_is(f, 1, 0);
  nf_backend_destroy(f); // the event, handle and range leaked above are freed here
}

// A mask fails chosen calls after `from` (several in a row, or with gaps),
// on top of fail_at; nf_backend_fault_set clears it.
static void test_fault_mask(void **state) {
  (void)state;
  nf_backend_t *f;
  assert_int_equal(nf_backend_fault_create(&f, nft_host(8 * G, G), 2, 0.0, 1), NF_OK);
  nf__backend_fault_mask(f, 4, 0x2Bull); // calls 4, 5, 7, 9 (bits 0, 1, 3, 5)
  size_t g;
  char want[64];
  for (uint64_t i = 1; i <= 12; i++) {
    bool fails = i == 2 || i == 4 || i == 5 || i == 7 || i == 9;
    nf_status_t st = f->ops->granularity(f, NF_TIER_DEVICE, &g);
    assert_int_equal(st, fails ? NF_ERR_BACKEND : NF_OK);
    snprintf(want, sizeof want, "injected fault in granularity (call %llu)", (unsigned long long)i);
    if (fails) assert_string_equal(nf__backend_err(), want);
  }
  uint64_t calls, failed;
  nf_backend_fault_counts(f, &calls, &failed);
  assert_int_equal(calls, 12);
  assert_int_equal(failed, 5);
  // Bit 63 is the last call of a mask; a call before `from` never fails.
  nf__backend_fault_mask(f, 14, 1ull << 63 | 1);
  for (uint64_t i = 13; i <= 80; i++)
    assert_int_equal(f->ops->granularity(f, NF_TIER_DEVICE, &g), i == 14 || i == 77 ? NF_ERR_BACKEND : NF_OK);
  nf__backend_fault_mask(f, 82, 1);
  nf_backend_fault_set(f, 0, 0.0); // clears the mask too
  for (int i = 0; i < 4; i++) assert_int_equal(f->ops->granularity(f, NF_TIER_DEVICE, &g), NF_OK);
  nf__backend_fault_mask(f, 0, ~0ull); // from 0: off
  assert_int_equal(f->ops->granularity(f, NF_TIER_DEVICE, &g), NF_OK);
  nf_backend_t *inner = nft_host(4 * G, G); // not a fault backend: nothing happens
  nf__backend_fault_mask(inner, 1, ~0ull);
  assert_int_equal(inner->ops->granularity(inner, NF_TIER_DEVICE, &g), NF_OK);
  nf_backend_destroy(inner);
  nf_backend_destroy(f);
}

// Only a probability strictly between 0 and 1 draws from the generator: a
// plan's random failures depend on its seed and the calls made under such a
// p, not on calls made while every call failed (p = 1) or none did (p = 0).
static void test_fault_draws_only_between(void **state) {
  (void)state;
  nf_backend_t *f[3];
  static const double p0[3] = {1.0, 0.0, 0.5};
  for (int i = 0; i < 3; i++) assert_int_equal(nf_backend_fault_create(&f[i], nft_host(4 * G, G), 0, p0[i], 99), NF_OK);
  size_t g;
  for (int i = 0; i < 40; i++) {
    assert_int_equal(f[0]->ops->granularity(f[0], NF_TIER_DEVICE, &g), NF_ERR_BACKEND);
    assert_int_equal(f[1]->ops->granularity(f[1], NF_TIER_DEVICE, &g), NF_OK);
  }
  nf_backend_fault_set(f[0], 0, 0.5);
  nf_backend_fault_set(f[1], 0, 0.5);
  int fails = 0;
  for (int i = 0; i < 200; i++) {
    nf_status_t st[3];
    for (int k = 0; k < 3; k++) st[k] = f[k]->ops->granularity(f[k], NF_TIER_DEVICE, &g);
    if (st[0] != st[2] || st[1] != st[2]) fail_msg("call %d under p = 0.5: %d %d %d", i, st[0], st[1], st[2]);
    fails += st[2] != NF_OK;
  }
  assert_in_range(fails, 60, 140);
  for (int i = 0; i < 3; i++) nf_backend_destroy(f[i]);
}

// Seed 0 stands for a fixed non-zero seed (xorshift would stay at 0, and a
// draw of 0 fails every call): p = 0.3 fails about 30 % of the calls.
static void test_fault_seed_zero(void **state) {
  (void)state;
  nf_backend_t *f;
  assert_int_equal(nf_backend_fault_create(&f, nft_host(4 * G, G), 0, 0.3, 0), NF_OK);
  int fails = 0;
  size_t g;
  for (int i = 0; i < 1000; i++) fails += f->ops->granularity(f, NF_TIER_DEVICE, &g) != NF_OK;
  assert_in_range(fails, 200, 400);
  nf_backend_destroy(f);
}

// The queries (map_room, stream_check, stream_capturing) are not calls: never
// counted, never failed, even at p = 1; over an inner backend without
// stream_capturing (host) the answer "not capturing" is written.
static void test_fault_queries_not_calls(void **state) {
  (void)state;
  nf_backend_t *f;
  assert_int_equal(nf_backend_fault_create(&f, nft_host(4 * G, G), 0, 1.0, 1), NF_OK);
  assert_int_equal(f->ops->map_room(f, 1), NF_OK);
  assert_int_equal(f->ops->stream_check(f, (nf_stream_t)0x1), NF_OK);
  int capturing = 7;
  assert_int_equal(f->ops->stream_capturing(f, (nf_stream_t)0x1, &capturing), NF_OK);
  assert_int_equal(capturing, 0);
  uint64_t calls = 9, failed = 9;
  nf_backend_fault_counts(f, &calls, &failed);
  assert_int_equal(calls + failed, 0);
  nf_backend_destroy(f);
}

// A mask from call 0 is off from the start (call numbers begin at 1, so the
// mask would otherwise fail the first calls).
static void test_fault_mask_from_zero(void **state) {
  (void)state;
  nf_backend_t *f;
  assert_int_equal(nf_backend_fault_create(&f, nft_host(4 * G, G), 0, 0.0, 1), NF_OK);
  nf__backend_fault_mask(f, 0, ~0ull);
  size_t g;
  for (int i = 0; i < 70; i++) assert_int_equal(f->ops->granularity(f, NF_TIER_DEVICE, &g), NF_OK);
  nf_backend_destroy(f);
}

// ---------------------------------------------------------------- threads

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fault_create_validation),
      cmocka_unit_test(test_fault_fail_at),
      cmocka_unit_test(test_fault_p),
      cmocka_unit_test(test_fault_p_reproducible),
      cmocka_unit_test(test_fault_cleanup_ops),
      cmocka_unit_test(test_fault_mask),
      cmocka_unit_test(test_fault_draws_only_between),
      cmocka_unit_test(test_fault_seed_zero),
      cmocka_unit_test(test_fault_queries_not_calls),
      cmocka_unit_test(test_fault_mask_from_zero),
  };
  return cmocka_run_group_tests(tests, setup_granule, NULL);
}
