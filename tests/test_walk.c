// src/torch/walk.c: nf_torch_walk, the segments and blocks PyTorch's memory
// snapshot gets from the adapter, checked against nf_snapshot's JSON of the
// same pool.
#include "nf_test.h"

#include "json_test.h"
#include "torch/torch.h" // nf_torch_walk

#define G (64 * 1024) // small granule: many granules, fast tests


// nf_torch_walk (src/torch/walk.c: the layout PyTorch's memory snapshot gets
// from the adapter) against the JSON snapshot: one segment per maximal run
// of ready mapped granules of a chunk (large: the chunk's arena), tiled by
// the chunk's blocks clipped to it; a shadow shows as free; a live or pending
// block has its stream and its request, cut to the piece where it is clipped.
typedef struct { uint64_t addr, size, req, stream; int state, large, seg; } wrec_t; // a segment's req: its private id
typedef struct { wrec_t r[4096]; int n; } wlist_t;

static void walk_cb(void *ctx, const nf_torch_seg_t *seg, const nf_torch_blk_t *blk) {
  wlist_t *w = ctx;
  assert_true(w->n < 4096);
  if (seg) w->r[w->n++] = (wrec_t){seg->addr, seg->size, seg->private_id, 0, -1, seg->large, 1};
  else w->r[w->n++] = (wrec_t){blk->addr, blk->size, blk->req, (uintptr_t)blk->stream, blk->state, 0, 0};
}

static int seg_cmp(const void *a, const void *b) {
  const wrec_t *x = *(wrec_t *const *)a, *y = *(wrec_t *const *)b;
  return (x->addr > y->addr) - (x->addr < y->addr);
}

static void verify_walk(nf_pool_t *p) {
  static wlist_t w, e; // walked, expected
  w.n = e.n = 0;
  assert_int_equal(nf_torch_walk(p, walk_cb, &w), 0); // first: its own flush of parked blocks
  assert_int_equal(nf_torch_walk(NULL, walk_cb, &w), -1);
  char *s = nf_snapshot(p);
  assert_non_null(s);
  jv *d = jdoc(s);
  assert_non_null(d);
  const jv *chunks = jget(d, "chunks");
  for (size_t ci = 0; ci < chunks->n; ci++) { // address order
    const jv *c = chunks->items[ci], *runs = jget(c, "mapped"), *blocks = jget(c, "blocks");
    uint64_t base = jhex(c, "base");
    int large = !strcmp(js(c, "arena"), "large");
    for (size_t ri = 0; ri < runs->n;) {
      if (!jget(runs->items[ri], "ready")->num) { ri++; continue; }
      uint64_t g = jnum(runs->items[ri], "granule"), end = g + jnum(runs->items[ri], "count");
      for (ri++; ri < runs->n && jget(runs->items[ri], "ready")->num && jnum(runs->items[ri], "granule") == end; ri++)
        end += jnum(runs->items[ri], "count"); // runs split by tier only: one segment
      uint64_t a = base + g * G, z = base + end * G;
      e.r[e.n++] = (wrec_t){a, z - a, 0, 0, -1, large, 1};
      for (size_t bi = 0; bi < blocks->n; bi++) {
        const jv *b = blocks->items[bi];
        uint64_t ba = jhex(b, "addr"), bz = ba + jnum(b, "size"), lo = ba > a ? ba : a, hi = bz < z ? bz : z;
        if (hi <= lo) continue;
        const char *st = js(b, "state");
        int state = !strcmp(st, "live") ? 1 : !strcmp(st, "pending") ? 2 : 0; // a shadow: free
        uint64_t req = 0, stream = 0;
        if (state) {
          req = jnum(b, "requested");
          req = ba == lo && req <= hi - lo ? req : hi - lo;
          stream = jhex(b, "stream");
        }
        e.r[e.n++] = (wrec_t){lo, hi - lo, req, stream, state, 0, 0};
      }
    }
  }
  jfree(d);
  nf_snapshot_free(s);
  // The walk goes chunk by chunk in the pool's order: compare segment by segment.
  wrec_t *ws[4096];
  int nseg = 0;
  for (int i = 0; i < w.n; i++)
    if (w.r[i].seg) ws[nseg++] = &w.r[i];
  qsort(ws, (size_t)nseg, sizeof *ws, seg_cmp);
  int k = 0;
  for (int i = 0; i < nseg; i++) {
    for (const wrec_t *x = ws[i]; x == ws[i] || (x < w.r + w.n && !x->seg); x++, k++) {
      if (k >= e.n) fail_msg("walk: more records than the snapshot's %d", e.n);
      const wrec_t *y = &e.r[k];
      if (x->seg != y->seg || x->addr != y->addr || x->size != y->size || x->req != y->req ||
          x->stream != y->stream || x->state != y->state || x->large != y->large)
        fail_msg("walk record %d: %s 0x%llx +%llu req %llu state %d stream 0x%llx large %d; snapshot: %s 0x%llx +%llu "
                 "req %llu state %d stream 0x%llx large %d",
                 k, x->seg ? "seg" : "blk", (unsigned long long)x->addr, (unsigned long long)x->size,
                 (unsigned long long)x->req, x->state, (unsigned long long)x->stream, x->large, y->seg ? "seg" : "blk",
                 (unsigned long long)y->addr, (unsigned long long)y->size, (unsigned long long)y->req, y->state,
                 (unsigned long long)y->stream, y->large);
    }
  }
  assert_int_equal(k, e.n);
}

static void test_torch_walk(void **state) {
  (void)state;
  // Random work under a limit that forces stitching, both arenas, three streams.
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1ull << 30, G, "limit:8MiB");
  assert_non_null(p);
  verify_walk(p); // empty
  uint64_t seed = nft_env_seed(7);
  void *l[64] = {0};
  for (int phase = 0; phase < 4; phase++) {
    for (int op = 0; op < 300; op++) {
      int i = (int)(nft_rand(&seed) % 64);
      if (l[i]) { assert_int_equal(nf_free(p, l[i]), NF_OK); l[i] = NULL; continue; }
      size_t sz = nft_rand(&seed) % 4 ? 1 + nft_rand(&seed) % (2 * G) : nft_rand(&seed) % (12 * G) + 1;
      l[i] = nf_alloc(p, sz, (void *)(uintptr_t)(nft_rand(&seed) % 3));
    }
    verify_walk(p);
  }
  for (int i = 0; i < 64; i++) nf_free(p, l[i]);
  nf_pool_destroy(p);
  nf_backend_destroy(be);

  // Deferred coalescing: small blocks freed side by side are parked apart
  // (far from the limit); the walk shows them coalesced, as the snapshot does.
  p = nft_pool(&be, 1ull << 30, G, "limit:1GiB");
  assert_non_null(p);
  void *sm[8];
  for (int i = 0; i < 8; i++) assert_non_null(sm[i] = nf_alloc(p, 1000, NULL));
  for (int i = 1; i < 7; i++)
    if (i != 4) assert_int_equal(nf_free(p, sm[i]), NF_OK);
  verify_walk(p);
  nf_free(p, sm[0]);
  nf_free(p, sm[4]);
  nf_free(p, sm[7]);
  nf_pool_destroy(p);
  nf_backend_destroy(be);

  // A pending block (freed, its recorded stream's work not done).
  p = nft_pending_pool(&be, G);
  verify_walk(p);
  nf_backend_host_complete_events(be);
  nf_pool_destroy(p);
  nf_backend_destroy(be);

  // Edge sharing: a request that starts in a1's last granule (test_edge's
  // head lender, 8 granules) leaves a shadow there.
  p = nft_pool(&be, 1024 * G, G, "limit:512KiB,small_max:4KiB,edges:1");
  assert_non_null(p);
  char *a1 = nf_alloc(p, 2 * G - G / 2, NULL), *a2 = nf_alloc(p, G / 2, NULL), *a3 = nf_alloc(p, G, NULL);
  assert_true(a1 && a2 && a3);
  assert_int_equal(nf_free(p, a2), NF_OK);
  assert_int_equal(nf_free(p, nf_alloc(p, 5 * G, NULL)), NF_OK);
  char *c = nf_alloc(p, 5 * G + G / 4, NULL);
  assert_non_null(c);
  // The pair: a shadow at each place (of the other side's bytes), each naming
  // the other (shadow_of).
  char *snap = nf_snapshot(p);
  jv *doc = jdoc(snap);
  assert_non_null(doc);
  uint64_t sh[4][3]; // addr, size, shadow_of
  int nsh = 0;
  const jv *chunks = jget(doc, "chunks");
  for (size_t ci = 0; ci < chunks->n; ci++) {
    const jv *blocks = jget(chunks->items[ci], "blocks");
    for (size_t bi = 0; bi < blocks->n; bi++)
      if (!strcmp(js(blocks->items[bi], "state"), "shadow") && nsh < 4) {
        sh[nsh][0] = jhex(blocks->items[bi], "addr");
        sh[nsh][1] = jnum(blocks->items[bi], "size");
        sh[nsh++][2] = jhex(blocks->items[bi], "shadow_of");
      }
  }
  jfree(doc);
  nf_snapshot_free(snap);
  assert_int_equal(nsh, 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(sh[i][2], sh[1 - i][0]);
    assert_int_equal(sh[i][1] + sh[1 - i][1], G); // each covers the other side's part of the granule
  }
  verify_walk(p);
  nf_free(p, c);
  nf_free(p, a1);
  nf_free(p, a3);
  nf_pool_destroy(p);
  nf_backend_destroy(be);

  // A private pool's segment names its id; the general pool's, 0.
  p = nft_pool(&be, 1ull << 30, G, "limit:8MiB");
  assert_non_null(p);
  assert_int_equal(nf_private_incref(p, 5), NF_OK);
  void *pv = nf_alloc_private(p, 5, 4 * G, NULL), *gv = nf_alloc(p, 4 * G, NULL);
  assert_true(pv && gv);
  static wlist_t w;
  w.n = 0;
  assert_int_equal(nf_torch_walk(p, walk_cb, &w), 0);
  int found = 0;
  for (int i = 0; i < w.n; i++) {
    const wrec_t *r = &w.r[i];
    if (!r->seg) continue;
    if ((uintptr_t)pv >= r->addr && (uintptr_t)pv < r->addr + r->size) { assert_int_equal(r->req, 5); found |= 1; }
    if ((uintptr_t)gv >= r->addr && (uintptr_t)gv < r->addr + r->size) { assert_int_equal(r->req, 0); found |= 2; }
  }
  assert_int_equal(found, 3);
  nf_free(p, pv);
  nf_free(p, gv);
  assert_int_equal(nf_private_release(p, 5), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);

  // A block offloaded to disk keeps only the granule it shares with a live
  // neighbour mapped: the walk shows that piece, its request cut to it.
  p = nft_pool(&be, 1024 * G, G, "limit:4MiB,small_max:4KiB");
  assert_non_null(p);
  char *x = nf_alloc(p, G / 2, NULL), *y = nf_alloc(p, 4 * G, NULL);
  assert_true(x && y);
  assert_ptr_equal(y, x + G / 2);
  assert_int_equal(nf_offload(p, y, NULL, NF_TIER_DISK), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  verify_walk(p);
  assert_int_equal(nf_prefetch(p, y, NULL), NF_OK);
  nf_free(p, y);
  nf_free(p, x);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_torch_walk),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
