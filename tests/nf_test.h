// Shared helpers for the test suite (cmocka). One header for all tests.
#ifndef NF_TEST_H
#define NF_TEST_H

#include <dirent.h>
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

#ifdef NF_READY // white box: tests that include core/core.h first
// Whether a failed tier operation left live block `a` with granules mapped
// without access (nf_block_t.unready; until its nf_prefetch): not to be read.
static inline bool nft_unready(nf_pool_t *p, const void *a) {
  nf_block_t *b = nf__map_find(p, (uintptr_t)a);
  return b && b->unready;
}
#endif

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

// The tier tests' pool (test_offload, test_offload_order, test_spill): a host
// backend of 1,024 granules of 64 KiB (their G), asserted to succeed.
static inline nf_pool_t *nft_pool64k(nf_backend_t **be, const char *conf) {
  nf_pool_t *p = nft_pool(be, 1024 * 65536ull, 65536, conf);
  assert_non_null(p);
  return p;
}

// A pool (limit 8 MiB, granule g) holding one pending block: 3 granules
// allocated on stream 1, recorded on stream 2, freed while stream 2's work is
// not done (manual events). nf_backend_host_complete_events(*be) ends it.
// Shared by test_walk and test_snapshot, which both check how it is shown.
static inline nf_pool_t *nft_pending_pool(nf_backend_t **be, uint64_t g) {
  nf_pool_t *p = nft_pool(be, 1ull << 30, g, "limit:8MiB");
  assert_non_null(p);
  nf_backend_host_set_manual_events(*be, 1);
  void *a = nf_alloc(p, 3 * g, (void *)1);
  assert_non_null(a);
  assert_int_equal(nf_record_stream(p, a, (void *)2), NF_OK);
  assert_int_equal(nf_free(p, a), NF_OK);
  return p;
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


// A block's bytes per tier (nf_block_tiers), asserted to succeed.
static inline void nft_tiers(nf_pool_t *p, void *ptr, uint64_t t[3]) {
  assert_int_equal(nf_block_tiers(p, ptr, t), NF_OK);
}

// The pool's statistics, after checking its invariants (nf_pool_check).
static inline void nft_stats(nf_pool_t *p, nf_stats_t *s) {
  nf_stats_get(p, s);
  if (nf_pool_check(p) != NF_OK) fail_msg("%s", nf_last_error());
}

// The pool's statistics as a value (no invariant check).
static inline nf_stats_t nft_stats_of(nf_pool_t *p) {
  nf_stats_t s;
  nf_stats_get(p, &s);
  return s;
}

// Descriptors this process has open (entries of /proc/self/fd, the
// directory's own included): tests compare counts before and after.
static inline int nft_open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  assert_non_null(d);
  int n = 0;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

// ------------------------------------------------------------ configuration
// The default configuration; asserts success.
static inline nf_config_t nft_conf_default(void) {
  nf_config_t c;
  assert_int_equal(nf_config_default(&c), NF_OK);
  return c;
}

// `s` parsed into the default configuration; asserts success.
static inline nf_config_t nft_conf_ok(const char *s) {
  nf_config_t c = nft_conf_default();
  char err[256] = "";
  if (nf_config_parse(&c, s, err, sizeof err) != NF_OK) fail_msg("parse('%s') failed: %s", s, err);
  return c;
}

// `s` refused: NF_ERR_CONFIG, the configuration untouched (a non-default one,
// to see that nothing is written), a terminated message that holds every
// non-NULL needle.
static inline void nft_conf_bad(const char *s, const char *n1, const char *n2) {
  nf_config_t c = nft_conf_default(), before;
  c.limit = 12345;
  before = c;
  char err[512];
  memset(err, 'x', sizeof err);
  nf_status_t st = nf_config_parse(&c, s, err, sizeof err);
  if (st != NF_ERR_CONFIG) fail_msg("parse('%s') returned %d, expected NF_ERR_CONFIG", s, (int)st);
  assert_memory_equal(&c, &before, sizeof c);
  assert_non_null(memchr(err, '\0', sizeof err));
  assert_true(strlen(err) > 0);
  if (n1 && !strstr(err, n1)) fail_msg("parse('%s'): message '%s' lacks '%s'", s, err, n1);
  if (n2 && !strstr(err, n2)) fail_msg("parse('%s'): message '%s' lacks '%s'", s, err, n2);
}

// ------------------------------------------------------------ live blocks
// A test's record of a block it allocated and filled with nft_fill(p, n, tag)
// on stream s (p NULL: the slot is unused).
typedef struct {
  void *p;
  size_t n;
  uint64_t tag;
  nf_stream_t s;
} nft_live_t;

// [a, a + n) and [b, b + m) overlap.
static inline bool nft_overlaps(uintptr_t a, size_t n, uintptr_t b, size_t m) { return a < b + m && b < a + n; }

// Every recorded block still holds its pattern.
static inline void nft_check_all(nft_live_t *l, int n) {
  for (int i = 0; i < n; i++)
    if (l[i].p && !nft_check(l[i].p, l[i].n, l[i].tag)) fail_msg("block %d (%p, %zu B) lost its data", i, l[i].p, l[i].n);
}

// No two recorded blocks overlap.
static inline void nft_no_overlap(nft_live_t *l, int n) {
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) {
      if (!l[i].p || !l[j].p) continue;
      uintptr_t a = (uintptr_t)l[i].p, b = (uintptr_t)l[j].p;
      if (a < b + l[j].n && b < a + l[i].n) fail_msg("blocks %p and %p overlap", l[i].p, l[j].p);
    }
}

// ------------------------------------------------------------ backend tests
#include "backend/backend.h"
#include <unistd.h>

// Backend tests (test_backend, test_host_event, test_fault_backend): a small
// granule keeps them fast, at least a page on any machine.
static inline size_t nft_small_granule(void) {
  long page = sysconf(_SC_PAGESIZE);
  return page > 65536 ? (size_t)page : 65536;
}

static inline nf_backend_t *nft_host(uint64_t capacity, size_t granule) {
  nf_backend_t *be = NULL;
  assert_int_equal(nf_backend_host_create(&be, capacity, granule), NF_OK);
  assert_non_null(be);
  return be;
}

// The host backend holds `granules` granules and `mappings` mappings.
static inline void nft_usage_is(nf_backend_t *be, uint64_t granules, uint64_t mappings) {
  uint64_t g = 99, m = 99;
  nf_backend_host_usage(be, &g, &m);
  assert_int_equal(g, granules);
  assert_int_equal(m, mappings);
}

// The calling thread's last backend message (be: the backend that failed,
// for the reader) / last pool error contains `needle`.
static inline void nft_err_has(nf_backend_t *be, const char *needle) {
  (void)be;
  if (!strstr(nf__backend_err(), needle)) fail_msg("error \"%s\" lacks \"%s\"", nf__backend_err(), needle);
}
static inline void nft_last_error_has(const char *needle) {
  if (!strstr(nf_last_error(), needle)) fail_msg("error \"%s\" lacks \"%s\"", nf_last_error(), needle);
}

// ------------------------------------------------------------ spy backends
// A test's own backend that forwards every op to `inner` (a host backend),
// so that it can watch or change single ops: nft_spy_init fills `ops` with
// forwarders, the test then overrides members. `be` must be the first member
// of a calloc'ed struct: destroy frees it and the inner backend.
static inline nf_status_t nft_fwd(nf_backend_t *be, nf_status_t st) {
  (void)be; // the inner op's message is the thread's (nf__backend_err)
  return st;
}
#define NFT_IN(be) ((be)->inner)
static inline nf_status_t nft_f_gran(nf_backend_t *be, nf_tier_t t, size_t *o) { return nft_fwd(be, NFT_IN(be)->ops->granularity(NFT_IN(be), t, o)); }
static inline nf_status_t nft_f_cap(nf_backend_t *be, nf_tier_t t, uint64_t *a, uint64_t *b) { return nft_fwd(be, NFT_IN(be)->ops->capacity(NFT_IN(be), t, a, b)); }
static inline nf_status_t nft_f_var(nf_backend_t *be, size_t n, size_t al, uintptr_t *o) { return nft_fwd(be, NFT_IN(be)->ops->va_reserve(NFT_IN(be), n, al, o)); }
static inline nf_status_t nft_f_vaf(nf_backend_t *be, uintptr_t v, size_t n) { return nft_fwd(be, NFT_IN(be)->ops->va_release(NFT_IN(be), v, n)); }
static inline nf_status_t nft_f_mc(nf_backend_t *be, nf_tier_t t, size_t n, nf_handle_t *o) { return nft_fwd(be, NFT_IN(be)->ops->mem_create(NFT_IN(be), t, n, o)); }
static inline nf_status_t nft_f_mr(nf_backend_t *be, nf_handle_t h) { return nft_fwd(be, NFT_IN(be)->ops->mem_release(NFT_IN(be), h)); }
static inline nf_status_t nft_f_map(nf_backend_t *be, uintptr_t v, size_t n, nf_handle_t h) { return nft_fwd(be, NFT_IN(be)->ops->map(NFT_IN(be), v, n, h)); }
static inline nf_status_t nft_f_unmap(nf_backend_t *be, uintptr_t v, size_t n) { return nft_fwd(be, NFT_IN(be)->ops->unmap(NFT_IN(be), v, n)); }
static inline nf_status_t nft_f_acc(nf_backend_t *be, uintptr_t v, size_t n) { return nft_fwd(be, NFT_IN(be)->ops->set_access(NFT_IN(be), v, n)); }
static inline nf_status_t nft_f_copy(nf_backend_t *be, uintptr_t d, uintptr_t s, size_t n, nf_stream_t st) { return nft_fwd(be, NFT_IN(be)->ops->copy(NFT_IN(be), d, s, n, st)); }
static inline nf_status_t nft_f_evc(nf_backend_t *be, nf_event_t *o) { return nft_fwd(be, NFT_IN(be)->ops->event_create(NFT_IN(be), o)); }
static inline nf_status_t nft_f_evd(nf_backend_t *be, nf_event_t e) { return nft_fwd(be, NFT_IN(be)->ops->event_destroy(NFT_IN(be), e)); }
static inline nf_status_t nft_f_evr(nf_backend_t *be, nf_event_t e, nf_stream_t s) { return nft_fwd(be, NFT_IN(be)->ops->event_record(NFT_IN(be), e, s)); }
static inline nf_status_t nft_f_evq(nf_backend_t *be, nf_event_t e) { return nft_fwd(be, NFT_IN(be)->ops->event_query(NFT_IN(be), e)); }
static inline nf_status_t nft_f_evs(nf_backend_t *be, nf_event_t e) { return nft_fwd(be, NFT_IN(be)->ops->event_sync(NFT_IN(be), e)); }
static inline nf_status_t nft_f_sw(nf_backend_t *be, nf_stream_t s, nf_event_t e) { return nft_fwd(be, NFT_IN(be)->ops->stream_wait(NFT_IN(be), s, e)); }
static inline void nft_f_destroy(nf_backend_t *be) {
  nf_backend_destroy(NFT_IN(be));
  free(be);
}

// `be` forwards to a new host backend of `capacity` and `granule` through
// `ops` (named members: optional ops stay NULL, i.e. not supported).
static inline void nft_spy_init(nf_backend_t *be, nf_backend_ops_t *ops, uint64_t capacity, uint64_t granule) {
  nf_backend_t *in = NULL;
  assert_int_equal(nf_backend_host_create(&in, capacity, granule), NF_OK);
  *ops = (nf_backend_ops_t){.name = "spy", .granularity = nft_f_gran, .capacity = nft_f_cap, .va_reserve = nft_f_var,
                            .va_release = nft_f_vaf, .mem_create = nft_f_mc, .mem_release = nft_f_mr,
                            .map = nft_f_map, .unmap = nft_f_unmap, .set_access = nft_f_acc, .copy = nft_f_copy,
                            .event_create = nft_f_evc, .event_destroy = nft_f_evd, .event_record = nft_f_evr,
                            .event_query = nft_f_evq, .event_sync = nft_f_evs, .stream_wait = nft_f_sw,
                            .destroy = nft_f_destroy};
  be->ops = ops;
  be->inner = in;
}

// A pool on backend `be` (not owned) with configuration `conf` (NULL: defaults).
static inline nf_pool_t *nft_pool_on(nf_backend_t *be, const char *conf) {
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256];
  if (conf) assert_int_equal(nf_config_parse(&cfg, conf, err, sizeof err), NF_OK);
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, be, &cfg), NF_OK);
  return p;
}

// A spy whose next `fail_acc` set-access calls and `fail_unmap` unmap calls
// fail (test_fault_tier, test_fault_deferred): calloc it, nft_spy_init, then
// set ops.set_access = nft_ws_acc and / or ops.unmap = nft_ws_unmap.
typedef struct { nf_backend_t be; nf_backend_ops_t ops; int fail_acc, fail_unmap; } nft_winspy_t;
static inline nf_status_t nft_ws_acc(nf_backend_t *be, uintptr_t v, size_t n) {
  if (((nft_winspy_t *)be)->fail_acc > 0 && ((nft_winspy_t *)be)->fail_acc--) return NF_ERR_BACKEND;
  return nft_f_acc(be, v, n);
}
static inline nf_status_t nft_ws_unmap(nf_backend_t *be, uintptr_t v, size_t n) {
  if (((nft_winspy_t *)be)->fail_unmap > 0 && ((nft_winspy_t *)be)->fail_unmap--) return NF_ERR_BACKEND;
  return nft_f_unmap(be, v, n);
}

// Destroy pool p and backend be (a fault backend over the host backend
// `inner`): whatever failed on the way, `inner` must hold no granule and no
// mapping once the pool is gone (test_fault, test_fault_tier).
static inline void nft_destroy_all(nf_pool_t *p, nf_backend_t *be, nf_backend_t *inner) {
  nf_pool_destroy(p);
  uint64_t gr = 1, mp = 1;
  nf_backend_host_usage(inner, &gr, &mp);
  assert_int_equal(gr, 0);
  assert_int_equal(mp, 0);
  nf_backend_destroy(be);
}

// The longest run of consecutive set bits of a fault mask (nf__backend_fault_mask).
static inline int nft_longest_run(uint64_t m) {
  int run = 0;
  for (; m; run++) m &= m << 1;
  return run;
}

// After faults from `mask`: cleanup calls are retried 3 times, so more than 2
// failures in a row may leak a staging range or mapping (by design); fewer
// must leave nothing behind (nft_destroy_all). test_fault_tier, test_fault_wait.
// An offload whose copy may still run when it returns (test_fault_deferred,
// test_tier_rules): a fault backend over a host backend with manual events,
// a pool of 8 granules of g; b (4 granules, filled with `tag`), e (1) and c
// (2) on stream A; 8 backend calls in a row fail from call k on while b is
// offloaded to `tier` on stream B (returned: its status). nft_undrained_end
// checks that freeing b on A, offloading c on A (a wait for A only) and then
// stitching 6 granules on A unmapped or reused nothing under B's copy, and
// that the pool is consistent; then destroys it all.
typedef struct { nf_backend_t *host, *be; nf_pool_t *p; void *b, *c; } nft_undrained_t;
#define NFT_A ((nf_stream_t)1)
#define NFT_B ((nf_stream_t)2)
static inline nf_status_t nft_undrained(nft_undrained_t *u, uint64_t g, uint64_t k, nf_tier_t tier, uint64_t tag) {
  u->host = nft_host(1024 * g, g);
  assert_int_equal(nf_backend_fault_create(&u->be, u->host, 0, 0, 1), NF_OK);
  char conf[64];
  snprintf(conf, sizeof conf, "limit:%llu,views:0", (unsigned long long)(8 * g));
  u->p = nft_pool_on(u->be, conf);
  nf_backend_host_set_manual_events(u->host, 1);
  u->b = nf_alloc(u->p, 4 * g, NFT_A);
  void *e = nf_alloc(u->p, g, NFT_A);
  u->c = nf_alloc(u->p, 2 * g, NFT_A);
  assert_true(u->b && e && u->c);
  nft_fill(u->b, 4 * g, tag);
  uint64_t base, failed;
  nf_backend_fault_counts(u->be, &base, &failed);
  nf__backend_fault_mask(u->be, base + k, 0xFF);
  nf_status_t r = nf_offload(u->p, u->b, NFT_B, tier);
  nf_backend_fault_set(u->be, 0, 0);
  return r;
}
static inline void nft_undrained_end(nft_undrained_t *u, uint64_t g, const char *what) {
  assert_int_equal(nf_free(u->p, u->b), NF_OK);                          // on A; B's copy may be in flight
  assert_int_equal(nf_offload(u->p, u->c, NFT_A, NF_TIER_DISK), NF_OK); // something waits for A only
  assert_non_null(nf_alloc(u->p, 6 * g, NFT_A)); // stitching unmaps what lies free: not b's range before B is done
  if (nf_backend_host_violations(u->host)) fail_msg("%s: b's range unmapped or reused under its copy out", what);
  assert_int_equal(nf_pool_check(u->p), NF_OK);
  nf_backend_host_complete_events(u->host);
  nf_backend_host_set_manual_events(u->host, 0);
  nf_pool_destroy(u->p);
  nf_backend_destroy(u->be); // and host, which it owns
}

// The end of a test on a plain host backend: the pool passes its check, then
// goes, leaving nothing in the backend (test_vmm_rules, test_view_rules).
static inline void nft_done(nf_pool_t *p, nf_backend_t *be) {
  if (nf_pool_check(p) != NF_OK) fail_msg("%s", nf_last_error());
  nft_destroy_all(p, be, be);
}

// A block of n bytes of pool p (on the default stream), filled with `tag`
// (0: left as it is), offloaded to `tier` and waited for.
static inline void *nft_offloaded(nf_pool_t *p, size_t n, nf_tier_t tier, uint64_t tag) {
  void *a = nf_alloc(p, n, NULL);
  assert_non_null(a);
  if (tag) nft_fill(a, n, tag);
  assert_int_equal(nf_offload(p, a, NULL, tier), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  return a;
}

static inline void nft_destroy_after(nf_pool_t *p, nf_backend_t *be, nf_backend_t *inner, uint64_t mask) {
  if (nft_longest_run(mask) <= 2) {
    nft_destroy_all(p, be, inner);
    return;
  }
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// ------------------------------------------------------------ files and mappings
// Write `n` bytes of `text` to a fresh temp file named after `tag` (gzip-
// compressed when gz); its path goes to `path` (the caller unlinks).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>
static inline void nft_write_tmp(char *path, size_t len, const char *tag, const char *text, size_t n, int gz) {
  snprintf(path, len, "/tmp/nf_%s_XXXXXX", tag);
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  if (gz) {
    close(fd);
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(gzwrite(f, text, (unsigned)n), (int)n);
    assert_int_equal(gzclose(f), Z_OK);
  } else {
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
  }
}

// Cut file `path` to half its size (a gzip stream cut short).
static inline void nft_truncate_half(const char *path) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  assert_int_equal(ftruncate(fileno(f), sz / 2), 0);
  fclose(f);
}

// Filler mappings that bring this process near vm.max_map_count: one region
// whose pages alternate in protection (each a kernel mapping of its own), so
// that a few more mappings reach the real bound. Unmapped in one call, by the
// test or by its teardown (nft_teardown_filler) if an assertion jumped out.
typedef struct { void *p; size_t len; } nft_filler_t;
static inline nft_filler_t *nft_filler(void) { // one per test binary (unused elsewhere: no warning)
  static nft_filler_t f;
  return &f;
}

static inline uint64_t nft_maps_now(void) { // kernel mappings of this process (no stdio: no allocation)
  static char buf[1 << 16];
  uint64_t n = 0;
  int fd = open("/proc/self/maps", O_RDONLY);
  if (fd < 0) return 0;
  for (ssize_t k; (k = read(fd, buf, sizeof buf)) > 0;)
    for (ssize_t i = 0; i < k; i++) n += buf[i] == '\n';
  close(fd);
  return n;
}

// True when the process now has about `left` mappings to go before the bound
// (false: the bound is unknown or too large to reach quickly: skip).
#if defined(__SANITIZE_THREAD__)
#define NFT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NFT_TSAN 1
#endif
#endif
static inline bool nft_fill_maps_to(uint64_t left) {
#ifdef NFT_TSAN
  // TSan's runtime maps memory as it goes: near the bound its own mmap fails
  // and it aborts the process (CI, 2026-12-04). ASan copes.
  (void)left;
  return false;
#endif
  unsigned long long lim = 0;
  FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
  if (f) {
    if (fscanf(f, "%llu", &lim) != 1) lim = 0;
    fclose(f);
  }
  uint64_t now = nft_maps_now();
  if (!lim || lim > (1u << 21) || !now || now + left + 2 >= lim) return false;
  size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (size_t)(lim - left - now);
  void *p = mmap(NULL, n * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  nft_filler()->p = p;
  nft_filler()->len = n * page;
  for (size_t i = 1; i < n; i += 2)
    if (mprotect((char *)p + i * page, page, PROT_NONE) != 0) break;
  return true;
}

static inline void nft_filler_free(void) {
  if (nft_filler()->p) munmap(nft_filler()->p, nft_filler()->len);
  nft_filler()->p = NULL;
}

static inline int nft_teardown_filler(void **state) {
  (void)state;
  nft_filler_free();
  return 0;
}

// Run `fn` with stderr going to a temp file; returns what it wrote (malloc'd,
// at most 64 KiB; the caller frees it).
static inline char *nft_capture_stderr(void (*fn)(void *), void *arg) {
  char path[] = "/tmp/nf_err_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  fflush(stderr);
  int saved = dup(2);
  assert_true(saved >= 0);
  dup2(fd, 2);
  fn(arg);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char *buf = calloc(1, 1 << 16);
  assert_non_null(buf);
  ssize_t got = pread(fd, buf, (1 << 16) - 1, 0);
  close(fd);
  buf[got > 0 ? got : 0] = 0;
  return buf;
}

#endif
