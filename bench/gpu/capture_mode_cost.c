// Cost of a cuThreadExchangeStreamCaptureMode pair (relaxed, then back), the
// price the CUDA backend pays per driver call (docs/benchmarks.md section 29).
//   gcc -O2 -o /tmp/capture_mode_cost bench/gpu/capture_mode_cost.c -ldl && /tmp/capture_mode_cost
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
typedef int (*init_t)(unsigned);
typedef int (*xchg_t)(int *);
typedef int (*ctx_t)(void **, int);
typedef int (*set_t)(void *);
int main(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) return 1;
  init_t init = (init_t)dlsym(h, "cuInit");
  xchg_t x = (xchg_t)dlsym(h, "cuThreadExchangeStreamCaptureMode");
  ctx_t retain = (ctx_t)dlsym(h, "cuDevicePrimaryCtxRetain");
  set_t set = (set_t)dlsym(h, "cuCtxSetCurrent");
  void *ctx;
  if (init(0) || retain(&ctx, 0) || set(ctx)) return 2;
  for (int rep = 0; rep < 5; rep++) {
    struct timespec a, b;
    int n = 1000000;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; i++) {
      int m = 2;
      x(&m);
      x(&m);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("exchange pair: %.1f ns\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
  }
  return 0;
}
