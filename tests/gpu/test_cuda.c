// GPU test of the CUDA backend and of the pool on real device memory.
// Built and run by bench/gpu/run.sh; CTest builds it too and runs it on the
// stand-in driver of tests/fake_cuda (test_cuda_gpu_fake: two simulated
// devices, no GPU timing). One program of the files in tests/gpu (cuda_test.h
// says what they share):
//
//   gcc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc tests/gpu/test_cuda.c tests/gpu/test_cuda_tiers.c
//       tests/gpu/test_cuda_faults.c tests/gpu/test_cuda_waits.c tests/gpu/cuda_util.c build/libnofrag.a
//       -lpthread -ldl -lm -o test_cuda && ./test_cuda [out.json [waits]]
//
// Exit status: 0 all passed, 1 a check failed, 77 skipped (no driver/GPU).
// The test talks to the driver itself (dlopen libcuda.so.1) only for what the
// backend does not do: host<->device copies, memsets and streams, used to
// write and check data patterns and to put load on streams.
// This file: the backend's ops directly, then the core pool on device memory
// (stitching, steady state, cross-stream reuse, views, destroy); threads and
// contexts in test_cuda_contexts.c, tiers and peers in test_cuda_tiers.c,
// backend faults in test_cuda_faults.c, failing waits for copies held on a
// stream in test_cuda_waits.c (argv[2] "waits": that section alone; "units":
// the units section, test_cuda_units.c, alone; "streams": test_cuda_streams.c
// alone; "edges": test_cuda_edges.c alone).
#include "cuda_test.h"

#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// ------------------------------------------------------------ backend direct
static void test_backend(nf_backend_t *be) {
  printf("-- backend: granularity, capacity, create/map/access/unmap/release, remap, events, host tier\n");
  size_t g = 0, gh = 0;
  OKB(be->ops->granularity(be, NF_TIER_DEVICE, &g));
  CHECK(g == 2u << 20, "device granularity %zu (expected 2 MiB on H200)", g);
  nf_status_t hs = be->ops->granularity(be, NF_TIER_HOST, &gh);
  printf("   granularity device %zu, host %zu (%s)\n", g, gh, nf_status_str(hs));
  uint64_t total = 0, avail = 0;
  OKB(be->ops->capacity(be, NF_TIER_DEVICE, &total, &avail));
  CHECK(total > (1ull << 30) && avail <= total, "capacity total %llu free %llu", (unsigned long long)total,
        (unsigned long long)avail);
  fprintf(jout, "\"granularity\": %zu, \"granularity_host\": %zu, \"device_total\": %llu,\n", g, gh,
          (unsigned long long)total);

  // Two address ranges; one handle written through range 1, re-mapped in range 2.
  size_t span = 16 * g;
  uintptr_t va1 = 0, va2 = 0;
  OKB(be->ops->va_reserve(be, span, g, &va1));
  OKB(be->ops->va_reserve(be, span, g, &va2));
  nf_handle_t h[4];
  for (int i = 0; i < 4; i++) OKB(be->ops->mem_create(be, NF_TIER_DEVICE, g, &h[i]));
  for (int i = 0; i < 4; i++) OKB(be->ops->map(be, va1 + (size_t)i * g, g, h[i]));
  OKB(be->ops->set_access(be, va1, 4 * g)); // one call for the run
  dev_fill(va1, 4 * g, 11);
  CHECK(dev_check(va1, 4 * g, 11), "pattern through first mapping");
  OKB(be->ops->unmap(be, va1, 4 * g)); // one call over the run of 4 handles
  // Re-map in reverse order at the other range: granule i's data follows it.
  for (int i = 0; i < 4; i++) OKB(be->ops->map(be, va2 + (size_t)(3 - i) * g, g, h[i]));
  OKB(be->ops->set_access(be, va2, 4 * g));
  hreserve(4 * g);
  uint32_t *ref = malloc(4 * g);
  pattern(ref, (4 * g) / 4, 11); // the whole 4g-byte pattern written above
  int same = 1;
  for (int i = 0; i < 4 && same; i++) {
    uint32_t *got = malloc(g);
    DRV(cuMemcpyDtoH(got, (CUdeviceptr)(va2 + (size_t)(3 - i) * g), g));
    same = memcmp(got, ref + (size_t)i * (g / 4), g) == 0;
    free(got);
  }
  CHECK(same, "data follows its handle across unmap/remap at another address");
  free(ref);

  // Error path: mapping over a mapped range must fail with the driver's text.
  nf_status_t st = be->ops->map(be, va2, g, h[0]);
  CHECK(st == NF_ERR_BACKEND && strstr(nf__backend_err(), "CUDA_ERROR_") != NULL, "double map -> %s '%s'",
        nf_status_str(st), nf__backend_err());
  printf("   double map error: %s\n", nf__backend_err());
  nf_handle_t huge;
  st = be->ops->mem_create(be, NF_TIER_DEVICE, (size_t)1 << 42, &huge); // 4 TiB
  CHECK(st == NF_ERR_OOM || st == NF_ERR_BACKEND, "4 TiB create -> %s", nf_status_str(st));
  printf("   4 TiB cuMemCreate: %s: %s\n", nf_status_str(st), nf__backend_err());
  if (st == NF_OK) be->ops->mem_release(be, huge);

  OKB(be->ops->unmap(be, va2, 4 * g));
  for (int i = 0; i < 4; i++) OKB(be->ops->mem_release(be, h[i]));

  // Timings of the single-granule ops (medians of 64).
  enum { N = 64 };
  double tc[N], tm[N], ta[N], tu[N], tr[N];
  nf_handle_t hh[N];
  uintptr_t vb = 0;
  OKB(be->ops->va_reserve(be, (size_t)N * g, g, &vb));
  for (int i = 0; i < N; i++) {
    double t0 = now_us();
    OKB(be->ops->mem_create(be, NF_TIER_DEVICE, g, &hh[i]));
    double t1 = now_us();
    OKB(be->ops->map(be, vb + (size_t)i * g, g, hh[i]));
    double t2 = now_us();
    OKB(be->ops->set_access(be, vb + (size_t)i * g, g));
    double t3 = now_us();
    tc[i] = t1 - t0; tm[i] = t2 - t1; ta[i] = t3 - t2;
  }
  for (int i = 0; i < N; i++) {
    double t0 = now_us();
    OKB(be->ops->unmap(be, vb + (size_t)i * g, g));
    double t1 = now_us();
    OKB(be->ops->mem_release(be, hh[i]));
    double t2 = now_us();
    tu[i] = t1 - t0; tr[i] = t2 - t1;
  }
  OKB(be->ops->va_release(be, vb, (size_t)N * g));
  double *arrs[5] = {tc, tm, ta, tu, tr};
  const char *names[5] = {"create", "map", "set_access", "unmap", "release"};
  fprintf(jout, "\"op_median_us\": {");
  printf("   median us:");
  for (int k = 0; k < 5; k++) {
    qsort(arrs[k], N, sizeof(double), cmp_d);
    printf(" %s %.1f", names[k], arrs[k][N / 2]);
    fprintf(jout, "%s\"%s\": %.2f", k ? ", " : "", names[k], arrs[k][N / 2]);
  }
  printf("\n");
  fprintf(jout, "},\n");

  // Run costs: one call over 64 granules vs one call per granule (remapping
  // and staging could use either), for device and host granules.
  fprintf(jout, "\"run_of_64_us\": {");
  for (int tier = 0; tier < 2; tier++) {
    nf_tier_t t = tier ? NF_TIER_HOST : NF_TIER_DEVICE;
    const char *tn = tier ? "host" : "device";
    int made = 0;
    OKB(be->ops->va_reserve(be, (size_t)N * g, g, &vb));
    for (; made < N; made++)
      if (be->ops->mem_create(be, t, g, &hh[made]) != NF_OK) break;
    double r[4] = {0};
    if (made == N) {
      for (int pass = 0; pass < 2; pass++) { // pass 0: one call per run, 1: per granule
        for (int i = 0; i < N; i++) OKB(be->ops->map(be, vb + (size_t)i * g, g, hh[i]));
        double t0 = now_us();
        if (!pass) OKB(be->ops->set_access(be, vb, (size_t)N * g));
        else for (int i = 0; i < N; i++) OKB(be->ops->set_access(be, vb + (size_t)i * g, g));
        double t1 = now_us();
        if (!pass) OKB(be->ops->unmap(be, vb, (size_t)N * g));
        else for (int i = 0; i < N; i++) OKB(be->ops->unmap(be, vb + (size_t)i * g, g));
        double t2 = now_us();
        r[2 * pass] = t1 - t0;
        r[2 * pass + 1] = t2 - t1;
      }
      printf("   %s x64 granules: set_access one call %.0f us, 64 calls %.0f us; unmap one call %.0f us, "
             "64 calls %.0f us\n", tn, r[0], r[2], r[1], r[3]);
    } else {
      printf("   %s x64 granules: skipped (%d created: %s)\n", tn, made, nf__backend_err());
    }
    fprintf(jout, "%s\"%s\": [%.1f, %.1f, %.1f, %.1f]", tier ? ", " : "", tn, r[0], r[2], r[1], r[3]);
    for (int i = 0; i < made; i++) OKB(be->ops->mem_release(be, hh[i]));
    OKB(be->ops->va_release(be, vb, (size_t)N * g));
  }
  fprintf(jout, "},\n");

  // Events: a long memset on a stream keeps an event pending for a while.
  CUstream s1 = NULL, s2 = NULL;
  DRV(cuStreamCreate(&s1, 1 /* non-blocking */));
  DRV(cuStreamCreate(&s2, 1));
  uintptr_t big = 0;
  nf_handle_t bh[32];
  OKB(be->ops->va_reserve(be, 32 * g, g, &big));
  for (int i = 0; i < 32; i++) {
    OKB(be->ops->mem_create(be, NF_TIER_DEVICE, g, &bh[i]));
    OKB(be->ops->map(be, big + (size_t)i * g, g, bh[i]));
  }
  OKB(be->ops->set_access(be, big, 32 * g));
  nf_event_t ev = NULL;
  OKB(be->ops->event_create(be, &ev));
  for (int r = 0; r < 400; r++) DRV(cuMemsetD32Async((CUdeviceptr)big, (unsigned)r, 32 * g / 4, s1));
  OKB(be->ops->event_record(be, ev, s1));
  nf_status_t q = be->ops->event_query(be, ev);
  printf("   event query right after 400 x 64 MiB memsets: %s\n", nf_status_str(q));
  CHECK(q == NF_ERR_NOT_READY || q == NF_OK, "query -> %s", nf_status_str(q));
  OKB(be->ops->stream_wait(be, s2, ev));
  DRV(cuMemsetD32Async((CUdeviceptr)big, 0xC0FFEEu, 32 * g / 4, s2)); // ordered after s1's work
  OKB(be->ops->event_sync(be, ev));
  CHECK(be->ops->event_query(be, ev) == NF_OK, "event complete after sync");
  DRV(cuStreamSynchronize(s2));
  hreserve(4096);
  DRV(cuMemcpyDtoH(hbuf, (CUdeviceptr)(big + 31 * g), 4096));
  CHECK(hbuf[0] == 0xC0FFEEu && hbuf[1023] == 0xC0FFEEu, "stream_wait ordered s2 after s1 (got %x)", hbuf[0]);
  OKB(be->ops->event_destroy(be, ev));

  // Host tier: host-backed granule mapped for the device; copy op into it.
  if (hs == NF_OK) {
    nf_handle_t hh1;
    uintptr_t hv = 0;
    st = be->ops->mem_create(be, NF_TIER_HOST, gh, &hh1);
    CHECK(st == NF_OK, "host-tier cuMemCreate -> %s: %s", nf_status_str(st), nf__backend_err());
    if (st == NF_OK) {
      OKB(be->ops->va_reserve(be, gh, gh, &hv));
      OKB(be->ops->map(be, hv, gh, hh1));
      OKB(be->ops->set_access(be, hv, gh));
      dev_fill(big, gh, 77);
      OKB(be->ops->copy(be, hv, big, gh, s1));
      DRV(cuStreamSynchronize(s1));
      CHECK(dev_check(hv, gh, 77), "device -> host-tier copy (cuMemcpyAsync) intact");
      OKB(be->ops->unmap(be, hv, gh));
      OKB(be->ops->mem_release(be, hh1));
      OKB(be->ops->va_release(be, hv, gh));
    }
  }
  OKB(be->ops->unmap(be, big, 32 * g));
  for (int i = 0; i < 32; i++) OKB(be->ops->mem_release(be, bh[i]));
  OKB(be->ops->va_release(be, big, 32 * g));
  OKB(be->ops->va_release(be, va1, span));
  OKB(be->ops->va_release(be, va2, span));
  DRV(cuStreamDestroy(s1));
  DRV(cuStreamDestroy(s2));
}

// Random alloc/free under a 64 MiB limit with sizes up to 24 MiB: holes force
// reclaim/stitching. Every live block's pattern is checked after every step
// that stitched, and all of them at the end.
static uint64_t stitched(const nf_stats_t *st) { return st->reclaims + st->view_moves + st->view_reuses; }

static void test_pool_stitching(nf_backend_t *be) {
  printf("-- pool: data integrity across stitching under a 64 MiB limit\n");
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256];
  OKP(nf_config_parse(&cfg, "limit:64MiB,release_threshold:never", err, sizeof err));
  nf_pool_t *pool = NULL;
  OKP(nf_pool_create(&pool, be, &cfg));
  if (!pool) return;
  live_t L[64];
  int n = 0, ooms = 0, bad = 0;
  uint32_t tag = 1;
  uint64_t reclaims0 = 0;
  for (int it = 0; it < 600; it++) live_step(pool, L, &n, &tag, 4, 24, 1u << 20, stitched, &reclaims0, &ooms, &bad);
  for (int i = 0; i < n; i++) bad += !dev_check(L[i].p, L[i].n, L[i].tag);
  nf_stats_t st;
  nf_stats_get(pool, &st);
  CHECK(bad == 0, "%d blocks lost their data", bad);
  CHECK(st.reclaims + st.view_moves > 0, "the workload never stitched (reclaims and view moves 0): test too easy");
  CHECK(nf_pool_check(pool) == NF_OK, "pool_check: %s", nf_last_error());
  printf("   600 ops: ooms %d, reclaims %llu (%llu granules), physical peak %llu MiB, backend calls %llu\n", ooms,
         (unsigned long long)st.reclaims, (unsigned long long)st.reclaimed_granules,
         (unsigned long long)(st.physical_peak >> 20), (unsigned long long)st.backend_calls);
  fprintf(jout, "\"stitch\": {\"ooms\": %d, \"reclaims\": %llu, \"bad_blocks\": %d, \"backend_calls\": %llu},\n", ooms,
          (unsigned long long)st.reclaims, bad, (unsigned long long)st.backend_calls);
  for (int i = 0; i < n; i++) nf_free(pool, (void *)L[i].p);
  nf_pool_destroy(pool);
}

// Steady state: repeating the same alloc/free sequence makes no backend calls.
// Cross-stream: a block freed on s1 while s1 still writes it, re-allocated on
// s2, must not be clobbered by s1's queued work.
static void test_pool_steady_and_streams(nf_backend_t *be) {
  printf("-- pool: zero backend calls in steady state; cross-stream reuse under load\n");
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256];
  OKP(nf_config_parse(&cfg, "limit:1GiB", err, sizeof err));
  nf_pool_t *pool = NULL;
  OKP(nf_pool_create(&pool, be, &cfg));
  if (!pool) return;
  size_t sizes[] = {3 << 20, 700, 64 << 20, 1 << 20, 5000, 17 << 20};
  void *p[6];
  nf_stats_t a, b;
  for (int rep = 0; rep < 1003; rep++) {
    if (rep == 3) nf_stats_get(pool, &a);
    for (int i = 0; i < 6; i++) p[i] = nf_alloc(pool, sizes[i], NULL);
    for (int i = 5; i >= 0; i--) nf_free(pool, p[i]);
  }
  nf_stats_get(pool, &b);
  uint64_t calls = b.backend_calls - a.backend_calls;
  CHECK(calls == 0, "%llu backend calls in 1000 steady repetitions", (unsigned long long)calls);
  fprintf(jout, "\"steady_backend_calls\": %llu,\n", (unsigned long long)calls);

  CUstream s1 = NULL, s2 = NULL;
  DRV(cuStreamCreate(&s1, 1));
  DRV(cuStreamCreate(&s2, 1));
  int clobbered = 0, reused = 0;
  size_t sz = 64u << 20;
  for (int r = 0; r < 8; r++) {
    void *x = nf_alloc(pool, sz, s1);
    CHECK(x != NULL, "alloc on s1: %s", nf_last_error());
    if (!x) break;
    for (int k = 0; k < 200; k++) DRV(cuMemsetD32Async((CUdeviceptr)x, 0xDEAD0000u + (unsigned)k, sz / 4, s1));
    nf_free(pool, x); // s1 still has ~200 memsets queued on x
    void *y = nf_alloc(pool, sz, s2);
    CHECK(y != NULL, "alloc on s2: %s", nf_last_error());
    if (!y) break;
    reused += (y == x);
    DRV(cuMemsetD32Async((CUdeviceptr)y, 0x5EED0000u + (unsigned)r, sz / 4, s2));
    DRV(cuCtxSynchronize());
    hreserve(sz);
    DRV(cuMemcpyDtoH(hbuf, (CUdeviceptr)y, sz));
    for (size_t i = 0; i < sz / 4; i += 997)
      if (hbuf[i] != 0x5EED0000u + (unsigned)r) { clobbered++; break; }
    nf_free(pool, y);
  }
  nf_stats_get(pool, &b);
  CHECK(clobbered == 0, "%d of 8 cross-stream reuses were clobbered by the old stream's work", clobbered);
  printf("   cross-stream: same address reused %d/8 times, clobbered %d, cross_stream_reuses %llu, "
         "stream_wait calls %llu\n", reused, clobbered, (unsigned long long)b.cross_stream_reuses,
         (unsigned long long)b.calls.stream_wait);
  fprintf(jout, "\"cross_stream\": {\"reused\": %d, \"clobbered\": %d, \"stream_waits\": %llu},\n", reused, clobbered,
          (unsigned long long)b.calls.stream_wait);
  DRV(cuStreamDestroy(s1));
  DRV(cuStreamDestroy(s2));
  nf_pool_destroy(pool);
}

// Views (src/core/view.c) on the device. One handle mapped at two places:
// writes through one read back through the other, unmapping one leaves the
// other intact. Then a repeating step at the smallest limit it fits in:
// granules move between the holes of layer A and the larger blocks B as
// views; from the third step on no backend call at all; every block's data
// checked at its free. Then with views:2 (eviction all the time) and two
// streams: A's blocks are freed on s1 with memsets still queued, B's blocks
// (on s2) take their granules behind GPU-side waits and must not be clobbered.
#define VA_N 8
#define VB_N 2
static size_t va_sz = (10u << 20) - 4096, vb_sz = (20u << 20) - 8192;
static int view_step(nf_pool_t *pool, uint32_t it, CUstream s1, CUstream s2, int *bad) {
  void *a[VA_N] = {0}, *b[VB_N] = {0};
  int ok = 1;
  for (int i = 0; i < VA_N && ok; i++) {
    ok = (a[i] = nf_alloc(pool, va_sz, s1)) != NULL;
    if (ok && s1) for (int k = 0; k < 20; k++) DRV(cuMemsetD32Async((CUdeviceptr)a[i], 0xA0000000u + it, va_sz / 4, s1));
    else if (ok) dev_fill((uintptr_t)a[i], va_sz, it * 100 + (uint32_t)i);
  }
  for (int i = 0; i < VA_N && ok; i += 2) { // holes: freed while s1 may still write them
    if (!s1) *bad += !dev_check((uintptr_t)a[i], va_sz, it * 100 + (uint32_t)i);
    nf_free(pool, a[i]);
    a[i] = NULL;
  }
  for (int i = 0; i < VB_N && ok; i++) {
    ok = (b[i] = nf_alloc(pool, vb_sz, s2)) != NULL;
    if (ok && s2) DRV(cuMemsetD32Async((CUdeviceptr)b[i], 0xB0000000u + it * 4 + (uint32_t)i, vb_sz / 4, s2));
    else if (ok) dev_fill((uintptr_t)b[i], vb_sz, it * 100 + 50 + (uint32_t)i);
  }
  if (s1) DRV(cuCtxSynchronize());
  for (int i = 0; i < VB_N; i++) {
    if (!b[i]) continue;
    if (s2) {
      hreserve(vb_sz);
      DRV(cuMemcpyDtoH(hbuf, (CUdeviceptr)b[i], vb_sz));
      for (size_t w = 0; w < vb_sz / 4; w += 1021)
        if (hbuf[w] != 0xB0000000u + it * 4 + (uint32_t)i) { (*bad)++; break; }
    } else {
      *bad += !dev_check((uintptr_t)b[i], vb_sz, it * 100 + 50 + (uint32_t)i);
    }
    nf_free(pool, b[i]);
  }
  for (int i = 0; i < VA_N; i++)
    if (a[i]) {
      if (!s1) *bad += !dev_check((uintptr_t)a[i], va_sz, it * 100 + (uint32_t)i);
      nf_free(pool, a[i]);
    }
  return ok;
}

static nf_pool_t *view_pool(nf_backend_t *be, uint64_t limit, int views) {
  nf_config_t cfg;
  nf_config_default(&cfg);
  cfg.limit = limit;
  cfg.views = (uint64_t)views;
  nf_pool_t *pool = NULL;
  OKP(nf_pool_create(&pool, be, &cfg));
  return pool;
}

static void test_pool_views(nf_backend_t *be) {
  printf("-- views: one granule mapped twice; zero calls in steady state at the limit; eviction; streams\n");
  size_t G = 0;
  OKB(be->ops->granularity(be, NF_TIER_DEVICE, &G));
  uintptr_t va = 0;
  nf_handle_t h = 0;
  OKB(be->ops->va_reserve(be, 4 * G, G, &va));
  OKB(be->ops->mem_create(be, NF_TIER_DEVICE, G, &h));
  OKB(be->ops->map(be, va, G, h));
  OKB(be->ops->map(be, va + 2 * G, G, h));
  OKB(be->ops->set_access(be, va, G));
  OKB(be->ops->set_access(be, va + 2 * G, G));
  dev_fill(va, G, 41);
  CHECK(dev_check(va + 2 * G, G, 41), "a write through one view is not read back through the other");
  dev_fill(va + 2 * G, G, 42);
  OKB(be->ops->unmap(be, va, G));
  CHECK(dev_check(va + 2 * G, G, 42), "unmapping one view changed the other");
  OKB(be->ops->unmap(be, va + 2 * G, G));
  OKB(be->ops->mem_release(be, h));
  OKB(be->ops->va_release(be, va, 4 * G));

  uint64_t lim = 0;
  int bad = 0;
  for (uint64_t g = 20; g < 80 && !lim; g++) { // smallest limit 3 steps fit in, views off
    nf_pool_t *pool = view_pool(be, g * G, 0);
    if (!pool) return;
    if (view_step(pool, 0, NULL, NULL, &bad) && view_step(pool, 1, NULL, NULL, &bad) &&
        view_step(pool, 2, NULL, NULL, &bad))
      lim = g * G;
    nf_pool_destroy(pool);
  }
  CHECK(lim != 0, "no limit found for the view steps");
  if (!lim) return;
  uint64_t calls_off = 0, calls_on = 0;
  nf_stats_t st = {0};
  for (int views = 0; views < 2; views++) {
    nf_pool_t *pool = view_pool(be, lim, views ? 1000 : 0);
    if (!pool) return;
    uint64_t c0 = 0;
    for (uint32_t it = 0; it < 10; it++) {
      if (it == 3) { nf_stats_get(pool, &st); c0 = st.backend_calls; }
      CHECK(view_step(pool, it, NULL, NULL, &bad), "step %u failed at the limit: %s", it, nf_last_error());
    }
    nf_stats_get(pool, &st);
    *(views ? &calls_on : &calls_off) = st.backend_calls - c0;
    CHECK(nf_pool_check(pool) == NF_OK, "pool_check: %s", nf_last_error());
    if (views) CHECK(st.view_reuses > 0 && st.view_moves > 0, "views never used (reuses %llu, moves %llu)",
                     (unsigned long long)st.view_reuses, (unsigned long long)st.view_moves);
    nf_pool_destroy(pool);
  }
  CHECK(calls_on == 0, "%llu backend calls in 7 steady steps with views", (unsigned long long)calls_on);
  printf("   limit %llu MiB: steps 3-9 made %llu backend calls with views off, %llu with views "
         "(reuses %llu, moves %llu)\n", (unsigned long long)(lim >> 20), (unsigned long long)calls_off,
         (unsigned long long)calls_on, (unsigned long long)st.view_reuses, (unsigned long long)st.view_moves);

  CUstream s1 = NULL, s2 = NULL;
  DRV(cuStreamCreate(&s1, 1));
  DRV(cuStreamCreate(&s2, 1));
  nf_pool_t *pool = view_pool(be, lim, 2);
  int bad_streams = 0;
  if (pool) {
    for (uint32_t it = 0; it < 10; it++)
      CHECK(view_step(pool, it, s1, s2, &bad_streams), "stream step %u failed: %s", it, nf_last_error());
    for (uint32_t it = 10; it < 14; it++) // single stream again, with eviction
      CHECK(view_step(pool, it, NULL, NULL, &bad), "step %u failed: %s", it, nf_last_error());
    nf_stats_get(pool, &st);
    CHECK(st.view_evictions > 0, "views:2 evicted nothing");
    CHECK(nf_pool_check(pool) == NF_OK, "pool_check: %s", nf_last_error());
    nf_pool_destroy(pool);
  }
  DRV(cuStreamDestroy(s1));
  DRV(cuStreamDestroy(s2));
  CHECK(bad == 0, "%d blocks lost their data across view reuse / moves / eviction", bad);
  CHECK(bad_streams == 0, "%d blocks clobbered by another stream's queued work after a view move", bad_streams);
  printf("   views:2 + two streams: evictions %llu, moves %llu, stream waits %llu, clobbered %d, lost %d\n",
         (unsigned long long)st.view_evictions, (unsigned long long)st.view_moves,
         (unsigned long long)st.calls.stream_wait, bad_streams, bad);
  fprintf(jout, "\"views\": {\"limit\": %llu, \"steady_calls_views_off\": %llu, \"steady_calls_views_on\": %llu, "
          "\"evictions\": %llu, \"lost\": %d, \"clobbered\": %d},\n", (unsigned long long)lim,
          (unsigned long long)calls_off, (unsigned long long)calls_on, (unsigned long long)st.view_evictions, bad,
          bad_streams);
}

// Destroy gives everything back: the driver's free memory returns to its level.
static void test_pool_destroy_returns_memory(nf_backend_t *be) {
  printf("-- pool: destroy returns device memory\n");
  uint64_t t, f0, f1, f2;
  be->ops->capacity(be, NF_TIER_DEVICE, &t, &f0);
  nf_config_t cfg;
  nf_config_default(&cfg);
  nf_pool_t *pool = NULL;
  OKP(nf_pool_create(&pool, be, &cfg));
  if (!pool) return;
  void *p = nf_alloc(pool, 2ull << 30, NULL);
  CHECK(p != NULL, "2 GiB alloc: %s", nf_last_error());
  be->ops->capacity(be, NF_TIER_DEVICE, &t, &f1);
  nf_pool_destroy(pool);
  be->ops->capacity(be, NF_TIER_DEVICE, &t, &f2);
  CHECK(f0 - f1 >= (2ull << 30) - (64ull << 20), "2 GiB not visible in cuMemGetInfo (%lld MiB)",
        (long long)(f0 - f1) >> 20);
  CHECK(f2 + (64ull << 20) >= f0, "destroy left %lld MiB in use", (long long)(f0 - f2) >> 20);
}

// A section that owns a CUDA backend of its own (its fault wrapper destroys it).
static void own_backend(void (*section)(nf_backend_t *inner)) {
  nf_backend_t *inner = NULL;
  OKP(nf_backend_cuda_create(&inner, 0));
  if (inner) section(inner);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *outp = argc > 1 ? argv[1] : "/dev/null";
  nf_backend_t *be = NULL;
  nf_status_t st = nf_backend_cuda_create(&be, 0);
  if (st != NF_OK) {
    printf("SKIP: no CUDA device: %s: %s\n", nf_status_str(st), nf_last_error());
    return 77;
  }
  cuda_test_load();
  jout = fopen(outp, "w");
  if (!jout) jout = fopen("/dev/null", "w");
  fprintf(jout, "{\n");
  const char *only = argc > 2 ? argv[2] : "";
  if (!strcmp(only, "units")) {
    test_pool_units(be);
  } else if (!strcmp(only, "edges")) {
    test_pool_edges(be);
  } else if (!strcmp(only, "capture")) {
    test_pool_foreign_capture(be);
  } else if (!strcmp(only, "streams")) {
    test_pool_many_streams(be);
    test_pool_streams_live(be);
    test_pool_route_in_capture(be);
    test_pool_foreign_capture(be);
  } else {
    if (strcmp(only, "waits") != 0) { // "waits": the last section alone
      test_backend(be);
      test_pool_stitching(be);
      test_pool_steady_and_streams(be);
      test_pool_views(be);
      test_pool_destroy_returns_memory(be);
      test_pool_foreign_thread(be);
      test_plugin_pool_unbound();
      test_pool_foreign_stream(be);
      test_pool_many_streams(be);
      test_pool_streams_live(be);
      test_pool_route_in_capture(be);
      test_pool_foreign_capture(be);
      test_pool_peers(be);
      test_pool_units(be);
      test_pool_edges(be);
      test_pool_spill_offload(be);
      own_backend(test_pool_backend_faults);
    }
    own_backend(test_pool_wait_faults); // last: where the code under test is wrong, the context is lost
  }
  fprintf(jout, "\"checks\": %d, \"failures\": %d\n}\n", checks, failures);
  fclose(jout);
  nf_backend_destroy(be);
  printf("%s: %d checks, %d failures\n", failures ? "FAILED" : "PASSED", checks, failures);
  return failures ? 1 : 0;
}
