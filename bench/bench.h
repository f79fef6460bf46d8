// Helpers shared by the C benchmarks (bench/*.c): a monotonic clock in ns and
// a comparator for sorting timings.
#ifndef NF_BENCH_H
#define NF_BENCH_H

#include <time.h>

static inline double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static inline int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#endif
