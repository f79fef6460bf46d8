// GPU test (see test_cuda.c): the waits a tier makes for its own copies fail
// while those copies really are still queued. The stream the operation is
// given is held by cuStreamWaitValue32 on a host word, so every copy an
// offload or prefetch queues on it stays pending until the test releases it.
// The operation's last call (its event record) and the next 3 (the records of
// the wait its failure path makes, 3 tries) fail (fault backend); what comes
// after, the rollback's unmaps included, succeeds. The memory the pending copies read
// and write must not be unmapped, nor handed to another block, before they
// ran: on release they would fault (illegal address: the context is lost) or
// write into the other block. Then the block must hold its data, wherever it
// ends, and everything held for the copies goes back at the next wait.
// tests/test_fault_wait.c is the CPU version (every call, every tier).
#include "cuda_test.h"

#include <dlfcn.h>
#include <string.h>

static CUresult (*wait_value32)(CUstream, CUdeviceptr, unsigned, unsigned);
static CUresult (*host_alloc)(void **, size_t, unsigned);
static CUresult (*host_dev_ptr)(CUdeviceptr *, void *, unsigned);
static CUresult (*host_free)(void *);

static int load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) return 0;
  wait_value32 = (CUresult(*)(CUstream, CUdeviceptr, unsigned, unsigned))dlsym(lib, "cuStreamWaitValue32_v2");
  if (!wait_value32) wait_value32 = (CUresult(*)(CUstream, CUdeviceptr, unsigned, unsigned))dlsym(lib, "cuStreamWaitValue32");
  host_alloc = (CUresult(*)(void **, size_t, unsigned))dlsym(lib, "cuMemHostAlloc");
  host_dev_ptr = (CUresult(*)(CUdeviceptr *, void *, unsigned))dlsym(lib, "cuMemHostGetDevicePointer_v2");
  host_free = (CUresult(*)(void *))dlsym(lib, "cuMemFreeHost");
  return wait_value32 && host_alloc && host_dev_ptr && host_free;
}

enum { OFF_HOST, OFF_DETACHED, PRE_HOST, PRE_DETACHED, KINDS };
static const char *kind_name[KINDS] = {"offload host", "offload detached", "prefetch host", "prefetch detached"};
#define BLK (32u << 20)

// One run of kind k. fail 0: the reference (counts the operation's calls in
// *ncalls); else its last call and the 3 after it fail, with S held.
static void wait_run(nf_backend_t *fb, int k, uint64_t fail, uint64_t *ncalls, volatile uint32_t *flag,
                     CUdeviceptr dflag, int *faults) {
  nf_config_t cfg;
  char err[256];
  nf_config_default(&cfg);
  OKP(nf_config_parse(&cfg, "limit:256MiB,views:0,release_threshold:never", err, sizeof err));
  nf_pool_t *p = NULL;
  OKP(nf_pool_create(&p, fb, &cfg));
  if (!p) return;
  CUstream S = NULL;
  DRV(cuStreamCreate(&S, 1));
  nf_tier_t tier = k == OFF_HOST || k == PRE_HOST ? NF_TIER_HOST : NF_TIER_HOST_DETACHED;
  void *a = nf_alloc(p, BLK, NULL);
  CHECK(a != NULL, "alloc: %s", nf_last_error());
  if (!a) { nf_pool_destroy(p); return; }
  dev_fill((uintptr_t)a, BLK, 70 + (uint32_t)k);
  if (k >= PRE_HOST) {
    OKP(nf_offload(p, a, NULL, tier));
    OKP(nf_offload_wait(p));
  }
  uint64_t before, failed, after;
  nf_backend_fault_counts(fb, &before, &failed);
  if (fail) {
    *flag = 0;
    __sync_synchronize();
    DRV(wait_value32(S, dflag, 1, 0)); // CU_STREAM_WAIT_VALUE_GEQ: S runs nothing until *flag >= 1
    nf__backend_fault_mask(fb, before + fail, 0xF);
  }
  nf_status_t r = k < PRE_HOST ? nf_offload(p, a, S, tier) : nf_prefetch(p, a, S);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", r ? nf_last_error() : "");
  nf_backend_fault_counts(fb, &after, &failed);
  nf_backend_fault_set(fb, 0, 0);
  *ncalls = after - before;
  CHECK(fail || r == NF_OK, "%s reference: %s", kind_name[k], msg);
  // Another block takes what lies free: not what the pending copies use.
  // (No trim here: it waits for S, which is held.)
  void *c = nf_alloc(p, 2 * BLK, NULL);
  if (c) dev_fill((uintptr_t)c, 2 * BLK, 90);
  *flag = 1;
  __sync_synchronize();
  CUresult sr = cuStreamSynchronize(S), cr = cuCtxSynchronize();
  CHECK(sr == 0 && cr == 0, "%s, failing from call %llu (%s): the released copies failed: stream %d, context %d",
        kind_name[k], (unsigned long long)fail, msg, sr, cr);
  if (sr || cr) { // the context is lost: nothing more can run on it
    *faults += 1;
    return;
  }
  OKP(nf_offload_wait(p));
  OKP(nf_trim(p));
  if (c) CHECK(dev_check((uintptr_t)c, 2 * BLK, 90), "%s: the other block was overwritten", kind_name[k]);
  uint64_t tb[3] = {0};
  OKP(nf_block_tiers(p, a, tb));
  if (tb[NF_TIER_HOST]) OKP(nf_prefetch(p, a, NULL));
  DRV(cuCtxSynchronize());
  CHECK(dev_check((uintptr_t)a, BLK, 70 + (uint32_t)k), "%s, failing from call %llu (%s -> %s): block lost its data",
        kind_name[k], (unsigned long long)fail, nf_status_str(r), msg);
  if (fail) printf("   %-17s record and waits failed -> %s; released copies ran, block intact%s\n", kind_name[k],
                   r == NF_OK ? "completed in stream order" : "error, rolled back", r ? "" : " (on the device)");
  OKP(nf_free(p, a));
  if (c) OKP(nf_free(p, c));
  OKP(nf_offload_wait(p));
  CHECK(nf_pool_check(p) == NF_OK, "%s: pool_check: %s", kind_name[k], nf_last_error());
  nf_pool_destroy(p);
  DRV(cuStreamDestroy(S));
}

// `inner`: a CUDA backend of its own, owned by the fault wrapper.
void test_pool_wait_faults(nf_backend_t *inner) {
  printf("-- pool: an offload's or prefetch's waits fail while its copies are held on the stream\n");
  nf_backend_t *fb = NULL;
  nf_status_t st = nf_backend_fault_create(&fb, inner, 0, 0, 1);
  CHECK(st == NF_OK, "fault backend: %s", nf_last_error());
  if (st != NF_OK) { nf_backend_destroy(inner); return; }
  if (!load()) {
    printf("   skipped: the driver lacks cuStreamWaitValue32 or cuMemHostAlloc\n");
    nf_backend_destroy(fb);
    return;
  }
  uint32_t *flag = NULL;
  CUdeviceptr dflag = 0;
  DRV(host_alloc((void **)&flag, 64, 0x1 | 0x2)); // CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP
  if (flag) DRV(host_dev_ptr(&dflag, flag, 0));
  int faults = 0;
  for (int k = 0; k < KINDS && flag && dflag && !faults; k++) {
    uint64_t n = 0, m = 0;
    wait_run(fb, k, 0, &n, flag, dflag, &faults);
    if (n) wait_run(fb, k, n, &m, flag, dflag, &faults);
  }
  fprintf(jout, "\"wait_faults\": {\"context_lost\": %d},\n", faults);
  if (flag) host_free(flag);
  if (!faults) nf_backend_destroy(fb);
}
