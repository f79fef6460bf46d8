// Async mapping (config `async:1`): the driver's VMM calls of an allocation
// run on a worker thread while the allocating thread goes on.
//
// At a tight limit an allocation may move granules (map + set access, ~27 us
// each on an H200) and unmap parked views after waiting for their last users
// (a host wait, then ~19 us per view): all on the thread that launches the
// training's kernels, with the GPU idle behind the host wait. With `async:1`,
// nf__map_block records those calls instead (a job); the pool's metadata
// changes at once, exactly as with synchronous calls, so every decision is the
// same. The job goes to a worker thread that makes the calls in order and then
// writes the job's ticket into a word of pinned host memory; the allocating
// stream gets a GPU-side wait for that ticket (cuStreamWaitValue64) before its
// next work. The allocation returns at once; the GPU waits only if it gets
// there before the worker is done. A host wait for last users becomes an
// event recorded now and waited for by the worker.
//
// Ordering rules (why this is safe):
// - The worker runs jobs in ticket order, one at a time, so the backend sees
//   the calls in the order the metadata changed.
// - Any backend call made synchronously (trim, release, tiers, teardown, the
//   synchronous path of a later allocation) first waits until every job is
//   done (nf__async_sync): synchronous code always sees the state it expects.
// - Every allocation's stream waits for the newest job submitted before it
//   returns (nf__async_order), so no stream's later work touches a range
//   before its mapping exists. A block used on another stream must be ordered
//   after its allocating stream (as PyTorch requires for reuse anyway).
// - The worker never takes the pool lock, and an event it waits for was
//   recorded before its own job's ticket was queued on any stream: no cycle.
// Not during a CUDA-graph capture, and not while a tier (spill, offload) holds
// state: those paths stay synchronous.
#include "core/core.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { AOP_MAP = 0, AOP_UNMAP = 1, AOP_ACCESS = 2, AOP_WAIT = 3 };
typedef struct {
  uint8_t kind;
  uintptr_t va;
  uint64_t size;
  nf_handle_t h;
  nf_event_t ev; // AOP_WAIT
} aop_t;

typedef struct ajob_s {
  struct ajob_s *next;
  uint64_t ticket;
  uint32_t n, cap;
  aop_t *ops;
} ajob_t;

struct nf_async_s {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t work, done; // work: a job is queued (or stop); done: a ticket was written
  ajob_t *head, *tail;       // submitted, not started
  ajob_t *open;              // being recorded by the allocating thread (pool lock held)
  ajob_t *spare;             // a finished job's memory, for the next one
  uint64_t submitted;        // newest submitted ticket (pool lock)
  uint64_t *flag;            // newest finished ticket (pinned host memory)
  uintptr_t dflag;           // its device address
  nf_event_t *evs;           // idle events for AOP_WAIT (mu)
  uint32_t nevs, capevs;
  bool stop;
  int failed;        // (mu) a call of the worker failed: the pool is unusable
  char err[512];     // (mu) its message
};

static uint64_t done_ticket(const nf_async_t *a) { return __atomic_load_n(a->flag, __ATOMIC_ACQUIRE); }

static void job_free(ajob_t *j) {
  if (!j) return;
  free(j->ops);
  free(j);
}

static nf_status_t run_op(nf_backend_t *be, nf_async_t *a, const aop_t *o) {
  switch (o->kind) {
  case AOP_MAP: return be->ops->map(be, o->va, o->size, o->h);
  case AOP_UNMAP: return be->ops->unmap(be, o->va, o->size);
  case AOP_ACCESS: return be->ops->set_access(be, o->va, o->size);
  default: {
    nf_status_t st = be->ops->event_sync(be, o->ev);
    pthread_mutex_lock(&a->mu);
    a->evs[a->nevs++] = o->ev; // room was made when it was created
    pthread_mutex_unlock(&a->mu);
    return st;
  }
  }
}

static void *worker(void *arg) {
  nf_pool_t *p = arg;
  nf_async_t *a = p->aq;
  static const char *names[] = {"map", "unmap", "set access", "waiting for stream work"};
  pthread_mutex_lock(&a->mu);
  for (;;) {
    while (!a->head && !a->stop) pthread_cond_wait(&a->work, &a->mu);
    ajob_t *j = a->head;
    if (!j) break; // stop, and nothing left
    a->head = j->next;
    if (!a->head) a->tail = NULL;
    bool failed = a->failed;
    pthread_mutex_unlock(&a->mu);
    // After a failure the rest is skipped (the state no longer matches the
    // metadata), but tickets still advance so that no stream waits forever.
    for (uint32_t k = 0; k < j->n && !failed; k++) {
      nf_status_t st = run_op(p->be, a, &j->ops[k]);
      if (st == NF_OK) continue;
      failed = true;
      pthread_mutex_lock(&a->mu);
      a->failed = 1;
      snprintf(a->err, sizeof a->err, "nofrag: async mapping: %s of [0x%llx, +%llu B) failed: %s", names[j->ops[k].kind],
               (unsigned long long)j->ops[k].va, (unsigned long long)j->ops[k].size, p->be->err);
      pthread_mutex_unlock(&a->mu);
    }
    if (failed) // the WAIT ops skipped: their events go back too
      for (uint32_t k = 0; k < j->n; k++) {
        if (j->ops[k].kind != AOP_WAIT) continue;
        pthread_mutex_lock(&a->mu);
        a->evs[a->nevs++] = j->ops[k].ev;
        pthread_mutex_unlock(&a->mu);
      }
    pthread_mutex_lock(&a->mu);
    __atomic_store_n(a->flag, j->ticket, __ATOMIC_RELEASE);
    j->n = 0;
    if (!a->spare) a->spare = j;
    else job_free(j);
    pthread_cond_broadcast(&a->done);
  }
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

nf_status_t nf__async_start(nf_pool_t *p) {
  nf_backend_t *be = p->be;
  if (!be->ops->flag_create || !be->ops->stream_wait_flag)
    return nf__error(NF_ERR_UNSUPPORTED, "nofrag: async:1: the %s backend cannot hold a stream on a flag", be->ops->name);
  nf_async_t *a = calloc(1, sizeof *a);
  if (!a) return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  nf_status_t st = be->ops->flag_create(be, &a->flag, &a->dflag);
  if (st != NF_OK) {
    free(a);
    return nf__error(st, "nofrag: async:1: %s", be->err);
  }
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->work, NULL);
  pthread_cond_init(&a->done, NULL);
  p->aq = a;
  if (pthread_create(&a->th, NULL, worker, p) != 0) {
    be->ops->flag_destroy(be, a->flag);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->work);
    pthread_cond_destroy(&a->done);
    free(a);
    p->aq = NULL;
    return nf__error(NF_ERR_BACKEND, "nofrag: async:1: cannot start the mapping thread");
  }
  return NF_OK;
}

// Hand the open job (if it holds calls) to the worker.
static void submit(nf_async_t *a) {
  ajob_t *j = a->open;
  if (!j || !j->n) return;
  a->open = NULL;
  j->ticket = ++a->submitted;
  j->next = NULL;
  pthread_mutex_lock(&a->mu);
  if (a->tail) a->tail->next = j;
  else a->head = j;
  a->tail = j;
  pthread_cond_signal(&a->work);
  pthread_mutex_unlock(&a->mu);
}

static nf_status_t failed_status(nf_async_t *a) {
  pthread_mutex_lock(&a->mu);
  int f = a->failed;
  char msg[sizeof a->err];
  memcpy(msg, a->err, sizeof msg);
  pthread_mutex_unlock(&a->mu);
  return f ? nf__error(NF_ERR_BACKEND, "%s (the pool is unusable from then on)", msg) : NF_OK;
}

nf_status_t nf__async_sync(nf_pool_t *p) {
  nf_async_t *a = p->aq;
  bool reopen = a->open != NULL;
  submit(a);
  if (done_ticket(a) < a->submitted) {
    pthread_mutex_lock(&a->mu);
    while (done_ticket(a) < a->submitted) pthread_cond_wait(&a->done, &a->mu);
    pthread_mutex_unlock(&a->mu);
  }
  if (reopen) nf__async_open(p); // recording goes on after the synchronous call
  return failed_status(a);
}

void nf__async_stop(nf_pool_t *p) {
  nf_async_t *a = p->aq;
  if (!a) return;
  submit(a);
  job_free(a->open); // an empty job
  a->open = NULL;
  pthread_mutex_lock(&a->mu);
  a->stop = true;
  pthread_cond_signal(&a->work);
  pthread_mutex_unlock(&a->mu);
  pthread_join(a->th, NULL);
  for (uint32_t i = 0; i < a->nevs; i++) p->be->ops->event_destroy(p->be, a->evs[i]);
  free(a->evs);
  job_free(a->spare);
  p->be->ops->flag_destroy(p->be, a->flag);
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->work);
  pthread_cond_destroy(&a->done);
  free(a);
  p->aq = NULL;
}

void nf__async_open(nf_pool_t *p) {
  nf_async_t *a = p->aq;
  if (a->open) return;
  pthread_mutex_lock(&a->mu);
  ajob_t *j = a->spare;
  a->spare = NULL;
  pthread_mutex_unlock(&a->mu);
  if (!j) j = calloc(1, sizeof *j);
  if (j) j->n = 0;
  a->open = j; // NULL (out of host memory): calls are made synchronously
}

nf_status_t nf__async_close(nf_pool_t *p) {
  submit(p->aq);
  job_free(p->aq->open); // an empty job
  p->aq->open = NULL;
  return failed_status(p->aq);
}

bool nf__async_recording(const nf_pool_t *p) { return p->aq && p->aq->open; }

static nf_status_t record(nf_pool_t *p, uint8_t kind, uintptr_t va, uint64_t size, nf_handle_t h, nf_event_t ev) {
  ajob_t *j = p->aq->open;
  if (j->n == j->cap) {
    uint32_t cap = j->cap ? j->cap * 2 : 64;
    aop_t *ops = realloc(j->ops, cap * sizeof *ops);
    if (!ops) return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
    j->ops = ops;
    j->cap = cap;
  }
  j->ops[j->n++] = (aop_t){.kind = kind, .va = va, .size = size, .h = h, .ev = ev};
  return NF_OK;
}

// The backend's VMM calls as the core makes them: recorded while a job is
// open, else made at once after every job is done.
nf_status_t nf__vmm_map(nf_pool_t *p, uintptr_t va, uint64_t size, nf_handle_t h) {
  p->st.calls.map++;
  if (p->aq) {
    if (p->aq->open) return record(p, AOP_MAP, va, size, h, NULL);
    nf_status_t st = nf__async_sync(p);
    if (st != NF_OK) return st;
  }
  return p->be->ops->map(p->be, va, size, h);
}

nf_status_t nf__vmm_unmap(nf_pool_t *p, uintptr_t va, uint64_t size) {
  p->st.calls.unmap++;
  if (p->aq) {
    if (p->aq->open) return record(p, AOP_UNMAP, va, size, 0, NULL);
    nf_status_t st = nf__async_sync(p);
    if (st != NF_OK) return st;
  }
  return p->be->ops->unmap(p->be, va, size);
}

nf_status_t nf__vmm_access(nf_pool_t *p, uintptr_t va, uint64_t size) {
  p->st.calls.set_access++;
  if (p->aq) {
    if (p->aq->open) return record(p, AOP_ACCESS, va, size, 0, NULL);
    nf_status_t st = nf__async_sync(p);
    if (st != NF_OK) return st;
  }
  return p->be->ops->set_access(p->be, va, size);
}

// Recording: the worker is to wait until stream x's work so far is complete
// (an event recorded on it now), before the calls recorded after this.
nf_status_t nf__async_wait_stream(nf_pool_t *p, uint32_t x) {
  nf_async_t *a = p->aq;
  nf_event_t ev = NULL;
  nf_status_t st = NF_OK;
  pthread_mutex_lock(&a->mu);
  if (a->nevs) ev = a->evs[--a->nevs];
  else { // one more event: room for it in the idle list, so the worker can always give it back
    nf_event_t *e = realloc(a->evs, (a->capevs + 1) * sizeof *e);
    if (e) { a->evs = e; a->capevs++; }
    else st = NF_ERR_NOMEM;
  }
  pthread_mutex_unlock(&a->mu);
  if (st != NF_OK) return nf__error(st, "nofrag: async mapping: out of events");
  if (!ev && (st = NF_BE(p, event_create, event_create, &ev)) != NF_OK)
    return nf__error(st, "nofrag: event create failed: %s", p->be->err);
  if ((st = NF_BE(p, event_record, event_record, ev, p->streams[x].handle)) == NF_OK) {
    p->st.calls.event_sync++;
    if ((st = record(p, AOP_WAIT, 0, 0, 0, ev)) == NF_OK) return NF_OK;
  } else nf__error(st, "nofrag: event record failed: %s", p->be->err);
  pthread_mutex_lock(&a->mu);
  a->evs[a->nevs++] = ev;
  pthread_mutex_unlock(&a->mu);
  return st;
}

// Before an allocation on stream s returns: s waits for the newest job
// submitted (GPU-side), unless it already does or the job is done.
nf_status_t nf__async_order(nf_pool_t *p, uint32_t s) {
  nf_async_t *a = p->aq;
  nf_stream_rec_t *r = &p->streams[s];
  if (r->aq_waited >= a->submitted) return NF_OK;
  // During a capture nothing is queued on the streams for the pool's sake
  // (the graph would keep the wait): the host waits for the worker instead.
  if (p->capture_mask) return nf__async_sync(p);
  if (done_ticket(a) < a->submitted) {
    p->st.calls.stream_wait++;
    nf_status_t st = p->be->ops->stream_wait_flag(p->be, r->handle, a->dflag, a->submitted);
    if (st != NF_OK) return nf__error(st, "nofrag: async mapping: stream wait failed: %s", p->be->err);
  }
  r->aq_waited = a->submitted;
  return failed_status(a);
}
