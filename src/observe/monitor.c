// Live monitor: each pool publishes its counters to a small shared-memory
// file that `nofrag top` (tools/top.c) reads from another process. The layout
// is monitor_shm.h; the core writes the counters into it (core/publish.h)
// once it is handed the buffer (p->pub). This file creates and removes the
// files, and reads them (with pread: writers map their file, readers never
// do, so a file truncated by whoever owns it cannot fault the reader).
//
// Lifetime: created at pool creation (unless NOFRAG_MONITOR=0), removed at
// nf_pool_destroy and, for pools never destroyed, by an atexit handler. A
// process that dies without exiting, or exec()s, leaves its files behind:
// readers find them dead (a dead pid, or the liveness lock of monitor_shm.h
// released with the writer's mapping) and skip them; `nofrag top --clean`
// removes them.
//
// The lock is held by the mapping, not by a kept fd: an OFD lock belongs to
// the open file description, which lives on (the fd closed) as long as a
// mapping of it does, and goes with the last one: munmap, exec, exit, crash.
// No fd per pool, and none that the application could close under us.
#include "observe/observe.h"

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
// Files this process created and has not removed yet, for the atexit handler
// and fork(). A fork()ed child inherits the list; entries carry the creating
// pid so that the child's exit does not remove its parent's files. An entry
// is in the list for as long as its file is mapped (reg_mu held from the open
// to the insertion, and from the removal to the munmap), so that the fork
// handler knows every mapping.
typedef struct mon_reg_s {
  struct mon_reg_s *next;
  nf_mon_shm_t *m;
  nf_pool_t *pool;
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

// fork(): the child's copies of the pools would keep the parent's files
// mapped, holding their liveness locks past the parent's exec (a phantom live
// pool for as long as the child runs), and publish the child's figures into
// the parent's files. The child's mappings are replaced with private copies
// at the same address: its pools publish where nobody reads. reg_mu is held
// across the fork so that no mapping is half-registered.
static void mon_prefork(void) { pthread_mutex_lock(&reg_mu); }
static void mon_postfork_parent(void) { pthread_mutex_unlock(&reg_mu); }
static void mon_postfork_child(void) {
  for (mon_reg_t **pp = &reg_head, *r; (r = *pp);) {
    unsigned char keep[sizeof(nf_mon_shm_t)];
    memcpy(keep, r->m, sizeof keep);
    if (mmap(r->m, sizeof keep, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
        MAP_FAILED) {
      memcpy(r->m, keep, sizeof keep);
      pp = &r->next;
    } else { // the range may be gone: that pool's copy stops publishing
      r->pool->pub = NULL;
      *pp = r->next;
      free(r);
    }
  }
  pthread_mutex_unlock(&reg_mu);
}

static void reg_init(void) {
  atexit(mon_atexit);
  pthread_atfork(mon_prefork, mon_postfork_parent, mon_postfork_child);
}

const char *nf__mon_dir(void) {
  const char *d = getenv("NOFRAG_SHM_DIR");
  return d && *d ? d : "/dev/shm";
}

// The name guard's byte (monitor_shm.h), to lock as `type`.
static struct flock guard(short type) {
  return (struct flock){.l_type = type, .l_whence = SEEK_SET, .l_start = NF_MON_GUARD_AT, .l_len = 1};
}

// The liveness lock's range (monitor_shm.h): below the guard byte.
static struct flock liveness(short type) {
  return (struct flock){.l_type = type, .l_whence = SEEK_SET, .l_len = NF_MON_GUARD_AT};
}

// Removes the stale file under our name before ours is created. A cleaner may
// be about to unlink that file by name (nf__mon_unlink_dead holds its guard
// from its check that the name still names the file to its unlink): wait for
// it, else that unlink would remove our new file. False: the guard stayed held
// for a second (a cleaner stopped mid-way): this pool goes without a file.
static bool unlink_stale(const char *path) {
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  bool ok = true;
  if (fd >= 0) {
    struct flock g = guard(F_WRLCK);
    struct timespec t0, t, nap = {0, 1000000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    // Other errors: no OFD locks here, so no cleaner holds one either.
    while (fcntl(fd, F_OFD_SETLK, &g) != 0 && (errno == EAGAIN || errno == EACCES)) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= 1000) { ok = false; break; }
      nanosleep(&nap, NULL);
    }
  }
  if (ok) unlink(path); // the guard still ours: no cleaner is between its check and its unlink
  if (fd >= 0) close(fd);
  return ok;
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
  // O_EXCL: a stale file of a dead process with our pid (or of this pid
  // before an exec) is replaced, never shared.
  if (!unlink_stale(path)) { free(r); return; }
  bool locked = false;
  pthread_mutex_lock(&reg_mu); // a fork() before the insertion would give the child the fd or mapping
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  void *addr = MAP_FAILED;
  if (fd >= 0 && fchmod(fd, 0600) == 0 && ftruncate(fd, (off_t)sizeof(nf_mon_shm_t)) == 0) {
    // The liveness lock (monitor_shm.h), before the magic is published; if
    // OFD locks are not there, readers judge the file by its pid only.
    struct flock l = liveness(F_RDLCK);
    locked = fcntl(fd, F_OFD_SETLK, &l) == 0;
    addr = mmap(NULL, sizeof(nf_mon_shm_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (fd >= 0) close(fd); // the mapping holds the file, and the lock
  if (addr != MAP_FAILED) {
    r->m = addr;
    r->pool = p;
    r->pid = getpid();
    r->next = reg_head;
    reg_head = r;
  }
  pthread_mutex_unlock(&reg_mu);
  if (addr == MAP_FAILED) { // the monitor is best effort: the pool works without it
    if (fd >= 0) unlink(path);
    free(r);
    return;
  }
  nf_mon_shm_t *m = addr; // zero-filled by ftruncate
  m->flags = locked ? NF_MON_LOCKED : 0;
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
  p->pub = &m->pub;
  nf__pub_full(p);
  // The header is complete: publish the magic last (release) so that readers
  // never trust a half-written header.
  __atomic_store_n(&m->magic, NF_MON_MAGIC, __ATOMIC_RELEASE);
}

void nf__mon_close(nf_pool_t *p) {
  if (!p->pub) return;
  nf_mon_shm_t *m = (nf_mon_shm_t *)((char *)p->pub - offsetof(nf_mon_shm_t, pub));
  p->pub = NULL;
  mon_reg_t *r = NULL;
  pthread_mutex_lock(&reg_mu);
  for (mon_reg_t **pp = &reg_head; *pp; pp = &(*pp)->next)
    if ((*pp)->m == m) { r = *pp; *pp = r->next; break; }
  // A fork()ed child's copy of the pool: the file is the parent's. Removed
  // before the unmap releases the liveness lock: never seen dead while there.
  if (r && r->pid == getpid()) unlink(r->path);
  munmap(m, sizeof *m);
  pthread_mutex_unlock(&reg_mu);
  free(r);
}

// ------------------------------------------------------------------ reader

// The file is read with pread, not mapped: anyone can write a file here, and
// one truncated while it is read would make a load from a mapping SIGBUS
// (nofrag top dies, for whoever runs it). False: short read (truncated).
static bool read_at(int fd, void *buf, size_t n, off_t off) {
  for (size_t done = 0; done < n;) {
    ssize_t r = pread(fd, (char *)buf + done, n - done, off + (off_t)done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += (size_t)r;
  }
  return true;
}

// Seqlock read through the file: seq (s0), then the whole record, then seq
// again (s1), each its own pread; the record holds one write's values when
// s0 == s1 is even. The writer makes seq odd before its first field store and
// even after its last (release stores). seq is read on its own, not taken
// from the record's copy: the kernel copies a record with string moves, whose
// loads may run out of order among themselves (a copy's seq may be newer
// than its fields), but not with the reads before and after it.
static bool mon_snapshot(int fd, size_t len, nf_mon_shm_t *copy, int nfields, nf_mon_entry_t *e) {
  const off_t seq_at = (off_t)offsetof(nf_mon_shm_t, pub.seq);
  for (unsigned tries = 0; tries < 200000; tries++) {
    uint64_t s0, s1;
    if (!read_at(fd, &s0, sizeof s0, seq_at)) return false;
    if (!(s0 & 1)) {
      if (!read_at(fd, copy, len, 0) || !read_at(fd, &s1, sizeof s1, seq_at)) return false;
      if (s1 == s0) {
        for (int i = 0; i < nfields; i++) e->v[i] = atomic_load_explicit(&copy->pub.v[i], memory_order_relaxed);
        return true;
      }
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
  // EPERM: the pid exists but is another user's, perhaps a reuse of it.
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  double started = proc_start(pid);
  return started >= 0 && started > (double)start_ns / 1e9 + 2.0; // btime is whole seconds
}

// The liveness lock of a file flagged NF_MON_LOCKED: 1 held, so its writer
// maps it, whatever its pid means here (a writer in another pid namespace
// sharing the directory: a dead or unrelated pid to us); 0 released, so no
// process maps it any more though its pid may live on (exec, a zombie); -1
// unknown (no OFD locks here: the pid decides). F_OFD_GETLK only tests: two
// readers never see each other's lock.
static int lock_held(int fd) {
  struct flock l = liveness(F_WRLCK); // not the guard
  if (fcntl(fd, F_OFD_GETLK, &l) != 0) return -1;
  return l.l_type != F_UNLCK;
}

// The judgement of a file open on fd, its header read into e.
static bool mon_dead(int fd, const nf_mon_entry_t *e) {
  int held = e->flags & NF_MON_LOCKED ? lock_held(fd) : -1;
  return held == 0 || (held < 0 && pid_dead(e->pid, e->start_ns));
}

int nf__mon_read(const char *path, nf_mon_entry_t *e) { return nf__mon_read_fd(path, e, NULL); }

int nf__mon_read_fd(const char *path, nf_mon_entry_t *e, int *keep) {
  memset(e, 0, sizeof *e);
  snprintf(e->path, sizeof e->path, "%s", path);
  // O_NONBLOCK: anyone can put a FIFO under a monitor name in /dev/shm, and a
  // blocking open of it would wait for a writer forever (fstat rejects it).
  // O_NOFOLLOW: our files are never symlinks; do not open what one names.
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return -1;
  struct stat sb;
  // A file from an older writer may hold fewer fields (NF_PUB_V1_FIELDS at
  // least); one from a newer writer more (ignored).
  const size_t v_at = offsetof(nf_mon_shm_t, pub.v), min = v_at + NF_PUB_V1_FIELDS * sizeof(uint64_t);
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < (off_t)min) {
    close(fd);
    return -1;
  }
  size_t len = (size_t)sb.st_size < sizeof(nf_mon_shm_t) ? (size_t)sb.st_size : sizeof(nf_mon_shm_t);
  nf_mon_shm_t copy;
  memset(&copy, 0, sizeof copy);
  int rc = -1;
  if (read_at(fd, &copy, len, 0) && copy.magic == NF_MON_MAGIC && copy.version == NF_MON_VERSION &&
      copy.size >= min) {
    size_t have = (copy.size < len ? copy.size : len) - v_at;
    int nfields = have / sizeof(uint64_t) < NF_PUB_NFIELDS ? (int)(have / sizeof(uint64_t)) : NF_PUB_NFIELDS;
    e->nfields = nfields;
    e->pid = copy.pid;
    e->uid = copy.uid;
    e->pool_id = copy.pool_id;
    e->start_ns = copy.start_ns;
    e->flags = copy.flags;
    memcpy(e->device, copy.device, sizeof e->device);
    e->device[sizeof e->device - 1] = 0;
    // nofrag top prints it as is, and anyone can write a file here: no
    // control bytes (terminal escapes) get through. Ours are plain ASCII.
    for (char *c = e->device; *c; c++)
      if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f) *c = '?';
    if (mon_dead(fd, e)) rc = 1;
    else if (mon_snapshot(fd, len, &copy, nfields, e)) {
      uint64_t mp = e->v[NF_PUB_MAPPED];
      uint64_t live = e->v[NF_PUB_LIVE], away = e->v[NF_PUB_AWAY], resident = live > away ? live - away : 0;
      e->fragmentation = mp ? 1.0 - (double)resident / (double)mp : 0.0;
      rc = 0;
    }
  }
  if (rc == 1 && keep) *keep = fd;
  else close(fd);
  return rc;
}

// unlink() goes by name, so only while the name still names the file judged:
// fd keeps that file (its inode number cannot go to a new file meanwhile),
// and its guard keeps a writer from replacing it between the check and the
// unlink (unlink_stale). A writer holding the guard is replacing the file:
// it removes it itself. Other lock errors: no OFD locks here, no guard.
bool nf__mon_unlink_dead(int fd, const nf_mon_entry_t *e) {
  struct flock g = guard(F_RDLCK);
  if (fcntl(fd, F_OFD_SETLK, &g) != 0 && (errno == EAGAIN || errno == EACCES)) return false;
  struct stat judged, named;
  bool gone = mon_dead(fd, e) && fstat(fd, &judged) == 0 && lstat(e->path, &named) == 0 &&
              judged.st_dev == named.st_dev && judged.st_ino == named.st_ino && unlink(e->path) == 0;
  g.l_type = F_UNLCK; // the caller's fd may live on
  fcntl(fd, F_OFD_SETLK, &g);
  return gone;
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
    int fd = -1, rc = nf__mon_read_fd(path, &v[n], clean ? &fd : NULL);
    if (rc == 0) n++;
    else if (rc == 1) {
      // With `clean`, count what was removed: another user's file in a
      // sticky directory (/dev/shm) stays, and top says "removed N files".
      bool gone = clean && nf__mon_unlink_dead(fd, &v[n]);
      if (fd >= 0) close(fd);
      if (dead && (gone || !clean)) (*dead)++;
    }
  }
  closedir(d);
  if (n) qsort(v, (size_t)n, sizeof *v, entry_cmp);
  *out = v;
  return n;
}
