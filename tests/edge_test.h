// Shared by the edge-sharing tests (test_edge.c, test_edge_rules.c): an
// 8-granule pool of 64 KiB granules on the host backend, with the layouts that
// leave a partly used granule to lend (a free head, a free tail, both).
#ifndef NF_EDGE_TEST_H
#define NF_EDGE_TEST_H

#include "nf_test.h"

#include "core/core.h"

#define G 65536ull
#define LIMIT "limit:512KiB,small_max:4KiB" // 8 granules; every request here in the large arena

typedef struct scen_s {
  nf_backend_t *be, *host;
  nf_pool_t *p;
  nft_live_t l[8]; // the scenario's live blocks, filled with patterns
  int n;
} scen_t;

static inline void *take(scen_t *s, uint64_t n, bool keep) {
  void *x = nf_alloc(s->p, n, 0);
  assert_non_null(x);
  if (keep) {
    uint64_t tag = 100 + (uint64_t)s->n;
    nft_fill(x, n, tag);
    s->l[s->n++] = (nft_live_t){.p = x, .n = n, .tag = tag};
  }
  return x;
}

static inline void give(scen_t *s, void *x) { assert_int_equal(nf_free(s->p, x), NF_OK); }

static inline void pool_on(scen_t *s, const char *conf, bool faults) {
  *s = (scen_t){0};
  char c[256];
  snprintf(c, sizeof c, LIMIT ",%s", conf);
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256];
  assert_int_equal(nf_config_parse(&cfg, c, err, sizeof err), NF_OK);
  assert_int_equal(nf_backend_host_create(&s->host, 1024 * G, G), NF_OK);
  s->be = s->host;
  if (faults) assert_int_equal(nf_backend_fault_create(&s->be, s->host, 0, 0, 1), NF_OK);
  assert_int_equal(nf_pool_create(&s->p, s->be, &cfg), NF_OK);
}

static inline void pool_off(scen_t *s) {
  nft_check_all(s->l, s->n);
  assert_int_equal(nf_pool_check(s->p), NF_OK);
  for (int i = 0; i < s->n; i++)
    if (s->l[i].p) give(s, s->l[i].p);
  assert_int_equal(nf_pool_check(s->p), NF_OK);
  nf_pool_destroy(s->p);
  nft_usage_is(s->host, 0, 0); // the second mappings went too
  nf_backend_destroy(s->be); // (a fault backend destroys the host one it wraps)
}

// Granule 1 holds a1's last quarter and then `lend` free bytes, with a3 live
// after them; `fill` granules are cached (mapped, free): every other granule
// of the 8 is taken.
static inline uintptr_t head_lender(scen_t *s, uint64_t lend, uint64_t fill) {
  char *a1 = take(s, 2 * G - lend, true);
  char *a2 = take(s, lend, false);
  char *a3 = take(s, G, true);
  assert_ptr_equal(a2, a1 + 2 * G - lend);
  assert_ptr_equal(a3, a1 + 2 * G);
  give(s, a2);
  if (fill) give(s, take(s, fill * G, false));
  return (uintptr_t)a1 + G; // granule 1
}

static inline nf_stats_t st(scen_t *s) { return nft_stats_of(s->p); }

// Granule 1 starts with `lend` free bytes, then q, live: a request may end there.
static inline uintptr_t tail_lender(scen_t *s, uint64_t at, uint64_t lend) {
  char *a = take(s, at * G, true);
  char *p = take(s, lend, false);
  char *q = take(s, G - lend, true);
  assert_ptr_equal(p, a + at * G);
  assert_ptr_equal(q, p + lend);
  give(s, p);
  return (uintptr_t)p;
}

// Granule 1 ends with 3G/4 free bytes (after a1's), granule 3 starts with
// 3G/4 free (before q's G/4): both-ends lenders for r = G/4. Granules 0..3 used.
static inline void both_lenders(scen_t *s) {
  char *a1 = take(s, 5 * G / 4, true), *a2 = take(s, 3 * G / 4, false);
  take(s, G, true);
  char *p = take(s, 3 * G / 4, false), *q = take(s, G / 4, true);
  assert_ptr_equal(a2, a1 + 5 * G / 4);
  assert_ptr_equal(q, a1 + 3 * G + 3 * G / 4);
  give(s, a2);
  give(s, p);
}


// Every backend call of an edge placement fails in turn, after `layout`
// (on a fault backend) left the pool one or two granules short of a request
// of 5 granules and G/4: the request either fails with the pool as it was
// (no pair left), or succeeds whole (with `edges` shared granules; 0: not
// checked), its data intact beside the scenario's live blocks.
static inline void fault_sweep(void (*layout)(scen_t *), uint64_t edges, uint64_t tag) {
  for (uint64_t k = 1;; k++) {
    scen_t s;
    pool_on(&s, "edges:1", true);
    layout(&s);
    uint64_t calls, failed;
    nf_backend_fault_counts(s.be, &calls, &failed);
    nf_backend_fault_set(s.be, calls + k, 0);
    char *c = nf_alloc(s.p, 5 * G + G / 4, 0);
    nf_backend_fault_counts(s.be, &calls, &failed);
    nf_backend_fault_set(s.be, 0, 0);
    assert_int_equal(nf_pool_check(s.p), NF_OK);
    nft_check_all(s.l, s.n);
    if (c) {
      if (edges) assert_int_equal(st(&s).edges, edges);
      nft_fill(c, 5 * G + G / 4, tag);
      s.l[s.n++] = (nft_live_t){.p = c, .n = 5 * G + G / 4, .tag = tag};
    } else {
      assert_int_equal(st(&s).edges, 0);
    }
    if (getenv("NFT_VERBOSE"))
      fprintf(stderr, "fault at call %llu: %s, %llu shared\n", (unsigned long long)k, c ? "placed" : "refused",
              (unsigned long long)st(&s).edges_made);
    pool_off(&s);
    if (!failed) break; // the k-th call was past the last one: every call was failed once
    assert_true(k < 200);
  }
}

#endif
