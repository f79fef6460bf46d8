// Edge sharing on the driver (src/core/edge.c, config `edges`): a block that
// starts inside another block's partly used granule, mapped a second time.
// Two streams then write, concurrently and many times over, to the bytes each
// side owns of that one physical granule (through its two mappings); at the
// end every block holds exactly its own last value. The CUDA guide's rule on
// virtual aliasing is about the same bytes; the two sides here share none,
// nor a 128 B line (blocks are 512 B aligned).
#include "cuda_test.h"

#include <string.h>

// Every 32-bit word of [d, d + n) equals v.
static int dev_all(uintptr_t d, size_t n, uint32_t v) {
  hreserve(n);
  if (cuMemcpyDtoH(hbuf, (CUdeviceptr)d, n) != 0) return 0;
  for (size_t i = 0; i < n / 4; i++)
    if (hbuf[i] != v) return 0;
  return 1;
}

void test_pool_edges(nf_backend_t *be) {
  printf("-- edge sharing: a block's first granule shared with another's last; concurrent writes on two streams\n");
  size_t G = 0;
  OKB(be->ops->granularity(be, NF_TIER_DEVICE, &G));
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256] = "";
  char conf[128];
  snprintf(conf, sizeof conf, "limit:%zu,small_max:4096,edges:1", 8 * G);
  OKP(nf_config_parse(&cfg, conf, err, sizeof err));
  nf_pool_t *p = NULL;
  OKP(nf_pool_create(&p, be, &cfg));
  if (!p) return;
  // Granule 1: a1's last half, then a free half with a3 live after it; five
  // granules cached. A request of 5.25 granules needs six on a boundary.
  uintptr_t a1 = (uintptr_t)nf_alloc(p, 3 * G / 2, 0), a2 = (uintptr_t)nf_alloc(p, G / 2, 0);
  uintptr_t a3 = (uintptr_t)nf_alloc(p, G, 0), fill = (uintptr_t)nf_alloc(p, 5 * G, 0);
  CHECK(a1 && a2 == a1 + 3 * G / 2 && a3 == a1 + 2 * G && fill, "layout: %#lx %#lx %#lx %#lx", (unsigned long)a1,
        (unsigned long)a2, (unsigned long)a3, (unsigned long)fill);
  if (!a1 || !a2 || !a3 || !fill) { nf_pool_destroy(p); return; }
  OKP(nf_free(p, (void *)fill));
  OKP(nf_free(p, (void *)a2));
  uintptr_t c = (uintptr_t)nf_alloc(p, 5 * G + G / 4, 0);
  nf_stats_t st;
  nf_stats_get(p, &st);
  CHECK(c && st.edges == 1, "the request did not share a granule (edges %llu): %s", (unsigned long long)st.edges,
        nf_last_error());
  uintptr_t d = (uintptr_t)nf_alloc(p, G / 4, 0); // the free quarter left at the granule's own place
  CHECK(d == a1 + 3 * G / 2, "the granule's free rest not used at its place: %#lx", (unsigned long)d);
  OKP(nf_pool_check(p));
  if (!c || !d) { nf_pool_destroy(p); return; }
  // The two mappings are one granule: c's first quarter is a1 + 1.75 G.
  dev_fill(c, G / 4, 61);
  CHECK(dev_check(a1 + 7 * G / 4, G / 4, 61), "the shared granule's two mappings differ");
  CUstream s1 = NULL, s2 = NULL;
  DRV(cuStreamCreate(&s1, 1));
  DRV(cuStreamCreate(&s2, 1));
  // Many rounds of writes on two streams at once: a1 and d (granule 1's
  // first three quarters, through its own place) on s1, c (its last quarter,
  // through the second mapping, and five more granules) on s2.
  for (unsigned r = 0; r < 300; r++) {
    DRV(cuMemsetD32Async((CUdeviceptr)a1, 0xA1000000u + r, (3 * G / 2) / 4, s1));
    DRV(cuMemsetD32Async((CUdeviceptr)d, 0xD0000000u + r, (G / 4) / 4, s1));
    DRV(cuMemsetD32Async((CUdeviceptr)c, 0xC0000000u + r, (5 * G + G / 4) / 4, s2));
  }
  DRV(cuStreamSynchronize(s1));
  DRV(cuStreamSynchronize(s2));
  CHECK(dev_all(a1, 3 * G / 2, 0xA1000000u + 299), "a1 lost its last value");
  CHECK(dev_all(d, G / 4, 0xD0000000u + 299), "the block in the granule's free rest lost its last value");
  CHECK(dev_all(c, 5 * G + G / 4, 0xC0000000u + 299), "the sharing block lost its last value");
  // The pair ends with c: the others keep their data, the pool its invariants.
  OKP(nf_free(p, (void *)c));
  nf_stats_get(p, &st);
  CHECK(st.edges == 0, "%llu shared granules after the free", (unsigned long long)st.edges);
  OKP(nf_pool_check(p));
  CHECK(dev_all(a1, 3 * G / 2, 0xA1000000u + 299) && dev_all(d, G / 4, 0xD0000000u + 299), "data changed by the free");
  // Again, now through the parked view or a new pair: still exact.
  c = (uintptr_t)nf_alloc(p, 5 * G + G / 4, 0);
  CHECK(c != 0, "the request failed the second time: %s", nf_last_error());
  if (c) {
    DRV(cuMemsetD32Async((CUdeviceptr)c, 0xC2C2C2C2u, (5 * G + G / 4) / 4, s2));
    DRV(cuMemsetD32Async((CUdeviceptr)d, 0xD2D2D2D2u, (G / 4) / 4, s1));
    DRV(cuStreamSynchronize(s1));
    DRV(cuStreamSynchronize(s2));
    CHECK(dev_all(c, 5 * G + G / 4, 0xC2C2C2C2u) && dev_all(d, G / 4, 0xD2D2D2D2u), "second pair: data mixed");
    OKP(nf_free(p, (void *)c));
  }
  OKP(nf_free(p, (void *)d));
  OKP(nf_free(p, (void *)a1));
  OKP(nf_free(p, (void *)a3));
  OKP(nf_pool_check(p));
  nf_stats_get(p, &st);
  printf("   %llu shared granules made; pool check clean\n", (unsigned long long)st.edges_made);
  fprintf(jout, "\"edges_made\": %llu,\n", (unsigned long long)st.edges_made);
  nf_pool_destroy(p);
  DRV(cuStreamDestroy(s1));
  DRV(cuStreamDestroy(s2));
}
