// The CUDA backend (src/backend/cuda.c) and the multi-device paths on a
// stand-in driver (tests/fake_cuda/fake_cuda.c: the driver's VMM, contexts,
// streams and events on host memory, for two devices), so that they run in
// CI without a GPU. The stand-in refuses what the driver refuses (a mapping's
// sub-range unmapped, an event recorded on another context's stream, a copy
// through memory its device was not granted ...) and counts each refusal
// that points at a nofrag bug as a violation: every test requires none, and
// that every call ran in the pool's device's primary context and relaxed
// capture mode, restoring the caller's. Stream order: test_cuda_fake_streams.c.
#include "cuda_fake_test.h"

#include "torch/torch.h"

#include <pthread.h>
#include <unistd.h>

// ------------------------------------------------------------------ opening
static void test_open(void **state) {
  (void)state;
  nf_backend_t *be = (nf_backend_t *)1;
  assert_int_equal(nf_backend_cuda_create(&be, 2), NF_ERR_INVALID); // two devices: 0 and 1
  assert_null(be);
  assert_non_null(strstr(nf_last_error(), "cuDeviceGet(2)"));
  // A plain C program's thread without a context gets the primary one ...
  assert_int_equal(nf_backend_cuda_create(&be, 1), NF_OK);
  assert_ptr_equal(current(), fakecu_primary(1));
  size_t g = 0;
  uint64_t total = 0, avail = 0;
  assert_int_equal(be->ops->granularity(be, NF_TIER_DEVICE, &g), NF_OK);
  assert_int_equal(g, G);
  assert_int_equal(be->ops->capacity(be, NF_TIER_DEVICE, &total, &avail), NF_OK);
  assert_int_equal(total, 128 * MiB);
  nf_backend_destroy(be);
  // ... the plug-in's unbound one leaves it without, and the capacity is
  // device 1's even while device 0's context is current.
  assert_int_equal(cuCtxSetCurrent(NULL), 0);
  setenv("NF_FAKE_CUDA", FAKE ",mem1=96", 1);
  assert_int_equal(nf__backend_cuda_open(&be, 1, false), NF_OK);
  assert_null(current());
  assert_int_equal(cuCtxSetCurrent(fakecu_primary(0)), 0);
  uint64_t c0 = fakecu_ctx_calls(fakecu_primary(0));
  assert_int_equal(be->ops->capacity(be, NF_TIER_DEVICE, &total, &avail), NF_OK);
  assert_int_equal(total, 96 * MiB);
  assert_int_equal(fakecu_ctx_calls(fakecu_primary(0)), c0);
  assert_ptr_equal(current(), fakecu_primary(0));
  nf_backend_destroy(be);
  setenv("NF_FAKE_CUDA", FAKE, 1);
}

// ------------------------------------------------------------------ contexts
// Allocations, frees, growth, trim and release on device 1's pool leave the
// caller's context and capture mode as they were -- no context, device 0's
// primary one, or one of its own -- and run in device 1's primary context in
// relaxed mode.
static void churn(nf_pool_t *p, uint64_t seed, int rounds) {
  nft_live_t l[24] = {{0}};
  for (int r = 0; r < rounds; r++) {
    int i = (int)(nft_rand(&seed) % 24);
    if (l[i].p) {
      assert_true(nft_check(l[i].p, l[i].n, l[i].tag));
      assert_int_equal(nf_free(p, l[i].p), NF_OK);
      l[i].p = NULL;
      continue;
    }
    size_t n = 512 + nft_rand(&seed) % (3 * G);
    if (!(l[i].p = nf_alloc(p, n, NULL))) continue; // at the limit: fine
    l[i] = (nft_live_t){l[i].p, n, seed, NULL};
    nft_fill(l[i].p, n, seed);
  }
  nft_check_all(l, 24);
  nft_no_overlap(l, 24);
  for (int i = 0; i < 24; i++)
    if (l[i].p) assert_int_equal(nf_free(p, l[i].p), NF_OK);
}

static void test_callers_context_kept(void **state) {
  (void)state;
  void *mine = fakecu_ctx_create(1);
  void *callers[] = {NULL, fakecu_primary(0), mine};
  for (int k = 0; k < 3; k++) {
    assert_int_equal(cuCtxSetCurrent(callers[k]), 0);
    int mode = 0; // global: torch.cuda.graph's default, the driver's too
    assert_int_equal(cuThreadExchangeStreamCaptureMode(&mode), 0);
    uint64_t c0 = fakecu_ctx_calls(callers[k]), p1 = fakecu_ctx_calls(fakecu_primary(1));
    fakecu_stats_t s0 = fstats();
    nf_backend_t *be;
    nf_pool_t *p = pool_on(1, 24 * MiB, NULL, &be);
    churn(p, 0x5eed + (uint64_t)k, 400);
    assert_int_equal(nf_trim(p), NF_OK);
    assert_int_equal(nf_pool_check(p), NF_OK);
    pool_off(p, be);
    assert_ptr_equal(current(), callers[k]);
    assert_int_equal(fakecu_capture_mode(), 0);
    assert_int_equal(fakecu_ctx_calls(callers[k]), c0);     // nothing in the caller's context
    assert_true(fakecu_ctx_calls(fakecu_primary(1)) > p1);  // all of it in device 1's
    assert_int_equal(fstats().unrelaxed, s0.unrelaxed);
    assert_true(fstats().creates > s0.creates);
  }
  assert_int_equal(cuCtxSetCurrent(NULL), 0);
  assert_int_equal(cuCtxDestroy_v2(mine), 0);
}

// ------------------------------------------------------------------ two devices
// Pools on both devices, interleaved, at tight limits (stitching and views),
// each on the default stream and a stream of its own device: every live
// block keeps its data, is backed by its own device's memory and granted to
// it, and neither pool's physical memory passes its limit.
static void test_two_devices(void **state) {
  (void)state;
  enum { N = 40 };
  nf_backend_t *be[2];
  nf_pool_t *p[2] = {pool_on(0, 20 * MiB, NULL, &be[0]), pool_on(1, 16 * MiB, NULL, &be[1])};
  void *s[2] = {fakecu_stream_create(fakecu_primary(0)), fakecu_stream_create(fakecu_primary(1))};
  nft_live_t l[2][N] = {{{0}}};
  uint64_t seed = nft_env_seed(0xC0DA);
  for (int r = 0; r < 3000; r++) {
    int d = (int)(nft_rand(&seed) & 1), i = (int)(nft_rand(&seed) % N);
    nft_live_t *b = &l[d][i];
    if (b->p) {
      if (!nft_check(b->p, b->n, b->tag)) fail_msg("device %d block %p lost its data (round %d)", d, b->p, r);
      assert_int_equal(nf_free(p[d], b->p), NF_OK);
      b->p = NULL;
      continue;
    }
    size_t n = (nft_rand(&seed) & 3) ? 256 + nft_rand(&seed) % (G / 2) : G / 2 + nft_rand(&seed) % (3 * G);
    nf_stream_t st = (nft_rand(&seed) & 1) ? (nf_stream_t)s[d] : NULL;
    void *q = nf_alloc(p[d], n, st);
    if (!q) {
      assert_int_equal(nf_last_status(), NF_ERR_OOM);
      continue;
    }
    *b = (nft_live_t){q, n, seed, st};
    nft_fill(q, n, seed);
    backed(q, n, d, 1ull << d);
  }
  fakecu_stats_t fs = fstats();
  assert_true(fs.used[0] <= 20 * MiB && fs.used[1] <= 16 * MiB);
  for (int d = 0; d < 2; d++) {
    nft_check_all(l[d], N);
    nft_no_overlap(l[d], N);
    assert_int_equal(nf_pool_check(p[d]), NF_OK);
    for (int i = 0; i < N; i++)
      if (l[d][i].p) assert_int_equal(nf_free(p[d], l[d][i].p), NF_OK);
    pool_off(p[d], be[d]);
    assert_int_equal(cuStreamDestroy_v2(s[d]), 0);
  }
  assert_null(current());
}

// A stream of device 0 handed to device 1's pool: refused when the pool first
// sees it (an event of device 1 cannot be recorded there), nothing changed.
static void test_other_device_stream(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool_on(1, 16 * MiB, NULL, &be);
  void *s0 = fakecu_stream_create(fakecu_primary(0));
  nf_stats_t before = nft_stats_of(p);
  assert_null(nf_alloc(p, MiB, (nf_stream_t)s0));
  assert_int_equal(nf_last_status(), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "another CUDA context"));
  nf_stats_t after = nft_stats_of(p);
  assert_int_equal(after.live_blocks, before.live_blocks);
  assert_int_equal(after.backend_calls, before.backend_calls);
  pool_off(p, be);
  assert_int_equal(cuStreamDestroy_v2(s0), 0);
}

// ------------------------------------------------------------------ peers
// After nf_pool_add_peer(p, 0), device 0 may copy from every live block of
// device 1's pool: the mapped ones are granted again, later ones at once.
static void test_peer(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool_on(1, 32 * MiB, NULL, &be);
  void *s0 = fakecu_stream_create(fakecu_primary(0));
  char *a = nf_alloc(p, 3 * G, NULL), *b = nf_alloc(p, G, NULL);
  assert_non_null(a);
  assert_non_null(b);
  nft_fill(a, G, 7);
  backed(a, 3 * G, 1, 2);
  fakecu_stats_t f0 = fstats();
  assert_int_equal(copy(b, a, G, s0), 700); // not granted to device 0 yet
  assert_int_equal(fstats().violations, f0.violations + 1);
  expected = 1;
  assert_int_equal(nf_pool_add_peer(p, 0), NF_OK);
  backed(a, 3 * G, 1, 3);
  backed(b, G, 1, 3);
  char *c = nf_alloc(p, 5 * G, NULL);
  assert_non_null(c);
  backed(c, 5 * G, 1, 3);
  assert_int_equal(copy(b, a, G, s0), 0);
  assert_true(nft_check(b, G, 7));
  assert_int_equal(nf_pool_add_peer(p, 5), NF_ERR_INVALID);
  assert_non_null(strstr(nf_last_error(), "no CUDA device 5"));
  nf_free(p, a);
  nf_free(p, b);
  nf_free(p, c);
  pool_off(p, be);
  // Without a P2P path the driver says so, and the pool says which devices.
  setenv("NF_FAKE_CUDA", FAKE ",peer=0", 1);
  p = pool_on(1, 32 * MiB, NULL, &be);
  assert_int_equal(nf_pool_add_peer(p, 0), NF_ERR_UNSUPPORTED);
  assert_non_null(strstr(nf_last_error(), "device 0 cannot access device 1's memory"));
  assert_non_null(a = nf_alloc(p, G, NULL));
  backed(a, G, 1, 2); // and nothing was granted to device 0
  nf_free(p, a);
  pool_off(p, be);
  setenv("NF_FAKE_CUDA", FAKE, 1);
  assert_int_equal(cuStreamDestroy_v2(s0), 0);
}

// ------------------------------------------------------------------ handles and sharing
// A device that refuses POSIX fd handles costs one refused cuMemCreate, not
// one per granule: the plain handle type is remembered. Its blocks cannot be
// shared, and the error says why.
static void test_handle_type_fallback(void **state) {
  (void)state;
  setenv("NF_FAKE_CUDA", FAKE ",fd1=0", 1);
  fakecu_stats_t f0 = fstats();
  nf_backend_t *be[2];
  nf_pool_t *p1 = pool_on(1, 32 * MiB, NULL, &be[1]), *p0 = pool_on(0, 32 * MiB, NULL, &be[0]);
  void *b[6];
  for (int i = 0; i < 6; i++) assert_non_null(b[i] = nf_alloc(p1, G, NULL)); // one granule each
  fakecu_stats_t f1 = fstats();
  assert_int_equal(f1.create_refused - f0.create_refused, 1);
  assert_int_equal(f1.creates_fd, f0.creates_fd);
  assert_true(f1.creates - f0.creates >= 6);
  char h[4096];
  int fds[8];
  size_t nfds = 0;
  uint64_t off = 0;
  assert_int_not_equal(nf_ipc_export(p1, b[0], h, sizeof h, fds, 8, &nfds, &off), NF_OK);
  assert_non_null(strstr(nf_last_error(), "cuMemExportToShareableHandle"));
  void *c = nf_alloc(p0, G, NULL); // device 0 still gets shareable handles
  assert_non_null(c);
  assert_true(fstats().creates_fd > f1.creates_fd);
  nf_free(p0, c);
  for (int i = 0; i < 6; i++) nf_free(p1, b[i]);
  pool_off(p1, be[1]);
  pool_off(p0, be[0]);
}

// A block exported from device 0's pool and imported through device 1's
// backend (the C++ adapter's IPC path): both see the same bytes, and the
// import's close unmaps what it mapped.
static void test_ipc(void **state) {
  (void)state;
  nf_backend_t *be[2];
  nf_pool_t *p = pool_on(0, 32 * MiB, NULL, &be[0]);
  assert_int_equal(nf__backend_cuda_open(&be[1], 1, false), NF_OK);
  void *pad = nf_alloc(p, 5000, NULL); // the shared block starts inside a granule
  size_t n = 2 * G + 12345;
  unsigned char *b = nf_alloc(p, n, NULL);
  assert_non_null(pad);
  assert_non_null(b);
  nft_fill(b, n, 77);
  char h[4096];
  int fds[8];
  size_t nfds = 0;
  uint64_t off = 0;
  if (nf_ipc_export(p, b, h, sizeof h, fds, 8, &nfds, &off) != NF_OK) fail_msg("export: %s", nf_last_error());
  assert_int_equal(nfds, 3);
  assert_int_equal(off, (uintptr_t)b & (G - 1));
  uint64_t mapped = fstats().mapped;
  void *base = NULL;
  nf_ipc_map_t *m = NULL;
  if (nf_ipc_import(be[1], h, &base, &m) != NF_OK) fail_msg("import: %s", nf_last_error());
  unsigned char *v = (unsigned char *)base + off;
  backed(v, n, -2, 2); // granted to the importing device
  assert_true(nft_check(v, n, 77));
  nft_fill(v, n, 78);
  assert_true(nft_check(b, n, 78));
  nf_ipc_close(m);
  assert_int_equal(fstats().mapped, mapped);
  for (size_t i = 0; i < nfds; i++) close(fds[i]);
  nf_free(p, b);
  nf_free(p, pad);
  pool_off(p, be[0]);
  nf_backend_destroy(be[1]);
}

// ------------------------------------------------------------------ streams and tiers
// Events that complete late (each reads NOT_READY three times) on a tight
// pool with three streams and cross-stream uses: blocks keep their data
// through the waits, and the pool waits on the GPU or the host as it must.
static void test_late_events(void **state) {
  (void)state;
  setenv("NF_FAKE_CUDA", FAKE ",lag=3", 1);
  enum { N = 32 };
  nf_backend_t *be;
  nf_pool_t *p = pool_on(0, 16 * MiB, NULL, &be);
  void *s[3] = {NULL, fakecu_stream_create(fakecu_primary(0)), fakecu_stream_create(fakecu_primary(0))};
  nft_live_t l[N] = {{0}};
  uint64_t seed = nft_env_seed(0x1A7E);
  fakecu_stats_t f0 = fstats();
  for (int r = 0; r < 2000; r++) {
    nft_live_t *b = &l[nft_rand(&seed) % N];
    if (b->p) {
      if (!nft_check(b->p, b->n, b->tag)) fail_msg("block %p lost its data (round %d)", b->p, r);
      if (nft_rand(&seed) % 3 == 0) assert_int_equal(nf_record_stream(p, b->p, (nf_stream_t)s[nft_rand(&seed) % 3]), NF_OK);
      assert_int_equal(nf_free(p, b->p), NF_OK);
      b->p = NULL;
      continue;
    }
    size_t n = 256 + nft_rand(&seed) % (2 * G);
    nf_stream_t st = (nf_stream_t)s[nft_rand(&seed) % 3];
    if (!(b->p = nf_alloc(p, n, st))) continue;
    *b = (nft_live_t){b->p, n, seed, st};
    nft_fill(b->p, n, seed);
  }
  nft_check_all(l, N);
  nft_no_overlap(l, N);
  assert_int_equal(nf_pool_check(p), NF_OK);
  fakecu_stats_t f1 = fstats();
  assert_true(f1.records > f0.records);
  assert_true(f1.waits + f1.queries + f1.syncs > f0.waits + f0.queries + f0.syncs);
  for (int i = 0; i < N; i++)
    if (l[i].p) nf_free(p, l[i].p);
  pool_off(p, be);
  assert_int_equal(cuStreamDestroy_v2(s[1]), 0);
  assert_int_equal(cuStreamDestroy_v2(s[2]), 0);
}

// Spill on the CUDA backend: past the device limit, blocks are backed by
// host-located memory (CU_MEM_LOCATION_TYPE_HOST) at the same addresses,
// granted to the pool's device, and keep their data.
static void test_spill(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = pool_on(1, 8 * MiB, "spill:host", &be);
  void *b[6];
  for (int i = 0; i < 6; i++) {
    assert_non_null(b[i] = nf_alloc(p, 3 * MiB, NULL));
    nft_fill(b[i], 3 * MiB, 100 + (uint64_t)i);
  }
  fakecu_stats_t f = fstats();
  assert_true(f.host_used > 0);
  assert_true(f.used[1] <= 8 * MiB);
  int host = 0;
  for (int i = 0; i < 6; i++) {
    assert_true(nft_check(b[i], 3 * MiB, 100 + (uint64_t)i));
    backed(b[i], 3 * MiB, -2, 2);
    int d;
    uint64_t acc;
    for (uintptr_t v = (uintptr_t)b[i] & ~(uintptr_t)(G - 1); v < (uintptr_t)b[i] + 3 * MiB; v += G)
      host += fakecu_where(v, &d, &acc) && d == -1;
  }
  assert_true(host > 0);
  assert_int_equal(nf_pool_check(p), NF_OK);
  for (int i = 0; i < 6; i++) nf_free(p, b[i]);
  pool_off(p, be);
}

// ------------------------------------------------------------------ the PyTorch plug-in
// The plug-in's pool for device 1, made and used from a thread whose current
// device is 0 (or that never touched CUDA): its blocks live on device 1, and
// the thread's context is what it was (PyTorch reads its current device from
// it).
static void test_plugin_device1(void **state) {
  (void)state;
  assert_int_equal(nf_torch_configure("limit:32MiB"), 0); // the plug-in's default backend: cuda
  void *callers[] = {fakecu_primary(0), NULL};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(cuCtxSetCurrent(callers[k]), 0);
    void *a = nf_torch_alloc(3 * MiB, 1, NULL);
    if (!a) fail_msg("nf_torch_alloc: %s", nf_torch_last_error());
    nft_fill(a, 3 * MiB, 9);
    backed(a, 3 * MiB, 1, 2);
    assert_ptr_equal(current(), callers[k]);
    assert_int_equal(nf_torch_add_peer(1, 0), 0); // what PyTorch's enablePeerAccess calls
    backed(a, 3 * MiB, 1, 3);
    assert_ptr_equal(current(), callers[k]);
    nf_torch_free(a, 3 * MiB, 1, NULL);
    nf_torch_reset(); // empty_cache: unmaps and releases on device 1
    assert_ptr_equal(current(), callers[k]);
  }
  nf_torch_shutdown();
  nf_torch_configure(NULL);
  assert_int_equal(cuCtxSetCurrent(NULL), 0);
}

// ------------------------------------------------------------------ threads
// Two threads, one with device 0's context current and one with none, each
// churning its own device's pool and both sharing device 1's: data kept,
// each thread's context untouched (TSan runs this too).
typedef struct {
  nf_pool_t *own, *shared;
  void *ctx;
  uint64_t seed;
  int bad; // 1: data lost, 2: context changed
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  cuCtxSetCurrent(w->ctx);
  nft_live_t l[16] = {{0}};
  for (int r = 0; r < 1500 && !w->bad; r++) {
    nft_live_t *b = &l[nft_rand(&w->seed) % 16];
    nf_pool_t *p = (b - l) & 1 ? w->shared : w->own;
    if (b->p) {
      if (!nft_check(b->p, b->n, b->tag)) w->bad = 1;
      nf_free(p, b->p);
      b->p = NULL;
    } else if ((b->p = nf_alloc(p, 256 + nft_rand(&w->seed) % (2 * G), NULL))) {
      b->n = nf_block_size(p, b->p);
      b->tag = w->seed;
      nft_fill(b->p, b->n, b->tag);
    }
    void *c = (void *)1;
    cuCtxGetCurrent(&c);
    if (c != w->ctx) w->bad = 2;
  }
  for (int i = 0; i < 16; i++)
    if (l[i].p) {
      if (!nft_check(l[i].p, l[i].n, l[i].tag)) w->bad = 1;
      nf_free(i & 1 ? w->shared : w->own, l[i].p);
    }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  nf_backend_t *be[3];
  nf_pool_t *shared = pool_on(1, 24 * MiB, NULL, &be[2]);
  worker_t w[2] = {{pool_on(0, 24 * MiB, NULL, &be[0]), shared, fakecu_primary(0), 11, 0},
                   {pool_on(1, 24 * MiB, NULL, &be[1]), shared, NULL, 12, 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, worker, &w[i]), 0);
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < 2; i++) {
    if (w[i].bad) fail_msg("thread %d: %s", i, w[i].bad == 1 ? "a block lost its data" : "its context changed");
    assert_int_equal(nf_pool_check(w[i].own), NF_OK);
    pool_off(w[i].own, be[i]);
  }
  assert_int_equal(nf_pool_check(shared), NF_OK);
  pool_off(shared, be[2]);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1); // the churn hits the limit on purpose
  // Each test: the stand-in's counters checked from its start (setup / teardown).
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_open), T(test_callers_context_kept), T(test_two_devices),
      T(test_other_device_stream), T(test_peer), T(test_handle_type_fallback),
      T(test_ipc), T(test_late_events), T(test_spill),
      T(test_plugin_device1), T(test_threads),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
