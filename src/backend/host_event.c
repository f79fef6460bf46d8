// Host backend events (see host.c): recorded events complete at once, or in
// manual mode only when a test completes them, so that tests can hold
// "GPU work" in flight.
#include "host.h"

#include <stdlib.h>

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
  if (t && !t->done)
    for (host_event *e = hb(be)->events; e; e = e->next)
      if (e->stream == t->stream && e->gen <= t->gen) e->done = true;
  return ev_unlock(be, st);
}

// Host "streams" run nothing, so a cross-stream wait has nothing to order.
// Cross-stream dependencies are not modelled by the manual-event mode either.
nf_status_t nf__host_stream_wait(nf_backend_t *be, nf_stream_t s, nf_event_t ev) {
  (void)s;
  nf_status_t st;
  ev_lock(be, "stream_wait", ev, &st);
  return ev_unlock(be, st);
}

