// Fault-injection backend: wraps another backend and makes chosen calls fail.
//
// Every op except destroy counts as one call, granularity and capacity
// included, numbered from 1 since creation (nf_backend_fault_set does not
// restart the count: fail_at is always an absolute call number). Call number
// `fail_at` fails, and each call also fails with probability `p` (xorshift64
// from `seed`, drawn only when 0 < p < 1 so that a plan is reproducible).
// nf__backend_fault_mask adds a pattern: call `from + i` fails for each bit i
// set in a 64-bit mask (several failures in one pool call: a failure and
// then the cleanup's retries, for example). nf_backend_fault_set clears it.
//
// A failed call never reaches the inner backend, so it changes nothing, as
// the vtable requires of every failing op. It returns NF_ERR_BACKEND, except
// mem_create, which alternates NF_ERR_OOM and NF_ERR_BACKEND (OOM first) so
// that both of the allocator's paths get exercised. The message is
// "injected fault in <op> (call N)".
//
// Failures are injected into the "cleanup" ops too (event_destroy, unmap,
// va_release, mem_release): a real driver can fail them, and the allocator
// must cope, e.g. by keeping the resource and retrying later, or by dropping
// it (a host inner backend frees whatever is left at destroy, so leaks there
// do not show up as leaks of the process). Use nf_backend_fault_set(be, 0, 0)
// to stop failing before tearing a pool down if a test needs a clean end.
//
// Errors of the inner backend are passed through with its message copied.
#include "backend.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>


typedef struct {
  nf_backend_t base;
  nf_backend_t *inner; // owned
  pthread_mutex_t mu;
  uint64_t calls, failed, fail_at, rng;
  uint64_t mask_from, mask; // calls mask_from + i, i a bit set in mask, fail
  double p;
  bool oom_next; // which error the next injected mem_create failure returns
} fault_backend;

static const nf_backend_ops_t fault_ops;

static fault_backend *fb(nf_backend_t *be) { return (fault_backend *)be; }

static uint64_t xorshift64(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

// Count the call and decide whether it fails; if so, write the message and
// set *st. Returns true when the call must not go to the inner backend.
static bool inject(nf_backend_t *be, const char *op, nf_status_t *st) {
  fault_backend *f = fb(be);
  pthread_mutex_lock(&f->mu);
  uint64_t n = ++f->calls;
  bool fail = n == f->fail_at || (n >= f->mask_from && n - f->mask_from < 64 && (f->mask >> (n - f->mask_from) & 1));
  if (f->p >= 1.0) fail = true;
  else if (f->p > 0.0 && (double)(xorshift64(&f->rng) >> 11) * 0x1.0p-53 < f->p) fail = true;
  if (fail) {
    f->failed++;
    *st = NF_ERR_BACKEND;
    if (strcmp(op, "mem_create") == 0) {
      if (f->oom_next) *st = NF_ERR_OOM;
      f->oom_next = !f->oom_next;
    }
    nf__backend_fail(be, *st, "injected fault in %s (call %llu)", op, (unsigned long long)n);
  }
  pthread_mutex_unlock(&f->mu);
  return fail;
}

// One wrapper per op: count/inject, else forward to the inner backend (whose
// message, on error, is the thread's already: nf__backend_err).
#define FORWARD(be, op, ...)                                                                                           \
  do {                                                                                                                 \
    nf_status_t st_;                                                                                                   \
    if (inject(be, #op, &st_)) return st_;                                                                             \
    nf_backend_t *in_ = fb(be)->inner;                                                                                 \
    return in_->ops->op(in_, __VA_ARGS__);                                                                               \
  } while (0)

static nf_status_t f_granularity(nf_backend_t *be, nf_tier_t tier, size_t *out) { FORWARD(be, granularity, tier, out); }
static nf_status_t f_capacity(nf_backend_t *be, nf_tier_t tier, uint64_t *total, uint64_t *free_bytes) {
  FORWARD(be, capacity, tier, total, free_bytes);
}
static nf_status_t f_va_reserve(nf_backend_t *be, size_t size, size_t align, uintptr_t *out) {
  FORWARD(be, va_reserve, size, align, out);
}
static nf_status_t f_va_release(nf_backend_t *be, uintptr_t va, size_t size) { FORWARD(be, va_release, va, size); }
static nf_status_t f_mem_create(nf_backend_t *be, nf_tier_t tier, size_t size, nf_handle_t *out) {
  FORWARD(be, mem_create, tier, size, out);
}
static nf_status_t f_mem_release(nf_backend_t *be, nf_handle_t h) { FORWARD(be, mem_release, h); }
static nf_status_t f_map(nf_backend_t *be, uintptr_t va, size_t size, nf_handle_t h) { FORWARD(be, map, va, size, h); }
static nf_status_t f_unmap(nf_backend_t *be, uintptr_t va, size_t size) { FORWARD(be, unmap, va, size); }
static nf_status_t f_set_access(nf_backend_t *be, uintptr_t va, size_t size) { FORWARD(be, set_access, va, size); }
static nf_status_t f_copy(nf_backend_t *be, uintptr_t dst, uintptr_t src, size_t size, nf_stream_t s) {
  FORWARD(be, copy, dst, src, size, s);
}
static nf_status_t f_event_create(nf_backend_t *be, nf_event_t *out) { FORWARD(be, event_create, out); }
static nf_status_t f_event_destroy(nf_backend_t *be, nf_event_t ev) { FORWARD(be, event_destroy, ev); }
static nf_status_t f_event_record(nf_backend_t *be, nf_event_t ev, nf_stream_t s) { FORWARD(be, event_record, ev, s); }
static nf_status_t f_event_query(nf_backend_t *be, nf_event_t ev) { FORWARD(be, event_query, ev); }
static nf_status_t f_event_sync(nf_backend_t *be, nf_event_t ev) { FORWARD(be, event_sync, ev); }
static nf_status_t f_stream_wait(nf_backend_t *be, nf_stream_t s, nf_event_t ev) { FORWARD(be, stream_wait, s, ev); }
// A query, not counted (call numbers stay those of the ops that act).
static nf_status_t f_map_room(nf_backend_t *be, uint64_t n) {
  nf_backend_t *in = fb(be)->inner;
  return in->ops->map_room ? in->ops->map_room(in, n) : NF_OK;
}
static nf_status_t f_stream_check(nf_backend_t *be, nf_stream_t s) {
  nf_backend_t *in = fb(be)->inner;
  return in->ops->stream_check ? in->ops->stream_check(in, s) : NF_OK;
}
static nf_status_t f_stream_capturing(nf_backend_t *be, nf_stream_t s, int *capturing) { // a query, not counted
  nf_backend_t *in = fb(be)->inner;
  *capturing = 0;
  return in->ops->stream_capturing ? in->ops->stream_capturing(in, s, capturing) : NF_OK;
}
static nf_status_t f_sync(nf_backend_t *be) {
  nf_backend_t *in = fb(be)->inner;
  if (!in->ops->sync) return nf__backend_fail(be, NF_ERR_UNSUPPORTED, "the %s backend has no device synchronize", in->ops->name);
  nf_status_t st;
  if (inject(be, "sync", &st)) return st;
  return in->ops->sync(in);
}
static nf_status_t f_add_peer(nf_backend_t *be, int device) {
  nf_backend_t *in = fb(be)->inner;
  if (!in->ops->add_peer) return nf__backend_fail(be, NF_ERR_UNSUPPORTED, "the %s backend has no peer devices", in->ops->name);
  FORWARD(be, add_peer, device);
}

// IPC (optional ops): counted and injected like the rest, so that IPC's
// failure paths can be tested too.
static nf_status_t f_mem_export(nf_backend_t *be, nf_handle_t h, int *fd, uint64_t *off) {
  nf_backend_t *in = fb(be)->inner;
  if (!in->ops->mem_export) return nf__backend_fail(be, NF_ERR_UNSUPPORTED, "the %s backend cannot export memory", in->ops->name);
  FORWARD(be, mem_export, h, fd, off);
}
static nf_status_t f_mem_import(nf_backend_t *be, int fd, uint64_t off, size_t size, nf_handle_t *out) {
  nf_backend_t *in = fb(be)->inner;
  if (!in->ops->mem_import) return nf__backend_fail(be, NF_ERR_UNSUPPORTED, "the %s backend cannot import memory", in->ops->name);
  FORWARD(be, mem_import, fd, off, size, out);
}

static void f_destroy(nf_backend_t *be) {
  fault_backend *f = fb(be);
  nf_backend_destroy(f->inner);
  pthread_mutex_destroy(&f->mu);
  free(f);
}

static const nf_backend_ops_t fault_ops = {
    .name = "fault",
    .granularity = f_granularity,
    .capacity = f_capacity,
    .va_reserve = f_va_reserve,
    .va_release = f_va_release,
    .mem_create = f_mem_create,
    .mem_release = f_mem_release,
    .map = f_map,
    .unmap = f_unmap,
    .set_access = f_set_access,
    .copy = f_copy,
    .event_create = f_event_create,
    .event_destroy = f_event_destroy,
    .event_record = f_event_record,
    .event_query = f_event_query,
    .event_sync = f_event_sync,
    .stream_wait = f_stream_wait,
    .add_peer = f_add_peer,
    .mem_export = f_mem_export,
    .mem_import = f_mem_import,
    .map_room = f_map_room,
    .stream_check = f_stream_check,
    .stream_capturing = f_stream_capturing,
    .sync = f_sync,
    .destroy = f_destroy,
};

// On failure the caller keeps ownership of `inner`.
NF_API nf_status_t nf_backend_fault_create(nf_backend_t **out, nf_backend_t *inner, uint64_t fail_at, double p,
                                           uint64_t seed) {
  if (!out) return nf__error(NF_ERR_INVALID, "fault backend: NULL output pointer");
  *out = NULL;
  if (!inner) return nf__error(NF_ERR_INVALID, "fault backend: no inner backend");
  if (isnan(p) || p < 0.0 || p > 1.0) return nf__error(NF_ERR_INVALID, "fault backend: probability %g not in [0, 1]", p);
  fault_backend *f = calloc(1, sizeof *f);
  if (!f) return nf__error(NF_ERR_NOMEM, "fault backend: out of host memory");
  if (pthread_mutex_init(&f->mu, NULL) != 0) {
    free(f);
    return nf__error(NF_ERR_NOMEM, "fault backend: pthread_mutex_init failed");
  }
  f->base.ops = &fault_ops;
  f->inner = inner;
  f->base.inner = inner; // lets a backend find itself behind the wrapper (host test hooks)
  f->fail_at = fail_at;
  f->p = p;
  f->rng = seed ? seed : 0x9E3779B97F4A7C15ull; // xorshift must not start at 0
  f->oom_next = true;
  *out = &f->base;
  return NF_OK;
}

// Not a fault backend: nothing to change. p outside [0, 1] is clamped.
NF_API void nf_backend_fault_set(nf_backend_t *be, uint64_t fail_at, double p) {
  if (!be || be->ops != &fault_ops) return;
  fault_backend *f = fb(be);
  pthread_mutex_lock(&f->mu);
  f->fail_at = fail_at;
  f->p = isnan(p) || p < 0.0 ? 0.0 : p > 1.0 ? 1.0 : p;
  f->mask = 0;
  pthread_mutex_unlock(&f->mu);
}

void nf__backend_fault_mask(nf_backend_t *be, uint64_t from, uint64_t mask) {
  if (!be || be->ops != &fault_ops) return;
  fault_backend *f = fb(be);
  pthread_mutex_lock(&f->mu);
  f->mask_from = from;
  f->mask = from ? mask : 0;
  pthread_mutex_unlock(&f->mu);
}

NF_API void nf_backend_fault_counts(nf_backend_t *be, uint64_t *calls, uint64_t *failed) {
  uint64_t c = 0, n = 0;
  if (be && be->ops == &fault_ops) {
    fault_backend *f = fb(be);
    pthread_mutex_lock(&f->mu);
    c = f->calls;
    n = f->failed;
    pthread_mutex_unlock(&f->mu);
  }
  if (calls) *calls = c;
  if (failed) *failed = n;
}
