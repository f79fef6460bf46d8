// Could nofrag map in the background? At a tight limit the pool's cost is the
// driver's VMM calls (~26 us of set access per one-granule mapping, ~19 us per
// unmap: bench/gpu/vmm_cost.c), all on the thread that allocates. A worker
// thread could make them while the allocating thread goes on launching work,
// the allocation's stream held back by a wait on a flag in pinned host memory
// (cuStreamWaitValue64) that the worker sets when the mapping is done. That is
// worth building only if (1) the worker's VMM calls do not stall the launching
// thread (a shared driver lock would serialize them), (2) VMM calls keep their
// speed while the GPU is busy, and (3) a stream wait on a host flag works and
// is released promptly. This program measures the three; one JSON object.
// Runs 27-28 answered: (1) no, (2) yes, and the GPU loses only ~3% to them, (3)
// yes, but (4) memsets and copies are refused when queued on a range that is
// not mapped, or mapped without access yet. So a block's mapping and access
// must be done before nf_alloc returns; the async version was removed
// (docs/design.md, "Mapping on another thread: tried, removed").
//
//   gcc -std=c11 -O2 -D_GNU_SOURCE -I/usr/local/cuda/include bench/gpu/async_map.c
//       -L/usr/local/cuda/lib64/stubs -lcuda -lpthread -o build/async_map && ./build/async_map
//
// Exit status 77 without a GPU.
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(call)                                                                             \
  do {                                                                                       \
    CUresult r_ = (call);                                                                    \
    if (r_ != CUDA_SUCCESS) {                                                                \
      const char *m_ = "?";                                                                  \
      cuGetErrorString(r_, &m_);                                                             \
      fprintf(stderr, "%s failed: %d %s\n", #call, (int)r_, m_);                              \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

#define LAUNCHES 4000 // memsets per launch phase
#define SLOTS 64      // one-granule mappings cycled by the worker

static CUcontext ctx;
static CUdevice dev;
static size_t G;
static CUdeviceptr va;
static CUmemGenericAllocationHandle hs[SLOTS];
static CUmemAccessDesc acc;
static atomic_bool stop;
static atomic_long cycles;
static double vmm_ns; // worker: total time in map+set_access+unmap

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}
static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

// Map, set access and unmap the SLOTS granules one by one, over and over
// (what a background mapper does at a tight limit), until told to stop.
static void *worker(void *arg) {
  long max = (long)(intptr_t)arg;
  CK(cuCtxSetCurrent(ctx));
  double t = 0;
  long n = 0;
  while (!atomic_load(&stop) && (max <= 0 || n < max)) {
    for (int i = 0; i < SLOTS; i++) {
      double t0 = now_ns();
      CK(cuMemMap(va + i * G, G, 0, hs[i], 0));
      CK(cuMemSetAccess(va + i * G, G, &acc, 1));
      CK(cuMemUnmap(va + i * G, G));
      t += now_ns() - t0;
      n++;
    }
  }
  vmm_ns = t;
  atomic_store(&cycles, n);
  return NULL;
}

// LAUNCHES async memsets of `bytes` each on s; per-launch call times, and
// the GPU's time for the lot (events around it): do VMM calls made meanwhile
// by another thread slow the GPU down, not just the launching thread?
static float gpu_ms;
static void launch_phase(CUstream s, CUdeviceptr buf, size_t bytes, double *med_us, double *p99_us, double *loop_ms) {
  static double t[LAUNCHES];
  CUevent a0, a1;
  CK(cuEventCreate(&a0, CU_EVENT_DEFAULT));
  CK(cuEventCreate(&a1, CU_EVENT_DEFAULT));
  CK(cuEventRecord(a0, s));
  double t0 = now_ns();
  for (int i = 0; i < LAUNCHES; i++) {
    double a = now_ns();
    CK(cuMemsetD32Async(buf, (unsigned)i, bytes / 4, s));
    t[i] = now_ns() - a;
  }
  *loop_ms = (now_ns() - t0) / 1e6;
  CK(cuEventRecord(a1, s));
  CK(cuEventSynchronize(a1));
  CK(cuEventElapsedTime(&gpu_ms, a0, a1));
  cuEventDestroy(a0);
  cuEventDestroy(a1);
  qsort(t, LAUNCHES, sizeof *t, cmpd);
  *med_us = t[LAUNCHES / 2] / 1e3;
  *p99_us = t[LAUNCHES * 99 / 100] / 1e3;
}

int main(void) {
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) {
    printf("{\"skipped\": \"no CUDA device\"}\n");
    return 77;
  }
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev}};
  CK(cuMemGetAllocationGranularity(&G, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  acc = (CUmemAccessDesc){.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CK(cuMemAddressReserve(&va, SLOTS * G, G, 0, 0));
  for (int i = 0; i < SLOTS; i++) CK(cuMemCreate(&hs[i], G, &prop, 0));
  int mem64 = 0, nor = 0;
  cuDeviceGetAttribute(&mem64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev);
  cuDeviceGetAttribute(&nor, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, dev);
  printf("{\"granule\": %zu, \"can_use_64_bit_stream_mem_ops\": %d, \"launches\": %d,\n", G, mem64, LAUNCHES);

  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buf;
  size_t bytes = 64u << 20; // ~20-30 us of GPU time per memset: the GPU stays busy, the CPU ahead
  CK(cuMemAlloc(&buf, bytes));

  // (2a) VMM cost with an idle GPU.
  pthread_t th;
  worker((void *)(intptr_t)(SLOTS * 8));
  double idle_us = vmm_ns / 1e3 / (double)atomic_load(&cycles);
  // (1a) launches alone.
  double m0, p0, l0, m1, p1, l1;
  launch_phase(s, buf, bytes, &m0, &p0, &l0);
  float g0 = gpu_ms;
  // (1b) launches while the worker cycles mappings; (2b) its VMM cost while the GPU is busy.
  atomic_store(&stop, false);
  pthread_create(&th, NULL, worker, (void *)(intptr_t)0);
  struct timespec ms = {0, 2000000};
  nanosleep(&ms, NULL); // the worker is running
  launch_phase(s, buf, bytes, &m1, &p1, &l1);
  float g1 = gpu_ms;
  atomic_store(&stop, true);
  pthread_join(th, NULL);
  double busy_us = vmm_ns / 1e3 / (double)atomic_load(&cycles);
  printf(" \"launch_alone\": {\"median_us\": %.2f, \"p99_us\": %.2f, \"loop_ms\": %.2f, \"gpu_ms\": %.2f},\n", m0,
         p0, l0, g0);
  printf(" \"launch_with_worker_mapping\": {\"median_us\": %.2f, \"p99_us\": %.2f, \"loop_ms\": %.2f, "
         "\"gpu_ms\": %.2f, \"worker_cycles\": %ld},\n", m1, p1, l1, g1, atomic_load(&cycles));
  printf(" \"worker_map_access_unmap_us\": {\"gpu_idle\": %.2f, \"gpu_busy_with_launches\": %.2f},\n", idle_us,
         busy_us);

  // (3) A stream held by a wait on a pinned host flag, released by another thread.
  uint64_t *flag;
  CK(cuMemHostAlloc((void **)&flag, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  *flag = 0;
  CUdeviceptr dflag;
  CK(cuMemHostGetDevicePointer(&dflag, flag, 0));
  CUevent e0, e1;
  CK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
  CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
  double lat[9];
  int early = 0;
  for (int r = 0; r < 9; r++) {
    uint64_t want = (uint64_t)r + 1;
    CK(cuEventRecord(e0, s));
    CUresult wr = mem64 ? cuStreamWaitValue64(s, dflag, want, CU_STREAM_WAIT_VALUE_GEQ)
                        : cuStreamWaitValue32(s, dflag, (uint32_t)want, CU_STREAM_WAIT_VALUE_GEQ);
    if (wr != CUDA_SUCCESS) {
      printf(" \"wait_value\": \"refused (CUresult %d)\"}\n", (int)wr);
      return 0;
    }
    CK(cuMemsetD32Async(buf, 7, 1024, s));
    CK(cuEventRecord(e1, s));
    nanosleep(&ms, NULL);
    if (cuEventQuery(e1) == CUDA_SUCCESS) early++; // ran before the flag was set: the wait did not hold
    double t0 = now_ns();
    atomic_store_explicit((_Atomic uint64_t *)flag, want, memory_order_release);
    while (cuEventQuery(e1) == CUDA_ERROR_NOT_READY) {}
    lat[r] = (now_ns() - t0) / 1e3;
  }
  qsort(lat, 9, sizeof *lat, cmpd);
  float held_ms;
  CK(cuEventElapsedTime(&held_ms, e0, e1));
  printf(" \"wait_value\": {\"ran_before_flag\": %d, \"release_latency_us_median\": %.2f, \"max\": %.2f, "
         "\"last_hold_ms\": %.2f},\n", early, lat[4], lat[8], held_ms);
  // (4) Run 27 found that cuMemsetD32Async / cuMemcpyAsync check their
  // pointers when they are queued: a range not yet mapped is refused there
  // (invalid argument), so mapping cannot wait for a worker. Is a range that
  // is mapped but whose access is not set yet accepted? Then only the access
  // call (the expensive one) could move to a worker: queue wait + memset +
  // copy back, set access from another thread, release the flag, check.
  CUdeviceptr pb;
  CK(cuMemAddressReserve(&pb, G, G, 0, 0));
  CK(cuMemMap(pb, G, 0, hs[0], 0));
  uint32_t *hbuf;
  CK(cuMemHostAlloc((void **)&hbuf, G, 0));
  uint64_t want = 100;
  CUresult wr = cuStreamWaitValue64(s, dflag, want, CU_STREAM_WAIT_VALUE_GEQ);
  CUresult mr = cuMemsetD32Async(pb, 0x5EEDu, G / 4, s);
  CUresult cr = cuMemcpyDtoHAsync(hbuf, pb, G, s);
  CUresult dr = cuMemcpyDtoDAsync(buf, pb, G, s);
  CK(cuMemSetAccess(pb, G, &acc, 1)); // (the worker's call: made here, before the flag, as a worker would)
  atomic_store_explicit((_Atomic uint64_t *)flag, want, memory_order_release);
  CUresult sr = cuStreamSynchronize(s);
  int good = sr == CUDA_SUCCESS && mr == CUDA_SUCCESS && cr == CUDA_SUCCESS;
  for (size_t i = 0; good && i < G / 4; i += 4099) good = hbuf[i] == 0x5EEDu;
  printf(" \"queued_on_mapped_range_before_access\": {\"wait\": %d, \"memset\": %d, \"memcpy_dtoh\": %d, "
         "\"memcpy_dtod\": %d, \"sync\": %d, \"data_ok\": %d},\n", (int)wr, (int)mr, (int)cr, (int)dr, (int)sr, good);
  CUdeviceptr pu;
  CK(cuMemAddressReserve(&pu, G, G, 0, 0));
  CUresult ur = cuMemsetD32Async(pu, 1, G / 4, s); // reserved, not mapped: what run 27 hit
  printf(" \"queued_on_unmapped_range\": {\"memset\": %d}}\n", (int)ur);
  cuStreamSynchronize(s);
  cuMemUnmap(pb, G);
  cuMemAddressFree(pb, G);
  cuMemAddressFree(pu, G);
  for (int i = 0; i < SLOTS; i++) cuMemRelease(hs[i]);
  cuMemAddressFree(va, SLOTS * G);
  return 0;
}
