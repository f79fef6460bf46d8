// Live monitor (src/monitor.c): the shared-memory file's lifetime and mode,
// its values against nf_stats_get, a reader racing a writer (named *threads*
// so that CI's TSan stage runs it), and dead-process detection and cleaning.
// Every test points NOFRAG_SHM_DIR at its own temporary directory.
#include "nf_test.h"
#include "observe/observe.h"

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

static char dir[64];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/nf_mon_XXXXXX");
  if (!mkdtemp(dir)) return -1;
  setenv("NOFRAG_SHM_DIR", dir, 1);
  setenv("NOFRAG_QUIET_OOM", "1", 1); // the OOMs here are deliberate
  unsetenv("NOFRAG_MONITOR");
  return 0;
}

// Removes whatever a failed test left, then the directory.
static int teardown(void **state) {
  (void)state;
  DIR *d = opendir(dir);
  struct dirent *de;
  char path[512];
  while (d && (de = readdir(d)))
    if (de->d_name[0] != '.' && snprintf(path, sizeof path, "%s/%s", dir, de->d_name) < (int)sizeof path &&
        unlink(path) != 0)
      rmdir(path); // test_special_files_skipped's directory
  if (d) closedir(d);
  rmdir(dir);
  return 0;
}

// Names of the files in dir (up to 8), returns the count.
static int list_files(char names[8][256]) {
  int n = 0;
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *de;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.' && n < 8) snprintf(names[n++], 256, "%s", de->d_name);
  closedir(d);
  return n;
}

static nf_pool_t *new_pool(uint64_t limit) {
  nf_pool_t *p = NULL;
  char conf[64];
  snprintf(conf, sizeof conf, "limit:%llu,granule:64KiB", (unsigned long long)limit);
  assert_int_equal(nf_pool_create_from_string(&p, conf), NF_OK);
  return p;
}

static void test_file_lifecycle(void **state) {
  (void)state;
  char names[8][256];
  nf_pool_t *p = new_pool(64 * NF_MiB);
  assert_int_equal(list_files(names), 1);
  char prefix[64];
  snprintf(prefix, sizeof prefix, "nofrag.%u.%d.", (unsigned)getuid(), (int)getpid());
  assert_memory_equal(names[0], prefix, strlen(prefix));
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, names[0]);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal(sb.st_mode & 07777, 0600); // readable by the owning user only
  nf_mon_entry_t e;
  assert_int_equal(nf__mon_read(path, &e), 0);
  assert_int_equal(e.pid, getpid());
  assert_string_equal(e.device, "host");
  assert_int_equal(e.v[NF_PUB_LIMIT], 64 * NF_MiB);
  nf_pool_destroy(p);
  assert_int_equal(list_files(names), 0);

  setenv("NOFRAG_MONITOR", "0", 1); // off: no file
  p = new_pool(64 * NF_MiB);
  assert_int_equal(list_files(names), 0);
  nf_pool_destroy(p);
  unsetenv("NOFRAG_MONITOR");

  // A process that exits without destroying its pool: the atexit handler
  // removes the file.
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    nf_pool_t *q = NULL;
    if (nf_pool_create_from_string(&q, "limit:64MiB") != NF_OK || !nf_alloc(q, 4096, NULL)) _exit(3);
    exit(list_files(names) == 1 ? 0 : 4);
  }
  int ws = 0;
  assert_int_equal(waitpid(child, &ws, 0), child);
  assert_true(WIFEXITED(ws));
  assert_int_equal(WEXITSTATUS(ws), 0);
  assert_int_equal(list_files(names), 0);

  // A fork()ed child that uses, then destroys its copy of the parent's pool:
  // the file is the parent's (its pid in the name), stays until the parent's
  // destroy, and does not count the child's allocations (they are not the
  // parent's: the child's copy publishes into memory of its own).
  p = new_pool(64 * NF_MiB);
  assert_int_equal(nf_free(p, nf_alloc(p, 4096, NULL)), NF_OK); // a mapped range the child can use
  assert_int_equal(list_files(names), 1);
  snprintf(path, sizeof path, "%s/%s", dir, names[0]);
  assert_int_equal(nf__mon_read(path, &e), 0);
  uint64_t allocs = e.v[NF_PUB_ALLOCS];
  child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    void *b = nf_alloc(p, 4096, NULL);
    if (!b || nf_free(p, b) != NF_OK) _exit(6);
    if (nf__mon_read(path, &e) != 0 || e.v[NF_PUB_ALLOCS] != allocs) _exit(7);
    nf_pool_destroy(p);
    _exit(list_files(names) == 1 ? 0 : 5);
  }
  assert_int_equal(waitpid(child, &ws, 0), child);
  assert_true(WIFEXITED(ws));
  assert_int_equal(WEXITSTATUS(ws), 0);
  assert_int_equal(list_files(names), 1);
  assert_int_equal(nf__mon_read(path, &e), 0);
  assert_int_equal(e.v[NF_PUB_ALLOCS], allocs);
  nf_pool_destroy(p);
  assert_int_equal(list_files(names), 0);
}

static void check_match(nf_pool_t *p, bool all) {
  nf_mon_entry_t *v;
  long dead = -1;
  assert_int_equal(nf__mon_list(NULL, false, &v, &dead), 1);
  assert_int_equal(dead, 0);
  nf_stats_t s;
  nf_stats_get(p, &s);
  assert_int_equal(v[0].v[NF_PUB_LIVE], s.live);
  assert_int_equal(v[0].v[NF_PUB_LIVE_PEAK], s.live_peak);
  assert_int_equal(v[0].v[NF_PUB_ALLOCS], s.allocs);
  assert_int_equal(v[0].v[NF_PUB_FREES], s.frees);
  assert_int_equal(v[0].v[NF_PUB_MAPPED], s.mapped);
  assert_int_equal(v[0].v[NF_PUB_PHYSICAL], s.physical);
  assert_int_equal(v[0].v[NF_PUB_LIMIT], s.limit);
  assert_int_equal(v[0].v[NF_PUB_GRANULE], s.granule);
  assert_int_equal(v[0].v[NF_PUB_OOMS], s.ooms);
  assert_int_equal(v[0].v[NF_PUB_SPILLED], 0);
  assert_int_equal(v[0].v[NF_PUB_OFFLOADED], s.offloaded);
  assert_true(v[0].v[NF_PUB_LARGEST_FREE] <= s.mapped);
  assert_true(v[0].fragmentation >= 0.0 && v[0].fragmentation <= 1.0);
  if (all) { // after a slow path (trim): the slow-path fields too
    assert_int_equal(v[0].v[NF_PUB_RECLAIMS], s.reclaims);
    assert_int_equal(v[0].v[NF_PUB_BACKEND_CALLS], s.backend_calls);
    assert_int_equal(v[0].v[NF_PUB_LARGEST_FREE], s.largest_free_mapped);
  }
  free(v);
}

static void test_values_match_stats(void **state) {
  (void)state;
  nf_pool_t *p = new_pool(32 * NF_MiB);
  uint64_t seed = nft_env_seed(42);
  void *blk[64] = {0};
  for (int i = 0; i < 20000; i++) { // random sizes under a tight limit: maps, stitches, OOMs
    int k = (int)(nft_rand(&seed) % 64);
    if (blk[k]) { assert_int_equal(nf_free(p, blk[k]), NF_OK); blk[k] = NULL; }
    else blk[k] = nf_alloc(p, 512 + nft_rand(&seed) % (2 * NF_MiB), NULL);
    if (i % 5000 == 4999) check_match(p, false);
  }
  assert_null(nf_alloc(p, 64 * NF_MiB, NULL)); // over the limit: an OOM is published at once
  check_match(p, false);
  for (int k = 0; k < 64; k++) nf_free(p, blk[k]);
  usleep(110000); // past the largest-free walk's rate limit
  assert_int_equal(nf_trim(p), NF_OK);
  check_match(p, true);
  nf_pool_destroy(p);
}

// An idle pool publishes its largest free mapped range: three allocations
// right after creation (within the walk's rate limit) left `nofrag top`
// showing LARGEST 0B while nf_stats said 3 MiB.
static void test_largest_free_idle(void **state) {
  (void)state;
  nf_pool_t *p = NULL;
  assert_int_equal(nf_pool_create_from_string(&p, "limit:1GiB"), NF_OK);
  void *keep[3] = {nf_alloc(p, 10000000, NULL), nf_alloc(p, 2000000, NULL), nf_alloc(p, 345678, NULL)};
  assert_true(keep[0] && keep[1] && keep[2]);
  nf_mon_entry_t *v = NULL;
  long dead = 0;
  assert_int_equal(nf__mon_list(NULL, false, &v, &dead), 1); // read before anything else walks
  uint64_t published = v[0].v[NF_PUB_LARGEST_FREE];
  free(v);
  nf_stats_t s;
  nf_stats_get(p, &s);
  assert_true(s.largest_free_mapped > 0);
  if (published != s.largest_free_mapped)
    fail_msg("published largest free %llu B, nf_stats %llu B", (unsigned long long)published,
             (unsigned long long)s.largest_free_mapped);
  for (int i = 0; i < 3; i++) nf_free(p, keep[i]);
  nf_pool_destroy(p);
}

// Offloaded bytes are published (both host tiers), and a file written with
// the first layout (fewer fields) is still read, its later fields as 0.
static void test_offloaded_and_old_layout(void **state) {
  (void)state;
  nf_pool_t *p = new_pool(32 * NF_MiB);
  void *a = nf_alloc(p, 4 * NF_MiB, NULL), *b = nf_alloc(p, 4 * NF_MiB, NULL);
  assert_true(a && b);
  assert_int_equal(nf_offload(p, a, NULL, NF_TIER_HOST), NF_OK);
  assert_int_equal(nf_offload(p, b, NULL, NF_TIER_HOST_DETACHED), NF_OK);
  assert_int_equal(nf_offload_wait(p), NF_OK);
  nf_stats_t s;
  nf_stats_get(p, &s);
  assert_true(s.offloaded >= 6 * NF_MiB); // whole 64 KiB granules inside each block
  check_match(p, false);
  char names[8][256], path[512];
  assert_int_equal(list_files(names), 1);
  snprintf(path, sizeof path, "%s/%s", dir, names[0]);
  nf_mon_entry_t e;
  assert_int_equal(nf__mon_read(path, &e), 0);
  assert_int_equal(e.v[NF_PUB_OFFLOADED], s.offloaded);
  // The same file cut to the first layout, as an older library wrote it.
  size_t v1 = offsetof(nf_mon_shm_t, pub.v) + NF_PUB_V1_FIELDS * sizeof(uint64_t);
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  char buf[sizeof(nf_mon_shm_t)];
  assert_int_equal(read(fd, buf, sizeof buf), (ssize_t)sizeof buf);
  close(fd);
  ((nf_mon_shm_t *)buf)->size = (uint32_t)v1;
  ((nf_mon_shm_t *)buf)->flags = 0; // nor did it take the liveness lock
  char old[600];
  snprintf(old, sizeof old, "%s/old-layout", dir);
  fd = open(old, O_CREAT | O_WRONLY | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, buf, v1), (ssize_t)v1);
  close(fd);
  assert_int_equal(nf__mon_read(old, &e), 0);
  assert_int_equal(e.v[NF_PUB_LIVE], s.live);
  assert_int_equal(e.v[NF_PUB_OFFLOADED], 0);
  // Shorter than the first layout: refused.
  assert_int_equal(truncate(old, (off_t)v1 - 8), 0);
  assert_int_equal(nf__mon_read(old, &e), -1);
  unlink(old);
  assert_int_equal(nf_prefetch(p, a, NULL), NF_OK);
  assert_int_equal(nf_prefetch(p, b, NULL), NF_OK);
  nf_free(p, a);
  nf_free(p, b);
  nf_pool_destroy(p);
}

// Freeing an offloaded block changes the tier counters (offloaded, spilled,
// away) without a mapping change: the plain free's publish must carry them,
// else top shows the freed block as offloaded (and, for a block whose range
// was unmapped, 100% fragmentation) until some later slow path. The monitor
// is read before nf_stats_get, which may publish itself.
static void test_tier_counters_after_free(void **state) {
  (void)state;
  const nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED, NF_TIER_DISK};
  for (size_t t = 0; t < 3; t++) {
    nf_pool_t *p = new_pool(64 * NF_MiB);
    void *a = nf_alloc(p, 8 * NF_MiB, NULL), *b = nf_alloc(p, NF_MiB, NULL);
    assert_true(a && b);
    assert_int_equal(nf_offload(p, a, NULL, tiers[t]), NF_OK);
    assert_int_equal(nf_offload_wait(p), NF_OK);
    assert_int_equal(nf_free(p, a), NF_OK);
    nf_mon_entry_t *v;
    assert_int_equal(nf__mon_list(NULL, false, &v, NULL), 1);
    nf_stats_t s;
    nf_stats_get(p, &s);
    assert_int_equal(v[0].v[NF_PUB_LIVE], s.live);
    assert_int_equal(v[0].v[NF_PUB_MAPPED], s.mapped);
    assert_int_equal(v[0].v[NF_PUB_OFFLOADED], s.offloaded);
    assert_int_equal(v[0].v[NF_PUB_SPILLED], s.spilled);
    assert_int_equal(v[0].v[NF_PUB_AWAY], 0); // nothing live is away
    double frag = 1.0 - (double)s.live / (double)s.mapped;
    if (v[0].fragmentation < frag - 1e-9 || v[0].fragmentation > frag + 1e-9)
      fail_msg("tier %d: fragmentation %.3f, expected %.3f", (int)tiers[t], v[0].fragmentation, frag);
    free(v);
    assert_int_equal(nf_free(p, b), NF_OK);
    nf_pool_destroy(p);
  }
}

// ------------------------------------------------------------------ race

#define RACE_SIZE 4096
typedef struct race_s {
  nf_pool_t *p;
  char path[512];
  atomic_int stop;
  long reads, torn;
} race_t;

// Writer: 1..4 live blocks of one size, so live == (allocs - frees) x size
// in every consistent snapshot; trims now and then so that full publishes
// (mapping changes) race the reader too.
static void *writer(void *arg) {
  race_t *r = arg;
  void *b[4] = {0};
  uint64_t seed = 7;
  for (long i = 0; !atomic_load(&r->stop); i++) {
    int k = (int)(nft_rand(&seed) & 3);
    if (b[k]) { nf_free(r->p, b[k]); b[k] = NULL; }
    else b[k] = nf_alloc(r->p, RACE_SIZE, NULL);
    if (i % 1000 == 999) nf_trim(r->p);
  }
  for (int k = 0; k < 4; k++) nf_free(r->p, b[k]);
  return NULL;
}

static void test_reader_races_writer(void **state) {
  (void)state;
  race_t r = {.p = new_pool(64 * NF_MiB)};
  char names[8][256];
  assert_int_equal(list_files(names), 1);
  snprintf(r.path, sizeof r.path, "%s/%s", dir, names[0]);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, writer, &r), 0);
  uint64_t last_allocs = 0;
  for (long i = 0; i < 20000; i++) {
    nf_mon_entry_t e;
    assert_int_equal(nf__mon_read(r.path, &e), 0);
    const uint64_t *v = e.v;
    bool ok = v[NF_PUB_ALLOCS] >= v[NF_PUB_FREES] && v[NF_PUB_ALLOCS] - v[NF_PUB_FREES] <= 4 &&
              v[NF_PUB_LIVE] == (v[NF_PUB_ALLOCS] - v[NF_PUB_FREES]) * RACE_SIZE &&
              v[NF_PUB_LIVE] <= v[NF_PUB_LIVE_PEAK] && v[NF_PUB_LIVE] <= v[NF_PUB_MAPPED] &&
              v[NF_PUB_MAPPED] <= v[NF_PUB_PHYSICAL] && v[NF_PUB_ALLOCS] >= last_allocs;
    if (!ok) {
      print_error("torn: live %llu peak %llu allocs %llu frees %llu mapped %llu physical %llu\n",
                  (unsigned long long)v[NF_PUB_LIVE], (unsigned long long)v[NF_PUB_LIVE_PEAK],
                  (unsigned long long)v[NF_PUB_ALLOCS], (unsigned long long)v[NF_PUB_FREES],
                  (unsigned long long)v[NF_PUB_MAPPED], (unsigned long long)v[NF_PUB_PHYSICAL]);
      r.torn++;
    }
    last_allocs = v[NF_PUB_ALLOCS];
    r.reads++;
  }
  atomic_store(&r.stop, 1);
  pthread_join(t, NULL);
  assert_int_equal(r.torn, 0);
  nf_mon_entry_t e;
  assert_int_equal(nf__mon_read(r.path, &e), 0);
  assert_true(e.v[NF_PUB_ALLOCS] > 100); // the writer did run concurrently
  nf_pool_destroy(r.p);
}

// ------------------------------------------------------------------ dead

// A monitor file as a writer of this version would leave it, for process
// `pid` started at `start_ns` (0: unknown), with `device` as its name.
static void fake_file(const char *path, int mode, int32_t pid, uint64_t start_ns, const char *device) {
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL, mode);
  assert_true(fd >= 0);
  nf_mon_shm_t m;
  memset(&m, 0, sizeof m);
  m.magic = NF_MON_MAGIC;
  m.version = NF_MON_VERSION;
  m.size = sizeof m;
  m.pid = pid;
  m.start_ns = start_ns;
  if (device) snprintf(m.device, sizeof m.device, "%s", device);
  assert_int_equal(write(fd, &m, sizeof m), (ssize_t)sizeof m);
  close(fd);
}

static void test_dead_process_ignored_and_cleaned(void **state) {
  (void)state;
  pid_t child = fork(); // a pid that is certainly dead once reaped
  assert_true(child >= 0);
  if (child == 0) _exit(0);
  assert_int_equal(waitpid(child, NULL, 0), child);
  char path[512];
  snprintf(path, sizeof path, "%s/nofrag.%u.%d.0", dir, (unsigned)getuid(), (int)child);
  fake_file(path, 0600, (int32_t)child, 0, "host");
  char junk[512]; // not a monitor file: skipped, never removed
  snprintf(junk, sizeof junk, "%s/nofrag.junk", dir);
  FILE *f = fopen(junk, "w");
  assert_non_null(f);
  fputs("hello", f);
  fclose(f);
  nf_pool_t *p = new_pool(64 * NF_MiB); // one live pool beside them
  nf_mon_entry_t e, *v;
  assert_int_equal(nf__mon_read(path, &e), 1);
  // A live pid that started after the file was written: a reused pid, so the
  // file is stale too (written for our own pid, dated 1970).
  char reused[512];
  snprintf(reused, sizeof reused, "%s/nofrag.%u.%d.99", dir, (unsigned)getuid(), (int)getpid());
  fake_file(reused, 0600, (int32_t)getpid(), 1000000000ull, "host");
  assert_int_equal(nf__mon_read(reused, &e), 1);
  assert_int_equal(unlink(reused), 0);
  long dead = 0;
  assert_int_equal(nf__mon_list(NULL, false, &v, &dead), 1);
  assert_int_equal(v[0].pid, getpid());
  assert_int_equal(dead, 1);
  free(v);
  assert_int_equal(access(path, F_OK), 0); // not cleaned without the flag
  assert_int_equal(nf__mon_list(NULL, true, &v, &dead), 1);
  assert_int_equal(dead, 1);
  free(v);
  assert_int_equal(access(path, F_OK), -1);
  assert_int_equal(access(junk, F_OK), 0);
  assert_int_equal(nf__mon_list(NULL, true, &v, &dead), 1);
  assert_int_equal(dead, 0);
  free(v);
  nf_pool_destroy(p);
}

// A dead process's pid now held by another user's process: kill(pid, 0)
// fails with EPERM, and the pid must still be checked for reuse (the file,
// dated 1970, is older than that process) instead of the file being taken
// for a live pool. Pid 1 belongs to root; when the test runs as root the
// reading is done by a child that has dropped to user nobody.
static void test_reused_pid_of_other_user(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/nofrag.%u.1.0", dir, (unsigned)getuid());
  fake_file(path, 0644, 1, 1000000000ull, "host");
  assert_int_equal(chmod(dir, 0755), 0);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(2);
    if (kill(1, 0) == 0 || errno != EPERM) _exit(5); // the case under test needs EPERM
    nf_mon_entry_t e, *v;
    long dead = -1;
    if (nf__mon_read(path, &e) != 1) _exit(3);
    if (nf__mon_list(NULL, false, &v, &dead) != 0 || dead != 1) _exit(4);
    free(v);
    _exit(0);
  }
  int ws = 0;
  assert_int_equal(waitpid(child, &ws, 0), child);
  assert_true(WIFEXITED(ws));
  if (WEXITSTATUS(ws) == 2 || WEXITSTATUS(ws) == 5) skip(); // no user to drop to / no EPERM here
  assert_int_equal(WEXITSTATUS(ws), 0);
  unlink(path);
}

// The device name comes from a file anyone can write and nofrag top prints it
// as is in its table: control bytes (a terminal escape) must not get through.
static void test_device_name_sanitized(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/nofrag.%u.%d.77", dir, (unsigned)getuid(), (int)getpid());
  struct timespec t; // alive, and the file is newer than this process
  clock_gettime(CLOCK_REALTIME, &t);
  fake_file(path, 0600, (int32_t)getpid(), (uint64_t)t.tv_sec * 1000000000ull,
            "\033[2J\033]0;x\007cuda:\2330\177");
  nf_mon_entry_t e;
  assert_int_equal(nf__mon_read(path, &e), 0);
  for (const char *c = e.device; *c; c++)
    if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
      fail_msg("control byte 0x%02x in '%s'", (unsigned char)*c, e.device);
  assert_non_null(strstr(e.device, "cuda:"));
  unlink(path);
}

// Anyone can write a file under a monitor name and truncate it while
// nofrag top reads it: reading must not fault (a mapping read past the end
// of a truncated file is SIGBUS, which killed top). A child truncates and
// restores the file as fast as it can while this process reads it.
static void test_truncated_while_read(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/nofrag.%u.%d.78", dir, (unsigned)getuid(), (int)getpid());
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  fake_file(path, 0600, (int32_t)getpid(), (uint64_t)t.tv_sec * 1000000000ull, "host");
  nf_mon_shm_t m;
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  assert_int_equal(pread(fd, &m, sizeof m, 0), (ssize_t)sizeof m);
  pid_t parent = getpid(), child = fork();
  assert_true(child >= 0);
  if (child == 0) { // bounded, and gone with its parent (a fault in the parent skips the kill below)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (long i = 0; i < 5000000 && getppid() == parent; i++)
      if (ftruncate(fd, 0) != 0 || pwrite(fd, &m, sizeof m, 0) != (ssize_t)sizeof m) _exit(2);
    _exit(0);
  }
  int ok = 0, refused = 0;
  for (int i = 0; i < 20000; i++) {
    nf_mon_entry_t e;
    int rc = nf__mon_read(path, &e);
    if (rc == 0) ok++;
    else if (rc == -1) refused++;
    else fail_msg("read %d: rc %d", i, rc);
  }
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  close(fd);
  unlink(path);
  assert_true(ok > 0); // whole copies are read; the rest refused as too short
  (void)refused;
}

// ------------------------------------------------------------------ liveness

// A child process with a published pool (one 4 KiB block). HOLD: it waits for
// EOF on the pipe *in, then exits (atexit removes its file); EXEC: it execs
// cat reading that pipe (same pid and start time, its pools gone); FORK_EXEC:
// the same, after forking a grandchild that uses its copy of the pool and
// waits on the pipe too. Returns once all that is done; close *in to end them.
enum { HOLD, EXEC, FORK_EXEC };
static pid_t pool_child(int mode, int *in) {
  int ready[2], cin[2]; // ready: O_CLOEXEC, so that its EOF says the exec is done
  assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
  assert_int_equal(pipe2(cin, O_CLOEXEC), 0);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    close(ready[0]);
    close(cin[1]);
    nf_pool_t *p = NULL;
    char c;
    if (nf_pool_create_from_string(&p, "limit:64MiB") != NF_OK || !nf_alloc(p, 4096, NULL)) _exit(3);
    if (mode == FORK_EXEC) {
      pid_t g = fork();
      if (g < 0) _exit(4);
      if (g == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); // gone with cat
        if (!nf_alloc(p, 8192, NULL) || write(ready[1], "g", 1) != 1) _exit(5);
        close(ready[1]);
        while (read(cin[0], &c, 1) > 0) {}
        _exit(0);
      }
    }
    if (write(ready[1], "p", 1) != 1) _exit(6);
    if (mode == HOLD) {
      close(ready[1]);
      while (read(cin[0], &c, 1) > 0) {}
      exit(0);
    }
    dup2(cin[0], 0);
    execl("/bin/cat", "cat", (char *)NULL);
    _exit(7);
  }
  close(ready[1]);
  close(cin[0]);
  char buf[4];
  ssize_t n, got = 0;
  while ((n = read(ready[0], buf + got, sizeof buf - (size_t)got)) > 0) got += n;
  close(ready[0]);
  assert_int_equal(got, mode == FORK_EXEC ? 2 : 1);
  *in = cin[1];
  return child;
}

// Ends a pool_child (closes its pipe) and checks that it exited with 0.
static void end_child(pid_t child, int in) {
  close(in);
  int ws = 0;
  assert_int_equal(waitpid(child, &ws, 0), child);
  assert_true(WIFEXITED(ws));
  assert_int_equal(WEXITSTATUS(ws), 0);
}

// A process that exec()s keeps its pid and start time but not its pools: its
// file must read as dead and be cleaned, not be shown live with frozen
// figures forever. FORK_EXEC: a grandchild forked after the pool lives on
// (its copy of the pool in use) and must not keep the file alive.
static void test_exec_leaves_dead(void **state) {
  (void)state;
  for (int mode = EXEC; mode <= FORK_EXEC; mode++) {
    int in;
    pid_t child = pool_child(mode, &in);
    char names[8][256], path[512];
    assert_int_equal(list_files(names), 1);
    snprintf(path, sizeof path, "%s/%s", dir, names[0]);
    assert_int_equal(kill(child, 0), 0); // alive, as cat
    // The exec lets go of the old image's files as it returns to user space,
    // in no set order: the pipe's EOF may come a moment before.
    nf_mon_entry_t e, *v;
    int rc = 0;
    for (int i = 0; i < 500 && (rc = nf__mon_read(path, &e)) == 0; i++) usleep(10000);
    if (rc != 1) fail_msg("mode %d: the exec'd process's pool reads live", mode);
    long dead = -1;
    assert_int_equal(nf__mon_list(NULL, false, &v, &dead), 0);
    free(v);
    assert_int_equal(dead, 1);
    assert_int_equal(nf__mon_list(NULL, true, &v, &dead), 0);
    free(v);
    assert_int_equal(dead, 1);
    assert_int_equal(list_files(names), 0);
    end_child(child, in);
  }
}

// The normal cases beside it: another process's pool reads live (its pid, its
// figures) and its file goes at its exit; a killed one reads dead at once,
// even as a zombie not yet reaped (kill(pid, 0) still finds the pid).
static void test_other_process_live_then_killed(void **state) {
  (void)state;
  int in;
  pid_t child = pool_child(HOLD, &in);
  char names[8][256], path[512];
  assert_int_equal(list_files(names), 1);
  snprintf(path, sizeof path, "%s/%s", dir, names[0]);
  nf_mon_entry_t e;
  assert_int_equal(nf__mon_read(path, &e), 0);
  assert_int_equal(e.pid, child);
  assert_int_equal(e.v[NF_PUB_ALLOCS], 1);
  end_child(child, in);
  assert_int_equal(list_files(names), 0);

  child = pool_child(HOLD, &in);
  assert_int_equal(list_files(names), 1);
  snprintf(path, sizeof path, "%s/%s", dir, names[0]);
  assert_int_equal(nf__mon_read(path, &e), 0);
  assert_int_equal(kill(child, SIGKILL), 0);
  siginfo_t si;
  assert_int_equal(waitid(P_PID, (id_t)child, &si, WEXITED | WNOWAIT), 0);
  assert_int_equal(kill(child, 0), 0); // a zombie
  if (nf__mon_read(path, &e) != 1) fail_msg("a killed process's pool reads live while it is a zombie");
  assert_int_equal(waitpid(child, NULL, 0), child);
  assert_int_equal(nf__mon_read(path, &e), 1);
  close(in);
  unlink(path);
}

// The reader trusts the lock only in files whose writer says it takes one:
// a file of an older library (flags 0) is never locked and, its process
// alive, must not read as dead; one flagged NF_MON_LOCKED reads live exactly
// while someone holds a lock on it, even with a pid that is dead here (a
// writer in another pid namespace that shares the directory).
static void test_lock_flag(void **state) {
  (void)state;
  pid_t gone = fork();
  assert_true(gone >= 0);
  if (gone == 0) _exit(0);
  assert_int_equal(waitpid(gone, NULL, 0), gone);
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  const pid_t pids[2] = {getpid(), gone};
  for (int i = 0; i < 2; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/nofrag.%u.%d.79", dir, (unsigned)getuid(), (int)pids[i]);
    fake_file(path, 0600, (int32_t)pids[i], (uint64_t)t.tv_sec * 1000000000ull, "host");
    nf_mon_entry_t e;
    assert_int_equal(nf__mon_read(path, &e), i == 0 ? 0 : 1); // unflagged: the pid decides
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint32_t flags = NF_MON_LOCKED;
    assert_int_equal(pwrite(fd, &flags, sizeof flags, offsetof(nf_mon_shm_t, flags)), (ssize_t)sizeof flags);
    assert_int_equal(nf__mon_read(path, &e), 1);
    struct flock l = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
    assert_int_equal(fcntl(fd, F_OFD_SETLK, &l), 0);
    assert_int_equal(nf__mon_read(path, &e), 0);
    assert_int_equal(nf__mon_read(path, &e), 0); // the reader took no lock of its own
    close(fd);
    assert_int_equal(nf__mon_read(path, &e), 1);
    unlink(path);
  }
}

// --clean in a sticky directory (/dev/shm) cannot remove another user's
// file of a dead process: it must not count it as removed (nofrag top prints
// "removed N files"). Needs root to make a file of another user; the listing
// runs as user nobody.
static void test_clean_counts_removed_only(void **state) {
  (void)state;
  if (geteuid() != 0) skip();
  pid_t dead = fork();
  assert_true(dead >= 0);
  if (dead == 0) _exit(0);
  assert_int_equal(waitpid(dead, NULL, 0), dead);
  char path[512];
  snprintf(path, sizeof path, "%s/nofrag.0.%d.0", dir, (int)dead);
  fake_file(path, 0644, (int32_t)dead, 0, NULL); // root's, readable by all
  assert_int_equal(chmod(dir, 01777), 0);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    nf_mon_entry_t *v;
    long n = -1;
    if (nf__mon_list(NULL, true, &v, &n) != 0) _exit(3);
    free(v);
    _exit(n == 0 ? 0 : 4);
  }
  int ws = 0;
  assert_int_equal(waitpid(child, &ws, 0), child);
  assert_true(WIFEXITED(ws));
  if (WEXITSTATUS(ws) == 2) skip();
  assert_int_equal(WEXITSTATUS(ws), 0);
  assert_int_equal(access(path, F_OK), 0); // still there
  long n = -1;
  nf_mon_entry_t *v;
  assert_int_equal(nf__mon_list(NULL, true, &v, &n), 0); // its owner (root) can
  free(v);
  assert_int_equal(n, 1);
  assert_int_equal(access(path, F_OK), -1);
}

// Files of other kinds under a monitor-like name (any user may create them in
// /dev/shm): a FIFO must not block the reader (open waits for a writer), a
// directory must not be taken for a pool. The listing runs in a child with an
// alarm so that a hang fails the test instead of stalling it.
static void test_special_files_skipped(void **state) {
  (void)state;
  char fifo[512], sub[512];
  snprintf(fifo, sizeof fifo, "%s/nofrag.%u.1.0", dir, (unsigned)getuid());
  snprintf(sub, sizeof sub, "%s/nofrag.dir", dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(mkdir(sub, 0700), 0);
  nf_pool_t *p = new_pool(64 * NF_MiB);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    alarm(20);
    nf_mon_entry_t e, *v;
    long dead = -1;
    if (nf__mon_read(fifo, &e) != -1) _exit(3);
    if (nf__mon_list(NULL, true, &v, &dead) != 1 || dead != 0 || v[0].pid != getppid()) _exit(4);
    free(v);
    _exit(0);
  }
  int ws = 0;
  assert_int_equal(waitpid(child, &ws, 0), child);
  if (!WIFEXITED(ws)) fail_msg("the reader was killed by signal %d (blocked on the FIFO)", WTERMSIG(ws));
  assert_int_equal(WEXITSTATUS(ws), 0);
  assert_int_equal(access(fifo, F_OK), 0); // not a monitor file: never removed
  nf_pool_destroy(p);
  unlink(fifo);
  rmdir(sub);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_file_lifecycle, setup, teardown),
      cmocka_unit_test_setup_teardown(test_values_match_stats, setup, teardown),
      cmocka_unit_test_setup_teardown(test_largest_free_idle, setup, teardown),
      cmocka_unit_test_setup_teardown(test_offloaded_and_old_layout, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tier_counters_after_free, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reader_races_writer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dead_process_ignored_and_cleaned, setup, teardown),
      cmocka_unit_test_setup_teardown(test_special_files_skipped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_device_name_sanitized, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated_while_read, setup, teardown),
      cmocka_unit_test_setup_teardown(test_clean_counts_removed_only, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reused_pid_of_other_user, setup, teardown),
      cmocka_unit_test_setup_teardown(test_exec_leaves_dead, setup, teardown),
      cmocka_unit_test_setup_teardown(test_other_process_live_then_killed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lock_flag, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
