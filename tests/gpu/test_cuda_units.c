// GPU test section: mapping units (config `units`) on the CUDA driver. The
// driver must take a 16-granule allocation mapped in one call, access set
// over runs mixing units and single granules, and whole-unit unmaps; device
// data must survive growth in units, a host-tier offload (each unit swapped
// whole for host granules), splits near the limit and stitching.
#include "cuda_test.h"

#include <string.h>

static nf_pool_t *units_pool(nf_backend_t *be, const char *conf) {
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256];
  OKP(nf_config_parse(&cfg, conf, err, sizeof err));
  nf_pool_t *pool = NULL;
  OKP(nf_pool_create(&pool, be, &cfg));
  return pool;
}

static uint64_t moved_of(const nf_stats_t *st) {
  return st->units_unmapped + st->reclaims + st->view_moves + st->view_reuses;
}

void test_pool_units(nf_backend_t *be) {
  printf("-- pool: mapping units (units:16): growth calls, data across splits and stitching\n");
  // 1. Growth: a 200 MiB block (100 granules) is 6 units and 4 singles: 10 creates, not 100.
  nf_pool_t *pool = units_pool(be, "units:16,release_threshold:never");
  if (!pool) return;
  nf_stats_t s0, s1;
  nf_stats_get(pool, &s0);
  double t0 = now_us();
  void *big = nf_alloc(pool, 200u << 20, NULL);
  double t_units = now_us() - t0;
  nf_stats_get(pool, &s1);
  CHECK(big != NULL, "alloc: %s", nf_last_error());
  CHECK(s1.units_made >= 5 && s1.calls.create - s0.calls.create <= 12, "200 MiB: %llu units, %llu creates",
        (unsigned long long)s1.units_made, (unsigned long long)(s1.calls.create - s0.calls.create));
  if (big) {
    dev_fill((uintptr_t)big, 200u << 20, 7);
    CHECK(dev_check((uintptr_t)big, 200u << 20, 7), "200 MiB block over units lost its data");
    // Host tier: each unit is unmapped whole and host granules mapped in its
    // place; the kernel reads them at the same address, then the prefetch.
    nf_stats_get(pool, &s0);
    nf_status_t so = nf_offload(pool, big, NULL, NF_TIER_HOST);
    if (so == NF_OK) so = nf_offload_wait(pool);
    nf_stats_get(pool, &s1);
    CHECK(so == NF_OK && s1.units == 0 && s1.units_unmapped == s0.units_unmapped + s0.units,
          "host offload of a block on %llu units: %s (units now %llu)", (unsigned long long)s0.units,
          so == NF_OK ? "ok" : nf_last_error(), (unsigned long long)s1.units);
    CHECK(dev_check((uintptr_t)big, 200u << 20, 7), "200 MiB block lost its data in host memory");
    CHECK(nf_prefetch(pool, big, NULL) == NF_OK, "prefetch: %s", nf_last_error());
    CHECK(dev_check((uintptr_t)big, 200u << 20, 7), "200 MiB block lost its data after the prefetch");
    nf_free(pool, big);
  }
  CHECK(nf_pool_check(pool) == NF_OK, "pool_check: %s", nf_last_error());
  nf_pool_destroy(pool);
  pool = units_pool(be, "units:0,release_threshold:never");
  if (pool) {
    t0 = now_us();
    big = nf_alloc(pool, 200u << 20, NULL);
    double t_single = now_us() - t0;
    CHECK(big != NULL, "alloc: %s", nf_last_error());
    printf("   200 MiB growth: %.0f us in units, %.0f us in single granules\n", t_units, t_single);
    fprintf(jout, "\"units_growth_us\": [%.0f, %.0f],\n", t_units, t_single);
    if (big) nf_free(pool, big);
    nf_pool_destroy(pool);
  }
  // 2. A random workload under a 1 GiB limit: units grow early, then blocks
  //    land over parts of free units (split near the limit) and stitching
  //    unmaps whole free ones. Every live block keeps its pattern.
  pool = units_pool(be, "units:16,limit:1GiB,release_threshold:never");
  if (!pool) return;
  live_t L[64];
  int n = 0, ooms = 0, bad = 0;
  uint32_t tag = 100;
  uint64_t moved = 0;
  for (int it = 0; it < 800; it++) live_step(pool, L, &n, &tag, 3, 96, 4u << 20, moved_of, &moved, &ooms, &bad);
  for (int i = 0; i < n; i++) bad += !dev_check(L[i].p, L[i].n, L[i].tag);
  nf_stats_t st;
  nf_stats_get(pool, &st);
  CHECK(bad == 0, "%d blocks lost their data", bad);
  CHECK(st.units_made > 0 && st.units_unmapped > 0, "units made %llu, unmapped %llu: test too easy",
        (unsigned long long)st.units_made, (unsigned long long)st.units_unmapped);
  CHECK(nf_pool_check(pool) == NF_OK, "pool_check: %s", nf_last_error());
  printf("   800 ops: ooms %d, units made %llu, unmapped %llu (%llu splits), reclaims %llu, calls %llu\n", ooms,
         (unsigned long long)st.units_made, (unsigned long long)st.units_unmapped, (unsigned long long)st.unit_splits,
         (unsigned long long)st.reclaims, (unsigned long long)st.backend_calls);
  fprintf(jout, "\"units\": {\"ooms\": %d, \"made\": %llu, \"unmapped\": %llu, \"splits\": %llu, \"bad_blocks\": %d},\n",
          ooms, (unsigned long long)st.units_made, (unsigned long long)st.units_unmapped,
          (unsigned long long)st.unit_splits, bad);
  for (int i = 0; i < n; i++) nf_free(pool, (void *)L[i].p);
  CHECK(nf_trim(pool) == NF_OK, "trim: %s", nf_last_error());
  nf_stats_get(pool, &st);
  CHECK(st.units == 0 && st.physical == 0, "after trim: %llu units, %llu B physical", (unsigned long long)st.units,
        (unsigned long long)st.physical);
  nf_pool_destroy(pool);
}
