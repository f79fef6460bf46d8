// Stream ordering with lazily recorded events.
//
// Each stream has one reusable event and a counter `rec` of its records. A
// block freed on stream A remembers seq = A.rec at the free: the k-th record
// covers the block's work iff k > seq. Nothing is recorded at free time; an
// event is recorded only when another stream wants the block (then that stream
// waits on it: no host blocking) or when its granules must be unmapped (then
// the host synchronizes). waited[S][A] remembers the newest A-event stream S
// already waits on, so one wait orders S after every block A freed before it:
// steady state makes no event calls.
#include "internal.h"

#include <stdlib.h>

nf_status_t nf__stream_index(nf_pool_t *p, nf_stream_t s, uint32_t *out) {
  if (NF_LIKELY(p->nstreams && p->streams[p->last_stream].handle == s)) {
    *out = p->last_stream;
    return NF_OK;
  }
  for (uint32_t i = 0; i < p->nstreams; i++) {
    if (p->streams[i].handle == s) {
      p->last_stream = i;
      *out = i;
      return NF_OK;
    }
  }
  if (p->nstreams == NF_MAX_STREAMS)
    return nf__error(NF_ERR_UNSUPPORTED, "nofrag: more than %d distinct streams used with one pool",
                     NF_MAX_STREAMS);
  uint32_t i = p->nstreams++;
  p->streams[i] = (nf_stream_rec_t){.handle = s};
  p->last_stream = i;
  *out = i;
  return NF_OK;
}

bool nf__block_retired(const nf_pool_t *p, const nf_block_t *b) {
  return b->stream == NF_STREAM_NONE || p->streams[b->stream].done > b->seq;
}

bool nf__block_usable(const nf_pool_t *p, const nf_block_t *b, uint32_t s) {
  if (b->stream == s || b->stream == NF_STREAM_NONE) return true;
  return p->streams[b->stream].done > b->seq || p->waited[s][b->stream] > b->seq;
}

static nf_status_t record(nf_pool_t *p, uint32_t a) {
  nf_stream_rec_t *r = &p->streams[a];
  nf_status_t st;
  if (!r->event) {
    st = NF_BE(p, event_create, event_create, &r->event);
    if (st != NF_OK) return nf__error(st, "nofrag: event create failed: %s", p->be->err);
  }
  st = NF_BE(p, event_record, event_record, r->event, r->handle);
  if (st != NF_OK) return nf__error(st, "nofrag: event record failed: %s", p->be->err);
  r->rec++;
  return NF_OK;
}

// Make stream s wait for the work that used free block b (freed on another
// stream). One record (if none covers b yet) and one stream wait.
nf_status_t nf__order_after(nf_pool_t *p, nf_block_t *b, uint32_t s) {
  if (nf__block_usable(p, b, s)) return NF_OK;
  uint32_t a = b->stream;
  nf_status_t st;
  if (p->streams[a].rec <= b->seq && (st = record(p, a)) != NF_OK) return st;
  st = NF_BE(p, stream_wait, stream_wait, p->streams[s].handle, p->streams[a].event);
  if (st != NF_OK) return nf__error(st, "nofrag: stream wait failed: %s", p->be->err);
  p->waited[s][a] = p->streams[a].rec;
  p->st.cross_stream_reuses++;
  return NF_OK;
}

// The stream has frees that no completed event covers yet (last_free holds
// the number of the first event that covers its newest free; 0 = none).
static inline bool dirty(const nf_stream_rec_t *r) { return r->done < r->last_free; }

// Block the host until every stream's freed work is complete, so that every
// free granule can be unmapped. Used by stitching and trim, never per call.
nf_status_t nf__streams_sync(nf_pool_t *p) {
  for (uint32_t a = 0; a < p->nstreams; a++) {
    nf_stream_rec_t *r = &p->streams[a];
    if (!dirty(r)) continue;
    nf_status_t st;
    if (r->rec < r->last_free && (st = record(p, a)) != NF_OK) return st;
    st = NF_BE(p, event_sync, event_sync, r->event);
    if (st != NF_OK) return nf__error(st, "nofrag: event synchronize failed: %s", p->be->err);
    r->done = r->rec;
  }
  return NF_OK;
}

// Non-blocking: record where needed and learn which streams are done.
nf_status_t nf__streams_poll(nf_pool_t *p) {
  for (uint32_t a = 0; a < p->nstreams; a++) {
    nf_stream_rec_t *r = &p->streams[a];
    if (!dirty(r)) continue;
    nf_status_t st;
    if (r->rec < r->last_free && (st = record(p, a)) != NF_OK) return st;
    st = NF_BE(p, event_query, event_query, r->event);
    if (st == NF_OK) r->done = r->rec;
    else if (st != NF_ERR_NOT_READY)
      return nf__error(st, "nofrag: event query failed: %s", p->be->err);
  }
  return NF_OK;
}

// A block used on extra streams (record_stream) is freed only once the
// work queued on each of them up to now has completed: record now, poll later.
nf_status_t nf__pending_add(nf_pool_t *p, nf_block_t *b) {
  int n = __builtin_popcountll(b->extra);
  uint32_t *pend = malloc((size_t)n * sizeof *pend);
  if (!pend) return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  int k = 0;
  for (uint64_t m = b->extra; m; m &= m - 1) {
    uint32_t a = (uint32_t)__builtin_ctzll(m);
    nf_status_t st = record(p, a);
    if (st != NF_OK) { free(pend); return st; }
    pend[k++] = p->streams[a].rec;
  }
  b->pend = pend;
  b->state = NF_BLK_PENDING;
  b->fprev = NULL;
  b->fnext = p->pending;
  if (p->pending) p->pending->fprev = b;
  p->pending = b;
  return NF_OK;
}

static bool pending_done(const nf_pool_t *p, const nf_block_t *b) {
  int k = 0;
  for (uint64_t m = b->extra; m; m &= m - 1)
    if (p->streams[__builtin_ctzll(m)].done < b->pend[k++]) return false;
  return true;
}

// Move pending blocks whose extra streams are done to the free index.
nf_status_t nf__pending_poll(nf_pool_t *p, bool blocking) {
  if (!p->pending) return NF_OK;
  nf_status_t st = blocking ? nf__streams_sync(p) : NF_OK;
  if (st != NF_OK) return st;
  for (nf_block_t *b = p->pending, *nx; b; b = nx) {
    nx = b->fnext;
    if (!blocking) {
      int k = 0;
      for (uint64_t m = b->extra; m; m &= m - 1, k++) {
        nf_stream_rec_t *r = &p->streams[__builtin_ctzll(m)];
        if (r->done >= b->pend[k]) continue;
        st = NF_BE(p, event_query, event_query, r->event);
        if (st == NF_OK) r->done = r->rec;
        else if (st != NF_ERR_NOT_READY)
          return nf__error(st, "nofrag: event query failed: %s", p->be->err);
      }
    }
    if (!pending_done(p, b)) continue;
    if (b->fprev) b->fprev->fnext = b->fnext;
    else p->pending = b->fnext;
    if (b->fnext) b->fnext->fprev = b->fprev;
    free(b->pend);
    b->pend = NULL;
    b->extra = 0;
    b->state = NF_BLK_FREE;
    nf__release_block(p, b);
  }
  return NF_OK;
}

void nf__streams_destroy(nf_pool_t *p) {
  for (uint32_t a = 0; a < p->nstreams; a++) {
    if (p->streams[a].event) {
      p->st.calls.event_sync++;
      p->be->ops->event_sync(p->be, p->streams[a].event);
      p->be->ops->event_destroy(p->be, p->streams[a].event);
      p->streams[a].event = NULL;
    }
  }
}
