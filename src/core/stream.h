// Stream state predicates: part of the core's private header (core.h
// includes it after the pool's types). The streams themselves are in
// stream.c; these read their state only.
#ifndef NF_CORE_STREAM_H
#define NF_CORE_STREAM_H

// Stream state predicates (pure: no backend call), used by every file of the
// core. A record on X after `need` covers the block's work on X. The block's
// tick may come from another stream's later free (merged blocks keep the
// latest tick), so X's own newest free bounds it: X's work on it is no later.
// need 0: X never freed a block, so none of its work is on freed memory (a
// conservative mark -- views_on -- names it all the same; record_stream'd
// blocks wait on the pending list): nothing to wait for. Otherwise a stream
// that only ever allocates would pin such ranges for good, since nothing
// records an event on it (streams_settle skips it).
static inline uint64_t nf__need_tick(const nf_stream_rec_t *r, uint64_t tick) {
  return tick < r->last_free ? tick : r->last_free;
}
// The slots that hold a stream: below the high-water mark, not given back
// (stream.c, streams_recycle).
static inline uint64_t nf__streams_held(const nf_pool_t *p) {
  return (p->nstreams >= 64 ? ~0ull : (1ull << p->nstreams) - 1) & ~p->stream_free;
}
// Stream x's work up to `need` (nf__need_tick) is known complete.
static inline bool nf__need_done(const nf_stream_rec_t *r, uint64_t need) { return !need || r->done_tick > need; }

static inline bool nf__block_retired(const nf_pool_t *p, const nf_block_t *b) {
  for (uint64_t m = b->smask; m; m &= m - 1) {
    const nf_stream_rec_t *r = &p->streams[__builtin_ctzll(m)];
    if (!nf__need_done(r, nf__need_tick(r, b->tick))) return false;
  }
  return true;
}

static inline bool nf__block_usable(const nf_pool_t *p, const nf_block_t *b, uint32_t s) {
  for (uint64_t m = b->smask & ~(1ull << s); m; m &= m - 1) {
    uint32_t x = (uint32_t)__builtin_ctzll(m);
    uint64_t need = nf__need_tick(&p->streams[x], b->tick);
    if (!nf__need_done(&p->streams[x], need) && p->waited[s][x] <= need) return false;
  }
  return true;
}

#endif
