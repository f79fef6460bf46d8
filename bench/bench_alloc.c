// Cached alloc+free pair on the host backend: the fast path (no backend
// call). Times batches of 1000 pairs with CLOCK_MONOTONIC and reports the
// median and p99 over batches, per pair, for several sizes; also a "mixed"
// case with a live set of 64 blocks of other sizes around the one recycled.
// The same pairs through glibc's malloc + free run in the same rounds (the
// reference the issue-13 target compares with: nofrag's pair <= 2x glibc's),
// and the floors of the pair's locking: two uncontended spin-lock
// acquire/release pairs alone (a thread without the lock's bias) and two
// nf__lock/nf__unlock pairs of a thread holding the bias (src/base/lock.c).
//
//   ./build/bench_alloc [pairs_per_size]
#include "base/base.h"
#include "bench.h"
#include "nofrag.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define BATCH 1000

int main(int argc, char **argv) {
  char *end = NULL;
  long pairs = argc > 1 ? strtol(argv[1], &end, 10) : 2000000;
  if (argc > 2 || (argc > 1 && (*end || pairs < BATCH))) {
    fprintf(stderr, "usage: %s [PAIRS]  (alloc+free pairs per size, at least %d; default 2000000)\n", argv[0], BATCH);
    return 2;
  }
  long batches = pairs / BATCH;
  nf_backend_t *be;
  nf_pool_t *p;
  nf_config_t c;
  nf_config_default(&c);
  c.limit = 64 * NF_GiB;
  if (nf_backend_host_create(&be, 64 * NF_GiB, 2 * NF_MiB) || nf_pool_create(&p, be, &c)) {
    fprintf(stderr, "setup: %s\n", nf_last_error());
    return 1;
  }
  size_t sizes[] = {512, 4096, 65536, 1 << 20, 8 << 20, 256 << 20};
  enum { NS = sizeof sizes / sizeof sizes[0], ROUNDS = 8 };
  // Rounds interleave the sizes so that a slow period of the machine (VM
  // neighbours) spreads over all of them instead of skewing one.
  long per = batches / ROUNDS;
  double *t[2][NS], *tg[2][NS];
  // Called through volatile pointers: the compiler may not fold a malloc+free pair away.
  void *(*volatile g_malloc)(size_t) = malloc;
  void (*volatile g_free)(void *) = free;
  uint64_t calls[2][NS] = {{0}};
  for (int m = 0; m < 2; m++)
    for (int k = 0; k < NS; k++) {
      t[m][k] = malloc(sizeof(double) * (size_t)(per * ROUNDS));
      tg[m][k] = malloc(sizeof(double) * (size_t)(per * ROUNDS));
    }
  for (int r = 0; r < ROUNDS; r++)
    for (int mixed = 0; mixed < 2; mixed++)
      for (int k = 0; k < NS; k++) {
        size_t n = sizes[k];
        void *keep[64] = {0};
        if (mixed) // neighbours: a live set around the block being recycled
          for (int i = 0; i < 64; i++) keep[i] = nf_alloc(p, n / 2 + 512 * (size_t)i, NULL);
        void *w = nf_alloc(p, n, NULL); // warm: map once
        nf_free(p, w);
        nf_stats_t s0, s1;
        nf_stats_get(p, &s0);
        for (long b = 0; b < per; b++) {
          double t0 = now_ns();
          for (int i = 0; i < BATCH; i++) {
            void *q = nf_alloc(p, n, NULL);
            if (!q) { fprintf(stderr, "alloc failed: %s\n", nf_last_error()); return 1; }
            nf_free(p, q);
          }
          t[mixed][k][r * per + b] = (now_ns() - t0) / BATCH;
        }
        nf_stats_get(p, &s1);
        calls[mixed][k] += s1.backend_calls - s0.backend_calls;
        for (int i = 0; i < 64; i++) nf_free(p, keep[i]);
        void *gkeep[64] = {0};
        if (mixed)
          for (int i = 0; i < 64; i++) gkeep[i] = g_malloc(n / 2 + 512 * (size_t)i);
        g_free(g_malloc(n));
        for (long b = 0; b < per; b++) {
          double t0 = now_ns();
          for (int i = 0; i < BATCH; i++) g_free(g_malloc(n));
          tg[mixed][k][r * per + b] = (now_ns() - t0) / BATCH;
        }
        for (int i = 0; i < 64; i++) g_free(gkeep[i]);
      }
  printf("%-16s %10s %10s %10s %12s %12s %8s\n", "size", "median_ns", "p99_ns", "mean_ns", "calls/pair",
         "glibc_med_ns", "x_glibc");
  for (int mixed = 0; mixed < 2; mixed++)
    for (int k = 0; k < NS; k++) {
      long nb = per * ROUNDS;
      double sum = 0, *v = t[mixed][k], *gv = tg[mixed][k];
      for (long b = 0; b < nb; b++) sum += v[b];
      qsort(v, (size_t)nb, sizeof *v, cmp);
      qsort(gv, (size_t)nb, sizeof *gv, cmp);
      char label[32];
      snprintf(label, sizeof label, "%s%zu", mixed ? "mixed/" : "", sizes[k]);
      printf("%-16s %10.1f %10.1f %10.1f %12.4f %12.1f %8.2f\n", label, v[nb / 2], v[nb * 99 / 100], sum / (double)nb,
             (double)calls[mixed][k] / (double)(nb * BATCH), gv[nb / 2], v[nb / 2] / gv[nb / 2]);
      free(v);
      free(gv);
    }
  // The floors of the pair's locking (src/base/lock.c): two acquire/release
  // pairs of the spin lock alone (an exchange with acquire order, a store with
  // release order: what a thread without the bias pays), and two of the real
  // nf__lock / nf__unlock from this thread, which earns the bias at once.
  static atomic_int lk;
  static nf_lock_t bl;
  double *fl = malloc(sizeof(double) * (size_t)batches), *fb = malloc(sizeof(double) * (size_t)batches);
  for (long b = 0; b < batches; b++) {
    double t0 = now_ns();
    for (int i = 0; i < BATCH; i++)
      for (int j = 0; j < 2; j++) {
        while (atomic_exchange_explicit(&lk, 1, memory_order_acquire)) {}
        atomic_store_explicit(&lk, 0, memory_order_release);
      }
    fl[b] = (now_ns() - t0) / BATCH;
    t0 = now_ns();
    for (int i = 0; i < BATCH; i++)
      for (int j = 0; j < 2; j++) {
        nf__lock(&bl);
        nf__unlock(&bl);
      }
    fb[b] = (now_ns() - t0) / BATCH;
  }
  qsort(fl, (size_t)batches, sizeof *fl, cmp);
  qsort(fb, (size_t)batches, sizeof *fb, cmp);
  printf("%-16s %10.1f %10.1f   (two spin-lock acquire/release pairs alone: a thread without the bias)\n",
         "spin floor", fl[batches / 2], fl[batches * 99 / 100]);
  printf("%-16s %10.1f %10.1f   (two nf__lock/nf__unlock pairs of this thread; lock bias %s)\n", "lock floor",
         fb[batches / 2], fb[batches * 99 / 100],
         !nf__lock_biasable() ? "unavailable (no membarrier, or NOFRAG_NO_LOCK_BIAS)"
         : atomic_load(&bl.bias) ? "held" : "not held");
  free(fl);
  free(fb);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  return 0;
}
