// Peer access (src/core/peer.c): after nf_pool_add_peer, another device may
// use every live block -- the ones mapped before the call, the ones mapped
// later, and those placed on a cached view (a mapping reused with no new
// grant). A spying backend models cuMemSetAccess: a mapping starts with no
// access, set_access grants the owner and the peers added so far, unmap drops
// the grant. The tests check each live block's granules through that model.
#include "nf_test.h"

#include "backend/backend.h"
#include "core/core.h"

#define G (64 * 1024)
#define S(x) ((nf_stream_t)(uintptr_t)(x))
#define MAXG 4096

typedef struct {
  nf_backend_t be;
  nf_backend_ops_t ops;
  uint64_t peers;           // add_peer so far
  uintptr_t granted[MAXG];  // granules whose mapping grants peer 1 (0: empty slot)
  int fail_access_in;       // >0: the n-th next set_access fails
  bool fail_peer;           // add_peer fails
} spy_t;

#define SP(be) ((spy_t *)(be))
#define IN(be) ((be)->inner)

static void grant(spy_t *s, uintptr_t va, size_t n, bool on) {
  for (uintptr_t a = va; a < va + n; a += G) {
    int hole = -1, at = -1;
    for (int i = 0; i < MAXG; i++) {
      if (s->granted[i] == a) at = i;
      if (!s->granted[i] && hole < 0) hole = i;
    }
    if (on && at < 0) {
      assert_true(hole >= 0);
      s->granted[hole] = a;
    }
    if (!on && at >= 0) s->granted[at] = 0;
  }
}

static bool granted(const spy_t *s, uintptr_t a) {
  for (int i = 0; i < MAXG; i++)
    if (s->granted[i] == a) return true;
  return false;
}

static nf_status_t sp_map(nf_backend_t *be, uintptr_t v, size_t n, nf_handle_t h) {
  grant(SP(be), v, n, false); // a new mapping has no access yet
  return nft_fwd(be, IN(be)->ops->map(IN(be), v, n, h));
}
static nf_status_t sp_unmap(nf_backend_t *be, uintptr_t v, size_t n) {
  nf_status_t st = IN(be)->ops->unmap(IN(be), v, n);
  if (st == NF_OK) grant(SP(be), v, n, false);
  return nft_fwd(be, st);
}
static nf_status_t sp_acc(nf_backend_t *be, uintptr_t v, size_t n) {
  if (SP(be)->fail_access_in > 0 && --SP(be)->fail_access_in == 0)
    return nf__backend_fail(be, NF_ERR_BACKEND, "spy: injected set_access failure");
  nf_status_t st = IN(be)->ops->set_access(IN(be), v, n);
  if (st == NF_OK && (SP(be)->peers & 2)) grant(SP(be), v, n, true);
  return nft_fwd(be, st);
}
static nf_status_t sp_peer(nf_backend_t *be, int d) {
  if (SP(be)->fail_peer) return nf__backend_fail(be, NF_ERR_BACKEND, "spy: injected add_peer failure");
  SP(be)->peers |= 1ull << d;
  return NF_OK;
}
static spy_t *spy_new(uint64_t capacity) {
  spy_t *s = calloc(1, sizeof *s);
  assert_non_null(s);
  nft_spy_init(&s->be, &s->ops, capacity, G);
  s->ops.map = sp_map;
  s->ops.unmap = sp_unmap;
  s->ops.set_access = sp_acc;
  s->ops.add_peer = sp_peer;
  return s;
}

static nf_pool_t *spy_pool(spy_t *s, const char *conf) { return nft_pool_on(&s->be, conf); }

// Every granule under live block `ptr` (size n) is granted to the peer.
static bool block_granted(const spy_t *s, const void *ptr, size_t n) {
  uintptr_t a = (uintptr_t)ptr & ~(uintptr_t)(G - 1);
  for (; a < (uintptr_t)ptr + n; a += G)
    if (!granted(s, a)) return false;
  return true;
}

enum { NB = 24 };

// A workload with holes, stitched blocks and reuse of cached views (the
// pattern of test_view's steps): `steps` rounds; every live block keeps its
// pattern; with `check_peer`, every block placed is granted to the peer.
static void churn(nf_pool_t *p, spy_t *s, void **b, size_t *n, uint64_t *seed, int steps, bool check_peer) {
  for (int it = 0; it < steps; it++) {
    int i = (int)(nft_rand(seed) % NB);
    if (b[i]) {
      assert_true(nft_check(b[i], n[i], (uint64_t)i + 1));
      assert_int_equal(nf_free(p, b[i]), NF_OK);
      b[i] = NULL;
      continue;
    }
    n[i] = (size_t)(nft_rand(seed) % (6 * G)) + 512;
    b[i] = nf_alloc(p, n[i], S((nft_rand(seed) & 1) + 1));
    if (!b[i]) continue; // at the limit: the next frees make room
    nft_fill(b[i], n[i], (uint64_t)i + 1);
    if (check_peer) assert_true(block_granted(s, b[i], n[i]));
  }
  assert_int_equal(nf_pool_check(p), NF_OK);
}

static void test_peer_sees_old_new_and_view_blocks(void **state) {
  (void)state;
  spy_t *s = spy_new(64 * (uint64_t)G);
  nf_pool_t *p = spy_pool(s, "limit:2097152");
  void *b[NB] = {0};
  size_t n[NB] = {0};
  uint64_t seed = nft_env_seed(11);
  churn(p, s, b, n, &seed, 400, false);
  nf_stats_t st;
  nf_stats_get(p, &st);
  assert_true(st.view_reuses + st.calls.map > 0);
  assert_int_equal(nf_pool_add_peer(p, 1), NF_OK);
  for (int i = 0; i < NB; i++)
    if (b[i]) assert_true(block_granted(s, b[i], n[i])); // mapped before the call
  churn(p, s, b, n, &seed, 2000, true); // growth, stitching and cached views after it
  nf_stats_get(p, &st);
  assert_true(st.view_reuses > 0); // the view path was exercised
  assert_int_equal(nf_pool_add_peer(p, 1), NF_OK); // idempotent
  for (int i = 0; i < NB; i++)
    if (b[i]) assert_int_equal(nf_free(p, b[i]), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(&s->be);
}

// A failing grant returns the backend's error and leaves every block usable;
// asking again grants what the first call missed.
static void test_peer_grant_failure(void **state) {
  (void)state;
  spy_t *s = spy_new(64 * (uint64_t)G);
  nf_pool_t *p = spy_pool(s, "limit:2097152");
  void *b[NB] = {0};
  size_t n[NB] = {0};
  uint64_t seed = nft_env_seed(12);
  churn(p, s, b, n, &seed, 300, false);
  s->fail_access_in = 1;
  assert_int_equal(nf_pool_add_peer(p, 1), NF_ERR_BACKEND);
  assert_non_null(strstr(nf_last_error(), "injected set_access failure"));
  for (int i = 0; i < NB; i++)
    if (b[i]) assert_true(nft_check(b[i], n[i], (uint64_t)i + 1));
  assert_int_equal(nf_pool_add_peer(p, 1), NF_OK);
  for (int i = 0; i < NB; i++)
    if (b[i]) assert_true(block_granted(s, b[i], n[i]));
  churn(p, s, b, n, &seed, 500, true);
  for (int i = 0; i < NB; i++)
    if (b[i]) assert_int_equal(nf_free(p, b[i]), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(&s->be);
}

// Bad input gets a clear error; a backend without peers says so.
static void test_peer_errors(void **state) {
  (void)state;
  assert_int_equal(nf_pool_add_peer(NULL, 1), NF_ERR_INVALID);
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 16 * (uint64_t)G, G, NULL);
  assert_non_null(p);
  assert_int_equal(nf_pool_add_peer(p, -1), NF_ERR_INVALID);
  assert_int_equal(nf_pool_add_peer(p, 1), NF_ERR_UNSUPPORTED);
  assert_non_null(strstr(nf_last_error(), "no peer devices"));
  void *x = nf_alloc(p, G, S(1));
  assert_non_null(x);
  assert_int_equal(nf_free(p, x), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

// Every address range is re-granted, each to its end, a granted run in one
// call: with 4-granule ranges (va_chunk) blocks lie in many small-arena and
// large-arena ranges, some ending exactly at a range's last granule. (A
// mutation study: a re-grant of the first range only, or of each range's
// last granule in a call of its own, passed.)
static void test_peer_every_range(void **state) {
  (void)state;
  spy_t *s = spy_new(256 * (uint64_t)G);
  nf_config_t c;
  nf_config_default(&c);
  c.va_chunk = 4 * G;
  c.small_max = 2 * G;
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create(&p, &s->be, &c), NF_OK);
  enum { N = 12 };
  void *b[N];
  size_t n[N];
  for (int i = 0; i < N; i++) { // 1, 2 (small arena), 3, 4 granules (large), thrice
    n[i] = (size_t)(i % 4 + 1) * G;
    assert_non_null(b[i] = nf_alloc(p, n[i], NULL));
    nft_fill(b[i], n[i], (uint64_t)i + 1);
  }
  assert_int_equal(nf_pool_add_peer(p, 1), NF_OK);
  for (int i = 0; i < N; i++) {
    if (!block_granted(s, b[i], n[i])) fail_msg("block %d (%zu B) not granted to the peer", i, n[i]);
    assert_true(nft_check(b[i], n[i], (uint64_t)i + 1));
    assert_int_equal(nf_free(p, b[i]), NF_OK);
  }
  nf_pool_destroy(p);
  assert_int_equal(nf_pool_create(&p, &s->be, &c), NF_OK); // a block alone in its range: one call
  void *w = nf_alloc(p, 4 * G, NULL);
  assert_non_null(w);
  uint64_t acc = nft_stats_of(p).calls.set_access;
  assert_int_equal(nf_pool_add_peer(p, 1), NF_OK);
  assert_int_equal(nft_stats_of(p).calls.set_access, acc + 1);
  assert_true(block_granted(s, w, 4 * G));
  assert_int_equal(nf_free(p, w), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(&s->be);
}

// Device 0 is a peer like any other (a pool on device 1 shares with it);
// the backend's refusal of a peer is the caller's error, and nothing is
// re-granted then.
static void test_peer_device0_and_refusal(void **state) {
  (void)state;
  spy_t *s = spy_new(64 * (uint64_t)G);
  nf_pool_t *p = spy_pool(s, "limit:2097152");
  void *x = nf_alloc(p, 2 * G, NULL);
  assert_non_null(x);
  assert_int_equal(nf_pool_add_peer(p, 0), NF_OK);
  assert_int_equal(s->peers, 1);
  s->fail_peer = true;
  uint64_t acc = nft_stats_of(p).calls.set_access;
  assert_int_equal(nf_pool_add_peer(p, 1), NF_ERR_BACKEND);
  nft_last_error_has("injected add_peer failure");
  assert_int_equal(nft_stats_of(p).calls.set_access, acc);
  assert_false(block_granted(s, x, 2 * G));
  s->fail_peer = false;
  assert_int_equal(nf_pool_add_peer(p, 1), NF_OK);
  assert_true(block_granted(s, x, 2 * G));
  assert_int_equal(nf_free(p, x), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(&s->be);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1); // the churn hits the limit on purpose
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_peer_sees_old_new_and_view_blocks),
      cmocka_unit_test(test_peer_grant_failure),
      cmocka_unit_test(test_peer_errors),
      cmocka_unit_test(test_peer_every_range),
      cmocka_unit_test(test_peer_device0_and_refusal),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
