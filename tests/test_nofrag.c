// The public layer that assembles a pool (src/nofrag.c): nf_pool_create /
// _from_string / nf_pool_destroy, which build every pool of the C API, the
// PyTorch plug-in and the Python package: what a caller sees when they fail
// (the status, *out, one message) and what they give back.
#include "nf_test.h"

#define MiB (1ull << 20)

static bool contains(const char *s, const char *needle) { return s && strstr(s, needle) != NULL; }

// NULL reads NOFRAG_CONF; success leaves no stale error behind.
static void test_pool_from_env_and_error_cleared(void **state) {
  (void)state;
  nf_pool_t *p = (nf_pool_t *)1;
  assert_int_equal(nf_pool_create_from_string(&p, "backend:host,no_such_key:1"), NF_ERR_CONFIG);
  assert_null(p);
  assert_true(nf_last_error()[0] != 0);
  setenv("NOFRAG_CONF", "backend:host,host_capacity:256MiB,limit:40MiB,granule:2MiB", 1);
  nf_status_t st = nf_pool_create_from_string(&p, NULL);
  unsetenv("NOFRAG_CONF");
  assert_int_equal(st, NF_OK);
  assert_string_equal(nf_last_error(), "");
  assert_int_equal(nf_last_status(), NF_OK);
  assert_int_equal(nft_stats_of(p).limit, 40 * MiB);
  nf_pool_destroy(p);
  nf_pool_destroy(NULL); // a no-op
  nf_backend_t *be = NULL;
  assert_int_equal(nf_backend_host_create(&be, 64 * MiB, 2 * MiB), NF_OK);
  p = (nf_pool_t *)1;
  assert_int_equal(nf_pool_create(&p, be, NULL), NF_ERR_INVALID); // a NULL argument: refused, no crash
  assert_null(p); // *out cleared on every failure
  assert_int_equal(nf_pool_create_from_string(NULL, "backend:host"), NF_ERR_INVALID);
  nf_backend_destroy(be);
  // A backend that cannot be made: its message, with one "nofrag: " prefix.
  assert_int_equal(nf_pool_create_from_string(&p, "backend:host,host_capacity:1MiB,granule:2MiB"), NF_ERR_CONFIG);
  assert_null(p);
  assert_true(contains(nf_last_error(), "nofrag: backend:host: host_capacity 1048576 B is below"));
  assert_false(contains(nf_last_error(), "nofrag: nofrag:"));
  assert_false(contains(nf_last_error(), ": nofrag: "));
}

// A pool that cannot be made (its trace file cannot be opened, after its
// reserve was created) leaves *out NULL and gives everything back, the
// backend it made included; a pool destroyed gives back the backend it owns.
static void test_pool_create_failure_and_destroy_give_back(void **state) {
  (void)state;
  int fds = nft_open_fds();
  nf_pool_t *p = (nf_pool_t *)1;
  nf_status_t st = nf_pool_create_from_string(&p, "backend:host,host_capacity:256MiB,limit:16MiB,granule:2MiB,"
                                                  "reserve:4MiB,trace:/nonexistent/nft/t.csv");
  assert_int_not_equal(st, NF_OK);
  assert_null(p);
  assert_true(contains(nf_last_error(), "/nonexistent/nft/t.csv"));
  assert_int_equal(nft_open_fds(), fds);
  assert_int_equal(nf_pool_create_from_string(&p, "backend:host,host_capacity:256MiB,limit:16MiB,granule:2MiB"), NF_OK);
  void *a = nf_alloc(p, 3 * MiB, NULL);
  assert_non_null(a);
  assert_true(nft_open_fds() > fds);
  assert_int_equal(nf_free(p, a), NF_OK);
  nf_pool_destroy(p);
  assert_int_equal(nft_open_fds(), fds);
}

// The out-of-memory report is printed (NOFRAG_QUIET_OOM unset) without harm.
static void test_pool_oom_report_printed(void **state) {
  (void)state;
  const char *q = getenv("NOFRAG_QUIET_OOM");
  char quiet[16] = "";
  if (q) snprintf(quiet, sizeof quiet, "%s", q);
  unsetenv("NOFRAG_QUIET_OOM");
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create_from_string(&p, "backend:host,host_capacity:256MiB,limit:8MiB,granule:2MiB"), NF_OK);
  assert_null(nf_alloc(p, 64 * MiB, NULL));
  assert_int_equal(nf_last_status(), NF_ERR_OOM);
  assert_true(contains(nf_last_oom_report(), "suggestion: "));
  nf_pool_destroy(p);
  if (q) setenv("NOFRAG_QUIET_OOM", quiet, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_from_env_and_error_cleared),
      cmocka_unit_test(test_pool_create_failure_and_destroy_give_back),
      cmocka_unit_test(test_pool_oom_report_printed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
