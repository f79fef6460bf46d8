// Shared helpers for the test suite (cmocka). One header for all tests.
#ifndef NF_TEST_H
#define NF_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "nofrag.h"

// Seed for randomized tests: fixed seeds plus NF_SEED from the environment
// (printed so that a failure can be reproduced).
static inline uint64_t nft_env_seed(uint64_t fallback) {
  const char *s = getenv("NF_SEED");
  uint64_t v = s && *s ? strtoull(s, NULL, 0) : fallback;
  return v;
}

static inline uint64_t nft_rand(uint64_t *s) { // xorshift64*
  uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
  x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

// Pattern helpers: fill a block with a pattern derived from (tag, offset) and
// verify it. Only `stride`-spaced words are written for large blocks so that
// tests stay fast but every page of the block is touched.
static inline void nft_fill(void *p, size_t n, uint64_t tag) {
  unsigned char *c = (unsigned char *)p;
  size_t step = n > (1u << 16) ? 4096 : 8;
  for (size_t off = 0; off + 8 <= n; off += step) {
    uint64_t v = tag * 0x100000001B3ull ^ off;
    memcpy(c + off, &v, 8);
  }
  if (n >= 8) { uint64_t v = tag ^ 0xABCDEFull ^ (n - 8); memcpy(c + n - 8, &v, 8); }
  else for (size_t i = 0; i < n; i++) c[i] = (unsigned char)(tag + i);
}

static inline int nft_check(const void *p, size_t n, uint64_t tag) {
  const unsigned char *c = (const unsigned char *)p;
  size_t step = n > (1u << 16) ? 4096 : 8;
  if (n >= 8) {
    uint64_t v, w = tag ^ 0xABCDEFull ^ (n - 8);
    memcpy(&v, c + n - 8, 8);
    if (v != w) return 0;
    for (size_t off = 0; off + 8 <= n; off += step) {
      if (off + 8 > n - 8 && off != n - 8) break; // overlapped by the tail word
      if (off + 8 > n - 8) break;
      memcpy(&v, c + off, 8);
      if (v != (tag * 0x100000001B3ull ^ off)) return 0;
    }
  } else {
    for (size_t i = 0; i < n; i++) if (c[i] != (unsigned char)(tag + i)) return 0;
  }
  return 1;
}

// A host backend + pool with a small granule, for tests.
static inline nf_pool_t *nft_pool(nf_backend_t **be, uint64_t capacity, uint64_t granule, const char *conf) {
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256] = "";
  if (conf && nf_config_parse(&cfg, conf, err, sizeof err) != NF_OK) {
    fprintf(stderr, "config: %s\n", err);
    return NULL;
  }
  if (nf_backend_host_create(be, capacity, granule) != NF_OK) return NULL;
  nf_pool_t *pool = NULL;
  if (nf_pool_create(&pool, *be, &cfg) != NF_OK) { nf_backend_destroy(*be); *be = NULL; return NULL; }
  return pool;
}

// Run the CLI (env NF_CLI, set by ctest) with `args`, a shell fragment;
// stdout and stderr land in `out`. Returns the exit status (-1: killed).
#include <sys/wait.h>
static inline int nft_run_cli(const char *args, char *out, size_t n) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", getenv("NF_CLI"), args);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t got = fread(out, 1, n - 1, p);
  out[got] = 0;
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif
