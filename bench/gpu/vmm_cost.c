// What the CUDA driver's VMM calls cost per granule, through nofrag's CUDA
// backend (the calls the pool makes): is creating physical memory priced per
// call or per byte (would multi-granule allocations make growth cheaper?), and
// is setting access priced per call or per granule (does batching a run into
// one call help?). Prints one JSON object. Built and run on the GPU machine:
//
//   gcc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc bench/gpu/vmm_cost.c
//       build/libnofrag.a -lpthread -ldl -lm -o build/vmm_cost && ./build/vmm_cost
//
// `./build/vmm_cost host` runs the same phases on the host backend (memfd +
// mmap), to check the program without a GPU.
// On CUDA it also asks whether the driver maps at an offset inside a multi-granule
// allocation and unmaps part of a mapping (run 26: neither), and times access
// with 4,096 other mappings alive (the driver called directly: the backend
// has no offset parameter).
// Exit status 77 without a driver or GPU. Each phase is timed over N granules
// (N x 2 MiB = 512 MiB by default) and repeated; medians of the repeats, in
// microseconds per granule.
#include "backend/backend.h"
#include "../bench.h"
#include "nofrag.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 256 // granules per phase
#define REPS 5

static nf_backend_t *be;
static size_t G;

#define OK(call)                                                                             \
  do {                                                                                       \
    nf_status_t s_ = (call);                                                                 \
    if (s_ != NF_OK) {                                                                       \
      fprintf(stderr, "%s failed: %s: %s\n", #call, nf_status_str(s_), be->err);             \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

// Create and release N granules' worth of memory in allocations of k granules.
static double create_cost(size_t k, double *release_us) {
  double t[REPS], r[REPS];
  nf_handle_t h[N];
  size_t n = N / k;
  for (int rep = 0; rep < REPS; rep++) {
    double t0 = now_ns();
    for (size_t i = 0; i < n; i++) OK(be->ops->mem_create(be, NF_TIER_DEVICE, k * G, &h[i]));
    double t1 = now_ns();
    for (size_t i = 0; i < n; i++) OK(be->ops->mem_release(be, h[i]));
    t[rep] = (t1 - t0) / 1e3 / N;
    r[rep] = (now_ns() - t1) / 1e3 / N;
  }
  *release_us = median(r, REPS);
  return median(t, REPS);
}

// Map N granules held in allocations of k granules each (one map call per
// allocation) at consecutive addresses, set access on the whole run in one
// call (run = 1) or allocation by allocation, unmap the run: is setting
// access priced per byte or per mapping?
static void map_cost(uintptr_t va, nf_handle_t *h, size_t k, bool run, double *map_us, double *acc_us,
                     double *unmap_us) {
  double m[REPS], a[REPS], u[REPS];
  size_t n = N / k;
  for (int rep = 0; rep < REPS; rep++) {
    double t0 = now_ns();
    for (size_t i = 0; i < n; i++) OK(be->ops->map(be, va + i * k * G, k * G, h[i]));
    double t1 = now_ns();
    if (run) OK(be->ops->set_access(be, va, N * G));
    else
      for (size_t i = 0; i < n; i++) OK(be->ops->set_access(be, va + i * k * G, k * G));
    double t2 = now_ns();
    OK(be->ops->unmap(be, va, N * G));
    double t3 = now_ns();
    m[rep] = (t1 - t0) / 1e3 / N;
    a[rep] = (t2 - t1) / 1e3 / N;
    u[rep] = (t3 - t2) / 1e3 / N;
  }
  *map_us = median(m, REPS);
  *acc_us = median(a, REPS);
  *unmap_us = median(u, REPS);
}

// The driver's own cuMemMap / cuMemUnmap, for what the backend interface
// cannot express: a mapping at an offset inside a multi-granule allocation,
// and a partial unmap. The backend made the primary context current.
typedef int (*cu_map_t)(unsigned long long, size_t, size_t, unsigned long long, unsigned long long);
typedef int (*cu_unmap_t)(unsigned long long, size_t);
static cu_map_t cu_map;
static cu_unmap_t cu_unmap;

#define CU(call)                                                                             \
  do {                                                                                       \
    int r_ = (call);                                                                         \
    if (r_) {                                                                                \
      fprintf(stderr, "%s failed: CUresult %d\n", #call, r_);                                \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

// The offset experiments (CUDA only): offset mappings, partial unmaps, and
// whether access costs more with many mappings alive in the context.
static void offset_phases(uintptr_t va) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  cu_map = lib ? (cu_map_t)dlsym(lib, "cuMemMap") : NULL;
  cu_unmap = lib ? (cu_unmap_t)dlsym(lib, "cuMemUnmap") : NULL;
  if (!cu_map || !cu_unmap) {
    printf(" \"offset\": \"skipped: no cuMemMap\",\n");
    return;
  }
  nf_handle_t h[N], unit;
  size_t k = 16;
  OK(be->ops->mem_create(be, NF_TIER_DEVICE, k * G, &unit));
  // Does the driver map at a non-zero offset at all? (Driver 580: no, 801.)
  int off_r = cu_map(va, G, G, unit, 0);
  if (!off_r) CU(cu_unmap(va, G));
  printf(" \"map at a 1-granule offset into a 16-granule allocation\": \"%s (CUresult %d)\",\n",
         off_r ? "refused" : "allowed", off_r);
  // A mapping of a whole 16-granule allocation: may one granule of it be unmapped?
  CU(cu_map(va, k * G, 0, unit, 0));
  int partial = cu_unmap(va, G);
  if (partial == 0) CU(cu_map(va, G, 0, unit, 0)); // it was allowed: put the granule back
  CU(cu_unmap(va, k * G));
  printf(" \"unmap of 1 granule of a 16-granule mapping\": \"%s (CUresult %d)\",\n", partial ? "refused" : "allowed",
         partial);
  OK(be->ops->mem_release(be, unit));
  // Access on one-granule mappings while 4,096 other mappings are alive.
  enum { OTHERS = 4096 };
  uintptr_t ova;
  nf_handle_t *oh = malloc(OTHERS * sizeof *oh);
  if (!oh || be->ops->va_reserve(be, (size_t)OTHERS * G, G, &ova) != NF_OK) {
    printf(" \"busy context\": \"skipped\",\n");
    free(oh);
    return;
  }
  size_t made = 0;
  for (; made < OTHERS; made++) {
    if (be->ops->mem_create(be, NF_TIER_DEVICE, G, &oh[made]) != NF_OK) break;
    if (be->ops->map(be, ova + made * G, G, oh[made]) != NF_OK) { be->ops->mem_release(be, oh[made]); break; }
  }
  OK(be->ops->set_access(be, ova, made * G));
  for (size_t i = 0; i < N; i++) OK(be->ops->mem_create(be, NF_TIER_DEVICE, G, &h[i]));
  double m, a, u;
  map_cost(va, h, 1, true, &m, &a, &u);
  printf(" \"1 granule per allocation with %zu other mappings alive\": {\"map_us\": %.2f, \"set_access_us\": %.2f, "
         "\"unmap_us\": %.2f},\n", made, m, a, u);
  for (size_t i = 0; i < N; i++) OK(be->ops->mem_release(be, h[i]));
  OK(be->ops->unmap(be, ova, made * G));
  for (size_t i = 0; i < made; i++) OK(be->ops->mem_release(be, oh[i]));
  OK(be->ops->va_release(be, ova, (size_t)OTHERS * G));
  free(oh);
}

int main(int argc, char **argv) {
  bool host = argc > 1 && !strcmp(argv[1], "host");
  nf_status_t st = host ? nf_backend_host_create(&be, 4 * NF_GiB, 2 * NF_MiB) : nf_backend_cuda_create(&be, 0);
  if (st != NF_OK) {
    printf("{\"skipped\": \"%s\"}\n", nf_last_error());
    return 77;
  }
  OK(be->ops->granularity(be, NF_TIER_DEVICE, &G));
  printf("{\"backend\": \"%s\", \"granule\": %zu, \"granules_per_phase\": %d, \"reps\": %d,\n \"create_us_per_granule\": {", be->ops->name, G, N, REPS);
  size_t ks[] = {1, 4, 16, 64};
  for (int j = 0; j < 4; j++) {
    double rel, c = create_cost(ks[j], &rel);
    printf("%s\"%zu\": [%.2f, %.2f]", j ? ", " : "", ks[j], c, rel);
  }
  printf("},\n \"create_note\": \"key: granules per allocation; value: [create, release] us per granule\",\n");
  uintptr_t va;
  OK(be->ops->va_reserve(be, N * G, 64 * G, &va));
  nf_handle_t h[N];
  for (int j = 0; j < 3; j++) {
    size_t k = j == 2 ? 16 : 1;
    bool run = j != 1;
    for (size_t i = 0; i < N / k; i++) OK(be->ops->mem_create(be, NF_TIER_DEVICE, k * G, &h[i]));
    double m, a, u;
    map_cost(va, h, k, run, &m, &a, &u);
    printf(" \"%zu granule(s) per allocation, access set %s\": {\"map_us\": %.2f, \"set_access_us\": %.2f, "
           "\"unmap_us\": %.2f},\n", k, run ? "on the whole run" : "per allocation", m, a, u);
    for (size_t i = 0; i < N / k; i++) OK(be->ops->mem_release(be, h[i]));
  }
  if (!host) offset_phases(va);
  OK(be->ops->va_release(be, va, N * G));
  printf(" \"units\": \"microseconds per 2 MiB granule, median of %d repeats\"}\n", REPS);
  nf_backend_destroy(be);
  return 0;
}
