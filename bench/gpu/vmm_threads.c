// Does the CUDA driver run VMM calls from several threads in parallel? Growth
// costs ~37 us per 2 MiB granule (create + map + set access, each granule its
// own allocation), all on the allocating thread; if T threads can each grow a
// slice of a large block at once, growth would cost ~37/T us per granule with
// no change to what a granule is. Times create+map+access of N granules (and
// unmap+release) split over T threads, T = 1, 2, 4, 8, 16, through nofrag's
// CUDA backend. Prints one JSON object. Built and run on the GPU machine:
//
//   gcc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc bench/gpu/vmm_threads.c
//       build/libnofrag.a -lpthread -ldl -lm -o build/vmm_threads && ./build/vmm_threads
//
// `./build/vmm_threads host` runs it on the host backend (memfd + mmap).
// Exit status 77 without a driver or GPU.
#include "backend/backend.h"
#include "../bench.h"
#include "nofrag.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 1024 // granules per phase (2 GiB at 2 MiB)
#define REPS 3

static nf_backend_t *be;
static size_t G;
static uintptr_t va;
static nf_handle_t h[N];
static void *ctx; // the primary context, made current in every worker
static int (*ctx_set)(void *);
static _Atomic int failures;

typedef struct {
  size_t g0, g1;
  int phase; // 0: create + map + access, 1: unmap + release
} slice_t;

static void *worker(void *arg) {
  slice_t *s = arg;
  if (ctx_set) ctx_set(ctx);
  for (size_t g = s->g0; g < s->g1; g++) {
    if (s->phase == 0) {
      if (be->ops->mem_create(be, NF_TIER_DEVICE, G, &h[g]) != NF_OK ||
          be->ops->map(be, va + g * G, G, h[g]) != NF_OK || be->ops->set_access(be, va + g * G, G) != NF_OK)
        failures++;
    } else {
      if (be->ops->unmap(be, va + g * G, G) != NF_OK || be->ops->mem_release(be, h[g]) != NF_OK) failures++;
    }
  }
  return NULL;
}

// Wall time per granule (us) of one phase over N granules split over t threads.
static double run_phase(int t, int phase) {
  pthread_t th[16];
  slice_t sl[16];
  double t0 = now_ns();
  for (int i = 0; i < t; i++) {
    sl[i] = (slice_t){(size_t)i * N / t, (size_t)(i + 1) * N / t, phase};
    pthread_create(&th[i], NULL, worker, &sl[i]);
  }
  for (int i = 0; i < t; i++) pthread_join(th[i], NULL);
  return (now_ns() - t0) / 1e3 / N;
}

int main(int argc, char **argv) {
  bool host = argc > 1 && !strcmp(argv[1], "host");
  nf_status_t st = host ? nf_backend_host_create(&be, 4 * NF_GiB, 2 * NF_MiB) : nf_backend_cuda_create(&be, 0);
  if (st != NF_OK) {
    printf("{\"skipped\": \"%s\"}\n", nf_last_error());
    return 77;
  }
  if (!host) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    int (*ctx_get)(void **) = lib ? (int (*)(void **))dlsym(lib, "cuCtxGetCurrent") : NULL;
    ctx_set = lib ? (int (*)(void *))dlsym(lib, "cuCtxSetCurrent") : NULL;
    if (ctx_get) ctx_get(&ctx);
  }
  if (be->ops->granularity(be, NF_TIER_DEVICE, &G) != NF_OK || be->ops->va_reserve(be, N * G, G, &va) != NF_OK) {
    printf("{\"skipped\": \"%s\"}\n", be->err);
    return 77;
  }
  printf("{\"backend\": \"%s\", \"granule\": %zu, \"granules\": %d, \"reps\": %d, \"threads\": {", be->ops->name, G, N,
         REPS);
  int ts[] = {1, 2, 4, 8, 16};
  for (int j = 0; j < 5; j++) {
    double grow[REPS], shrink[REPS];
    for (int r = 0; r < REPS; r++) {
      grow[r] = run_phase(ts[j], 0);
      shrink[r] = run_phase(ts[j], 1);
    }
    qsort(grow, REPS, sizeof *grow, cmp);
    qsort(shrink, REPS, sizeof *shrink, cmp);
    printf("%s\"%d\": {\"create_map_access_us\": %.2f, \"unmap_release_us\": %.2f}", j ? ", " : "", ts[j],
           grow[REPS / 2], shrink[REPS / 2]);
    fflush(stdout);
  }
  printf("}, \"failures\": %d, \"units\": \"wall microseconds per 2 MiB granule, median of %d\"}\n", (int)failures,
         REPS);
  be->ops->va_release(be, va, N * G);
  nf_backend_destroy(be);
  return failures ? 1 : 0;
}
