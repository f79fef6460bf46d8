// Deferred coalescing (freelist.c, pool.c): part of the core's private
// header (core.h includes it after the pool's types). The inline park and
// unpark of a freed block in the bin of its exact size, which nf_free's hot
// path runs; the types (nf_bin_t) and the bins' rules are in core.h.
#ifndef NF_CORE_BINS_H
#define NF_CORE_BINS_H

// Deferred coalescing: park a freed block of the general pool in the bin of
// its exact size, un-coalesced. Not while views are on (they track free
// granules per block), not with spilled granules about (they must leave free
// ranges), not for private pools (their blocks stay theirs). A bin holding
// another size, full, or the byte bound (limit/16) reached: released as
// usual. The large arena parks one block at a time, one whose allocation
// placement made with no mapping (`memo`), and the next free releases it
// first: parking large blocks for longer changed which free block later large
// requests took (+3..8% peak physical memory on the replay traces).
// nf__bin_parkable: the bin b may go to, or NULL (nothing changes).
static NF_ALWAYS_INLINE nf_bin_t *nf__bin_parkable(nf_pool_t *p, const nf_block_t *b, bool memo) {
  if (p->vw_on | p->host_sweep | (p->host_mapped > p->offl_granules) | (b->chunk->priv != NULL))
    return NULL;
  bool large = b->arena != NF_ARENA_SMALL;
  if (large && (!memo || p->bin_large)) return NULL;
  uint64_t units = b->size >> NF_ALIGN_SHIFT;
  nf_bin_t *bin = &p->bins[nf__bin_of(units)];
  if ((bin->units != units && bin->n) || bin->n >= NF_BIN_MAX || p->bin_bytes + b->size > p->cfg.limit >> 4)
    return NULL;
  return bin;
}
static NF_ALWAYS_INLINE void nf__bin_push(nf_pool_t *p, nf_bin_t *bin, nf_block_t *b, bool memo) {
  bin->units = b->size >> NF_ALIGN_SHIFT; // (an empty bin takes any size)
  b->parked = 1;
  b->memo = memo;
  b->fx = p->fx; // nf_free bumped it: this park is the pool's latest event
  b->fprev = NULL;
  b->fnext = bin->head;
  if (bin->head) bin->head->fprev = b;
  bin->head = b;
  bin->n++;
  p->bin_blocks++;
  p->bin_bytes += b->size;
  if (b->arena != NF_ARENA_SMALL) p->bin_large = b;
}
static NF_ALWAYS_INLINE bool nf__bin_park(nf_pool_t *p, nf_block_t *b, bool memo) {
  nf_bin_t *bin = nf__bin_parkable(p, b, memo);
  if (bin) nf__bin_push(p, bin, b, memo);
  return bin != NULL;
}

// Out of its bin (still FREE, not indexed, still in the map).
static inline void nf__bin_out(nf_pool_t *p, nf_block_t *b) {
  nf_bin_t *bin = &p->bins[nf__bin_of(b->size >> NF_ALIGN_SHIFT)];
  if (b->fprev) b->fprev->fnext = b->fnext;
  else bin->head = b->fnext;
  if (b->fnext) b->fnext->fprev = b->fprev;
  b->fprev = b->fnext = NULL;
  b->parked = 0;
  if (b == p->bin_large) p->bin_large = NULL;
  bin->n--;
  p->bin_blocks--;
  p->bin_bytes -= b->size;
}

#endif
