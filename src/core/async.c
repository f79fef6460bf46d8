// Async access (config `async:1`): the expensive half of an allocation's
// mapping calls runs on a worker thread while the allocating thread goes on.
//
// At a tight limit an allocation may move hundreds of granules. Mapping one
// costs ~1 us, setting access on it ~27 us (run 26, H200), all on the thread
// that launches the training's kernels. The calls cannot all move to a
// worker: cuMemsetD32Async and cuMemcpyAsync check their pointers when they
// are queued, and refuse a range that is not mapped yet (run 27). So maps and
// unmaps stay synchronous and only cuMemSetAccess is recorded (a job), made
// by a worker thread, which then writes the job's ticket into a word of pinned
// host memory; the allocating stream gets a GPU-side wait for that ticket
// (cuStreamWaitValue64) before its next work. Nothing executes on the GPU in
// the range before its access is set. The pool's metadata changes at once,
// exactly as with synchronous calls, so every decision is the same.
//
// Ordering rules (why this is safe):
// - The worker runs jobs in ticket order.
// - An unmap, and every other synchronous call that depends on the mappings
//   (release, the tiers, nf_pool_check, teardown), first waits until every
//   job is done (nf__async_sync): no access call can land on a range that was
//   unmapped meanwhile, and synchronous code sees the state it expects.
// - Every allocation's stream waits for the newest job submitted before it
//   returns (nf__async_order), even a cache hit: a block found mapped may lie
//   where a job still sets access. A block used on another stream must be
//   ordered after its allocating stream first (PyTorch requires it for reuse).
// - The worker never takes the pool lock: no cycle.
// Not during a CUDA-graph capture (the host waits for the worker instead of
// queuing a wait), and not while a tier (spill, offload) holds state.
#include "core/core.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { // one cuMemSetAccess
  uintptr_t va;
  uint64_t size;
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

static void *worker(void *arg) {
  nf_pool_t *p = arg;
  nf_async_t *a = p->aq;
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
      nf_status_t st = p->be->ops->set_access(p->be, j->ops[k].va, j->ops[k].size);
      if (st == NF_OK) continue;
      failed = true;
      pthread_mutex_lock(&a->mu);
      a->failed = 1;
      snprintf(a->err, sizeof a->err, "nofrag: async access: set access on [0x%llx, +%llu B) failed: %s",
               (unsigned long long)j->ops[k].va, (unsigned long long)j->ops[k].size, p->be->err);
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
    return nf__error(NF_ERR_BACKEND, "nofrag: async:1: cannot start the access thread");
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
  if ((!a->open || !a->open->n) && done_ticket(a) >= a->submitted) return failed_status(a); // nothing pending
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


static nf_status_t record(nf_pool_t *p, uintptr_t va, uint64_t size) {
  ajob_t *j = p->aq->open;
  if (j->n == j->cap) {
    uint32_t cap = j->cap ? j->cap * 2 : 64;
    aop_t *ops = realloc(j->ops, cap * sizeof *ops);
    if (!ops) return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
    j->ops = ops;
    j->cap = cap;
  }
  j->ops[j->n++] = (aop_t){.va = va, .size = size};
  return NF_OK;
}

// The backend's VMM calls as the core makes them (counted). Maps are made at
// once (a range must be mapped when work on it is queued); an unmap waits for
// every job first (access must not land on a range unmapped meanwhile);
// access is recorded while a job is open.
nf_status_t nf__vmm_map(nf_pool_t *p, uintptr_t va, uint64_t size, nf_handle_t h) {
  p->st.calls.map++;
  return p->be->ops->map(p->be, va, size, h);
}

nf_status_t nf__vmm_unmap(nf_pool_t *p, uintptr_t va, uint64_t size) {
  p->st.calls.unmap++;
  nf_status_t st = nf__async_barrier(p);
  if (st != NF_OK) return st;
  return p->be->ops->unmap(p->be, va, size);
}

nf_status_t nf__vmm_access(nf_pool_t *p, uintptr_t va, uint64_t size) {
  p->st.calls.set_access++;
  if (p->aq && p->aq->open) return record(p, va, size);
  nf_status_t st = nf__async_barrier(p);
  if (st != NF_OK) return st;
  return p->be->ops->set_access(p->be, va, size);
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
    if (st != NF_OK) return nf__error(st, "nofrag: async access: stream wait failed: %s", p->be->err);
  }
  r->aq_waited = a->submitted;
  return failed_status(a);
}
