// The CUDA backend on machines without a GPU: creation must fail cleanly with
// NF_ERR_UNSUPPORTED and a message naming the cause (CPU CI), or succeed
// where a driver and a device exist. Also the plug-in's layout exports that
// the Python package checks its ctypes mirror against.
#include "nf_test.h"

#include "backend/backend.h"

size_t nf_stats_size(void);
size_t nf_stats_offset(const char *field);
int nf_torch_stats(int device, nf_stats_t *out);

static void test_create_or_unsupported(void **state) {
  (void)state;
  nf_backend_t *be = (nf_backend_t *)0x1;
  nf_status_t st = nf_backend_cuda_create(&be, 0);
  if (st == NF_OK) {
    // A driver and a GPU exist: the backend must answer basic queries.
    assert_non_null(be);
    size_t g = 0;
    assert_int_equal(be->ops->granularity(be, NF_TIER_DEVICE, &g), NF_OK);
    assert_true(g >= 4096 && (g & (g - 1)) == 0);
    uint64_t total = 0, avail = 0;
    assert_int_equal(be->ops->capacity(be, NF_TIER_DEVICE, &total, &avail), NF_OK);
    assert_true(total > 0 && avail <= total);
    nf_backend_destroy(be);
    return;
  }
  assert_null(be);
  const char *msg = nf_last_error();
  fprintf(stderr, "cuda backend unavailable (expected without a GPU): %s: %s\n", nf_status_str(st), msg);
  assert_int_equal(st, NF_ERR_UNSUPPORTED);
  // Either the driver library is missing or it has no usable device.
  assert_true(strstr(msg, "libcuda.so.1") != NULL || strstr(msg, "cuInit") != NULL);
}

// The pool built from a config names the backend once: the message was
// "nofrag: backend: nofrag: backend: found: ..." (nf__error formatting
// nf_last_error() into itself).
static void test_pool_from_config_message(void **state) {
  (void)state;
  nf_pool_t *p = NULL;
  nf_status_t st = nf_pool_create_from_string(&p, "backend:cuda");
  if (st == NF_OK) { nf_pool_destroy(p); return; } // a GPU machine
  const char *msg = nf_last_error();
  fprintf(stderr, "backend:cuda: %s\n", msg);
  static const char *const shapes[] = {"nofrag: backend:cuda: libcuda.so.1 not found: no NVIDIA driver on this machine (",
                                       "nofrag: backend:cuda: cuInit: "};
  if (strncmp(msg, shapes[0], strlen(shapes[0])) != 0 && strncmp(msg, shapes[1], strlen(shapes[1])) != 0)
    fail_msg("message shape: '%s'", msg);
  assert_null(strstr(msg + 1, "nofrag:"));
  assert_null(strstr(msg + 17, "backend:"));
}

static void test_bad_arguments(void **state) {
  (void)state;
  assert_int_equal(nf_backend_cuda_create(NULL, 0), NF_ERR_INVALID);
  nf_backend_t *be = NULL;
  nf_status_t st = nf_backend_cuda_create(&be, -1);
  assert_int_equal(st, NF_ERR_INVALID);
  assert_null(be);
  // A large ordinal: INVALID with a driver, UNSUPPORTED without one.
  st = nf_backend_cuda_create(&be, 4096);
  assert_true(st == NF_ERR_INVALID || st == NF_ERR_UNSUPPORTED);
  assert_null(be);
}

static void test_repeated_create_is_stable(void **state) {
  (void)state;
  // The driver is loaded once (pthread_once); the answer must not change.
  nf_backend_t *be = NULL;
  nf_status_t first = nf_backend_cuda_create(&be, 0);
  if (be) nf_backend_destroy(be);
  for (int i = 0; i < 3; i++) {
    be = NULL;
    assert_int_equal(nf_backend_cuda_create(&be, 0), first);
    if (be) nf_backend_destroy(be);
  }
}

static void test_stats_layout_exports(void **state) {
  (void)state;
  assert_int_equal(nf_stats_size(), sizeof(nf_stats_t));
  assert_int_equal(nf_stats_offset("live"), offsetof(nf_stats_t, live));
  assert_int_equal(nf_stats_offset("calls.map"), offsetof(nf_stats_t, calls.map));
  assert_int_equal(nf_stats_offset("backend_calls"), offsetof(nf_stats_t, backend_calls));
  assert_int_equal(nf_stats_offset("fragmentation"), offsetof(nf_stats_t, fragmentation));
  assert_int_equal(nf_stats_offset("no_such_field"), (size_t)-1);
  nf_stats_t st;
  assert_int_equal(nf_torch_stats(-1, &st), -1);
  assert_int_equal(nf_torch_stats(63, &st), 1); // no pool on that device: zeros
  assert_int_equal(st.live, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_or_unsupported),
      cmocka_unit_test(test_bad_arguments), cmocka_unit_test(test_pool_from_config_message),
      cmocka_unit_test(test_repeated_create_is_stable),
      cmocka_unit_test(test_stats_layout_exports),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
