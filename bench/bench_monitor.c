// Cost of the live monitor on the cached alloc+free pair (issue 5 target:
// < 5% of the pair). Two pools on two host backends, one publishing to its
// shared-memory file (NOFRAG_MONITOR unset) and one not (NOFRAG_MONITOR=0);
// rounds alternate between them so that the VM's slow periods hit both
// alike. Per pool: median and p99 over batches of 1000 pairs, per pair.
//
//   ./build/bench_monitor [pairs_per_mode]
#include "bench.h"
#include "nofrag.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define BATCH 1000
#define ROUNDS 16

int main(int argc, char **argv) {
  long pairs = argc > 1 ? atol(argv[1]) : 4000000;
  long per = pairs / BATCH / ROUNDS;
  if (per < 1) per = 1;
  size_t sizes[] = {512, 1 << 20};
  enum { NS = sizeof sizes / sizeof sizes[0] };
  nf_backend_t *be[2];
  nf_pool_t *p[2];
  for (int m = 0; m < 2; m++) { // m = 0: monitor on, 1: off
    nf_config_t c;
    nf_config_default(&c);
    c.limit = 16 * NF_GiB;
    if (m) setenv("NOFRAG_MONITOR", "0", 1);
    else unsetenv("NOFRAG_MONITOR");
    if (nf_backend_host_create(&be[m], 16 * NF_GiB, 2 * NF_MiB) || nf_pool_create(&p[m], be[m], &c)) {
      fprintf(stderr, "setup: %s\n", nf_last_error());
      return 1;
    }
  }
  double *t[2][NS];
  for (int m = 0; m < 2; m++)
    for (int k = 0; k < NS; k++) t[m][k] = malloc(sizeof(double) * (size_t)(per * ROUNDS));
  for (int r = 0; r < ROUNDS; r++)
    for (int k = 0; k < NS; k++)
      for (int mm = 0; mm < 2; mm++) {
        int m = (r & 1) ? 1 - mm : mm; // alternate which pool goes first
        void *w = nf_alloc(p[m], sizes[k], NULL); // warm: map once
        nf_free(p[m], w);
        for (long b = 0; b < per; b++) {
          double t0 = now_ns();
          for (int i = 0; i < BATCH; i++) {
            void *q = nf_alloc(p[m], sizes[k], NULL);
            if (!q) { fprintf(stderr, "alloc failed: %s\n", nf_last_error()); return 1; }
            nf_free(p[m], q);
          }
          t[m][k][r * per + b] = (now_ns() - t0) / BATCH;
        }
      }
  printf("%-8s %14s %14s %12s %12s %10s\n", "size", "on_median_ns", "off_median_ns", "on_p99_ns", "off_p99_ns",
         "overhead");
  long nb = per * ROUNDS;
  for (int k = 0; k < NS; k++) {
    double med[2], p99[2];
    for (int m = 0; m < 2; m++) {
      qsort(t[m][k], (size_t)nb, sizeof(double), cmp);
      med[m] = t[m][k][nb / 2];
      p99[m] = t[m][k][nb * 99 / 100];
    }
    printf("%-8zu %14.1f %14.1f %12.1f %12.1f %9.1f%%\n", sizes[k], med[0], med[1], p99[0], p99[1],
           100.0 * (med[0] - med[1]) / med[1]);
  }
  for (int m = 0; m < 2; m++) {
    nf_pool_destroy(p[m]);
    nf_backend_destroy(be[m]);
    for (int k = 0; k < NS; k++) free(t[m][k]);
  }
  return 0;
}
