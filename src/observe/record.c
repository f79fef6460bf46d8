// In-process trace recording (`trace:PATH`): every successful nf_alloc and
// every nf_free of a pool, as an RMM logging_resource_adaptor CSV log, so
// that a user's job can be replayed later with `nofrag replay PATH`.
//
// Format (what rmm::mr::logging_resource_adaptor writes, and what
// src/replay/trace_rmm.c reads): the header "Thread,Time,Action,Pointer,Size,Stream",
// then one row per call:
//
//     <os thread id>,HH:MM:SS:uuuuuu,allocate,0x7f...,<size>,0x<stream>
//     <os thread id>,HH:MM:SS:uuuuuu,free,0x7f...,<size>,0x<stream>
//
// Time is the local wall-clock time of day (the UTC offset is taken once, at
// pool creation). Size is the requested size, for frees too (RMM's
// deallocate carries it, and its reader expects it). A free's Stream is the
// stream the block was allocated on. Rows are written in the order the pool
// lock serialised the calls, so the file is one consistent order even with
// many threads (RMM's own replay benchmark replays each Thread apart; ours
// reads the rows in file order).
//
// Rows are built in a 64 KiB buffer under the pool lock and written with
// write(2) when it is full and at pool destroy. Bound: the file never exceeds
// cfg.trace_max bytes (0 = no bound); the first row that would not fit stops
// the recording for good (so the file is a prefix of the job's calls, which
// replays cleanly) and one line "nofrag: trace PATH truncated at N bytes" goes
// to stderr. A write error (disk full) also stops it, with one line; a write
// cut short inside a row is cut back to the last whole row. A fork()ed
// child's copy of the pool records nothing (the file is the parent's).
// A pool never destroyed (the PyTorch plug-in's) is flushed by an atexit
// handler, and writes each later row at once (frees during teardown).
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "observe/observe.h"

#define NF_REC_BUF ((size_t)64 << 10)
#define NF_REC_HEADER "Thread,Time,Action,Pointer,Size,Stream\n"
#define NF_REC_ROW_MAX 128 // 20 + 1 + 15 + 1 + 8 + 1 + 18 + 1 + 20 + 1 + 18 + 1 < 128

typedef struct nf_rec_s {
  struct nf_rec_s *next; // the registry of open recorders (atexit flush)
  nf_pool_t *pool;
  bool at_exit;          // the atexit flush ran: each row is written at once
  int fd;
  pid_t pid;          // the recording process (a fork()ed child's copy writes nothing)
  bool stopped;       // truncated or failed: no more rows
  uint64_t max;       // byte bound (UINT64_MAX: none)
  uint64_t written;   // bytes written to the file
  int64_t tz_off;     // seconds east of UTC at open
  size_t len;         // bytes in buf
  char path[NF_TRACE_PATH_MAX];
  char buf[NF_REC_BUF];
} nf_rec_t;

static _Thread_local long tl_tid;

static long os_tid(void) {
  if (NF_UNLIKELY(!tl_tid)) tl_tid = (long)syscall(SYS_gettid);
  return tl_tid;
}

// Write everything in buf; false (and the recording stopped) on an error.
static bool flush(nf_rec_t *r) {
  // A fork()ed child holds a copy of the parent's buffer and shares its file
  // offset: writing would repeat the parent's rows and mix in the child's.
  if (getpid() != r->pid) {
    r->stopped = true;
    r->len = 0;
    return false;
  }
  size_t off = 0;
  while (off < r->len) {
    ssize_t n = write(r->fd, r->buf + off, r->len - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = n < 0 ? errno : EIO;
      r->stopped = true;
      // A write cut short (disk full) may have ended inside a row: cut the
      // file back to the last whole row (buf holds whole rows), else the
      // reader rejects the whole log or reads a wrong last value. Where the
      // path cannot be truncated (a pipe, a device) there is nothing to cut.
      size_t keep = off;
      while (keep && r->buf[keep - 1] != '\n') keep--;
      if (keep < off && ftruncate(r->fd, (off_t)(r->written + keep)) == 0) off = keep;
      fprintf(stderr, "nofrag: trace %s: write failed after %llu bytes: %s; recording stopped\n", r->path,
              (unsigned long long)(r->written + off), strerror(e));
      r->written += off;
      r->len = 0;
      return false;
    }
    off += (size_t)n;
  }
  r->written += r->len;
  r->len = 0;
  return true;
}

// Open recorders, for the atexit flush of pools never destroyed.
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static nf_rec_t *reg_head;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;

// Write out what each open recorder of this process holds. The pool lock
// orders it with rows being added; another thread may hold that lock at exit
// forever (exit() does not stop threads): then give up on that pool after
// ~1 s rather than hang the exit.
static void rec_atexit(void) {
  pthread_mutex_lock(&reg_mu);
  for (nf_rec_t *r = reg_head; r; r = r->next) {
    if (r->pid != getpid()) continue;
    nf_lock_t *l = &r->pool->lock_; // the raw lock: the flush reads no block
    int tries = 0;
    while (!nf__trylock(l) && ++tries < 100000) sched_yield();
    if (tries >= 100000) continue;
    r->at_exit = true;
    if (r->len && !r->stopped) flush(r);
    nf__unlock(l);
  }
  pthread_mutex_unlock(&reg_mu);
}

static void reg_init(void) { atexit(rec_atexit); }

// Append `n` bytes (a whole row or the header) unless the bound forbids it.
static void append(nf_rec_t *r, const char *s, size_t n) {
  if (r->written + r->len + n > r->max) {
    r->stopped = true;
    // A failed flush has said so itself; the file does not hold `written` bytes then.
    if (flush(r))
      fprintf(stderr, "nofrag: trace %s truncated at %llu bytes\n", r->path, (unsigned long long)r->written);
    return;
  }
  if (r->len + n > sizeof r->buf && !flush(r)) return;
  memcpy(r->buf + r->len, s, n);
  r->len += n;
}

nf_status_t nf__rec_open(nf_pool_t *p) {
  nf_rec_t *r = malloc(sizeof *r);
  if (!r) return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  memset(r, 0, offsetof(nf_rec_t, buf));
  memcpy(r->path, p->cfg.trace, sizeof r->path);
  r->path[sizeof r->path - 1] = '\0';
  r->max = p->cfg.trace_max ? p->cfg.trace_max : UINT64_MAX;
  r->pid = getpid();
  r->fd = open(r->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (r->fd < 0) {
    int e = errno;
    nf_status_t st = nf__error(NF_ERR_CONFIG, "nofrag: trace: cannot open '%s' for writing: %s", r->path,
                               strerror(e));
    free(r);
    return st;
  }
  time_t now = time(NULL);
  struct tm tm;
  r->tz_off = localtime_r(&now, &tm) ? (int64_t)tm.tm_gmtoff : 0;
  append(r, NF_REC_HEADER, sizeof NF_REC_HEADER - 1);
  r->pool = p;
  p->rec = r;
  pthread_once(&reg_once, reg_init);
  pthread_mutex_lock(&reg_mu);
  r->next = reg_head;
  reg_head = r;
  pthread_mutex_unlock(&reg_mu);
  return NF_OK;
}

void nf__rec_close(nf_pool_t *p) {
  nf_rec_t *r = p->rec;
  if (!r) return;
  pthread_mutex_lock(&reg_mu);
  for (nf_rec_t **q = &reg_head; *q; q = &(*q)->next)
    if (*q == r) {
      *q = r->next;
      break;
    }
  pthread_mutex_unlock(&reg_mu);
  if (r->len) flush(r);
  close(r->fd);
  free(r);
  p->rec = NULL;
}

// Lower-case hex with 0x, into out; returns the length.
static size_t put_hex(char *out, uint64_t v) {
  char tmp[16];
  size_t n = 0;
  do {
    tmp[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  out[0] = '0', out[1] = 'x';
  for (size_t i = 0; i < n; i++) out[2 + i] = tmp[n - 1 - i];
  return n + 2;
}

static size_t put_dec(char *out, uint64_t v) {
  char tmp[20];
  size_t n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  for (size_t i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
  return n;
}

static size_t put2(char *out, uint64_t v) {
  out[0] = (char)('0' + v / 10 % 10), out[1] = (char)('0' + v % 10);
  return 2;
}

void nf__rec_row(nf_pool_t *p, bool alloc, uintptr_t ptr, uint64_t size, nf_stream_t stream) {
  nf_rec_t *r = p->rec;
  if (r->stopped) return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int64_t sec = (int64_t)ts.tv_sec + r->tz_off;
  uint64_t day = (uint64_t)(((sec % 86400) + 86400) % 86400);
  char row[NF_REC_ROW_MAX];
  size_t n = put_dec(row, (uint64_t)os_tid());
  row[n++] = ',';
  n += put2(row + n, day / 3600);
  row[n++] = ':';
  n += put2(row + n, day / 60 % 60);
  row[n++] = ':';
  n += put2(row + n, day % 60);
  row[n++] = ':';
  uint64_t us = (uint64_t)ts.tv_nsec / 1000;
  for (int i = 5; i >= 0; i--, us /= 10) row[n + (size_t)i] = (char)('0' + us % 10);
  n += 6;
  if (alloc) memcpy(row + n, ",allocate,", 10), n += 10;
  else memcpy(row + n, ",free,", 6), n += 6;
  n += put_hex(row + n, (uint64_t)ptr);
  row[n++] = ',';
  n += put_dec(row + n, size);
  row[n++] = ',';
  n += put_hex(row + n, (uint64_t)(uintptr_t)stream);
  row[n++] = '\n';
  append(r, row, n);
  if (NF_UNLIKELY(r->at_exit) && !r->stopped) flush(r);
}
