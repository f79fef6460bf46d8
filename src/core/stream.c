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

// The slots that something in the pool names: captures, stream routes, the
// record_stream masks of live and pending blocks, and their allocation
// streams: all of them (`allocs`), or only those a slot cannot be taken from
// (pending and offloaded blocks'; streams_steal). An orphan names no slot.
static uint64_t streams_named(const nf_pool_t *p, bool allocs) {
  uint64_t named = p->capture_mask;
  for (nf_chunk_t *c = p->chunks; c; c = c->next)
    for (const nf_block_t *b = c->first; b; b = b->next)
      if (b->state == NF_BLK_LIVE || b->state == NF_BLK_PENDING) { // (not a shadow: edge.c)
        named |= b->extra;
        if (b->stream != NF_STREAM_ORPHAN && (allocs || b->state != NF_BLK_LIVE || b->where)) named |= 1ull << b->stream;
      }
  for (uint32_t i = 0; i < p->nroutes; i++)
    if (!p->routes[i].by_thread) named |= 1ull << p->routes[i].s;
  return named;
}

// The slots no live or pending block, route or capture names.
static uint64_t streams_unnamed(const nf_pool_t *p) { return ~streams_named(p, true); }

static nf_status_t slots_refused(const char *why) {
  return nf__error(NF_ERR_UNSUPPORTED, "nofrag: more than %d distinct streams used with one pool, and no slot can "
                   "be given back or taken: %s (a slot is taken from a stream only its live blocks' allocations "
                   "name; record_stream'ed, pending and offloaded blocks, routes and captures keep theirs)",
                   NF_MAX_STREAMS, why);
}

// Slot x starts afresh for a new stream: every free on it so far is complete
// (the caller waited for it), which done_tick past every tick so far says to
// the bits of x left in free blocks' and granules' masks; the new stream's
// frees tick after it. Its events stay, for the slot's next stream.
static void slot_reset(nf_pool_t *p, uint32_t x) {
  nf_stream_rec_t *r = &p->streams[x];
  r->handle = (nf_stream_t)UINTPTR_MAX; // matches nothing: lookups skip free slots anyway
  r->rec_tick = r->last_free = 0;
  r->done_tick = p->tick + 1;
  r->ev_head = 0;
  memset(r->ev_tick, 0, sizeof r->ev_tick);
  for (uint32_t y = 0; y < NF_MAX_STREAMS; y++) p->waited[x][y] = p->waited[y][x] = 0;
}

// Offload copies name their streams. After a wait that covers them, finishing
// them (a blocking poll: a record it makes on an idle stream is done at once)
// empties the list. Finished copies change the tier counters with no mapping
// change: the next publish carries them (nf__pub_dirty, as after nf_free's poll).
static nf_status_t copies_finish(nf_pool_t *p) {
  if (!p->xfers) return NF_OK;
  nf__pub_dirty(p);
  nf_status_t st = p->tier.poll(p, true);
  if (st != NF_OK) return st;
  return p->xfers ? slots_refused("offload copies are in flight") : NF_OK;
}

// All NF_MAX_STREAMS slots hold streams: give back the slots of the streams
// nothing in the pool names (no live or pending block allocated or recorded
// on it, no route, no capture). Such a stream may be gone (a CuPy stream
// collected, an external stream destroyed): its handle may not be recorded
// on, so one host wait for the whole device makes its work complete instead.
// Never one of `keep`: slots the caller holds in a local (nf_offload's and
// nf_prefetch's stream, while the orphan they move gets a slot), which
// nothing else may name yet.
// O(blocks): only when a pool has seen 64 streams and a new one comes.
// Every slot named: NF_OK, none given back (stream_free stays 0).
static nf_status_t streams_recycle(nf_pool_t *p, uint64_t keep) {
  uint64_t m = streams_unnamed(p) & ~keep;
  nf_status_t st;
  if (!m && p->pending && !p->capture_lookup) { // record_stream'ed blocks whose work is done name nothing once freed
    if ((st = nf__pending_poll(p, false)) != NF_OK) return st;
    m = streams_unnamed(p) & ~keep;
  }
  if (!m) return NF_OK;
  const char *why = (p->capture_mask | p->capture_lookup) ? "a stream is being captured (no host wait is allowed)"
                  : !p->be->ops->sync ? "the backend cannot wait for the whole device"
                  : NULL;
  if (why) return slots_refused(why);
  p->st.calls.event_sync++; // a host wait, counted and timed with the event ones (PyTorch: num_sync_all_streams)
  p->be_t0 = nf__calls_ns_now();
  st = nf__calls_timed(&p->st.call_ns.event_sync, p->be_t0, p->be->ops->sync(p->be));
  if (st != NF_OK)
    return nf__error(st, "nofrag: %d streams used: device synchronize (to give back the slots of unused streams) "
                     "failed: %s", NF_MAX_STREAMS, nf__backend_err());
  if (p->xfers) {
    if ((st = copies_finish(p)) != NF_OK) return st;
    m = streams_unnamed(p) & ~keep; // (finishing copies names no new stream; asked again all the same)
    if (!m) return NF_OK;
  }
  for (uint64_t k = m; k; k &= k - 1) slot_reset(p, (uint32_t)__builtin_ctzll(k));
  // The clock passes done_tick: the next stream's frees (and a deferred
  // copy's x->tick = p->tick + 1) tick after it, never at it (streams_settle
  // and nf__stream_done would take such a free for done: done_tick >= tick).
  p->tick++;
  p->stream_free = m;
  p->streams_recycled += (uint64_t)__builtin_popcountll(m);
  return NF_OK;
}

static nf_status_t ev_cover(nf_pool_t *p, uint32_t x, uint64_t need, uint32_t *h);

// The slot streams_steal takes, of candidates m: among the NF_STEAL_LOOK
// least recently used, the first whose frees are known complete (no call),
// or whose newest record, covering its last free, one query finds done.
// Else the least recently used, whose frees must be waited for. So a stream
// that allocates and holds (no free since its work was last seen done) gives
// its slot up with no call, and one with a kernel still running on what it
// freed is passed over where another is done.
#define NF_STEAL_LOOK 4
static uint32_t steal_pick(nf_pool_t *p, uint64_t m) {
  uint32_t lru[NF_STEAL_LOOK];
  int n = 0;
  for (; m; m &= m - 1) { // the NF_STEAL_LOOK least recently used, oldest first (one pass)
    uint32_t y = (uint32_t)__builtin_ctzll(m);
    int k = n < NF_STEAL_LOOK ? n++ : NF_STEAL_LOOK;
    for (; k > 0 && p->streams[lru[k - 1]].used > p->streams[y].used; k--)
      if (k < NF_STEAL_LOOK) lru[k] = lru[k - 1];
    if (k < NF_STEAL_LOOK) lru[k] = y;
  }
  for (int k = 0; k < n; k++) {
    nf_stream_rec_t *r = &p->streams[lru[k]];
    if (!nf__need_done(r, r->last_free) && r->rec_tick > r->last_free &&
        NF_BE(p, event_query, event_query, nf__stream_event(r)) == NF_OK && r->rec_tick > r->done_tick)
      r->done_tick = r->rec_tick; // (a failed query only means no shortcut: the wait below orders all the same)
    if (nf__need_done(r, r->last_free)) return lru[k];
  }
  return lru[0];
}

// Every slot is named, and a new stream comes (a server with a stream per
// request, PyTorch's 128 pool streams and its default one): take the slot of
// a stream that only live blocks' allocations name (steal_pick: the least
// recently used, or one of the next few whose frees are known done). Its
// handle is alive (its blocks are), so where its frees are not known
// complete, one host wait on that stream alone (not the device) makes them
// so; its live blocks keep the handle (NF_STREAM_ORPHAN) and get a slot
// again when they are freed or moved (nf__block_home). Slots named otherwise
// keep their streams: record_stream'ed and pending blocks (their events
// decide when memory comes back), offloaded blocks (the tier orders copies
// by slot), routes and captures. Not during a capture (no event calls, no
// host wait). O(blocks) per steal.
static nf_status_t streams_steal(nf_pool_t *p, uint64_t keep, uint32_t *out) {
  if (p->capture_mask | p->capture_lookup) return slots_refused("a stream is being captured (no host wait is allowed)");
  nf_status_t st = copies_finish(p);
  if (st != NF_OK) return st;
  uint64_t m = nf__streams_held(p) & ~(streams_named(p, false) | keep);
  if (!m) return slots_refused("every stream is named by a record_stream'ed, pending or offloaded block, a route "
                               "or a capture");
  uint32_t x = steal_pick(p, m), h;
  nf_stream_rec_t *r = &p->streams[x];
  if (!nf__need_done(r, r->last_free)) { // on the oldest record covering its last free (or a fresh one)
    if ((st = ev_cover(p, x, r->last_free, &h)) != NF_OK) return st;
    if ((st = NF_BE(p, event_sync, event_sync, r->ev[h])) != NF_OK)
      return nf__error(st, "nofrag: more than %d streams: event synchronize (to take the slot of stream %p) failed: "
                       "%s", NF_MAX_STREAMS, r->handle, nf__backend_err());
  }
  for (nf_chunk_t *c = p->chunks; c; c = c->next)
    for (nf_block_t *b = c->first; b; b = b->next)
      if (b->state == NF_BLK_LIVE && b->stream == x) {
        b->stream = NF_STREAM_ORPHAN;
        b->orphan = r->handle;
        p->orphans++;
      }
  slot_reset(p, x);
  p->tick++; // past done_tick, as in streams_recycle
  p->streams_stolen++;
  *out = x;
  return NF_OK;
}

// The slot holding stream s, or -1.
static int stream_find(const nf_pool_t *p, nf_stream_t s) {
  for (uint64_t m = nf__streams_held(p); m; m &= m - 1)
    if (p->streams[__builtin_ctzll(m)].handle == s) return __builtin_ctzll(m);
  return -1;
}

// nf__stream_index; a slot taken from another stream is never one of `keep`.
static nf_status_t stream_index(nf_pool_t *p, nf_stream_t s, uint64_t keep, uint32_t *out) {
  if (NF_LIKELY(p->nstreams && p->streams[p->last_stream].handle == s)) {
    *out = p->last_stream;
    return NF_OK;
  }
  int found = stream_find(p, s);
  uint32_t i = 0;
  if (found >= 0) {
    i = (uint32_t)found;
    goto out;
  }
  nf_status_t st = p->be->ops->stream_check ? p->be->ops->stream_check(p->be, s) : NF_OK;
  if (st != NF_OK) return nf__error(st, "nofrag: stream %p cannot be used with this pool: %s", s, nf__backend_err());
  if (!p->stream_free && p->nstreams == NF_MAX_STREAMS) {
    if ((st = streams_recycle(p, keep)) != NF_OK) return st;
    if (!p->stream_free) { // every slot named
      if ((st = streams_steal(p, keep, &i)) != NF_OK) return st;
      p->streams[i].handle = s;
      goto out;
    }
  }
  if (p->stream_free) { // a given-back slot: its record was reset there, its events kept
    i = (uint32_t)__builtin_ctzll(p->stream_free);
    p->stream_free &= p->stream_free - 1;
    p->streams[i].handle = s;
  } else {
    i = p->nstreams++;
    p->streams[i] = (nf_stream_rec_t){.handle = s};
  }
out:
  nf__stream_switch(p, i);
  *out = i;
  return NF_OK;
}

nf_status_t nf__stream_index(nf_pool_t *p, nf_stream_t s, uint32_t *out) { return stream_index(p, s, 0, out); }

nf_status_t nf__stream_index_for(nf_pool_t *p, nf_stream_t s, const nf_block_t *b, uint32_t *out) {
  return stream_index(p, s, b->stream == NF_STREAM_ORPHAN ? 0 : 1ull << b->stream, out);
}

// An orphan's allocation stream is slot s's from now on.
static void orphan_settle(nf_pool_t *p, nf_block_t *b, uint32_t s) {
  b->stream = (uint16_t)s;
  b->orphan = NULL;
  p->orphans--;
}

nf_status_t nf__block_home(nf_pool_t *p, nf_block_t *b, uint64_t keep) {
  if (NF_LIKELY(b->stream != NF_STREAM_ORPHAN)) return NF_OK;
  uint32_t s;
  nf_status_t st = stream_index(p, b->orphan, keep, &s);
  if (st == NF_OK) orphan_settle(p, b, s);
  return st;
}

// nf_free of an orphan that can get no slot (every one is named by a
// record_stream'ed, pending or offloaded block, a route or a capture): wait
// on the host for its stream's work so far, with an event of its own, and
// hand the block to a slot the pool holds (the last one looked up), whose
// stream then counts as its user: a later user waits for that stream's work
// up to the free as well, more than it must, never less. A free must not
// fail where the caller (PyTorch's deleter) cannot handle it.
nf_status_t nf__block_home_any(nf_pool_t *p, nf_block_t *b) {
  nf_status_t st = nf__block_home(p, b, 0);
  if (st != NF_ERR_UNSUPPORTED || p->capture_mask || !p->nstreams) return st; // (NF_OK included)
  nf_event_t ev = NULL;
  if ((st = NF_BE(p, event_create, event_create, &ev)) == NF_OK) {
    if ((st = NF_BE(p, event_record, event_record, ev, b->orphan)) == NF_OK)
      st = NF_BE(p, event_sync, event_sync, ev);
    p->be->ops->event_destroy(p->be, ev);
  }
  if (st != NF_OK)
    return nf__error(st, "nofrag: nf_free of %p: a host wait for its stream %p (whose slot another stream took) "
                     "failed: %s", (void *)b->addr, b->orphan, nf__backend_err());
  nf__error_clear();
  orphan_settle(p, b, p->last_stream);
  return NF_OK;
}

int nf_stream_known(nf_pool_t *p, nf_stream_t s) {
  if (!p) { nf__error(NF_ERR_INVALID, "nofrag: nf_stream_known: NULL pool"); return -1; }
  nf__pool_lock(p);
  int known = stream_find(p, s) >= 0;
  // A live block whose stream lost its slot records on it when freed.
  for (nf_chunk_t *c = p->orphans && !known ? p->chunks : NULL; c && !known; c = c->next)
    for (const nf_block_t *b = c->first; b && !known; b = b->next)
      known = b->state == NF_BLK_LIVE && b->stream == NF_STREAM_ORPHAN && b->orphan == s;
  nf__pool_unlock(p);
  return known;
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
    if (st == NF_OK) { if (r->rec_tick > r->done_tick) r->done_tick = r->rec_tick; } // (a recycled slot's is ahead)
    else if (blocking || st != NF_ERR_NOT_READY)
      return nf__error(st, "nofrag: event %s failed: %s", blocking ? "synchronize" : "query", nf__backend_err());
  }
  *done = r->done_tick >= tick;
  return NF_OK;
}

// Make stream s wait for the work of every other stream that may still use
// free block b: per such stream one record (if none covers b yet) and one wait.
// A record made earlier is queried first: done, it tells every stream at once
// (done_tick), where a wait orders only s. Free blocks merge, so one used by
// many streams in turn names them all; without the query each new stream
// waited on each of them (about 31 waits per allocation with PyTorch's 128
// pool streams, run 76). A fresh record is not queried: its work is queued.
// Only for a block that would make s wait on NF_QUERY_FIRST streams or more,
// and no more queries after one finds work in flight:
// where a stream or two take turns, a wait is the cheaper call (and the
// replay targets' call counts hold).
#define NF_QUERY_FIRST 3
nf_status_t nf__order_after(nf_pool_t *p, nf_block_t *b, uint32_t s) {
  uint64_t todo = 0;
  for (uint64_t m = b->smask & ~(1ull << s); m; m &= m - 1) {
    uint32_t x = (uint32_t)__builtin_ctzll(m);
    const nf_stream_rec_t *r = &p->streams[x];
    uint64_t need = nf__need_tick(r, b->tick);
    if (!nf__need_done(r, need) && p->waited[s][x] <= need) todo |= m & -m;
  }
  bool query = __builtin_popcountll(todo) >= NF_QUERY_FIRST && !p->capture_mask; // (no queries during a capture)
  for (uint64_t m = todo; m; m &= m - 1) {
    uint32_t x = (uint32_t)__builtin_ctzll(m);
    nf_stream_rec_t *r = &p->streams[x];
    uint64_t need = nf__need_tick(r, b->tick);
    bool fresh = r->rec_tick <= need;
    uint32_t h; // the oldest record covering b: s waits for no more of x than it must
    nf_status_t st = ev_cover(p, x, need, &h);
    if (st != NF_OK) return st;
    if (query && !fresh) {
      st = NF_BE(p, event_query, event_query, r->ev[h]);
      if (st == NF_OK) {
        if (r->ev_tick[h] > r->done_tick) r->done_tick = r->ev_tick[h];
        continue;
      }
      // Work in flight: likely the others' too, so one query at most is spent
      // on it. A failed query stops them as well: it is only a shortcut, and
      // the wait below orders s all the same (or fails with its own error).
      query = false;
    }
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
    bool done;
    if (r->rec_tick <= r->last_free && (st = nf__stream_record(p, x)) != NF_OK) return st;
    if ((st = nf__stream_done(p, x, r->last_free, blocking, &done)) != NF_OK) return st;
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
    if (NF_UNLIKELY(p->vw_on)) p->vw_release(p, b, true); // a hook: views and edge sharing lie above the streams
    else nf__release_block(p, b);
  }
  return NF_OK;
}

void nf__streams_destroy(nf_pool_t *p) {
  for (uint32_t a = 0; a < p->nstreams; a++) {
    nf_stream_rec_t *r = &p->streams[a];
    if (r->rec_tick) { // the newest record covers the older ones
      (void)NF_BE(p, event_sync, event_sync, nf__stream_event(r));
    }
    for (int h = 0; h < NF_EVENTS; h++)
      if (r->ev[h]) p->be->ops->event_destroy(p->be, r->ev[h]);
    memset(r->ev, 0, sizeof r->ev);
  }
}
