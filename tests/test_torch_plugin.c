// The PyTorch plug-in's C entry points (src/torch/plugin.c) on the host
// backend: the edges python/tests/test_python.py does not reach (per-device
// trace paths, device ranges, several devices' pools, counters, statuses,
// per-thread errors, the thrower, the memory fraction's bounds, shutdown).
// No GPU and no torch needed: every pool here says backend:host, except the
// one test of the plug-in's default backend, which accepts both outcomes.
#include "nf_test.h"

#include "torch/torch.h"

#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1ull << 20)
#define HOST_CONF "backend:host,host_capacity:1GiB,limit:64MiB,granule:2MiB"

// Read once, when the plug-in first initialises (main sets it before any call).
#define THROW_ENV "NOFRAG_TORCH_THROW"

static int setup(void **state) {
  (void)state;
  nf_torch_set_throw(0);
  nf_torch_shutdown();
  return nf_torch_configure(HOST_CONF) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  nf_torch_set_throw(0);
  nf_torch_shutdown();
  nf_torch_configure(NULL);
  return 0;
}

static uint64_t counter(int device, int i) {
  uint64_t c[6] = {0};
  assert_int_equal(nf_torch_counters(device, c, 6), 0);
  return c[i];
}

static nf_stats_t dev_stats(int device) {
  nf_stats_t s;
  assert_int_equal(nf_torch_stats(device, &s), 0);
  return s;
}

static bool contains(const char *s, const char *needle) { return s && strstr(s, needle) != NULL; }

// A fresh temporary directory, and its removal (files and one level of subfolders).
static void tmp_dir(char dir[64]) {
  snprintf(dir, 64, "/tmp/nft_plugin_XXXXXX");
  assert_non_null(mkdtemp(dir));
}

static void rm_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[600];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (unlink(p) != 0) rm_dir(p);
  }
  closedir(d);
  rmdir(dir);
}

static void configure_trace(const char *path) {
  char conf[512];
  snprintf(conf, sizeof conf, "%s,trace:%s", HOST_CONF, path);
  nf_torch_shutdown();
  assert_int_equal(nf_torch_configure(conf), 0);
}

// ------------------------------------------------------------ initialisation

// NOFRAG_TORCH_THROW=0 (set by main before the first call) turns raising off
// from the start; nf_torch_set_throw answers the previous setting.
static void test_throw_env_and_previous_setting(void **state) {
  (void)state;
  assert_int_equal(nf_torch_set_throw(1), 0); // off, from the environment
  assert_int_equal(nf_torch_set_throw(1), 1);
  assert_int_equal(nf_torch_set_throw(0), 1);
  assert_int_equal(nf_torch_set_throw(0), 0);
}

// The thrower (c10's torchCheckFail in PyTorch; a recorder here, which
// returns) is called once per failed allocation while raising is on, never
// while it is off, never for an empty request, and with PyTorch's OOM text.
static int thrown;
static char thrown_msg[1200];
static void record_throw(const char *func, const char *file, uint32_t line, const char *msg) {
  (void)func, (void)file, (void)line;
  thrown++;
  snprintf(thrown_msg, sizeof thrown_msg, "%s", msg);
}

static void test_thrower_called_only_while_enabled(void **state) {
  (void)state;
  assert_int_equal(nf_torch_set_throw(0), 0);
  assert_int_equal(nf_torch_set_thrower((void *)record_throw), 0); // installed, but raising is off
  assert_int_equal(nf_torch_set_throw(1), 0);
  assert_int_equal(nf_torch_set_thrower(NULL), 1); // NULL keeps the one installed
  thrown = 0;
  assert_null(nf_torch_alloc(1ull << 40, 0, NULL));
  assert_int_equal(thrown, 1);
  assert_true(strncmp(thrown_msg, "CUDA out of memory (nofrag)", 27) == 0);
  assert_null(nf_torch_alloc(0, 0, NULL)); // an empty storage: NULL, no exception
  assert_null(nf_torch_alloc(0, 64, NULL)); // even where no pool can be made
  assert_int_equal(thrown, 1);
  assert_int_equal(nf_torch_set_throw(0), 1);
  assert_null(nf_torch_alloc(1ull << 40, 0, NULL));
  assert_int_equal(thrown, 1);
  assert_int_equal(nf_torch_set_thrower(NULL), 0);
}

// The plug-in's pools are CUDA pools unless the string says backend:host
// (nf_config_default's backend is host). Without a GPU the pool cannot be
// made; with one it is a CUDA pool: never silently a host pool.
static void test_default_backend_is_cuda(void **state) {
  (void)state;
  nf_torch_shutdown();
  assert_int_equal(nf_torch_configure("limit:64MiB"), 0);
  nf_pool_t *p = nf_torch_pool_get(0, 1);
  if (p) {
    char buf[1024];
    assert_true(nf_torch_config_string(0, buf, sizeof buf) > 0);
    assert_true(contains(buf, "backend:cuda"));
  } else {
    assert_true(nf_torch_last_error()[0] != 0);
  }
}

// With no nf_torch_configure string, NOFRAG_CONF configures the pools.
static void test_env_conf_when_not_configured(void **state) {
  (void)state;
  nf_torch_shutdown();
  assert_int_equal(nf_torch_configure(NULL), 0);
  setenv("NOFRAG_CONF", "backend:host,host_capacity:1GiB,limit:48MiB,granule:2MiB", 1);
  nf_pool_t *p = nf_torch_pool_get(0, 1);
  unsetenv("NOFRAG_CONF");
  assert_non_null(p);
  assert_int_equal(dev_stats(0).limit, 48 * MiB);
}

// Each device's pool is configured for its device, and "" with 0 answers
// for a device that has no pool.
static void test_config_string_per_device(void **state) {
  (void)state;
  char buf[1024] = "x";
  assert_int_equal(nf_torch_config_string(3, buf, sizeof buf), 0);
  assert_string_equal(buf, "");
  assert_non_null(nf_torch_pool_get(3, 1));
  assert_true(nf_torch_config_string(3, buf, sizeof buf) > 0);
  assert_true(contains(buf, ",device:3,"));
}

// ------------------------------------------------------------ device range

// Device 64 is out of range everywhere (the table has 64 entries): no entry
// point may read or write past it, and an allocation says NF_ERR_INVALID.
static void test_device_out_of_range(void **state) {
  (void)state;
  nf_stats_t st;
  uint64_t c[6];
  assert_null(nf_torch_pool(64));
  assert_true(contains(nf_torch_last_error(), "out of range"));
  assert_null(nf_torch_pool_get(64, 1));
  assert_int_equal(nf_torch_stats(64, &st), -1);
  assert_int_equal(nf_torch_counters(64, c, 6), -1);
  assert_true(nf_torch_get_fraction(64) == 0.0);
  assert_int_equal(nf_torch_add_peer(64, 0), -1);
  for (int dev = -1; dev <= 64; dev += 65) {
    assert_null(nf_torch_alloc(MiB, dev, NULL));
    assert_int_equal(nf_torch_last_status(), NF_ERR_INVALID);
    assert_true(contains(nf_torch_last_error(), "out of range"));
  }
}

// ------------------------------------------------------------ trace paths

// `path` configured, pools on devices 0 and `dev`: device dev's trace is `want`.
static void trace_lands(const char *path, int dev, const char *want) {
  configure_trace(path);
  assert_non_null(nf_torch_pool_get(0, 1));
  assert_non_null(nf_torch_pool_get(dev, 1));
  assert_int_equal(access(want, F_OK), 0);
}

// Device N's trace goes beside device 0's with ".devN" before the extension;
// a leading dot is not an extension and a dot in a folder's name is not one.
static void test_trace_path_names(void **state) {
  (void)state;
  char dir[64], path[256], want[300];
  tmp_dir(dir);
  snprintf(path, sizeof path, "%s/.hidden", dir);
  snprintf(want, sizeof want, "%s/.hidden.dev1", dir);
  trace_lands(path, 1, want);

  snprintf(path, sizeof path, "%s/a.b", dir);
  assert_int_equal(mkdir(path, 0700), 0);
  snprintf(path, sizeof path, "%s/a.b/job", dir);
  snprintf(want, sizeof want, "%s/a.b/job.dev2", dir);
  trace_lands(path, 2, want);
  nf_torch_shutdown();
  rm_dir(dir);
}

// A path of `len` bytes (len < NF_TRACE_PATH_MAX): dir + "/" + "t...t".
static void long_path(char *path, const char *dir, size_t len) {
  size_t d = strlen(dir);
  memset(path, 't', len);
  memcpy(path, dir, d);
  path[d] = '/';
  path[len] = 0;
}

// A path that fits only without ".devN" is refused for device N (with a
// message saying so), not truncated; one byte shorter, it fits.
static void test_trace_path_too_long(void **state) {
  (void)state;
  char dir[64], path[NF_TRACE_PATH_MAX];
  tmp_dir(dir);
  for (size_t len = NF_TRACE_PATH_MAX - 6; len <= NF_TRACE_PATH_MAX - 5; len++) {
    long_path(path, dir, len); // device 1's path is len + 5 bytes long
    configure_trace(path);
    assert_non_null(nf_torch_pool_get(0, 1));
    nf_pool_t *p1 = nf_torch_pool_get(1, 1);
    if (len + 5 < NF_TRACE_PATH_MAX) {
      assert_non_null(p1);
    } else {
      assert_null(p1);
      assert_true(contains(nf_torch_last_error(), "too long"));
      assert_null(nf_torch_alloc(MiB, 1, NULL));
      assert_int_equal(nf_torch_last_status(), NF_ERR_BACKEND);
      assert_true(contains(nf_torch_last_error(), "(not out of memory)"));
    }
  }
  nf_torch_shutdown();
  rm_dir(dir);
}

// A thread's error is its own: a pool that cannot be made replaces an older
// error of this thread.
static void test_creation_error_replaces_older_one(void **state) {
  (void)state;
  char dir[64], path[NF_TRACE_PATH_MAX];
  tmp_dir(dir);
  long_path(path, dir, NF_TRACE_PATH_MAX - 2);
  configure_trace(path); // device 0 would fit (no file needed: no pool is made here)
  assert_int_equal(nf_torch_free_any((void *)0x1000), -1);
  assert_true(contains(nf_torch_last_error(), "not a live block"));
  assert_null(nf_torch_pool_get(1, 1));
  assert_true(contains(nf_torch_last_error(), "too long"));
  nf_torch_shutdown();
  rm_dir(dir);
}

// ------------------------------------------------------------ several devices

// Counting, freeing and hooks that carry no device find the right pool:
// device 1's blocks are counted on device 1, free_any answers 1 past device
// 0's pool, and empty_cache / record_stream reach a device after one that has
// no pool.
static void test_devices_beyond_the_first(void **state) {
  (void)state;
  void *a = nf_torch_alloc(MiB, 0, NULL);
  void *b = nf_torch_alloc(3 * MiB, 1, NULL);
  void *c = nf_torch_alloc(5 * MiB, 1, NULL);
  void *e = nf_torch_alloc(2 * MiB, 3, NULL); // no pool on device 2
  assert_true(a && b && c && e);
  assert_int_equal(counter(1, 0), 8 * MiB);
  assert_int_equal(counter(1, 2), 2);
  assert_int_equal(counter(0, 0), MiB);
  assert_int_equal(counter(0, 2), 1);
  assert_int_equal(nf_torch_free_any(b), 1);
  assert_int_equal(nf_torch_last_status(), NF_OK);
  assert_int_equal(counter(1, 1), 3 * MiB);
  assert_int_equal(counter(1, 3), 1);
  nf_torch_free(c, 5 * MiB, 1, NULL);
  assert_int_equal(counter(1, 1), 8 * MiB);
  assert_int_equal(counter(1, 3), 2);
  assert_int_equal(counter(0, 3), 0);
  nf_torch_record_stream(e, (void *)9);
  assert_int_equal(nf_torch_last_status(), NF_OK);
  nf_torch_free(e, 2 * MiB, 3, NULL);
  assert_true(dev_stats(3).mapped > 0);
  nf_torch_reset(); // empty_cache: every device
  assert_int_equal(dev_stats(1).mapped, 0);
  assert_int_equal(dev_stats(3).mapped, 0);
  nf_torch_free(a, MiB, 0, NULL);
}

// ------------------------------------------------------------ statuses and counters

static void test_status_and_counters_of_failures(void **state) {
  (void)state;
  nf_torch_free_any(nf_torch_alloc(MiB, 0, NULL));
  assert_int_equal(nf_torch_last_status(), NF_OK);
  assert_int_equal(nf_torch_free_any((void *)0x1000), -1); // no pool's pointer
  assert_int_equal(nf_torch_last_status(), NF_ERR_INVALID);
  assert_null(nf_torch_alloc(1ull << 40, 0, NULL));
  assert_int_equal(nf_torch_last_status(), NF_ERR_OOM);
  void *p = nf_torch_alloc(MiB, 0, NULL); // a success clears the status
  assert_non_null(p);
  assert_int_equal(nf_torch_last_status(), NF_OK);
  // An empty request is no failure: not counted, no status.
  uint64_t ooms = counter(0, 4), pool_ooms = dev_stats(0).ooms;
  assert_null(nf_torch_alloc(0, 0, NULL));
  assert_int_equal(counter(0, 4), ooms);
  assert_int_equal(dev_stats(0).ooms, pool_ooms);
  assert_int_equal(nf_torch_last_status(), NF_OK);
  // Where no pool can be made either (device 64): still no status.
  assert_null(nf_torch_alloc(0, 64, NULL));
  assert_int_equal(nf_torch_last_status(), NF_OK);
  // A free that fails (here a double free) is no free: not counted.
  nf_torch_free(p, MiB, 0, NULL);
  assert_int_equal(counter(0, 3), 2);
  assert_int_equal(counter(0, 1), 2 * MiB);
  nf_torch_free(p, MiB, 0, NULL);
  assert_true(contains(nf_torch_last_error(), "failed"));
  assert_int_equal(counter(0, 3), 2);
  assert_int_equal(counter(0, 1), 2 * MiB);
}

// out[4] counts every failed allocation, out[5] those the fraction refused;
// only the first n values are written; a reset clears all six.
static void test_counters_layout_and_reset(void **state) {
  (void)state;
  nf_torch_set_fraction(0.0, 0);
  assert_null(nf_torch_alloc(MiB, 0, NULL));
  assert_null(nf_torch_alloc(0, 0, NULL)); // empty: neither refused nor counted
  nf_torch_set_fraction(0.5, 0);
  assert_null(nf_torch_alloc(1ull << 40, 0, NULL));
  uint64_t c[8] = {7, 7, 7, 7, 7, 7, 7, 7};
  assert_int_equal(nf_torch_counters(0, c, 2), 0);
  assert_int_equal(c[2], 7);
  assert_int_equal(nf_torch_counters(0, c, 8), 0);
  assert_int_equal(c[4], 2);
  assert_int_equal(c[5], 1);
  assert_int_equal(c[6], 7);
  nf_torch_reset_counters(0);
  assert_int_equal(nf_torch_counters(0, c, 6), 0);
  for (int i = 0; i < 6; i++) assert_int_equal(c[i], 0);
}

// A checkpoint's block re-created at its address counts as an allocation.
static void test_alloc_at_is_counted(void **state) {
  (void)state;
  nf_pool_t *pool = nf_torch_pool_get(0, 1);
  assert_non_null(pool);
  assert_int_equal(nf_private_incref(pool, 5), NF_OK);
  void *p = nf_torch_alloc_private(3 * MiB, 0, NULL, 5);
  assert_non_null(p);
  nf_torch_free(p, 3 * MiB, 0, NULL);
  assert_int_equal(counter(0, 2), 1);
  assert_ptr_equal(nf_torch_alloc_at(0, 5, p, 3 * MiB, NULL), p);
  assert_int_equal(counter(0, 2), 2);
  assert_int_equal(counter(0, 0), 6 * MiB);
  nf_torch_free(p, 3 * MiB, 0, NULL);
  assert_int_equal(nf_private_release(pool, 5), NF_OK);
}

// The host backend has no peers: the grant fails, and says so.
static void test_add_peer_failure(void **state) {
  (void)state;
  assert_int_equal(nf_torch_add_peer(0, 1), -1);
  assert_true(contains(nf_torch_last_error(), "peer access"));
}

// ------------------------------------------------------------ memory fraction

static void test_fraction_bounds(void **state) {
  (void)state;
  void *p = nf_torch_alloc(16 * MiB, 0, NULL); // the backend's free memory is now below its total
  assert_non_null(p);
  nf_torch_set_fraction(0.25, 0); // of the total, as PyTorch computes it
  assert_int_equal(nf_torch_last_status(), NF_OK);
  assert_int_equal(dev_stats(0).limit, 256 * MiB);
  nf_torch_set_fraction(1.0, 0); // the whole device is allowed
  assert_int_equal(nf_torch_last_status(), NF_OK);
  assert_true(nf_torch_get_fraction(0) == 1.0);
  assert_int_equal(dev_stats(0).limit, 1024 * MiB);
  nf_torch_set_fraction(NAN, 0);
  assert_int_equal(nf_torch_last_status(), NF_ERR_INVALID);
  assert_true(nf_torch_get_fraction(0) == 1.0);
  nf_torch_free(p, 16 * MiB, 0, NULL);
  nf_torch_set_fraction(2.0 / 1024.0, 0); // exactly one granule: allowed
  assert_int_equal(nf_torch_last_status(), NF_OK);
  assert_int_equal(dev_stats(0).limit, 2 * MiB);
  p = nf_torch_alloc(MiB, 0, NULL);
  assert_non_null(p);
  nf_torch_free(p, MiB, 0, NULL);
}

// ------------------------------------------------------------ host placement

// nf_torch_set_host_alloc(n): blocks of n bytes and more go to host memory.
static void test_host_alloc_threshold_inclusive(void **state) {
  (void)state;
  assert_int_equal(nf_torch_set_host_alloc(4 * MiB), 0);
  void *p = nf_torch_alloc(4 * MiB, 0, NULL);
  void *q = nf_torch_alloc(4 * MiB - 512, 0, NULL);
  assert_int_equal(nf_torch_set_host_alloc(0), 4 * MiB);
  assert_true(p && q);
  uint64_t t[3];
  nft_tiers(nf_torch_pool(0), p, t);
  assert_int_equal(t[1], 4 * MiB);
  nft_tiers(nf_torch_pool(0), q, t);
  assert_int_equal(t[1], 0);
  nf_torch_free(p, 4 * MiB, 0, NULL);
  nf_torch_free(q, 4 * MiB - 512, 0, NULL);
}

// ------------------------------------------------------------ shutdown

// Shutdown forgets a device's fraction and refusal, and gives back the
// backends (their memfds).
static void test_shutdown_forgets_everything(void **state) {
  (void)state;
  int fds = nft_open_fds();
  void *p = nf_torch_alloc(MiB, 0, NULL);
  void *q = nf_torch_alloc(MiB, 1, NULL);
  assert_true(p && q);
  assert_true(nft_open_fds() > fds);
  nf_torch_set_fraction(0.0, 0);
  nf_torch_shutdown();
  assert_int_equal(nft_open_fds(), fds);
  assert_true(nf_torch_get_fraction(0) == 1.0);
  assert_int_equal(nf_torch_configure(HOST_CONF), 0);
  p = nf_torch_alloc(MiB, 0, NULL);
  assert_non_null(p);
  nf_torch_free(p, MiB, 0, NULL);
}

// ------------------------------------------------------------ errors per thread

static void *fail_free(void *arg) {
  nf_torch_free_any(arg);
  return contains(nf_torch_last_error(), "0x2000") ? arg : NULL;
}

static void *read_error(void *arg) {
  (void)arg;
  return contains(nf_torch_last_error(), "0x2000") ? (void *)1 : NULL;
}

// nf_torch_last_error answers this thread's own last error, or else the
// process's latest one (another thread's).
static void test_errors_are_per_thread(void **state) {
  (void)state;
  nf_torch_free_any((void *)0x1000);
  pthread_t t;
  void *r = NULL;
  assert_int_equal(pthread_create(&t, NULL, fail_free, (void *)0x2000), 0);
  pthread_join(t, &r);
  assert_non_null(r);
  assert_true(contains(nf_torch_last_error(), "0x1000"));
  assert_int_equal(pthread_create(&t, NULL, read_error, NULL), 0); // no error of its own
  pthread_join(t, &r);
  assert_non_null(r);
}

int main(void) {
  setenv(THROW_ENV, "0", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_throw_env_and_previous_setting),
      cmocka_unit_test_setup_teardown(test_thrower_called_only_while_enabled, setup, teardown),
      cmocka_unit_test_setup_teardown(test_default_backend_is_cuda, setup, teardown),
      cmocka_unit_test_setup_teardown(test_env_conf_when_not_configured, setup, teardown),
      cmocka_unit_test_setup_teardown(test_config_string_per_device, setup, teardown),
      cmocka_unit_test_setup_teardown(test_device_out_of_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_trace_path_names, setup, teardown),
      cmocka_unit_test_setup_teardown(test_trace_path_too_long, setup, teardown),
      cmocka_unit_test_setup_teardown(test_creation_error_replaces_older_one, setup, teardown),
      cmocka_unit_test_setup_teardown(test_devices_beyond_the_first, setup, teardown),
      cmocka_unit_test_setup_teardown(test_status_and_counters_of_failures, setup, teardown),
      cmocka_unit_test_setup_teardown(test_counters_layout_and_reset, setup, teardown),
      cmocka_unit_test_setup_teardown(test_alloc_at_is_counted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_add_peer_failure, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fraction_bounds, setup, teardown),
      cmocka_unit_test_setup_teardown(test_host_alloc_threshold_inclusive, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shutdown_forgets_everything, setup, teardown),
      cmocka_unit_test_setup_teardown(test_errors_are_per_thread, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
