// Private pools (private_pool.c): part of the core's private header (core.h
// includes it after the pool's types and the stream predicates).
#ifndef NF_CORE_PRIVATE_POOL_H
#define NF_CORE_PRIVATE_POOL_H

// A private pool owns whole address-range chunks (chunk->priv) and their own
// free index, so its freed blocks are reused only by allocations routed to
// it, and nothing unmaps its granules while it exists (nf__unmap_cached skips
// its chunks). When its last user releases it, its chunks join the general
// pool: free blocks become general free blocks, live ones stay where they are.
typedef struct nf_priv_s {
  uint64_t id;
  uint64_t uses;                  // use count; 0: handed back (the struct is gone)
  uint64_t live_blocks, live;     // live blocks in its chunks, requested bytes
  nf_tlsf_t tlsf[NF_ARENA_COUNT]; // its free blocks
  struct nf_priv_s *next;
} nf_priv_t;

// A route: allocations on stream index `s` (capture: the stream is being
// captured) or from thread `thread` (by_thread) go to `pv`.
typedef struct nf_route_s {
  nf_priv_t *pv;
  uint64_t thread;
  uint32_t s;
  bool by_thread;
} nf_route_t;

// The free index a block belongs to: its chunk owner's.
static inline nf_tlsf_t *nf__tlsf_of(nf_pool_t *p, const nf_block_t *b) {
  return NF_UNLIKELY(b->chunk->priv != NULL) ? &b->chunk->priv->tlsf[b->arena] : &p->tlsf[b->arena];
}
nf_priv_t *nf__priv_find(const nf_pool_t *p, uint64_t id);
nf_priv_t *nf__priv_route(const nf_pool_t *p, uint32_t s); // route for an allocation on stream index s (NULL: general)
nf_status_t nf__priv_chunk_new(nf_pool_t *p, nf_priv_t *pv, int arena, uint64_t min_size);
uint64_t nf__priv_check(nf_pool_t *p, nf_status_t *st); // nf_pool_check: free blocks indexed in private pools
void nf__privs_destroy(nf_pool_t *p);
// Whether a free block may be used on stream s with no event call (always
// true outside captures; during one, placement takes only such blocks).
static inline bool nf__capture_ok(const nf_pool_t *p, const nf_block_t *b, uint32_t s) {
  return NF_LIKELY(!p->capture_mask) || nf__block_usable(p, b, s);
}

#endif
