// The GPU test's shared parts (declared in cuda_test.h): driver symbols,
// check counters, pattern helpers.
#include "cuda_test.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
CUresult (*cuStreamCreate)(CUstream *, unsigned);
CUresult (*cuCtxCreate)(void **, unsigned, int);
CUresult (*cuCtxDestroy)(void *);
CUresult (*cuStreamSynchronize)(CUstream);
CUresult (*cuStreamDestroy)(CUstream);
CUresult (*cuCtxSynchronize)(void);
CUresult (*cuDeviceGetCount)(int *);
CUresult (*cuDeviceGet)(int *, int);
CUresult (*cuDeviceCanAccessPeer)(int *, int, int);
CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
CUresult (*cuDevicePrimaryCtxRelease)(int);
CUresult (*cuCtxSetCurrent)(void *);
CUresult (*cuCtxGetCurrent)(void **);
CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
CUresult (*cuStreamBeginCapture)(CUstream, int);
CUresult (*cuStreamEndCapture)(CUstream, void **);
CUresult (*cuGraphDestroy)(void *);
CUresult (*cuThreadExchangeStreamCaptureMode)(int *);

int failures, checks;
FILE *jout;

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) { printf("SKIP: libcuda.so.1 lacks %s\n", name); exit(77); }
  return p;
}

void cuda_test_load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
  cuMemcpyHtoD = sym(lib, "cuMemcpyHtoD_v2");
  cuMemcpyDtoH = sym(lib, "cuMemcpyDtoH_v2");
  cuMemsetD32Async = sym(lib, "cuMemsetD32Async");
  cuStreamCreate = sym(lib, "cuStreamCreate");
  cuStreamSynchronize = sym(lib, "cuStreamSynchronize");
  cuStreamDestroy = sym(lib, "cuStreamDestroy_v2");
  cuCtxSynchronize = sym(lib, "cuCtxSynchronize");
  cuDeviceGetCount = sym(lib, "cuDeviceGetCount");
  cuDeviceGet = sym(lib, "cuDeviceGet");
  cuDeviceCanAccessPeer = sym(lib, "cuDeviceCanAccessPeer");
  cuDevicePrimaryCtxRetain = sym(lib, "cuDevicePrimaryCtxRetain");
  cuDevicePrimaryCtxRelease = sym(lib, "cuDevicePrimaryCtxRelease_v2");
  cuCtxSetCurrent = sym(lib, "cuCtxSetCurrent");
  cuCtxGetCurrent = sym(lib, "cuCtxGetCurrent");
  cuMemcpyDtoD = sym(lib, "cuMemcpyDtoD_v2");
  cuCtxCreate = sym(lib, "cuCtxCreate_v2");
  cuCtxDestroy = sym(lib, "cuCtxDestroy_v2");
  cuStreamBeginCapture = sym(lib, "cuStreamBeginCapture_v2");
  cuStreamEndCapture = sym(lib, "cuStreamEndCapture");
  cuGraphDestroy = sym(lib, "cuGraphDestroy");
  cuThreadExchangeStreamCaptureMode = sym(lib, "cuThreadExchangeStreamCaptureMode");
}

double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

void pattern(uint32_t *h, size_t words, uint32_t tag) {
  for (size_t i = 0; i < words; i++) h[i] = (uint32_t)(tag * 2654435761u) ^ (uint32_t)i;
}
int verify(const uint32_t *h, size_t words, uint32_t tag) {
  for (size_t i = 0; i < words; i++)
    if (h[i] != ((uint32_t)(tag * 2654435761u) ^ (uint32_t)i)) return 0;
  return 1;
}

uint32_t *hbuf;
static size_t hbuf_words;
void hreserve(size_t bytes) {
  if (bytes / 4 > hbuf_words) { hbuf_words = bytes / 4; hbuf = realloc(hbuf, hbuf_words * 4); }
}
void dev_fill(uintptr_t d, size_t bytes, uint32_t tag) {
  hreserve(bytes);
  pattern(hbuf, bytes / 4, tag);
  DRV(cuMemcpyHtoD((CUdeviceptr)d, hbuf, bytes));
}
int dev_check(uintptr_t d, size_t bytes, uint32_t tag) {
  hreserve(bytes);
  memset(hbuf, 0, bytes);
  if (cuMemcpyDtoH(hbuf, (CUdeviceptr)d, bytes) != 0) return 0;
  return verify(hbuf, bytes / 4, tag);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
uint64_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

// One step of the random workload the pool sections share (up to 64 live
// blocks): allocate and fill (a large block, 1..big_mib MiB, one time in
// big_every, else up to small_max bytes), or check and free a random one.
// When granules moved since *moved (the counter `moved_of` reads), every
// live block is checked. Failed checks add to *bad, OOMs to *ooms.
void live_step(nf_pool_t *pool, live_t *L, int *n, uint32_t *tag, int big_every, int big_mib, size_t small_max,
               uint64_t (*moved_of)(const nf_stats_t *), uint64_t *moved, int *ooms, int *bad) {
  if (*n == 0 || (*n < 64 && rnd() % 100 < 55)) {
    size_t sz = rnd() % (uint64_t)big_every == 0 ? (size_t)(1 + rnd() % (uint64_t)big_mib) << 20
                                                 : (size_t)(512 + rnd() % small_max);
    sz &= ~(size_t)3;
    void *p = nf_alloc(pool, sz, NULL);
    if (!p) {
      ++*ooms;
      CHECK(nf_last_status() == NF_ERR_OOM, "alloc failed: %s", nf_last_error());
      return;
    }
    L[*n] = (live_t){(uintptr_t)p, sz, (*tag)++};
    dev_fill(L[*n].p, sz, L[*n].tag);
    ++*n;
    nf_stats_t st;
    nf_stats_get(pool, &st);
    if (moved_of(&st) != *moved) { // granules moved or units went: everything live must be intact
      *moved = moved_of(&st);
      for (int i = 0; i < *n; i++) *bad += !dev_check(L[i].p, L[i].n, L[i].tag);
    }
  } else {
    int i = (int)(rnd() % (uint64_t)*n);
    *bad += !dev_check(L[i].p, L[i].n, L[i].tag);
    CHECK(nf_free(pool, (void *)L[i].p) == NF_OK, "free: %s", nf_last_error());
    L[i] = L[--*n];
  }
}

