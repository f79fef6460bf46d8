// Live monitor: each pool publishes its counters to a small shared-memory
// file that `nofrag top` (tools/top.c) reads from another process. Layout and
// the writer's fast path are in internal.h (nf_mon_shm_t, nf__mon_fast); this
// file creates and removes the files, publishes on slow paths, and reads them.
//
// Lifetime: created at pool creation (unless NOFRAG_MONITOR=0), removed at
// nf_pool_destroy and, for pools never destroyed, by an atexit handler. A
// process that dies without exiting leaves its files behind: readers detect
// the dead pid and skip them; `nofrag top --clean` removes them.
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// ------------------------------------------------------------------ registry
// Files this process created and has not removed yet, for the atexit handler.
// A fork()ed child inherits the list; entries carry the creating pid so that
// the child's exit does not remove its parent's files.
typedef struct mon_reg_s {
  struct mon_reg_s *next;
  nf_mon_shm_t *m;
  pid_t pid;
  char path[];
} mon_reg_t;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static mon_reg_t *reg_head;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static _Atomic uint32_t next_pool_id;

static void mon_atexit(void) {
  pthread_mutex_lock(&reg_mu);
  pid_t me = getpid();
  for (mon_reg_t *r = reg_head; r; r = r->next)
    if (r->pid == me) unlink(r->path); // no munmap: other threads may still be running
  pthread_mutex_unlock(&reg_mu);
}

static void reg_init(void) { atexit(mon_atexit); }

const char *nf__mon_dir(void) {
  const char *d = getenv("NOFRAG_SHM_DIR");
  return d && *d ? d : "/dev/shm";
}

static uint64_t mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

void nf__mon_open(nf_pool_t *p) {
  const char *env = getenv("NOFRAG_MONITOR");
  if (env && strcmp(env, "0") == 0) return;
  pthread_once(&reg_once, reg_init);
  uint32_t id = atomic_fetch_add_explicit(&next_pool_id, 1, memory_order_relaxed);
  char path[512];
  int n = snprintf(path, sizeof path, "%s/nofrag.%u.%d.%u", nf__mon_dir(), (unsigned)getuid(), (int)getpid(), id);
  if (n < 0 || (size_t)n >= sizeof path) return;
  mon_reg_t *r = malloc(sizeof *r + (size_t)n + 1);
  if (!r) return;
  memcpy(r->path, path, (size_t)n + 1);
  // O_EXCL: a stale file of a dead process with our pid is replaced, never shared.
  unlink(path);
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) { free(r); return; } // the monitor is best effort: the pool works without it
  void *addr = MAP_FAILED;
  if (fchmod(fd, 0600) == 0 && ftruncate(fd, (off_t)sizeof(nf_mon_shm_t)) == 0)
    addr = mmap(NULL, sizeof(nf_mon_shm_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (addr == MAP_FAILED) { unlink(path); free(r); return; }
  nf_mon_shm_t *m = addr; // zero-filled by ftruncate
  m->version = NF_MON_VERSION;
  m->size = sizeof *m;
  m->pid = (int32_t)getpid();
  m->uid = (uint32_t)getuid();
  m->pool_id = id;
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  m->start_ns = (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
  const char *bn = p->be->ops->name ? p->be->ops->name : "?";
  if (strcmp(bn, "cuda") == 0) snprintf(m->device, sizeof m->device, "cuda:%d", p->cfg.device);
  else snprintf(m->device, sizeof m->device, "%s", bn);
  p->mon = m;
  nf__mon_full(p);
  // The header is complete: publish the magic last (release) so that readers
  // never trust a half-written header.
  __atomic_store_n(&m->magic, NF_MON_MAGIC, __ATOMIC_RELEASE);
  r->m = m;
  r->pid = getpid();
  pthread_mutex_lock(&reg_mu);
  r->next = reg_head;
  reg_head = r;
  pthread_mutex_unlock(&reg_mu);
}

void nf__mon_close(nf_pool_t *p) {
  nf_mon_shm_t *m = p->mon;
  if (!m) return;
  p->mon = NULL;
  mon_reg_t *r = NULL;
  pthread_mutex_lock(&reg_mu);
  for (mon_reg_t **pp = &reg_head; *pp; pp = &(*pp)->next)
    if ((*pp)->m == m) { r = *pp; *pp = r->next; break; }
  pthread_mutex_unlock(&reg_mu);
  if (r) {
    unlink(r->path);
    free(r);
  }
  munmap(m, sizeof *m);
}

_Static_assert(NF_MON_V1_FIELDS == NF_MON_OFFLOADED, "fields are only appended after the first layout");

void nf__mon_full(nf_pool_t *p) {
  nf_mon_shm_t *m = p->mon;
  if (!m) return;
  uint64_t v[NF_MON_NFIELDS] = {0};
  v[NF_MON_LIVE] = p->st.live;
  v[NF_MON_LIVE_PEAK] = p->st.live_peak;
  v[NF_MON_ALLOCS] = p->st.allocs;
  v[NF_MON_FREES] = p->st.frees;
  v[NF_MON_MAPPED] = p->gran_mapped << p->gshift;
  v[NF_MON_PHYSICAL] = p->gran_created << p->gshift;
  v[NF_MON_LIMIT] = p->cfg.limit;
  v[NF_MON_GRANULE] = p->granule;
  // The walk is O(blocks + granules): one per 100 ms window, plus up to 3
  // more when the mapping changed, else the last value stands (a workload
  // that maps often must not pay a walk per mapping change; periodic ticks
  // walk as before). The allowance covers the burst of mappings after a pool
  // opens, so an idle pool does not keep the value from before its last
  // mappings (top showed LARGEST 0B); a skipped walk marks the value stale
  // until the next one (every 4096th op, or nf_stats_get, which publishes).
  uint64_t now = mono_ns();
  bool window = p->mon_lf_ns && now - p->mon_lf_ns < 100000000ull;
  bool remapped = p->gran_mapped != p->mon_mapped || p->gran_created != p->mon_created; // not a periodic tick
  if (!window || (remapped && p->mon_lf_burst < 4)) {
    v[NF_MON_LARGEST_FREE] = nf__largest_free_mapped(p, NULL);
    if (!window) { p->mon_lf_ns = now; p->mon_lf_burst = 0; }
    p->mon_lf_burst++;
    p->mon_lf_stale = false;
  } else {
    v[NF_MON_LARGEST_FREE] = atomic_load_explicit(&m->v[NF_MON_LARGEST_FREE], memory_order_relaxed);
    p->mon_lf_stale = true;
  }
  v[NF_MON_SPILLED] = (p->host_mapped - p->offl_granules) << p->gshift;
  v[NF_MON_OFFLOADED] = (p->offl_granules + p->detached_granules) << p->gshift;
  v[NF_MON_AWAY] = p->away_granules << p->gshift;
  v[NF_MON_OOMS] = p->st.ooms;
  v[NF_MON_RECLAIMS] = p->st.reclaims;
  const nf_calls_t *c = &p->st.calls;
  v[NF_MON_BACKEND_CALLS] = c->va_reserve + c->va_release + c->create + c->release + c->map + c->unmap +
                            c->set_access + c->event_create + c->event_record + c->event_query +
                            c->event_sync + c->stream_wait;
  uint64_t s = atomic_load_explicit(&m->seq, memory_order_relaxed);
  atomic_store_explicit(&m->seq, s + 1, memory_order_relaxed);
  for (int i = 0; i < NF_MON_NFIELDS; i++) atomic_store_explicit(&m->v[i], v[i], memory_order_release);
  atomic_store_explicit(&m->seq, s + 2, memory_order_release);
  p->mon_mapped = p->gran_mapped;
  p->mon_created = p->gran_created;
}

// ------------------------------------------------------------------ reader

// Seqlock read: s0 (acquire) even, fields (acquire), s1 (relaxed) == s0. An
// acquire load that sees a value of a write in progress synchronises with its
// release store, which comes after the odd seq: s1 then differs from s0.
static bool mon_snapshot(const nf_mon_shm_t *m, int nfields, nf_mon_entry_t *e) {
  nf_mon_shm_t *w = (nf_mon_shm_t *)m; // atomics are read-only here; C11 loads take non-const
  for (unsigned tries = 0; tries < 200000; tries++) {
    uint64_t s0 = atomic_load_explicit(&w->seq, memory_order_acquire);
    if (!(s0 & 1)) {
      for (int i = 0; i < nfields; i++) e->v[i] = atomic_load_explicit(&w->v[i], memory_order_acquire);
      if (atomic_load_explicit(&w->seq, memory_order_relaxed) == s0) return true;
    }
    if (tries > 64) sched_yield();
  }
  return false; // a writer died mid-update: the file stays odd forever
}

// When process `pid` started, in seconds since the epoch (-1: unknown):
// /proc/PID/stat's 22nd field (clock ticks after boot) plus /proc/stat's btime.
static double proc_start(int pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *q = strrchr(buf, ')'); // the command name may hold spaces
  unsigned long long ticks = 0;
  int field = 2;
  for (; q && *q && field < 22; q++)
    if (*q == ' ') field++;
  if (!q || sscanf(q, "%llu", &ticks) != 1) return -1;
  f = fopen("/proc/stat", "r");
  if (!f) return -1;
  unsigned long long btime = 0;
  char line[256];
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "btime %llu", &btime) == 1) break;
  fclose(f);
  long hz = sysconf(_SC_CLK_TCK);
  return btime && hz > 0 ? (double)btime + (double)ticks / (double)hz : -1;
}

// The file's process is gone: no such pid, or the pid now belongs to a
// process that started after the file was written (pid reuse).
static bool pid_dead(int pid, uint64_t start_ns) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  double started = proc_start(pid);
  return started >= 0 && started > (double)start_ns / 1e9 + 2.0; // btime is whole seconds
}

int nf__mon_read(const char *path, nf_mon_entry_t *e) {
  memset(e, 0, sizeof *e);
  snprintf(e->path, sizeof e->path, "%s", path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat sb;
  // A file from an older writer may hold fewer fields (NF_MON_V1_FIELDS at
  // least); one from a newer writer more (ignored).
  const size_t v_at = offsetof(nf_mon_shm_t, v), min = v_at + NF_MON_V1_FIELDS * sizeof(uint64_t);
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < (off_t)min) {
    close(fd);
    return -1;
  }
  size_t len = (size_t)sb.st_size < sizeof(nf_mon_shm_t) ? (size_t)sb.st_size : sizeof(nf_mon_shm_t);
  void *addr = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (addr == MAP_FAILED) return -1;
  const nf_mon_shm_t *m = addr;
  int rc = -1;
  if (__atomic_load_n(&m->magic, __ATOMIC_ACQUIRE) == NF_MON_MAGIC && m->version == NF_MON_VERSION &&
      m->size >= min) {
    size_t have = (m->size < len ? m->size : len) - v_at;
    int nfields = have / sizeof(uint64_t) < NF_MON_NFIELDS ? (int)(have / sizeof(uint64_t)) : NF_MON_NFIELDS;
    e->pid = m->pid;
    e->uid = m->uid;
    e->pool_id = m->pool_id;
    e->start_ns = m->start_ns;
    memcpy(e->device, m->device, sizeof e->device);
    e->device[sizeof e->device - 1] = 0;
    if (pid_dead(e->pid, e->start_ns)) rc = 1;
    else if (mon_snapshot(m, nfields, e)) {
      uint64_t mp = e->v[NF_MON_MAPPED];
      uint64_t live = e->v[NF_MON_LIVE], away = e->v[NF_MON_AWAY], resident = live > away ? live - away : 0;
      e->fragmentation = mp ? 1.0 - (double)resident / (double)mp : 0.0;
      rc = 0;
    }
  }
  munmap(addr, len);
  return rc;
}

static int entry_cmp(const void *a, const void *b) {
  const nf_mon_entry_t *x = a, *y = b;
  if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
  return (x->pool_id > y->pool_id) - (x->pool_id < y->pool_id);
}

long nf__mon_list(const char *dir, bool clean, nf_mon_entry_t **out, long *dead) {
  if (!dir) dir = nf__mon_dir();
  *out = NULL;
  if (dead) *dead = 0;
  DIR *d = opendir(dir);
  if (!d) return -1;
  nf_mon_entry_t *v = NULL;
  long n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, "nofrag.", 7) != 0) continue;
    if (n == cap) {
      long nc = cap ? cap * 2 : 16;
      nf_mon_entry_t *nv = realloc(v, sizeof *v * (size_t)nc);
      if (!nv) break;
      v = nv;
      cap = nc;
    }
    char path[512];
    if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path) continue;
    int rc = nf__mon_read(path, &v[n]);
    if (rc == 0) n++;
    else if (rc == 1) {
      if (dead) (*dead)++;
      if (clean) unlink(path);
    }
  }
  closedir(d);
  if (n) qsort(v, (size_t)n, sizeof *v, entry_cmp);
  *out = v;
  return n;
}
