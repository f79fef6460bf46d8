// The stand-in driver's private header: what its two halves share --
// fake_cuda.c (devices, contexts, memory) and fake_stream.c (streams,
// events, the work queued on them, capture). Cross-file names take fk_.
#ifndef NF_FAKE_INT_H
#define NF_FAKE_INT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE // memfd_create, fallocate
#endif
#include "fake_cuda.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

enum {
  OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NO_DEVICE = 100, INVALID_DEVICE = 101, INVALID_CONTEXT = 201,
  ALREADY_MAPPED = 208, NOT_MAPPED = 211, INVALID_HANDLE = 400, NOT_READY = 600, ILLEGAL_ADDRESS = 700,
  NOT_SUPPORTED = 801, CAPTURE_UNSUPPORTED = 900, CAPTURE_INVALIDATED = 901, WOULD_HANG = 999,
};
enum { LOC_DEVICE = 1, LOC_HOST = 2, HT_FD = 1, RELAXED = 2 };
#define MAGIC_CTX 0x43545831u
#define MAGIC_STREAM 0x53545231u
#define MAGIC_EVENT 0x45564e31u
#define MAGIC_HANDLE 0x484e4431u

struct fctx;
// Work queued on a stream, run in order once it may (fake_stream.c).
typedef struct fop {
  int kind;           // OP_COPY, OP_SET32, OP_RECORD, OP_WAIT_EVENT, OP_WAIT_VALUE
  uintptr_t dst, src; // OP_WAIT_VALUE: dst is the host word
  size_t n;
  unsigned v, flags;
  struct fobj *ev; // OP_RECORD / OP_WAIT_EVENT
  uint64_t gen;    // the event's record this one completes / waits for
  struct fop *next;
} fop_t;

// A stream or an event.
typedef struct fobj {
  unsigned magic;      // 0 once destroyed (freed when nothing refers to it any more)
  struct fctx *ctx;    // the context current at its creation
  int n;               // stream: capture status (0 none, 1 active, 2 invalidated); event: NOT_READY answers left (lag)
  int cmode;           // stream: the capture's mode (0 global, 1 thread-local, 2 relaxed)
  pthread_t owner;     // stream: the capturing thread
  uint64_t gen, done;  // event: records made, records completed
  fop_t *head, *tail;  // stream: queued work
  bool listed;         // stream: in the list progress walks
  struct fobj *next;   // streams: that list; events: the destroyed ones still pending
} fobj_t;

typedef struct fctx {
  unsigned magic;
  int dev;
  uint64_t calls;
  fobj_t legacy; // the context's legacy default stream (NULL, 1, 2); magic set at first use
} fctx_t;

extern pthread_mutex_t fk_mu;      // the whole driver's state
extern fakecu_stats_t fk_st;       // counters (fakecu_stats)
extern _Thread_local fctx_t *fk_cur;  // the calling thread's current context
extern _Thread_local int fk_mode;     // its capture mode (cuThreadExchangeStreamCaptureMode)

// Options: NF_FAKE_CUDA holds 'key=value,...', read at every call so that a
// test may change them between calls (single-threaded moments only: setenv
// is not thread-safe). fake_dev_opt("fd", 1, d) reads "fd1".
int fake_opt(const char *key, int dflt);
int fake_dev_opt(const char *key, int dev, int dflt);
int fk_ndev(void);
fctx_t *fk_ctx_of(void *c);
// Prints and counts a refusal that points at a bug of the caller; returns r (aborts under strict=1).
int fk_violation(int r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Every call that acts, under fk_mu: counted against the current context, and
// whether it ran in relaxed capture mode (those that may break a capture elsewhere).
void fk_enter(bool capture_unsafe);
#define RETURN(r) do { int r_ = (r); pthread_mutex_unlock(&fk_mu); return r_; } while (0)
// [a, a + n) is reachable from `dev`: every granule mapped and granted to it
// (memory outside every reservation is host memory: reachable).
bool fk_reachable(uintptr_t a, size_t n, int dev);
// A context's streams are drained and forgotten (cuCtxDestroy).
void fk_ctx_streams_drop(fctx_t *c);

#endif
