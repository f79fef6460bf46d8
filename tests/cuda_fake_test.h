// The stand-in driver's tests (test_cuda_fake.c, test_cuda_fake_streams.c):
// the driver entry points they call themselves, their setup / teardown
// (the stand-in's counters checked from each test's start), pools on a
// device, and where a block's granules are backed.
#ifndef NF_CUDA_FAKE_TEST_H
#define NF_CUDA_FAKE_TEST_H

#include "nf_test.h"

#include "backend/backend.h"
#include "fake_cuda/fake_cuda.h"

#define MiB (1ull << 20)
#define G (2 * MiB)
#define FAKE "devices=2,mem=128"

// The driver entry points the tests call themselves (the stand-in's).
int cuCtxSetCurrent(void *ctx);
int cuCtxGetCurrent(void **ctx);
int cuThreadExchangeStreamCaptureMode(int *mode);
int cuMemcpyAsync(uintptr_t dst, uintptr_t src, size_t n, void *stream);
int cuStreamDestroy_v2(void *stream);
int cuStreamCreate(void **stream, unsigned flags);
int cuStreamSynchronize(void *stream);
int cuStreamWaitValue32_v2(void *stream, uintptr_t addr, unsigned value, unsigned flags);
int cuMemsetD32Async(uintptr_t dst, unsigned value, size_t words, void *stream);
int cuCtxDestroy_v2(void *ctx);

// A copy of the test's own, in relaxed capture mode as the library's are.
static inline int copy(void *dst, const void *src, size_t n, void *stream) {
  int mode = 2;
  assert_int_equal(cuThreadExchangeStreamCaptureMode(&mode), 0);
  int r = cuMemcpyAsync((uintptr_t)dst, (uintptr_t)src, n, stream);
  assert_int_equal(cuThreadExchangeStreamCaptureMode(&mode), 0);
  return r;
}

static inline void *current(void) {
  void *c = (void *)1;
  assert_int_equal(cuCtxGetCurrent(&c), 0);
  return c;
}

static inline fakecu_stats_t fstats(void) {
  fakecu_stats_t s;
  fakecu_stats(&s);
  return s;
}

static fakecu_stats_t at_setup; // the stand-in's counters when the test began
static uint64_t expected;        // violations the test provokes on purpose

static inline int setup(void **state) {
  (void)state;
  setenv("NF_FAKE_CUDA", FAKE, 1);
  at_setup = fstats();
  expected = 0;
  return cuCtxSetCurrent(NULL);
}

// Nothing the driver would refuse but what the test provoked, no call out of
// relaxed capture mode, and every handle and mapping given back (each test
// ends with its pools destroyed). Counted from the test's start, so that one
// failure does not fail the tests after it.
static inline int teardown(void **state) {
  (void)state;
  fakecu_stats_t s = fstats();
  uint64_t v = s.violations - at_setup.violations, u = s.unrelaxed - at_setup.unrelaxed;
  if (v != expected || u || s.handles != at_setup.handles || s.mapped != at_setup.mapped) {
    fprintf(stderr, "stand-in driver: %llu violations (%llu provoked), %llu unrelaxed calls, %lld handles, %lld B mapped left\n",
            (unsigned long long)v, (unsigned long long)expected, (unsigned long long)u,
            (long long)(s.handles - at_setup.handles), (long long)(s.mapped - at_setup.mapped));
    return -1;
  }
  return 0;
}

// A pool on `dev` over an unbound backend (the PyTorch plug-in's way), at `limit`.
static inline nf_pool_t *pool_on(int dev, uint64_t limit, const char *conf, nf_backend_t **be) {
  assert_int_equal(nf__backend_cuda_open(be, dev, false), NF_OK);
  nf_config_t c = conf ? nft_conf_ok(conf) : nft_conf_default();
  c.limit = limit;
  c.device = dev;
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, *be, &c), NF_OK);
  return p;
}

static inline void pool_off(nf_pool_t *p, nf_backend_t *be) {
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// Every granule of [a, a + n) is backed on `dev` (-1: host) or, with dev -2,
// anywhere, and granted to each device of `need`.
static inline void backed(const void *a, size_t n, int dev, uint64_t need) {
  for (uintptr_t v = (uintptr_t)a & ~(uintptr_t)(G - 1); v < (uintptr_t)a + n; v += G) {
    int d = -3;
    uint64_t acc = 0;
    if (!fakecu_where(v, &d, &acc)) fail_msg("granule %#lx of a live block is not mapped", (unsigned long)v);
    if (dev != -2 && d != dev) fail_msg("granule %#lx is backed on %d, not %d", (unsigned long)v, d, dev);
    if ((acc & need) != need) fail_msg("granule %#lx grants %#llx, not %#llx", (unsigned long)v, (unsigned long long)acc,
                                       (unsigned long long)need);
  }
}

#endif
