// GPU test, tiers and peers (see test_cuda.c): peer access with two or more
// GPUs; spill past the limit and offload/prefetch cycles on device memory,
// and the bandwidth of one offload and prefetch.
#include "cuda_test.h"

#include <stdlib.h>

// Peer access (nf_pool_add_peer): the pool's own device is a no-op, a device
// that does not exist is refused. With two or more GPUs, each peer with a P2P
// path copies a block mapped before the call and one mapped after it from
// its own context (the copy engine of the peer reads device 0's mappings:
// without the grant the driver faults); without a path, UNSUPPORTED.
void test_pool_peers(nf_backend_t *be) {
  printf("-- pool: peer access\n");
  int n = 0;
  DRV(cuDeviceGetCount(&n));
  nf_config_t cfg;
  nf_config_default(&cfg);
  nf_pool_t *pool = NULL;
  OKP(nf_pool_create(&pool, be, &cfg));
  if (!pool) return;
  OKP(nf_pool_add_peer(pool, 0));
  CHECK(nf_pool_add_peer(pool, n) == NF_ERR_INVALID, "device %d does not exist: %s", n, nf_last_error());
  size_t bytes = 8u << 20;
  void *before = nf_alloc(pool, bytes, NULL);
  CHECK(before != NULL, "alloc: %s", nf_last_error());
  if (before) dev_fill((uintptr_t)before, bytes, 31);
  void *mine = NULL;
  for (int d = 1; d < n && before; d++) {
    int dev0 = 0, devd = 0, can = 0;
    DRV(cuDeviceGet(&dev0, 0));
    DRV(cuDeviceGet(&devd, d));
    DRV(cuDeviceCanAccessPeer(&can, devd, dev0));
    nf_status_t st = nf_pool_add_peer(pool, d);
    if (!can) {
      CHECK(st == NF_ERR_UNSUPPORTED, "device %d has no P2P path to 0: %s", d, nf_status_str(st));
      continue;
    }
    CHECK(st == NF_OK, "add_peer(%d): %s", d, nf_last_error());
    void *after = nf_alloc(pool, bytes, NULL);
    CHECK(after != NULL, "alloc: %s", nf_last_error());
    if (!after) continue;
    dev_fill((uintptr_t)after, bytes, 32);
    DRV(cuCtxSynchronize());
    void *ctx = NULL, *cur = NULL;
    DRV(cuCtxGetCurrent(&cur));
    DRV(cuDevicePrimaryCtxRetain(&ctx, devd));
    DRV(cuCtxSetCurrent(ctx));
    // Peer reads: device d copies each block within device 0's memory.
    if (!mine) mine = nf_alloc(pool, bytes, NULL);
    CHECK(mine != NULL, "alloc: %s", nf_last_error());
    if (mine) {
      DRV(cuMemcpyDtoD((CUdeviceptr)mine, (CUdeviceptr)before, bytes));
      CHECK(dev_check((uintptr_t)mine, bytes, 31), "device %d: block mapped before add_peer reads wrong", d);
      DRV(cuMemcpyDtoD((CUdeviceptr)mine, (CUdeviceptr)after, bytes));
      CHECK(dev_check((uintptr_t)mine, bytes, 32), "device %d: block mapped after add_peer reads wrong", d);
    }
    DRV(cuCtxSetCurrent(cur));
    DRV(cuDevicePrimaryCtxRelease(devd));
    nf_free(pool, after);
  }
  if (n < 2) printf("   (one GPU: the peer copies need a second device; not run)\n");
  if (mine) nf_free(pool, mine);
  if (before) nf_free(pool, before);
  nf_pool_destroy(pool);
}

// Spill past the limit, then offload/prefetch cycles with the copies queued
// behind other work on the stream, both tiers; every block's pattern is
// checked after it comes back. Also the bandwidth of one 512 MiB offload and
// prefetch (H200 here: host memory over PCIe).
void test_pool_spill_offload(nf_backend_t *be) {
  printf("-- pool: spill past a 256 MiB limit; offload/prefetch under load (host, detached, disk)\n");
  setenv("NOFRAG_QUIET_SPILL", "1", 1);
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256];
  OKP(nf_config_parse(&cfg, "limit:256MiB,spill:host,spill_limit:2GiB,release_threshold:never", err, sizeof err));
  nf_pool_t *pool = NULL;
  OKP(nf_pool_create(&pool, be, &cfg));
  if (!pool) return;
  const size_t M = 1 << 20;
  live_t S[6];
  int bad = 0;
  for (int i = 0; i < 6; i++) { // 1.5 x the limit
    S[i] = (live_t){(uintptr_t)nf_alloc(pool, 64 * M, NULL), 64 * M, 500u + (uint32_t)i};
    CHECK(S[i].p, "spill alloc %d: %s", i, nf_last_error());
    if (S[i].p) dev_fill(S[i].p, S[i].n, S[i].tag);
  }
  nf_stats_t st;
  nf_stats_get(pool, &st);
  uint64_t t[3] = {0};
  if (S[5].p) OKP(nf_block_tiers(pool, (void *)S[5].p, t));
  CHECK(st.spilled >= 128 * M && t[1] == 64 * M, "spilled %llu, last block on host %llu", (unsigned long long)st.spilled,
        (unsigned long long)t[1]);
  // The GPU writes spilled memory through the same address.
  CUstream s = NULL;
  DRV(cuStreamCreate(&s, 0));
  if (S[5].p) {
    DRV(cuMemsetD32Async((CUdeviceptr)S[5].p, 0x5EED5EEDu, 64 * M / 4, s));
    DRV(cuStreamSynchronize(s));
    hreserve(64 * M);
    DRV(cuMemcpyDtoH(hbuf, (CUdeviceptr)S[5].p, 64 * M));
    CHECK(hbuf[0] == 0x5EED5EEDu && hbuf[64 * M / 4 - 1] == 0x5EED5EEDu, "GPU write to spilled memory lost");
    dev_fill(S[5].p, S[5].n, S[5].tag);
  }
  for (int i = 0; i < 6; i++) bad += S[i].p && !dev_check(S[i].p, S[i].n, S[i].tag);
  for (int i = 0; i < 6; i++) nf_free(pool, (void *)S[i].p);
  void *d = nf_alloc(pool, 192 * M, NULL);
  if (d) OKP(nf_block_tiers(pool, d, t));
  CHECK(d && t[1] == 0 && t[0] == 192 * M, "after spill, new blocks must be on the device (host %llu)",
        (unsigned long long)t[1]);
  nf_free(pool, d);
  // Cycles: 8 blocks of 12..33 MiB on a 256 MiB limit with a 64 MiB scratch
  // block alive too; offloads are queued behind a memset of the scratch.
  live_t B[8];
  int where[8] = {0}, moved = 0, cycles = 0;
  void *scratch = nf_alloc(pool, 64 * M, s);
  for (int i = 0; i < 8; i++) {
    B[i] = (live_t){(uintptr_t)nf_alloc(pool, (size_t)(12 + 3 * i) * M, s), (size_t)(12 + 3 * i) * M, 600u + (uint32_t)i};
    CHECK(B[i].p, "cycle alloc %d: %s", i, nf_last_error());
    if (B[i].p) dev_fill(B[i].p, B[i].n, B[i].tag);
  }
  for (int it = 0; it < 120 && scratch; it++) {
    int i = (int)(rnd() % 8);
    if (!B[i].p) continue;
    DRV(cuMemsetD32Async((CUdeviceptr)scratch, (unsigned)it, 64 * M / 4, s)); // load ahead of the copy
    if (!where[i]) {
      int k = (int)(rnd() % 4);
      nf_tier_t tier = k == 0 ? NF_TIER_DISK : k == 1 ? NF_TIER_HOST_DETACHED : NF_TIER_HOST;
      nf_status_t r = nf_offload(pool, (void *)B[i].p, s, tier);
      CHECK(r == NF_OK, "offload: %s", nf_last_error());
      if (r == NF_OK) where[i] = tier, moved++;
    } else {
      nf_status_t r = nf_prefetch(pool, (void *)B[i].p, s);
      if (r == NF_ERR_OOM) continue; // the others hold the device: fine, try later
      CHECK(r == NF_OK, "prefetch: %s", nf_last_error());
      if (r != NF_OK) continue;
      where[i] = 0;
      cycles++;
      DRV(cuStreamSynchronize(s));
      bad += !dev_check(B[i].p, B[i].n, B[i].tag);
      B[i].tag += 100; // new contents for the next cycle
      dev_fill(B[i].p, B[i].n, B[i].tag);
    }
    CHECK(nf_pool_check(pool) == NF_OK, "pool_check: %s", nf_last_error());
  }
  for (int i = 0; i < 8; i++) {
    if (!B[i].p) continue;
    if (where[i]) { OKP(nf_prefetch(pool, (void *)B[i].p, s)); cycles++; }
    DRV(cuStreamSynchronize(s));
    bad += !dev_check(B[i].p, B[i].n, B[i].tag);
    nf_free(pool, (void *)B[i].p);
  }
  nf_free(pool, scratch);
  nf_stats_get(pool, &st);
  CHECK(bad == 0, "%d blocks lost their data", bad);
  CHECK(moved >= 20 && cycles >= 15, "too few moves: %d offloads, %d round trips", moved, cycles);
  printf("   spill peak %llu MiB; %d offloads, %d round trips, 0 blocks lost expected, %d found; copies %llu\n",
         (unsigned long long)(st.spilled_peak >> 20), moved, cycles, bad, (unsigned long long)st.calls.copy);
  nf_pool_destroy(pool);
  // Bandwidth of one 512 MiB block, there and back.
  OKP(nf_config_parse(&cfg, "limit:2GiB,spill:off", err, sizeof err));
  pool = NULL;
  OKP(nf_pool_create(&pool, be, &cfg));
  void *big = pool ? nf_alloc(pool, 512 * M, s) : NULL;
  // [tier][round]: round 0 creates the host granules (and, detached, maps
  // them at the window), round 1 reuses them.
  double off_gbs[2][2] = {{0}}, pre_gbs[2][2] = {{0}};
  for (int k = 0; k < 2 && big; k++)
    for (int round = 0; round < 2; round++) {
      nf_tier_t tier = k ? NF_TIER_HOST_DETACHED : NF_TIER_HOST;
      dev_fill((uintptr_t)big, 512 * M, 77u + (uint32_t)(2 * k + round));
      DRV(cuStreamSynchronize(s));
      double t0 = now_us();
      OKP(nf_offload(pool, big, s, tier));
      OKP(nf_offload_wait(pool));
      double t1 = now_us();
      OKP(nf_prefetch(pool, big, s));
      DRV(cuStreamSynchronize(s));
      double t2 = now_us();
      OKP(nf_offload_wait(pool)); // the host granules return before the next round
      off_gbs[k][round] = 512.0 * M / ((t1 - t0) * 1e3);
      pre_gbs[k][round] = 512.0 * M / ((t2 - t1) * 1e3);
      CHECK(dev_check((uintptr_t)big, 512 * M, 77u + (uint32_t)(2 * k + round)),
            "512 MiB block corrupted by offload + prefetch (tier %d, round %d)", (int)tier, round);
    }
  if (big) {
    printf("   512 MiB host:     offload %.1f GB/s fresh, %.1f warm (incl. remap); prefetch %.1f / %.1f GB/s\n",
           off_gbs[0][0], off_gbs[0][1], pre_gbs[0][0], pre_gbs[0][1]);
    printf("   512 MiB detached: offload %.1f GB/s fresh, %.1f warm (incl. unmap);  prefetch %.1f / %.1f GB/s\n",
           off_gbs[1][0], off_gbs[1][1], pre_gbs[1][0], pre_gbs[1][1]);
    nf_free(pool, big);
  }
  fprintf(jout, "\"offload\": {\"bad_blocks\": %d, \"offloads\": %d, \"round_trips\": %d, \"offload_GBps\": %.2f, "
                "\"prefetch_GBps\": %.2f, \"offload_warm_GBps\": %.2f, \"prefetch_warm_GBps\": %.2f, "
                "\"detached_offload_GBps\": [%.2f, %.2f], \"detached_prefetch_GBps\": [%.2f, %.2f]},\n",
          bad, moved, cycles, off_gbs[0][0], pre_gbs[0][0], off_gbs[0][1], pre_gbs[0][1], off_gbs[1][0],
          off_gbs[1][1], pre_gbs[1][0], pre_gbs[1][1]);
  nf_pool_destroy(pool);
  DRV(cuStreamDestroy(s));
}
