// More streams over a pool's life than its 64 slots (src/core/stream.c,
// streams_recycle), as CuPy or external-stream users make them: 200 streams,
// each made, given a block with memsets queued, the block freed with that
// work in flight. A stream is destroyed only once the pool has forgotten it
// (nf_stream_known; nofrag.h: the pool may record on a stream it knows), so
// the handles stay distinct and the slots must be given back. Each block,
// handed to the next stream, must read that stream's value; blocks live on
// the default stream all along keep theirs. (An event record on a destroyed
// stream crashed the driver in run 73: what the pool must never make.)
// One kept block is offloaded with its copy in flight when the 65th comes.
#include "cuda_test.h"

#include <pthread.h>
#include "core/core.h"

#include <stdlib.h>

// A pool of the default configuration under `limit` (NULL, checked, on failure).
static nf_pool_t *pool_with_limit(nf_backend_t *be, uint64_t limit) {
  nf_config_t c;
  nf_config_default(&c);
  c.limit = limit;
  nf_pool_t *pool = NULL;
  OKP(nf_pool_create(&pool, be, &c));
  return pool;
}

void test_pool_many_streams(nf_backend_t *be) {
  printf("-- pool: 200 streams made and destroyed (more than the 64 slots)\n");
  nf_pool_t *pool = pool_with_limit(be, 256ull << 20);
  if (!pool) return;
  const size_t sz = 4u << 20;
  enum { KEEP = 4 };
  uintptr_t keep[KEEP];
  for (int k = 0; k < KEEP; k++) { // live on the default stream throughout
    keep[k] = (uintptr_t)nf_alloc(pool, sz, NULL);
    CHECK(keep[k] != 0, "alloc: %s", nf_last_error());
    if (keep[k]) dev_fill(keep[k], sz, 7000u + (uint32_t)k);
  }
  // One of them offloaded to host memory, its copy left in flight: the 65th
  // stream's slot recycling finishes listed copies after its device wait
  // (it refused the new stream while one was listed before).
  if (keep[1]) OKP(nf_offload(pool, (void *)keep[1], NULL, NF_TIER_HOST));
  int fails = 0, wrong = 0, still_known = 0;
  uint32_t *h = malloc(sz);
  CUstream made[200] = {0};
  for (int i = 0; i < 200 && h; i++) {
    CUstream s = NULL;
    DRV(cuStreamCreate(&s, 1 /* non-blocking */));
    made[i] = s;
    void *x = nf_alloc(pool, sz, s);
    if (!x) {
      fails++;
      if (fails <= 3) printf("   stream %d: alloc failed: %s\n", i, nf_last_error());
    } else {
      for (int k = 0; k < 50; k++) DRV(cuMemsetD32Async((CUdeviceptr)x, 0xDEAD0000u + (unsigned)k, sz / 4, s));
      DRV(cuMemsetD32Async((CUdeviceptr)x, 0x5EED0000u + (unsigned)i, sz / 4, s));
      DRV(cuStreamSynchronize(s));
      DRV(cuMemcpyDtoH(h, (CUdeviceptr)x, sz));
      for (size_t w = 0; w < sz / 4; w += 1021)
        if (h[w] != 0x5EED0000u + (unsigned)i) { wrong++; break; }
      for (int k = 0; k < 50; k++) DRV(cuMemsetD32Async((CUdeviceptr)x, 0xBAD00000u + (unsigned)k, sz / 4, s));
      OKP(nf_free(pool, x)); // its memsets still queued
    }
    for (int j = 0; j <= i; j++) // destroy the streams the pool has forgotten
      if (made[j] && nf_stream_known(pool, made[j]) == 0) {
        DRV(cuStreamSynchronize(made[j]));
        DRV(cuStreamDestroy(made[j]));
        made[j] = NULL;
      }
  }
  for (int j = 0; j < 200; j++) still_known += made[j] != NULL;
  free(h);
  CHECK(fails == 0, "%d of 200 allocations on new streams failed", fails);
  CHECK(wrong == 0, "%d of 200 blocks did not read their stream's value", wrong);
  uint64_t t[3] = {0};
  if (keep[1]) OKP(nf_block_tiers(pool, (void *)keep[1], t));
  CHECK(!keep[1] || t[1] == sz, "the offloaded block is not on the host after the recycling (%llu B there)",
        (unsigned long long)t[1]);
  for (int k = 0; k < KEEP; k++)
    if (keep[k]) {
      CHECK(dev_check(keep[k], sz, 7000u + (uint32_t)k), "block %d on the default stream lost its data", k);
      OKP(nf_free(pool, (void *)keep[k]));
    }
  OKP(nf_pool_check(pool));
  nf_stats_t st;
  nf_stats_get(pool, &st);
  CHECK(pool->streams_recycled > 0, "no stream slot was given back");
  printf("   200 streams: %d allocations failed, %d blocks wrong; %llu slots given back, %llu event syncs "
         "(device waits included), %llu stream waits\n", fails, wrong, (unsigned long long)pool->streams_recycled,
         (unsigned long long)st.calls.event_sync, (unsigned long long)st.calls.stream_wait);
  fprintf(jout, "\"many_streams\": {\"failed\": %d, \"wrong\": %d, \"recycled\": %llu},\n", fails, wrong,
          (unsigned long long)pool->streams_recycled);
  nf_pool_destroy(pool);
  CHECK(still_known <= 64, "%d streams still known to the pool at the end", still_known);
  for (int j = 0; j < 200; j++)
    if (made[j]) DRV(cuStreamDestroy(made[j])); // after the pool: it may have recorded on them
}

// More than 64 streams holding live blocks at once (a server with a stream per
// request; src/core/stream.c, streams_steal): 100 streams each get a block
// and queue memsets on it, all left live, so streams past the 64th take the
// least recently used stream's slot. Then each block gets more queued work
// and is freed with it in flight (an orphan gets a slot again), and a block
// of the same size is allocated on another of the streams, which writes its
// tag once: where that stream were not ordered after the freed block's
// queued work, that work would overwrite the tag. All read back after one
// device synchronize.
void test_pool_streams_live(nf_backend_t *be) {
  printf("-- pool: 100 streams holding live blocks at once (more than the 64 slots)\n");
  nf_pool_t *pool = pool_with_limit(be, 1ull << 30);
  if (!pool) return;
  enum { N = 100, JUNK = 20 };
  const size_t sz = 4u << 20;
  CUstream s[N] = {0};
  void *x[N] = {0}, *y[N] = {0};
  int fails = 0, wrong = 0;
  for (int i = 0; i < N; i++) {
    DRV(cuStreamCreate(&s[i], 1 /* non-blocking */));
    x[i] = nf_alloc(pool, sz, s[i]);
    if (!x[i]) {
      if (++fails <= 3) printf("   stream %d: alloc failed: %s\n", i, nf_last_error());
      continue;
    }
    for (int k = 0; k < JUNK; k++) DRV(cuMemsetD32Async((CUdeviceptr)x[i], 0xDEAD0000u + (unsigned)k, sz / 4, s[i]));
    DRV(cuMemsetD32Async((CUdeviceptr)x[i], 0x5EED0000u + (unsigned)i, sz / 4, s[i]));
  }
  uint64_t stolen = pool->streams_stolen, orphans = pool->orphans;
  uint32_t *h = malloc(sz);
  for (int i = 0; i < N && h; i++) { // a block of an early stream is an orphan now: its slot was taken
    if (!x[i] || i % 9) continue;
    DRV(cuStreamSynchronize(s[i]));
    DRV(cuMemcpyDtoH(h, (CUdeviceptr)x[i], sz));
    for (size_t w = 0; w < sz / 4; w += 1021)
      if (h[w] != 0x5EED0000u + (unsigned)i) { wrong++; break; }
  }
  for (int i = 0; i < N; i++) {
    if (!x[i]) continue;
    for (int k = 0; k < JUNK; k++) DRV(cuMemsetD32Async((CUdeviceptr)x[i], 0xBAD00000u + (unsigned)k, sz / 4, s[i]));
    nf_status_t st = nf_free(pool, x[i]); // its memsets still queued
    if (st != NF_OK && ++fails <= 3) printf("   free %d: %s\n", i, nf_last_error());
    int j = (i + 37) % N;
    y[i] = nf_alloc(pool, sz, s[j]);
    if (!y[i]) {
      if (++fails <= 3) printf("   stream %d: alloc failed: %s\n", j, nf_last_error());
      continue;
    }
    DRV(cuMemsetD32Async((CUdeviceptr)y[i], 0x7A900000u + (unsigned)i, sz / 4, s[j]));
  }
  DRV(cuCtxSynchronize());
  for (int i = 0; i < N && h; i++) {
    if (!y[i]) continue;
    DRV(cuMemcpyDtoH(h, (CUdeviceptr)y[i], sz));
    for (size_t w = 0; w < sz / 4; w += 1021)
      if (h[w] != 0x7A900000u + (unsigned)i) { wrong++; break; }
    OKP(nf_free(pool, y[i]));
  }
  free(h);
  OKP(nf_pool_check(pool));
  CHECK(fails == 0, "%d allocations or frees failed", fails);
  CHECK(wrong == 0, "%d blocks did not read their stream's value", wrong);
  CHECK(stolen >= N - 64, "only %llu slots taken for %d streams", (unsigned long long)stolen, N);
  CHECK(pool->orphans == 0, "%llu blocks still without a slot", (unsigned long long)pool->orphans);
  nf_stats_t st;
  nf_stats_get(pool, &st);
  printf("   100 live streams: %d failed, %d wrong; %llu slots taken (%llu orphans after the first round), %llu in "
         "all, %llu event syncs, %llu stream waits\n", fails, wrong, (unsigned long long)stolen,
         (unsigned long long)orphans, (unsigned long long)pool->streams_stolen, (unsigned long long)st.calls.event_sync,
         (unsigned long long)st.calls.stream_wait);
  fprintf(jout, "\"streams_live\": {\"failed\": %d, \"wrong\": %d, \"stolen\": %llu},\n", fails, wrong,
          (unsigned long long)pool->streams_stolen);
  nf_pool_destroy(pool);
  for (int i = 0; i < N; i++)
    if (s[i]) DRV(cuStreamDestroy(s[i])); // after the pool: it may have recorded on them
}

// A MemPool begun on a stream whose capture (global mode, the strictest) is
// already under way, with every slot named by live blocks: finding the
// stream a slot would take one (a host wait), which would invalidate the
// capture. The backend's stream_capturing tells the pool, which refuses
// instead; the capture then ends intact.
void test_pool_route_in_capture(nf_backend_t *be) {
  printf("-- pool: a route on a stream already being captured, every slot named (no host wait)\n");
  nf_pool_t *pool = pool_with_limit(be, 512ull << 20);
  if (!pool) return;
  enum { N = 64 };
  CUstream s[N] = {0}, cap = NULL;
  void *x[N] = {0};
  for (int i = 0; i < N; i++) {
    DRV(cuStreamCreate(&s[i], 1));
    x[i] = nf_alloc(pool, 1 << 20, s[i]);
    CHECK(x[i] != NULL, "alloc: %s", nf_last_error());
  }
  DRV(cuStreamCreate(&cap, 1));
  int capturing = -1;
  OKB(be->ops->stream_capturing(be, cap, &capturing));
  CHECK(capturing == 0, "stream_capturing says %d before the capture", capturing);
  DRV(cuStreamBeginCapture(cap, 0));
  OKB(be->ops->stream_capturing(be, cap, &capturing));
  CHECK(capturing == 1, "stream_capturing says %d during the capture", capturing);
  OKP(nf_private_incref(pool, 1));
  uint64_t stolen = pool->streams_stolen;
  nf_status_t st = nf_private_begin(pool, 1, cap);
  CHECK(st == NF_ERR_UNSUPPORTED, "nf_private_begin on the capturing stream: %s (%s)", nf_status_str(st),
        nf_last_error());
  CHECK(pool->streams_stolen == stolen, "a slot was taken during the capture");
  void *g = NULL;
  CUresult r = cuStreamEndCapture(cap, &g);
  CHECK(r == 0, "the capture was invalidated (cuStreamEndCapture: %d)", r);
  if (g) DRV(cuGraphDestroy(g));
  OKP(nf_private_begin(pool, 1, cap)); // outside the capture: a slot taken after one wait
  CHECK(pool->streams_stolen == stolen + 1, "no slot taken outside the capture");
  OKP(nf_private_end(pool, 1));
  OKP(nf_private_release(pool, 1));
  for (int i = 0; i < N; i++)
    if (x[i]) OKP(nf_free(pool, x[i]));
  OKP(nf_pool_check(pool));
  printf("   refused during the capture (%s), the capture ended intact; a slot taken after it\n",
         st == NF_ERR_UNSUPPORTED ? "NF_ERR_UNSUPPORTED" : nf_status_str(st));
  nf_pool_destroy(pool);
  for (int i = 0; i < N; i++)
    if (s[i]) DRV(cuStreamDestroy(s[i]));
  DRV(cuStreamDestroy(cap));
}

// A capture the pool does not know of (another library's, or another pool's,
// in global mode: the strictest, torch.cuda.graph's default) under way on
// another thread while the pool waits on the host: nf_trim after work queued
// on the freed block waits for its events, then unmaps. In the thread's
// default (global) mode the driver refuses that wait and invalidates the
// capture; the backend runs every call in relaxed mode, so neither happens.
// The thread's own capture mode is the same after a backend call.
typedef struct {
  void *ctx;
  CUdeviceptr buf;
  volatile int stop;
  int captures, broken;
} fcap_t;

static void *fcap_thread(void *arg) {
  fcap_t *f = arg;
  CUstream cap = NULL;
  if (cuCtxSetCurrent(f->ctx) != 0 || cuStreamCreate(&cap, 1) != 0) return NULL;
  while (!f->stop) {
    void *g = NULL;
    if (cuStreamBeginCapture(cap, 0) != 0) { f->broken++; break; }
    (void)cuMemsetD32Async(f->buf, 7, 1024, cap);
    if (cuStreamEndCapture(cap, &g) != 0) f->broken++;
    if (g) (void)cuGraphDestroy(g);
    f->captures++;
  }
  (void)cuStreamDestroy(cap);
  return NULL;
}

void test_pool_foreign_capture(nf_backend_t *be) {
  printf("-- pool: host waits while another thread captures (global mode) a stream the pool does not know\n");
  nf_pool_t *pool = pool_with_limit(be, 512ull << 20);
  if (!pool) return;
  fcap_t f = {0};
  void *keep = nf_alloc(pool, 4096, NULL);
  CHECK(keep != NULL, "alloc: %s", nf_last_error());
  DRV(cuCtxGetCurrent(&f.ctx));
  f.buf = (CUdeviceptr)(uintptr_t)keep;
  CUstream s = NULL;
  DRV(cuStreamCreate(&s, 1));
  nf_stats_t st0, st1;
  nf_stats_get(pool, &st0);
  pthread_t th;
  CHECK(pthread_create(&th, NULL, fcap_thread, &f) == 0, "pthread_create");
  int trims = 0, failed = 0;
  nf_status_t first = NF_OK;
  char why[256] = "";
  for (double t0 = now_us(); now_us() - t0 < 2e6; trims++) {
    void *x = nf_alloc(pool, 8u << 20, s);
    if (!x) { failed++; continue; }
    (void)cuMemsetD32Async((CUdeviceptr)(uintptr_t)x, 1, (8u << 20) / 4, s);
    nf_free(pool, x);
    nf_status_t r = nf_trim(pool); // the block's granules: a wait for s, then unmapped
    if (r != NF_OK && !failed++) first = r, snprintf(why, sizeof why, "%s", nf_last_error());
  }
  f.stop = 1;
  pthread_join(th, NULL);
  nf_stats_get(pool, &st1);
  uint64_t waits = st1.calls.event_sync - st0.calls.event_sync;
  int mode = 1; // this thread's mode (global, the default, all along above) comes back from a backend call
  DRV(cuThreadExchangeStreamCaptureMode(&mode));
  CHECK(mode == 0, "the thread's capture mode was %d during the test, not global (0)", mode);
  int capturing = -1;
  OKB(be->ops->stream_capturing(be, s, &capturing));
  mode = 0;
  DRV(cuThreadExchangeStreamCaptureMode(&mode));
  CHECK(mode == 1, "the thread's capture mode came back as %d, not thread-local (1)", mode);
  CHECK(failed == 0, "%d of %d alloc/trim rounds failed: %s: %s", failed, trims, nf_status_str(first), why);
  CHECK(f.broken == 0, "%d of %d foreign captures broken", f.broken, f.captures);
  CHECK(waits > 0 && f.captures > 0, "no host wait (%llu) or no capture (%d): nothing tested", (unsigned long long)waits,
        f.captures);
  DRV(cuStreamSynchronize(s));
  OKP(nf_free(pool, keep));
  OKP(nf_pool_check(pool));
  printf("   %d trims (%llu host waits) beside %d captures: %d broken, %d rounds failed\n", trims,
         (unsigned long long)waits, f.captures, f.broken, failed);
  fprintf(jout, "\"foreign_capture\": {\"trims\": %d, \"host_waits\": %llu, \"captures\": %d, \"broken\": %d},\n",
          trims, (unsigned long long)waits, f.captures, f.broken);
  nf_pool_destroy(pool);
  DRV(cuStreamDestroy(s));
}
