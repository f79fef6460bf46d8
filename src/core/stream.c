// Stream ordering with lazily recorded events.
//
// A pool-wide clock ticks at every free and every event record. A free block
// remembers the streams whose work may still touch it (smask) and the tick of
// its free; a record on stream X at tick r covers every free on X before r.
// An event is recorded when another stream wants the block (that stream then
// waits on it: no host blocking) or when granules must be unmapped (the host
// waits); frees record too, but only for a while after an eviction's host
// wait (so that the next one can wait on an older record: nf__stream_wait),
// so a steady state that never evicts makes no event calls. waited[S][X]
// keeps the newest X-record stream S already waits on, so one wait orders S
// after every block X freed before it. Free blocks
// of different streams merge (union of streams), so streams do not fragment
// the address space.
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

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
  nf_status_t st = p->be->ops->stream_check ? p->be->ops->stream_check(p->be, s) : NF_OK;
  if (st != NF_OK) return nf__error(st, "nofrag: stream %p cannot be used with this pool: %s", s, nf__backend_err());
  uint32_t i = p->nstreams++;
  p->streams[i] = (nf_stream_rec_t){.handle = s};
  p->last_stream = i;
  *out = i;
  return NF_OK;
}

// Record stream x's newest event in the ring's next slot (its oldest record
// goes). `quiet`: a failure sets no error (an optional record).
static nf_status_t record(nf_pool_t *p, uint32_t x, bool quiet) {
  nf_stream_rec_t *r = &p->streams[x];
  uint32_t h = r->rec_tick ? (r->ev_head + 1) % NF_EVENTS : 0;
  nf_status_t st;
  if (!r->ev[h]) {
    st = NF_BE(p, event_create, event_create, &r->ev[h]);
    if (st != NF_OK) return quiet ? st : nf__error(st, "nofrag: event create failed: %s", nf__backend_err());
  }
  st = NF_BE(p, event_record, event_record, r->ev[h], r->handle);
  if (st != NF_OK) return quiet ? st : nf__error(st, "nofrag: event record failed: %s", nf__backend_err());
  r->ev_head = h;
  r->rec_tick = r->ev_tick[h] = ++p->tick;
  return NF_OK;
}

nf_status_t nf__stream_record(nf_pool_t *p, uint32_t x) { return record(p, x, false); }

// *h = the ring slot of the oldest kept record of stream x at a tick above
// `need` (it covers x's frees up to need); none kept (the newest is older):
// a fresh record's.
static nf_status_t ev_cover(nf_pool_t *p, uint32_t x, uint64_t need, uint32_t *h) {
  const nf_stream_rec_t *r = &p->streams[x];
  if (r->rec_tick <= need) {
    nf_status_t st = nf__stream_record(p, x);
    *h = r->ev_head;
    return st;
  }
  *h = r->ev_head;
  for (uint32_t k = 1; k < NF_EVENTS; k++) {
    uint32_t g = (r->ev_head + NF_EVENTS - k) % NF_EVENTS;
    if (!r->ev[g] || r->ev_tick[g] <= need) break;
    *h = g;
  }
  return NF_OK;
}

// Wait on the host until stream x's work up to its free at tick `need` is
// complete: on the oldest record that covers it, not on a fresh one, so
// that the GPU keeps the work queued after that record while the caller
// unmaps and maps (a fresh record drains the stream and leaves the GPU idle
// through those calls). The next NF_EV_HOT ticks of frees record as they
// go (nf__stream_mark), so that the next wait finds a record close behind
// what it needs.
nf_status_t nf__stream_wait(nf_pool_t *p, uint32_t x, uint64_t need) {
  nf_stream_rec_t *r = &p->streams[x];
  if (nf__need_done(r, need)) return NF_OK;
  uint32_t h;
  nf_status_t st = ev_cover(p, x, need, &h);
  if (st != NF_OK) return st;
  p->ev_hot = p->tick + NF_EV_HOT;
  st = NF_BE(p, event_sync, event_sync, r->ev[h]);
  if (st != NF_OK) return nf__error(st, "nofrag: event synchronize failed: %s", nf__backend_err());
  if (r->ev_tick[h] > r->done_tick) r->done_tick = r->ev_tick[h];
  return NF_OK;
}

// Wait (on the host) until the work of streams m up to tick is complete:
// what views and unit splits need before they unmap a virtual range.
nf_status_t nf__streams_retire(nf_pool_t *p, uint64_t m, uint64_t tick) {
  nf_block_t t = {.smask = m, .tick = tick};
  for (; m; m &= m - 1) {
    uint32_t x = (uint32_t)__builtin_ctzll(m);
    nf_status_t st = nf__stream_wait(p, x, nf__need_tick(&p->streams[x], tick));
    if (st != NF_OK) return st;
  }
  return nf__block_retired(p, &t) ? NF_OK : nf__error(NF_ERR_BACKEND, "nofrag: stream work not complete after a host wait");
}

void nf__stream_mark(nf_pool_t *p, uint32_t x) {
  if (p->tick - p->streams[x].rec_tick >= NF_EV_GAP && !p->capture_mask) record(p, x, true);
}

// Whether the work on stream x up to the record at `tick` is complete: one
// query of x's newest record (or a wait for it); a newer record not yet
// complete makes the answer "not yet" even if `tick` is done.
nf_status_t nf__stream_done(nf_pool_t *p, uint32_t x, uint64_t tick, bool blocking, bool *done) {
  nf_stream_rec_t *r = &p->streams[x];
  if (r->done_tick < tick) {
    nf_status_t st = blocking ? NF_BE(p, event_sync, event_sync, nf__stream_event(r)) : NF_BE(p, event_query, event_query, nf__stream_event(r));
    if (st == NF_OK) r->done_tick = r->rec_tick;
    else if (blocking || st != NF_ERR_NOT_READY)
      return nf__error(st, "nofrag: event %s failed: %s", blocking ? "synchronize" : "query", nf__backend_err());
  }
  *done = r->done_tick >= tick;
  return NF_OK;
}

// Make stream s wait for the work of every other stream that may still use
// free block b: per such stream one record (if none covers b yet) and one wait.
nf_status_t nf__order_after(nf_pool_t *p, nf_block_t *b, uint32_t s) {
  for (uint64_t m = b->smask & ~(1ull << s); m; m &= m - 1) {
    uint32_t x = (uint32_t)__builtin_ctzll(m);
    nf_stream_rec_t *r = &p->streams[x];
    uint64_t need = nf__need_tick(r, b->tick);
    if (nf__need_done(r, need) || p->waited[s][x] > need) continue;
    uint32_t h; // the oldest record covering b: s waits for no more of x than it must
    nf_status_t st = ev_cover(p, x, need, &h);
    if (st != NF_OK) return st;
    st = NF_BE(p, stream_wait, stream_wait, p->streams[s].handle, r->ev[h]);
    if (st != NF_OK) return nf__error(st, "nofrag: stream wait failed: %s", nf__backend_err());
    p->waited[s][x] = r->ev_tick[h];
    p->st.cross_stream_reuses++;
  }
  return NF_OK;
}

// Learn which streams' frees are complete: blocking (event synchronize, for
// stitching and trim) or not (event query, for the release policy). Streams
// with frees no record covers get one first.
static nf_status_t streams_settle(nf_pool_t *p, bool blocking) {
  if (p->capture_mask) return NF_OK; // during a capture: what is known already, no event calls
  for (uint32_t x = 0; x < p->nstreams; x++) {
    nf_stream_rec_t *r = &p->streams[x];
    if (r->done_tick >= r->last_free) continue;
    nf_status_t st;
    if (r->rec_tick <= r->last_free && (st = nf__stream_record(p, x)) != NF_OK) return st;
    st = blocking ? NF_BE(p, event_sync, event_sync, nf__stream_event(r)) : NF_BE(p, event_query, event_query, nf__stream_event(r));
    if (st == NF_OK) r->done_tick = r->rec_tick;
    else if (blocking || st != NF_ERR_NOT_READY)
      return nf__error(st, "nofrag: event %s failed: %s", blocking ? "synchronize" : "query", nf__backend_err());
  }
  return NF_OK;
}

nf_status_t nf__streams_sync(nf_pool_t *p) { return streams_settle(p, true); }
nf_status_t nf__streams_poll(nf_pool_t *p) { return streams_settle(p, false); }

// A block used on extra streams (record_stream) is freed only once the
// work queued on each of them up to now has completed: record now, poll later.
nf_status_t nf__pending_add(nf_pool_t *p, nf_block_t *b) {
  uint64_t t = b->tick;
  // During a capture the records are left to nf__pending_poll (after it).
  for (uint64_t m = p->capture_mask ? 0 : b->extra; m; m &= m - 1) {
    nf_status_t st = nf__stream_record(p, (uint32_t)__builtin_ctzll(m));
    if (st != NF_OK) return st;
  }
  b->tick = t;
  b->state = NF_BLK_PENDING;
  b->fprev = NULL;
  b->fnext = p->pending;
  if (p->pending) p->pending->fprev = b;
  p->pending = b;
  return NF_OK;
}

// Move pending blocks whose extra streams are done to the free index
// (blocking: after waiting for them; else by event queries: alloc_locked,
// before a request maps memory).
nf_status_t nf__pending_poll(nf_pool_t *p, bool blocking) {
  if (!p->pending || p->capture_mask) return NF_OK; // no event calls during a capture
  uint64_t busy = 0; // streams whose newest record a query found not done: asked once per poll
  for (nf_block_t *b = p->pending, *nx; b; b = nx) {
    nx = b->fnext;
    bool done = !(b->extra & busy);
    for (uint64_t m = b->extra; m && done; m &= m - 1) {
      uint32_t x = (uint32_t)__builtin_ctzll(m);
      if (p->streams[x].done_tick > b->tick) continue;
      nf_status_t st;
      // Freed during a capture: no record covers the free yet.
      if (p->streams[x].rec_tick <= b->tick && (st = nf__stream_record(p, x)) != NF_OK) return st;
      if ((st = nf__stream_done(p, x, b->tick + 1, blocking, &done)) != NF_OK) return st;
      if (!done) busy |= m & -m;
    }
    if (!done) continue;
    if (b->fprev) b->fprev->fnext = b->fnext;
    else p->pending = b->fnext;
    if (b->fnext) b->fnext->fprev = b->fprev;
    b->extra = 0;
    b->state = NF_BLK_FREE;
    if (NF_UNLIKELY(p->vw_on)) p->vw_dead(p, b, true); // a hook: views lie above the streams
    nf__release_block(p, b);
  }
  return NF_OK;
}

void nf__streams_destroy(nf_pool_t *p) {
  for (uint32_t a = 0; a < p->nstreams; a++) {
    nf_stream_rec_t *r = &p->streams[a];
    if (r->rec_tick) { // the newest record covers the older ones
      p->st.calls.event_sync++;
      p->be->ops->event_sync(p->be, nf__stream_event(r));
    }
    for (int h = 0; h < NF_EVENTS; h++)
      if (r->ev[h]) p->be->ops->event_destroy(p->be, r->ev[h]);
    memset(r->ev, 0, sizeof r->ev);
  }
}
