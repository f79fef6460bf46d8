// The stand-in driver's streams and events (see fake_cuda.c): work queued on
// a stream runs in order, at once when nothing is ahead of it, else when what
// holds it lets go -- a cuStreamWaitValue32 on a host word, a wait for an
// event recorded behind such work. Every driver call first runs what may run
// (progress), so a copy the test held back runs when the test releases it,
// and then finds its memory as nofrag left it by that time: unmapped or
// granted elsewhere is an illegal address, as on a GPU (counted, printed).
// Host waits (event and stream synchronize, synchronous copies) spin until
// the work is done; work that can never run would hang a GPU: after 20 s the
// wait fails and says so. Captures record nothing (their work is dropped); a
// potentially unsafe call from a thread not in relaxed mode while a global
// capture runs (or its own non-relaxed one) invalidates it, as the driver
// does. The legacy default stream has no implicit synchronization with
// other streams here: work on it is ordered only against itself.
#include "fake_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { OP_COPY, OP_SET32, OP_RECORD, OP_WAIT_EVENT, OP_WAIT_VALUE };

static fobj_t *streams;   // every stream with work queued once (progress walks them)
static fobj_t *dead_events; // destroyed with a record still queued: freed once it ran

// A stream handle: the legacy / per-thread ones (NULL, 1, 2) name the current
// context's default stream.
static fobj_t *stream_of(void *s) {
  if ((uintptr_t)s <= 2) {
    if (!fk_cur) return NULL;
    fobj_t *l = &fk_cur->legacy;
    if (l->magic != MAGIC_STREAM) *l = (fobj_t){.magic = MAGIC_STREAM, .ctx = fk_cur};
    return l;
  }
  fobj_t *x = s;
  return x->magic == MAGIC_STREAM ? x : NULL;
}
static fobj_t *event_of(void *x) { fobj_t *e = x; return e && e->magic == MAGIC_EVENT ? e : NULL; }

static bool runnable(const fop_t *o) {
  if (o->kind == OP_WAIT_EVENT) return o->ev->done >= o->gen;
  if (o->kind != OP_WAIT_VALUE) return true;
  uint32_t w = __atomic_load_n((const uint32_t *)o->dst, __ATOMIC_ACQUIRE); // (the host writes it, any thread)
  switch (o->flags & 3) { // CU_STREAM_WAIT_VALUE_GEQ, EQ, AND, NOR
  case 0: return (int32_t)(w - o->v) >= 0;
  case 1: return w == o->v;
  case 2: return (w & o->v) != 0;
  default: return ~(w | o->v) != 0;
  }
}

// Runs o; the status goes back to a call that ran it at once (queued work
// that faults later can only be counted: a GPU's error would be sticky).
static int run(fobj_t *s, const fop_t *o) {
  int dev = s->ctx->dev;
  switch (o->kind) {
  case OP_COPY:
    if (!fk_reachable(o->src, o->n, dev) || !fk_reachable(o->dst, o->n, dev))
      return fk_violation(ILLEGAL_ADDRESS, "copy %#lx <- %#lx (%zu B) on device %d: an address not mapped or not granted when it ran",
                          (unsigned long)o->dst, (unsigned long)o->src, o->n, dev);
    memmove((void *)o->dst, (const void *)o->src, o->n);
    fk_st.copies++;
    break;
  case OP_SET32:
    if (!fk_reachable(o->dst, 4 * o->n, dev))
      return fk_violation(ILLEGAL_ADDRESS, "memset %#lx (%zu words) on device %d: not mapped or not granted when it ran",
                          (unsigned long)o->dst, o->n, dev);
    for (size_t i = 0; i < o->n; i++) memcpy((char *)o->dst + 4 * i, &o->v, 4);
    break;
  case OP_RECORD:
    if (o->gen > o->ev->done) o->ev->done = o->gen;
    break;
  default:
    break;
  }
  return OK;
}

// Runs every queued op that may run, until none can (under fk_mu).
static void progress(void) {
  for (bool moved = true; moved;) {
    moved = false;
    for (fobj_t **pp = &streams, *s; (s = *pp);) {
      for (fop_t *o; (o = s->head) && runnable(o); moved = true) {
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        (void)run(s, o);
        free(o);
      }
      if (!s->head && !s->magic) { // destroyed, drained
        *pp = s->next;
        free(s);
      } else {
        pp = &s->next;
      }
    }
  }
  for (fobj_t **pp = &dead_events, *e; (e = *pp);) {
    if (e->done >= e->gen) { *pp = e->next; free(e); }
    else pp = &e->next;
  }
}

static void list(fobj_t *s) {
  if (s->listed) return;
  s->listed = true;
  s->next = streams;
  streams = s;
}

// Queue `o` on s (or run it now: nothing ahead and nothing holds it). A
// capturing stream records the work into its graph: dropped here.
static int submit(fobj_t *s, fop_t o) {
  progress();
  if (s->n) return OK;
  if (!s->head && runnable(&o)) return run(s, &o);
  fop_t *q = malloc(sizeof *q);
  if (!q) return OUT_OF_MEMORY;
  *q = o;
  q->next = NULL;
  if (s->tail) s->tail->next = q;
  else s->head = q;
  s->tail = q;
  list(s); // walked by progress from now on
  return OK;
}

// A potentially unsafe call (a host wait, a synchronous copy) while a capture
// forbids it: the driver refuses it and invalidates the capture(s).
static bool capture_forbids(void) {
  if (fk_mode == RELAXED) return false;
  bool hit = false;
  for (fobj_t *s = streams; s; s = s->next)
    if (s->n == 1 && s->cmode != RELAXED &&
        (pthread_equal(s->owner, pthread_self()) || (fk_mode == 0 && s->cmode == 0))) {
      s->n = 2;
      hit = true;
    }
  return hit;
}

// A host wait until done(arg) (under fk_mu, which it drops while it sleeps).
static int wait_until(bool (*done)(void *), void *arg, const char *what) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    progress();
    if (done(arg)) return OK;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 20) return fk_violation(WOULD_HANG, "%s: work that can never run (a GPU would hang)", what);
    pthread_mutex_unlock(&fk_mu);
    usleep(200);
    pthread_mutex_lock(&fk_mu);
  }
}
static bool event_done(void *e) { return ((fobj_t *)e)->done >= ((fobj_t *)e)->gen; }
static bool stream_idle(void *s) { return !((fobj_t *)s)->head; }
static bool ctx_idle(void *c) {
  for (fobj_t *s = streams; s; s = s->next)
    if (s->ctx == c && s->head) return false;
  return true;
}

// ------------------------------------------------------------ streams
// Streams and events belong to the context current at their creation.
static int obj_create(void **out, unsigned magic, const char *call) {
  fk_enter(false);
  if (!fk_cur) RETURN(fk_violation(INVALID_CONTEXT, "%s with no context current", call));
  fobj_t *x = calloc(1, sizeof *x);
  if (!x) RETURN(OUT_OF_MEMORY);
  *x = (fobj_t){.magic = magic, .ctx = fk_cur};
  *out = x;
  RETURN(OK);
}
int cuStreamCreate(void **out, unsigned flags) {
  (void)flags; // blocking or not: no implicit synchronization here either way
  return obj_create(out, MAGIC_STREAM, "cuStreamCreate");
}
int cuStreamDestroy_v2(void *p) {
  fk_enter(false);
  fobj_t *s = (uintptr_t)p <= 2 ? NULL : stream_of(p);
  if (!s) RETURN(fk_violation(INVALID_HANDLE, "cuStreamDestroy(%p)", p));
  s->magic = 0; // its queued work still runs (progress frees it after)
  if (!s->listed) free(s);
  progress();
  RETURN(OK);
}
int cuStreamSynchronize(void *p) {
  fk_enter(true);
  fobj_t *s = stream_of(p);
  if (!s) RETURN(fk_violation(INVALID_HANDLE, "cuStreamSynchronize(%p)", p));
  if (capture_forbids()) RETURN(CAPTURE_UNSUPPORTED);
  RETURN(wait_until(stream_idle, s, "cuStreamSynchronize"));
}
int cuCtxSynchronize(void) {
  fk_enter(true);
  if (!fk_cur) RETURN(fk_violation(INVALID_CONTEXT, "cuCtxSynchronize with no context current"));
  if (capture_forbids()) RETURN(CAPTURE_UNSUPPORTED);
  RETURN(wait_until(ctx_idle, fk_cur, "cuCtxSynchronize"));
}
int cuStreamGetCtx(void *p, void **ctx) {
  pthread_mutex_lock(&fk_mu);
  fobj_t *s = stream_of(p);
  if (s) *ctx = s->ctx;
  RETURN(s ? OK : INVALID_HANDLE);
}
int cuStreamIsCapturing(void *p, int *status) {
  fk_enter(false);
  fobj_t *s = stream_of(p);
  if (!s) RETURN(fk_violation(INVALID_HANDLE, "cuStreamIsCapturing(%p)", p));
  *status = s->n;
  RETURN(OK);
}
int cuStreamBeginCapture_v2(void *p, int cmode) {
  fk_enter(false);
  fobj_t *s = stream_of(p);
  if (!s || (uintptr_t)p <= 2 || s->n) RETURN(INVALID_VALUE); // (the legacy stream cannot be captured)
  progress();
  s->n = 1;
  s->cmode = cmode;
  s->owner = pthread_self();
  list(s); // capture_forbids finds it
  RETURN(OK);
}
int cuStreamEndCapture(void *p, void **graph) {
  fk_enter(false);
  fobj_t *s = stream_of(p);
  if (!s || !s->n) RETURN(INVALID_VALUE);
  int r = s->n == 2 ? CAPTURE_INVALIDATED : OK;
  s->n = 0;
  *graph = r == OK ? malloc(1) : NULL;
  RETURN(r);
}
int cuGraphDestroy(void *g) { free(g); return OK; }
int cuStreamWaitValue32_v2(void *p, uintptr_t addr, unsigned v, unsigned flags) {
  fk_enter(false);
  fobj_t *s = stream_of(p);
  if (!s) RETURN(fk_violation(INVALID_HANDLE, "cuStreamWaitValue32(%p)", p));
  RETURN(submit(s, (fop_t){.kind = OP_WAIT_VALUE, .dst = addr, .v = v, .flags = flags}));
}
int cuStreamWaitValue32(void *p, uintptr_t addr, unsigned v, unsigned flags) { return cuStreamWaitValue32_v2(p, addr, v, flags); }

// ------------------------------------------------------------ events
int cuEventCreate(void **out, unsigned flags) { (void)flags; return obj_create(out, MAGIC_EVENT, "cuEventCreate"); }
int cuEventDestroy_v2(void *x) {
  fk_enter(false);
  fobj_t *e = event_of(x);
  if (!e) RETURN(fk_violation(INVALID_HANDLE, "cuEventDestroy(%p)", x));
  e->magic = 0;
  progress();
  if (e->done >= e->gen) free(e);
  else { e->next = dead_events; dead_events = e; } // a queued record still names it
  RETURN(OK);
}
int cuEventRecord(void *x, void *p) {
  fk_enter(true);
  fobj_t *e = event_of(x), *s = stream_of(p);
  if (!e || !s) RETURN(fk_violation(INVALID_HANDLE, "cuEventRecord(%p, %p): bad handle or no context", x, p));
  if (s->ctx != e->ctx)
    RETURN(fk_violation(INVALID_HANDLE, "cuEventRecord: the event is device %d's, the stream device %d's context",
                        e->ctx->dev, s->ctx->dev));
  if (s->n) RETURN(OK); // a node of the capture's graph: the event itself does not change
  e->n = fake_opt("lag", 0);
  fk_st.records++;
  RETURN(submit(s, (fop_t){.kind = OP_RECORD, .ev = e, .gen = ++e->gen}));
}
int cuEventQuery(void *x) {
  fk_enter(true);
  fobj_t *e = event_of(x);
  if (!e) RETURN(fk_violation(INVALID_HANDLE, "cuEventQuery(%p)", x));
  fk_st.queries++;
  progress();
  if (e->n > 0) { e->n--; RETURN(NOT_READY); }
  RETURN(event_done(e) ? OK : NOT_READY);
}
int cuEventSynchronize(void *x) {
  fk_enter(true);
  fobj_t *e = event_of(x);
  if (!e) RETURN(fk_violation(INVALID_HANDLE, "cuEventSynchronize(%p)", x));
  if (capture_forbids()) RETURN(CAPTURE_UNSUPPORTED);
  fk_st.syncs++;
  e->n = 0;
  RETURN(wait_until(event_done, e, "cuEventSynchronize"));
}
int cuStreamWaitEvent(void *p, void *x, unsigned flags) {
  fk_enter(true);
  fobj_t *s = stream_of(p), *e = event_of(x);
  if (!s || !e || flags) RETURN(fk_violation(INVALID_HANDLE, "cuStreamWaitEvent(%p, %p)", p, x));
  fk_st.waits++;
  RETURN(submit(s, (fop_t){.kind = OP_WAIT_EVENT, .ev = e, .gen = e->gen}));
}

// ------------------------------------------------------------ copies
static int async_op(void *p, fop_t o, const char *what) {
  fk_enter(true);
  fobj_t *s = stream_of(p);
  if (!s) RETURN(fk_violation(p ? INVALID_HANDLE : INVALID_CONTEXT, "%s: no stream %p (or no context)", what, p));
  RETURN(submit(s, o));
}
// Synchronous: on the current context's default stream, waited for.
static int sync_op(fop_t o, const char *what) {
  fk_enter(true);
  fobj_t *s = stream_of(NULL);
  if (!s) RETURN(fk_violation(INVALID_CONTEXT, "%s with no context current", what));
  if (capture_forbids()) RETURN(CAPTURE_UNSUPPORTED);
  uint64_t bad = fk_st.violations;
  int r = submit(s, o);
  if (r == OK) r = wait_until(stream_idle, s, what);
  RETURN(r == OK && fk_st.violations != bad ? ILLEGAL_ADDRESS : r); // a synchronous call reports its own fault, queued or not
}
int cuMemcpyAsync(uintptr_t dst, uintptr_t src, size_t n, void *s) {
  return async_op(s, (fop_t){.kind = OP_COPY, .dst = dst, .src = src, .n = n}, "cuMemcpyAsync");
}
int cuMemcpyDtoHAsync_v2(void *dst, uintptr_t src, size_t n, void *s) {
  return async_op(s, (fop_t){.kind = OP_COPY, .dst = (uintptr_t)dst, .src = src, .n = n}, "cuMemcpyDtoHAsync");
}
int cuMemsetD32Async(uintptr_t dst, unsigned v, size_t n, void *s) {
  return async_op(s, (fop_t){.kind = OP_SET32, .dst = dst, .v = v, .n = n}, "cuMemsetD32Async");
}
int cuMemsetD32_v2(uintptr_t dst, unsigned v, size_t n) { return sync_op((fop_t){.kind = OP_SET32, .dst = dst, .v = v, .n = n}, "cuMemsetD32"); }
int cuMemcpyDtoH_v2(void *dst, uintptr_t src, size_t n) {
  return sync_op((fop_t){.kind = OP_COPY, .dst = (uintptr_t)dst, .src = src, .n = n}, "cuMemcpyDtoH");
}
int cuMemcpyHtoD_v2(uintptr_t dst, const void *src, size_t n) {
  return sync_op((fop_t){.kind = OP_COPY, .dst = dst, .src = (uintptr_t)src, .n = n}, "cuMemcpyHtoD");
}
int cuMemcpyDtoD_v2(uintptr_t dst, uintptr_t src, size_t n) {
  return sync_op((fop_t){.kind = OP_COPY, .dst = dst, .src = src, .n = n}, "cuMemcpyDtoD");
}

// Pinned host memory: plain host memory here, its device address its own.
int cuMemAllocHost_v2(void **p, size_t n) { return (*p = malloc(n ? n : 1)) ? OK : OUT_OF_MEMORY; }
int cuMemHostAlloc(void **p, size_t n, unsigned flags) { (void)flags; return cuMemAllocHost_v2(p, n); }
int cuMemHostGetDevicePointer_v2(uintptr_t *d, void *p, unsigned flags) { (void)flags; *d = (uintptr_t)p; return OK; }
int cuMemFreeHost(void *p) { free(p); return OK; }

// ------------------------------------------------------------ contexts, the tests' side
void fk_ctx_streams_drop(fctx_t *c) {
  progress();
  for (fobj_t **pp = &streams, *s; (s = *pp);) {
    if (s->ctx != c) { pp = &s->next; continue; }
    for (fop_t *o = s->head, *n; o; o = n) { n = o->next; free(o); } // (a GPU would drop them too)
    *pp = s->next;
    if (s != &c->legacy) free(s);
  }
}
void *fakecu_stream_create(void *ctx) {
  fobj_t *s = calloc(1, sizeof *s);
  if (s) *s = (fobj_t){.magic = MAGIC_STREAM, .ctx = fk_ctx_of(ctx)};
  return s;
}
