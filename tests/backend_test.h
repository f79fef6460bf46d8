// Shared by the host backend tests (test_backend.c, test_host_maps.c): a
// small granule and the reserve / create / map-with-access steps they all take.
#ifndef NF_BACKEND_TEST_H
#define NF_BACKEND_TEST_H

#include "nf_test.h"

#include "backend/backend.h"

// A small granule keeps tests fast; at least a page on any machine.
static size_t G;

static inline int setup_granule(void **state) {
  (void)state;
  G = nft_small_granule();
  return 0;
}

static inline uintptr_t reserve(nf_backend_t *be, size_t size) {
  uintptr_t va = 0;
  assert_int_equal(be->ops->va_reserve(be, size, 0, &va), NF_OK);
  assert_int_equal(va % G, 0);
  return va;
}

static inline nf_handle_t create(nf_backend_t *be, size_t size) {
  nf_handle_t h = 0;
  assert_int_equal(be->ops->mem_create(be, NF_TIER_DEVICE, size, &h), NF_OK);
  assert_true(h != 0);
  return h;
}

static inline void map_rw(nf_backend_t *be, uintptr_t va, size_t size, nf_handle_t h) {
  assert_int_equal(be->ops->map(be, va, size, h), NF_OK);
  assert_int_equal(be->ops->set_access(be, va, size), NF_OK);
}

#endif
