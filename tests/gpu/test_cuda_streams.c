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
#include "core/core.h"

#include <stdlib.h>

void test_pool_many_streams(nf_backend_t *be) {
  printf("-- pool: 200 streams made and destroyed (more than the 64 slots)\n");
  nf_config_t c;
  nf_config_default(&c);
  c.limit = 256ull << 20;
  nf_pool_t *pool = NULL;
  OKP(nf_pool_create(&pool, be, &c));
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
