// The pool's layout for PyTorch's memory snapshot (torch.cuda.memory._snapshot),
// built by the C++ adapter (src/torch/adapter_trace.cpp): PyTorch describes memory
// as segments tiled by blocks. nofrag's segments are the maximal runs of mapped
// (ready) granules of an address range; its blocks, clipped to a run, tile it
// (live blocks are always wholly mapped; free ones may be clipped).
#include "core/core.h"
#include "torch/torch.h"

static void walk_run(nf_pool_t *p, const nf_chunk_t *c, uintptr_t a, uintptr_t e, nf_torch_walk_fn fn, void *ctx) {
  nf_torch_seg_t seg = {.addr = a, .size = e - a, .private_id = c->priv ? c->priv->id : 0,
                        .large = c->arena == NF_ARENA_LARGE};
  fn(ctx, &seg, NULL);
  for (const nf_block_t *b = c->first; b; b = b->next) {
    uintptr_t lo = b->addr > a ? b->addr : a, hi = b->addr + b->size < e ? b->addr + b->size : e;
    if (hi <= lo) continue;
    // A shadow (edge sharing, src/core/edge.c) holds no tensor: PyTorch sees inactive memory there.
    uint8_t state = b->state == NF_BLK_SHADOW ? NF_BLK_FREE : b->state;
    nf_torch_blk_t blk = {.addr = lo, .size = hi - lo, .req = 0, .state = state, .stream = NULL};
    if (state != NF_BLK_FREE) {
      blk.req = b->addr == lo && b->req <= hi - lo ? b->req : hi - lo;
      blk.stream = nf__block_stream(p, b);
    }
    fn(ctx, NULL, &blk);
  }
}

NF_API int nf_torch_walk(nf_pool_t *p, nf_torch_walk_fn fn, void *ctx) {
  if (!p || !fn) return -1;
  nf__pool_lock(p);
  nf__bins_flush(p); // blocks as without deferred coalescing
  for (const nf_chunk_t *c = p->chunks; c; c = c->next) {
    const uint64_t *ready = NF_READY(c);
    for (uint64_t g = 0; g < c->ngran;) {
      if (!nf__bit(ready, g)) { g++; continue; }
      uint64_t e = g;
      while (e < c->ngran && nf__bit(ready, e)) e++;
      walk_run(p, c, c->base + (g << p->gshift), c->base + (e << p->gshift), fn, ctx);
      g = e;
    }
  }
  nf__pool_unlock(p);
  return 0;
}
