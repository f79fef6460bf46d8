// Host backend events (see host.c): recorded events complete at once, or in
// manual mode only when a test completes them, so that tests can hold
// "GPU work" in flight. In manual mode a test may also declare that a stream
// works on a range (nf_backend_host_use); unmapping it before an event
// recorded on that stream afterwards is complete counts as a violation: the
// mistake that on a GPU would fault or write through the next mapping.
#include "host.h"

#include <stdlib.h>

// [a, b) used on s before event gen `gen`: addresses, or (phys) the physical
// memory that was mapped there (nf__host_phys), for the reuse checks.
struct host_use { uintptr_t a, b; nf_stream_t s; uint64_t gen; bool phys; };
struct host_done { nf_stream_t s; uint64_t gen; };                 // s's newest event known complete
// Stream s waited (stream_wait) on event `on_gen` of stream `on` when the
// newest event gen was `after`: once an event of s above `after` completes,
// `on`'s work before on_gen is complete too (as on a GPU).
struct host_dep { nf_stream_t s, on; uint64_t after, on_gen; };

// Stream s's work before event gen `gen` is complete (under the lock), and
// with it the work of the streams s waited for before that event.
static void stream_done(host_backend *h, nf_stream_t s, uint64_t gen) {
  size_t i = 0;
  while (i < h->ndones && h->dones[i].s != s) i++;
  if (i < h->ndones) {
    if (gen <= h->dones[i].gen) return; // nothing new (also ends cycles of waits)
    h->dones[i].gen = gen;
  } else {
    if (!nf__host_grow((void **)&h->dones, &h->capdones, h->ndones + 1, sizeof *h->dones))
      return; // a use then stays "in flight": a false alarm, never a missed one
    h->dones[h->ndones++] = (struct host_done){s, gen};
  }
  for (size_t k = 0; k < h->ndeps; k++)
    if (h->deps[k].s == s && gen > h->deps[k].after) stream_done(h, h->deps[k].on, h->deps[k].on_gen);
}

static bool use_done(const host_backend *h, const struct host_use *u) {
  for (size_t i = 0; i < h->ndones; i++)
    if (h->dones[i].s == u->s) return h->dones[i].gen > u->gen;
  return false;
}

void nf__host_uses_check(host_backend *h, uintptr_t va, size_t size) {
  for (size_t i = 0; i < h->nuses; i++) {
    const struct host_use *u = &h->uses[i];
    if (!u->phys && u->a < va + size && va < u->b && !use_done(h, u)) h->violations++;
  }
}

void nf__host_uses_free(host_backend *h) {
  free(h->uses);
  free(h->dones);
  free(h->deps);
  h->uses = NULL;
  h->dones = NULL;
  h->deps = NULL;
  h->nuses = h->capuses = h->ndones = h->capdones = h->ndeps = h->capdeps = 0;
}

// Stream s's work from now on (its waits made before event gen `before`)
// runs after stream x's work before event gen `gen`: through the stream
// waits s made, transitively (depth-bounded: wait chains are short).
static bool ordered(const host_backend *h, nf_stream_t s, uint64_t before, nf_stream_t x, uint64_t gen, int depth) {
  for (size_t i = 0; i < h->ndones; i++)
    if (h->dones[i].s == x && h->dones[i].gen > gen) return true;
  for (size_t k = 0; k < h->ndeps && depth < 8; k++) {
    const struct host_dep *d = &h->deps[k];
    if (d->s != s || d->after >= before) continue;
    if ((d->on == x && d->on_gen > gen) || ordered(h, d->on, d->on_gen, x, gen, depth + 1)) return true;
  }
  return false;
}

static void add_use(host_backend *h, struct host_use u) {
  // Out of host memory: the use goes unchecked (tests only).
  if (nf__host_grow((void **)&h->uses, &h->capuses, h->nuses + 1, sizeof *h->uses)) h->uses[h->nuses++] = u;
}

// `fresh`: the memory was just handed to s (a new block): every use of it by
// another stream, by address or through the physical memory mapped there,
// must be complete or ordered before s's work from now. Under the lock.
static void declare_locked(host_backend *h, nf_stream_t s, const void *addr, size_t n, bool fresh) {
  if (h->manual) {
    size_t k = 0, n0; // drop completed uses first
    for (size_t i = 0; i < h->nuses; i++)
      if (!use_done(h, &h->uses[i])) h->uses[k++] = h->uses[i];
    h->nuses = k;
    add_use(h, (struct host_use){(uintptr_t)addr, (uintptr_t)addr + n, s, h->event_gen, false});
    n0 = h->nuses;
    for (uintptr_t va = (uintptr_t)addr, end = va + n; va < end;) { // its physical runs, merged
      size_t len = end - va;
      uint64_t pa = nf__host_phys(h, va, &len);
      struct host_use *last = h->nuses > n0 ? &h->uses[h->nuses - 1] : NULL;
      if (pa && last && last->b == pa) last->b += len;
      else if (pa) add_use(h, (struct host_use){pa, pa + len, s, h->event_gen, true});
      va += len;
    }
    bool race = false; // one violation per declaration
    for (size_t i = 0; fresh && !race && i + 1 < n0; i++) {
      const struct host_use *u = &h->uses[i];
      bool hit = false;
      for (size_t j = u->phys ? n0 : n0 - 1; j < h->nuses && !hit; j++) // addresses vs addresses, phys vs phys
        hit = h->uses[j].phys == u->phys && u->a < h->uses[j].b && h->uses[j].a < u->b;
      race = hit && u->s != s && !ordered(h, s, UINT64_MAX, u->s, u->gen, 0);
    }
    h->violations += race;
  }
}

static void declare_use(nf_backend_t *be, nf_stream_t s, const void *addr, size_t n, bool fresh) {
  host_backend *h = nf__host_of(be);
  if (!h || !n) return;
  pthread_mutex_lock(&h->mu);
  declare_locked(h, s, addr, n, fresh);
  pthread_mutex_unlock(&h->mu);
}

// A copy queued on s (h_copy; the data moves at once, but on a GPU it lands
// only before s's next completed event): in manual mode both ranges count as
// s's work in flight, so that unmapping either, or handing out what was
// mapped there to another stream, before an event behind the copy completed
// counts as a violation.
void nf__host_copy_use(host_backend *h, nf_stream_t s, uintptr_t dst, uintptr_t src, size_t n) {
  declare_locked(h, s, (const void *)dst, n, false);
  declare_locked(h, s, (const void *)src, n, false);
}

NF_API void nf_backend_host_use(nf_backend_t *be, nf_stream_t s, const void *addr, size_t n) {
  declare_use(be, s, addr, n, false);
}

NF_API void nf_backend_host_use_new(nf_backend_t *be, nf_stream_t s, const void *addr, size_t n) {
  declare_use(be, s, addr, n, true);
}

NF_API uint64_t nf_backend_host_violations(nf_backend_t *be) {
  host_backend *h = nf__host_of(be);
  if (!h) return 0;
  pthread_mutex_lock(&h->mu);
  uint64_t v = h->violations;
  pthread_mutex_unlock(&h->mu);
  return v;
}

// Every event complete: all work done.
static void complete_all(host_backend *h) {
  for (host_event *e = h->events; e; e = e->next) e->done = true;
  h->nuses = 0;
  h->ndeps = 0;
}

NF_API void nf_backend_host_set_manual_events(nf_backend_t *be, int manual) {
  host_backend *h = nf__host_of(be);
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  h->manual = manual != 0;
  if (!manual) complete_all(h); // leaving manual mode finishes the pretended work
  pthread_mutex_unlock(&h->mu);
}

NF_API void nf_backend_host_complete_events(nf_backend_t *be) {
  host_backend *h = nf__host_of(be);
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  complete_all(h);
  pthread_mutex_unlock(&h->mu);
}

// Lock the backend and check `ev`: returns the event (lock held) or NULL
// with *st set (lock held too); ev_unlock ends either.
static host_event *ev_lock(nf_backend_t *be, const char *op, nf_event_t ev, nf_status_t *st) {
  pthread_mutex_lock(&hb(be)->mu);
  *st = NF_OK;
  if (ev && ((host_event *)ev)->magic == EVENT_MAGIC) return ev;
  *st = nf__backend_fail(be, NF_ERR_INVALID, "host backend: %s: invalid event %p", op, ev);
  return NULL;
}

static nf_status_t ev_unlock(nf_backend_t *be, nf_status_t st) {
  pthread_mutex_unlock(&hb(be)->mu);
  return st;
}

nf_status_t nf__host_event_create(nf_backend_t *be, nf_event_t *out) {
  host_backend *h = hb(be);
  host_event *e = calloc(1, sizeof *e);
  if (!e) return nf__backend_fail(be, NF_ERR_NOMEM, "host backend: out of host memory");
  e->magic = EVENT_MAGIC;
  e->done = true; // an event never recorded counts as complete (CUDA)
  pthread_mutex_lock(&h->mu);
  e->next = h->events;
  if (h->events) h->events->prev = e;
  h->events = e;
  pthread_mutex_unlock(&h->mu);
  *out = e;
  return NF_OK;
}

void nf__host_event_free(host_backend *h, host_event *e) {
  if (e->prev) e->prev->next = e->next;
  else h->events = e->next;
  if (e->next) e->next->prev = e->prev;
  e->magic = 0;
  free(e);
}

nf_status_t nf__host_event_destroy(nf_backend_t *be, nf_event_t ev) {
  nf_status_t st;
  host_event *e = ev_lock(be, "event_destroy", ev, &st);
  if (e) nf__host_event_free(hb(be), e);
  return ev_unlock(be, st);
}

nf_status_t nf__host_event_record(nf_backend_t *be, nf_event_t ev, nf_stream_t s) {
  nf_status_t st;
  host_event *e = ev_lock(be, "event_record", ev, &st);
  if (e) {
    e->gen = ++hb(be)->event_gen;
    e->stream = s;
    e->done = !hb(be)->manual;
    if (e->done) stream_done(hb(be), s, e->gen);
  }
  return ev_unlock(be, st);
}

nf_status_t nf__host_event_query(nf_backend_t *be, nf_event_t ev) {
  nf_status_t st;
  host_event *e = ev_lock(be, "event_query", ev, &st);
  return ev_unlock(be, e && !e->done ? NF_ERR_NOT_READY : st);
}

// Waiting for an event means the work before it on its stream is done: the
// events recorded earlier on the same stream complete too.
nf_status_t nf__host_event_sync(nf_backend_t *be, nf_event_t ev) {
  nf_status_t st;
  host_event *t = ev_lock(be, "event_sync", ev, &st);
  if (t && !t->done) {
    for (host_event *e = hb(be)->events; e; e = e->next)
      if (e->stream == t->stream && e->gen <= t->gen) e->done = true;
    stream_done(hb(be), t->stream, t->gen);
  }
  return ev_unlock(be, st);
}

// A wait for the whole device: all the work held in manual mode completes.
nf_status_t nf__host_sync(nf_backend_t *be) {
  pthread_mutex_lock(&hb(be)->mu);
  complete_all(hb(be));
  pthread_mutex_unlock(&hb(be)->mu);
  return NF_OK;
}

// Host "streams" run nothing, so a cross-stream wait has nothing to order;
// in manual mode it is remembered for the use checks: s's events recorded
// from now on complete only after ev's stream's work before ev (a wait for
// s then covers that work, as on a GPU).
nf_status_t nf__host_stream_wait(nf_backend_t *be, nf_stream_t s, nf_event_t ev) {
  nf_status_t st;
  host_event *e = ev_lock(be, "stream_wait", ev, &st);
  host_backend *h = hb(be);
  // Out of host memory: the wait goes unrecorded (a false alarm at worst).
  if (e && h->manual && !e->done && nf__host_grow((void **)&h->deps, &h->capdeps, h->ndeps + 1, sizeof *h->deps))
    h->deps[h->ndeps++] = (struct host_dep){s, e->stream, h->event_gen, e->gen};
  return ev_unlock(be, st);
}

