// Edge sharing (edge.c): part of the core's private header (core.h includes it
// after the pool's types).
#ifndef NF_CORE_EDGE_H
#define NF_CORE_EDGE_H

// At the limit, a request whose size is not a whole number of granules may
// start (or end) inside a granule another block holds part of, mapped there a
// second time. The two places never share a byte: a shadow block covers each
// side's part of the other's.

// Granule g of c is a second mapping of a granule owned elsewhere.
static inline bool nf__guest(const nf_chunk_t *c, uint64_t g) { return c->guest && (c->guest[g >> 6] >> (g & 63) & 1); }
nf_status_t nf__edge_place(nf_pool_t *p, uint64_t rsize, uint32_t s, nf_block_t **out);
nf_status_t nf__edge_check(nf_pool_t *p, const nf_chunk_t *c, uint64_t g); // nf_pool_check: guest granule g of c
// The release of block b (state FREE) once views are on: its granules' busy
// bits and last users (nf__view_dead; `used`: its streams worked on them),
// the free index, then the pairs of its shared end granules. Pairs exist
// only with views on (nf__edge_place), so the release without views needs
// none of it.
void nf__release_viewed(nf_pool_t *p, nf_block_t *b, bool used);

#endif
