// The working stand-in driver (fake_cuda.c): what its tests ask it beyond the
// driver's own entry points. Contexts, streams and handles are the driver's
// opaque pointers (CUcontext, CUstream, CUmemGenericAllocationHandle).
#ifndef NF_FAKE_CUDA_H
#define NF_FAKE_CUDA_H

#include <stdint.h>

#define FAKECU_MAX_DEV 8

typedef struct {
  uint64_t violations;      // calls the driver would refuse or that break a rule the fake checks (each printed)
  uint64_t unrelaxed;       // calls that may break another thread's capture, made outside relaxed capture mode
  uint64_t creates, creates_fd; // cuMemCreate that succeeded; of them, with a POSIX fd handle type
  uint64_t create_refused;  // cuMemCreate refused for the handle type (option fdK=0)
  uint64_t handles;         // physical allocations alive (created or imported, not yet freed)
  uint64_t mapped;          // bytes mapped now
  uint64_t used[FAKECU_MAX_DEV], host_used; // bytes of physical memory per location
  uint64_t records, waits, queries, syncs, copies;
} fakecu_stats_t;

// Counters since the library was loaded.
void fakecu_stats(fakecu_stats_t *out);
// Device ordinal's primary context (what cuDevicePrimaryCtxRetain gives).
void *fakecu_primary(int dev);
// A context of `dev` other than its primary one (what cuCtxCreate would make).
void *fakecu_ctx_create(int dev);
// Calls made while `ctx` was current on the calling thread (NULL: no context).
uint64_t fakecu_ctx_calls(void *ctx);
// A stream of `ctx`.
void *fakecu_stream_create(void *ctx);
// The granule at `va`: 1 and its backing memory's device (-1: host memory)
// and the devices granted access (bit per ordinal) if mapped, else 0.
int fakecu_where(uintptr_t va, int *dev, uint64_t *access);
// The calling thread's stream-capture mode (cuThreadExchangeStreamCaptureMode's).
int fakecu_capture_mode(void);

#endif
