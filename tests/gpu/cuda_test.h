// Shared by the GPU test's files (tests/gpu/*.c, one program; see
// test_cuda.c for how it is built): the driver calls the test makes itself,
// the check counters and macros, and the data-pattern helpers.
#ifndef NF_CUDA_TEST_H
#define NF_CUDA_TEST_H

#include "backend/backend.h"
#include "nofrag.h"

#include <stdint.h>
#include <stdio.h>

// The driver, for what the backend does not do: host<->device copies,
// memsets, streams, peer contexts. Filled by cuda_test_load().
typedef int CUresult;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;
extern CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
extern CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
extern CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
extern CUresult (*cuStreamCreate)(CUstream *, unsigned);
extern CUresult (*cuStreamSynchronize)(CUstream);
extern CUresult (*cuStreamDestroy)(CUstream);
extern CUresult (*cuCtxSynchronize)(void);
extern CUresult (*cuDeviceGetCount)(int *);
extern CUresult (*cuDeviceGet)(int *, int);
extern CUresult (*cuDeviceCanAccessPeer)(int *, int, int);
extern CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
extern CUresult (*cuDevicePrimaryCtxRelease)(int);
extern CUresult (*cuCtxSetCurrent)(void *);
extern CUresult (*cuCtxGetCurrent)(void **);
extern CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
extern CUresult (*cuCtxCreate)(void **, unsigned, int); // cuCtxCreate_v2
extern CUresult (*cuCtxDestroy)(void *);
extern CUresult (*cuStreamBeginCapture)(CUstream, int); // cuStreamBeginCapture_v2; mode 0: global
extern CUresult (*cuStreamEndCapture)(CUstream, void **);
extern CUresult (*cuGraphDestroy)(void *);
extern CUresult (*cuThreadExchangeStreamCaptureMode)(int *); // 0 global, 1 thread-local, 2 relaxed
// Load the calls above from libcuda.so.1; exits 77 (skip) if one is missing.
void cuda_test_load(void);

extern int failures, checks;
extern FILE *jout; // the JSON results file
#define CHECK(cond, ...)                                                              \
  do {                                                                                \
    checks++;                                                                         \
    if (!(cond)) {                                                                    \
      failures++;                                                                     \
      printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                          \
      printf(__VA_ARGS__);                                                            \
      printf("\n");                                                                   \
    }                                                                                 \
  } while (0)
#define DRV(call) CHECK((call) == 0, "driver call %s failed", #call)
// OKB: a backend op (message in nf__backend_err()); OKP: a pool/config call (nf_last_error).
#define OKB(call) do { nf_status_t s_ = (call); CHECK(s_ == NF_OK, "%s -> %s: %s", #call, nf_status_str(s_), nf__backend_err()); } while (0)
#define OKP(call) do { nf_status_t s_ = (call); CHECK(s_ == NF_OK, "%s -> %s: %s", #call, nf_status_str(s_), nf_last_error()); } while (0)

double now_us(void);
// Host buffer <-> pattern of (tag, word index).
void pattern(uint32_t *h, size_t words, uint32_t tag);
int verify(const uint32_t *h, size_t words, uint32_t tag);
// A host staging buffer of at least `bytes` (hbuf, grown by hreserve).
extern uint32_t *hbuf;
void hreserve(size_t bytes);
// Write / check a pattern over a device range (whole range; sizes here are small).
void dev_fill(uintptr_t d, size_t bytes, uint32_t tag);
int dev_check(uintptr_t d, size_t bytes, uint32_t tag);

typedef struct { uintptr_t p; size_t n; uint32_t tag; } live_t;
uint64_t rnd(void); // xorshift64, one sequence for the whole program
// One step of the pool sections' random workload (cuda_util.c).
void live_step(nf_pool_t *pool, live_t *L, int *n, uint32_t *tag, int big_every, int big_mib, size_t small_max,
               uint64_t (*moved_of)(const nf_stats_t *), uint64_t *moved, int *ooms, int *bad);

// The sections in the other files, run by main (test_cuda.c).
void test_pool_foreign_thread(nf_backend_t *be);
void test_plugin_pool_unbound(void);
void test_pool_foreign_stream(nf_backend_t *be);
void test_pool_peers(nf_backend_t *be);
void test_pool_units(nf_backend_t *be);
void test_pool_many_streams(nf_backend_t *be);
void test_pool_streams_live(nf_backend_t *be);
void test_pool_route_in_capture(nf_backend_t *be);
void test_pool_foreign_capture(nf_backend_t *be);
void test_pool_spill_offload(nf_backend_t *be);
void test_pool_edges(nf_backend_t *be);
void test_pool_backend_faults(nf_backend_t *inner); // owns inner (a CUDA backend of its own)
void test_pool_wait_faults(nf_backend_t *inner);    // likewise

#endif
