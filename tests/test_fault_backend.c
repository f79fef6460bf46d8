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

// ---------------------------------------------------------------- threads

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fault_create_validation),
      cmocka_unit_test(test_fault_fail_at),
      cmocka_unit_test(test_fault_p),
      cmocka_unit_test(test_fault_p_reproducible),
      cmocka_unit_test(test_fault_cleanup_ops),
      cmocka_unit_test(test_fault_mask),
  };
  return cmocka_run_group_tests(tests, setup_granule, NULL);
}
