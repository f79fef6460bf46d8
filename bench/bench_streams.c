// Streams that all keep blocks live (src/core/stream.c): N streams each hold
// one live block; round after round, each stream in turn frees its block and
// allocates a new one of the same size. Up to 64 streams every stream keeps
// its slot; past 64, round-robin is the worst order for the slots (the stream
// that comes is always the one whose slot went last): its free takes a slot
// again (streams_steal: one event record and one host wait on the victim, and
// a walk of the blocks), and its allocation finds it. Host backend, events
// complete at once: this times the pool's own work, not a GPU's waits.
// Median ns per free+alloc over rounds, and slots taken per pair.
//
//   ./build/bench_streams [rounds]
#include "bench.h"
#include "core/core.h"
#include "nofrag.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  char *end = NULL;
  long rounds = argc > 1 ? strtol(argv[1], &end, 10) : 200;
  if (argc > 2 || (argc > 1 && (*end || rounds < 3))) {
    fprintf(stderr, "usage: %s [ROUNDS]  (rounds over every stream, at least 3; default 200)\n", argv[0]);
    return 2;
  }
  int counts[] = {16, 64, 65, 100, 200};
  printf("%-8s %12s %12s %14s\n", "streams", "median_ns", "p90_ns", "steals/pair");
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    int n = counts[c];
    nf_backend_t *be;
    nf_pool_t *p;
    nf_config_t cfg;
    nf_config_default(&cfg);
    cfg.limit = 4 * NF_GiB;
    if (nf_backend_host_create(&be, 4 * NF_GiB, 2 * NF_MiB) || nf_pool_create(&p, be, &cfg)) {
      fprintf(stderr, "setup: %s\n", nf_last_error());
      return 1;
    }
    void **x = calloc((size_t)n, sizeof *x);
    double *t = malloc(sizeof(double) * (size_t)rounds);
    for (int i = 0; i < n; i++) x[i] = nf_alloc(p, 64 << 10, (nf_stream_t)(uintptr_t)(0x1000 + i));
    uint64_t s0 = 0;
    for (long r = 0; r < rounds; r++) {
      if (r == 1) s0 = p->streams_stolen; // round 0 warms up
      double t0 = now_ns();
      for (int i = 0; i < n; i++) {
        nf_stream_t s = (nf_stream_t)(uintptr_t)(0x1000 + i);
        if (nf_free(p, x[i]) != NF_OK || !(x[i] = nf_alloc(p, 64 << 10, s))) {
          fprintf(stderr, "%d streams, round %ld: %s\n", n, r, nf_last_error());
          return 1;
        }
      }
      t[r] = (now_ns() - t0) / n;
    }
    double steals = (double)(p->streams_stolen - s0) / ((double)(rounds - 1) * n);
    qsort(t + 1, (size_t)rounds - 1, sizeof *t, cmp);
    printf("%-8d %12.1f %12.1f %14.3f\n", n, t[1 + (rounds - 1) / 2], t[1 + (rounds - 1) * 9 / 10], steals);
    if (nf_pool_check(p) != NF_OK) {
      fprintf(stderr, "check: %s\n", nf_last_error());
      return 1;
    }
    for (int i = 0; i < n; i++) nf_free(p, x[i]);
    free(x);
    free(t);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
  }
  return 0;
}
