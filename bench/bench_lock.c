// What the pool lock's bias (src/base/lock.c) costs when threads take turns:
// T threads share one pool and take turns in phases of N cached 512 B
// alloc+free pairs each (a phase ends, the next thread's begins: PyTorch's
// forward on the main thread, backward on the autograd thread, at N ~ 10^3).
// Every phase change revokes the bias (a membarrier) if the last thread held
// it. Reports, per N, the median over phases of ns per pair, the hand-over
// included; run it with and without NOFRAG_NO_LOCK_BIAS=1 to compare (the
// choice is made once per process).
//
//   ./build/bench_lock [threads] [pairs_per_N]
#include "base/base.h"
#include "bench.h"
#include "nofrag.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static nf_pool_t *pool;
static _Atomic long turn; // phase number; thread (turn % T) runs it
static int nthreads;
static long phase_len, nphases;
static double *phase_ns;

static void *worker(void *arg) {
  int me = (int)(intptr_t)arg;
  for (long ph = me; ph < nphases; ph += nthreads) {
    while (atomic_load_explicit(&turn, memory_order_acquire) != ph) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    double t0 = now_ns();
    for (long i = 0; i < phase_len; i++) {
      void *q = nf_alloc(pool, 512, NULL);
      if (!q || nf_free(pool, q) != NF_OK) { fprintf(stderr, "pair failed: %s\n", nf_last_error()); exit(1); }
    }
    phase_ns[ph] = (now_ns() - t0) / (double)phase_len;
    atomic_store_explicit(&turn, ph + 1, memory_order_release);
  }
  return NULL;
}

int main(int argc, char **argv) {
  nthreads = argc > 1 ? atoi(argv[1]) : 2;
  long total = argc > 2 ? atol(argv[2]) : 2000000;
  if (nthreads < 1 || nthreads > 64 || total < 1000) {
    fprintf(stderr, "usage: %s [threads 1..64] [pairs per phase length, >= 1000]\n", argv[0]);
    return 2;
  }
  nf_backend_t *be;
  nf_config_t c;
  nf_config_default(&c);
  c.limit = 1 * NF_GiB;
  if (nf_backend_host_create(&be, 1 * NF_GiB, 2 * NF_MiB) || nf_pool_create(&pool, be, &c)) {
    fprintf(stderr, "setup: %s\n", nf_last_error());
    return 1;
  }
  printf("threads %d, lock bias %s\n", nthreads,
         nf__lock_biasable() ? "available" : "unavailable (no membarrier, or NOFRAG_NO_LOCK_BIAS)");
  printf("%-10s %10s %10s %10s\n", "phase_len", "median_ns", "p90_ns", "phases");
  long lens[] = {1, 16, 256, 4096, 65536};
  for (int k = 0; k < (int)(sizeof lens / sizeof lens[0]); k++) {
    phase_len = lens[k];
    nphases = total / phase_len;
    if (nphases < 4 * nthreads) nphases = 4 * nthreads;
    phase_ns = calloc((size_t)nphases, sizeof *phase_ns);
    atomic_store(&turn, 0);
    pthread_t t[64];
    for (int i = 0; i < nthreads; i++) pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < nthreads; i++) pthread_join(t[i], NULL);
    qsort(phase_ns, (size_t)nphases, sizeof *phase_ns, cmp);
    printf("%-10ld %10.1f %10.1f %10ld\n", phase_len, phase_ns[nphases / 2], phase_ns[nphases * 9 / 10], nphases);
    free(phase_ns);
  }
  nf_pool_destroy(pool);
  nf_backend_destroy(be);
  return 0;
}
