// Live monitor (src/observe/monitor.c), the publishing side: the shared-memory
// file's lifetime and mode, its values against nf_stats_get (tier counters,
// largest free range, the first layout's files), and a reader racing a writer
// (CI's TSan stage runs the tests matching "monitor"). What the reader makes
// of a file's contents is in test_monitor_reader.c; which files are live or
// dead, and --clean, in test_monitor_liveness.c.
#include "nf_test.h"
#include "monitor_test.h"
#include "observe/observe.h"

#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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
    assert_int_equal(v[0].v[NF_PUB_BACKEND_NS], s.backend_ns);
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

// An empty NOFRAG_SHM_DIR is unset, not the root directory.
static void test_dir_default(void **state) {
  (void)state;
  setenv("NOFRAG_SHM_DIR", "", 1);
  assert_string_equal(nf__mon_dir(), "/dev/shm");
  setenv("NOFRAG_SHM_DIR", dir, 1);
  assert_string_equal(nf__mon_dir(), dir);
}

// A fork()ed child that exits (atexit handlers run) leaves the parent's file
// alone: the registry's entries are the parent's, not the child's.
static void test_child_exit_keeps_parent_file(void **state) {
  (void)state;
  nf_pool_t *p = new_pool(64 * NF_MiB);
  char names[8][256];
  assert_int_equal(list_files(names), 1);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) exit(0);
  int ws = 0;
  assert_int_equal(waitpid(child, &ws, 0), child);
  assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  assert_int_equal(list_files(names), 1);
  nf_pool_destroy(p);
  assert_int_equal(list_files(names), 0);
}

// A name exactly as long as the path buffer does not fit (its NUL does not):
// the pool goes without a file rather than create one under a cut name (a
// cut pool id can be another pool's name). The directory is nested to make
// "DIR/nofrag.UID.PID.ID" 512 bytes long for the next pool's id.
static void test_name_too_long(void **state) {
  (void)state;
  nf_pool_t *p = new_pool(64 * NF_MiB);
  char names[8][256];
  assert_int_equal(list_files(names), 1);
  unsigned id = (unsigned)strtoul(strrchr(names[0], '.') + 1, NULL, 10) + 1; // pool ids count up in a process
  nf_pool_destroy(p);
  char name[64], deep[600];
  int nl = snprintf(name, sizeof name, "nofrag.%u.%d.%u", (unsigned)getuid(), (int)getpid(), id);
  size_t want = 512 - 1 - (size_t)nl; // the directory's length
  snprintf(deep, sizeof deep, "%s", dir);
  char made[4][600];
  int nmade = 0;
  while (strlen(deep) < want) { // "/" and at most 200 bytes a component, never 1 byte left over
    size_t left = want - strlen(deep), add = left - 1 > 200 ? 200 : left - 1;
    if (left - 1 - add == 1) add--;
    size_t l = strlen(deep);
    deep[l] = '/';
    memset(deep + l + 1, 'd', add);
    deep[l + 1 + add] = 0;
    assert_int_equal(mkdir(deep, 0700), 0);
    assert_true(nmade < 4);
    snprintf(made[nmade++], sizeof made[0], "%s", deep);
  }
  assert_int_equal(strlen(deep) + 1 + (size_t)nl, 512);
  setenv("NOFRAG_SHM_DIR", deep, 1);
  p = new_pool(64 * NF_MiB); // works, without a file
  assert_non_null(nf_alloc(p, 4096, NULL));
  DIR *d = opendir(deep);
  assert_non_null(d);
  struct dirent *de;
  int files = 0;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.') files++;
  closedir(d);
  nf_pool_destroy(p);
  setenv("NOFRAG_SHM_DIR", dir, 1);
  for (int i = nmade - 1; i >= 0; i--) { // remove what a cut name left, then the directories
    d = opendir(made[i]);
    char path[1200];
    while (d && (de = readdir(d)))
      if (de->d_name[0] != '.' && snprintf(path, sizeof path, "%s/%s", made[i], de->d_name) < (int)sizeof path)
        unlink(path);
    if (d) closedir(d);
    rmdir(made[i]);
  }
  assert_int_equal(files, 0);
}

// The largest free range walk is rate-limited (one per 100 ms, plus a burst
// of 3 for mapping changes): a skipped walk keeps the last value and marks
// it stale, and nf_stats_get then publishes a fresh one. Here the burst is
// spent by three mapping allocations (the last one sees a's 1 MiB hole), and
// a fourth mapping allocation skips its walk (unless 100 ms passed: then it
// walks and publishes the fresh value, fine too).
static uint64_t published_largest_free(void) {
  nf_mon_entry_t *v;
  assert_int_equal(nf__mon_list(NULL, false, &v, NULL), 1);
  uint64_t x = v[0].v[NF_PUB_LARGEST_FREE];
  free(v);
  return x;
}

static void test_stale_largest_free_refreshed(void **state) {
  (void)state;
  nf_pool_t *p = new_pool(NF_GiB);
  void *a = nf_alloc(p, NF_MiB, NULL), *b = nf_alloc(p, NF_MiB, NULL);
  assert_true(a && b);
  assert_int_equal(nf_free(p, a), NF_OK);
  void *c = nf_alloc(p, 2 * NF_MiB, NULL); // maps (a's hole is too small): the burst's last walk
  assert_non_null(c);
  uint64_t walked = published_largest_free();
  assert_true(walked >= NF_MiB);
  assert_int_equal(nf_free(p, b), NF_OK); // a's and b's holes: 2 MiB
  void *d = nf_alloc(p, 3 * NF_MiB, NULL);
  assert_non_null(d);
  uint64_t skipped = published_largest_free();
  nf_stats_t s;
  nf_stats_get(p, &s);
  assert_true(s.largest_free_mapped >= 2 * NF_MiB);
  if (skipped != walked && skipped != s.largest_free_mapped) // the last walk's value, or a fresh one
    fail_msg("published largest free %llu B: neither the last walk's %llu B nor the current %llu B",
             (unsigned long long)skipped, (unsigned long long)walked, (unsigned long long)s.largest_free_mapped);
  uint64_t refreshed = published_largest_free();
  if (refreshed != s.largest_free_mapped)
    fail_msg("published largest free %llu B after nf_stats_get, which says %llu B", (unsigned long long)refreshed,
             (unsigned long long)s.largest_free_mapped);
  nf_free(p, c);
  nf_free(p, d);
  nf_pool_destroy(p);
}

// Each 100 ms window has its own burst of walks for mapping changes: after
// an earlier window spent its burst, mapping allocations in a new window
// still publish a fresh value (read before nf_stats_get, which publishes).
static void test_largest_free_burst_per_window(void **state) {
  (void)state;
  nf_pool_t *p = new_pool(NF_GiB);
  void *keep[4];
  for (int i = 0; i < 4; i++) assert_non_null(keep[i] = nf_alloc(p, NF_MiB, NULL)); // the burst, spent
  usleep(150000); // past the rate limit: a new window
  void *x = nf_alloc(p, NF_MiB, NULL), *y = nf_alloc(p, NF_MiB, NULL); // the window's first walks
  assert_true(x && y);
  assert_int_equal(nf_free(p, x), NF_OK); // a 1 MiB hole (y bounds it)
  void *z = nf_alloc(p, 3 * NF_MiB, NULL); // maps: walks, the window's burst not spent
  assert_non_null(z);
  nf_mon_entry_t *v;
  assert_int_equal(nf__mon_list(NULL, false, &v, NULL), 1);
  uint64_t published = v[0].v[NF_PUB_LARGEST_FREE];
  free(v);
  nf_stats_t s;
  nf_stats_get(p, &s);
  assert_true(s.largest_free_mapped >= NF_MiB);
  if (published != s.largest_free_mapped)
    fail_msg("published largest free %llu B, nf_stats %llu B", (unsigned long long)published,
             (unsigned long long)s.largest_free_mapped);
  for (int i = 0; i < 4; i++) nf_free(p, keep[i]);
  nf_free(p, y);
  nf_free(p, z);
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
// is read before nf_stats_get, which may publish itself. Then: spilled's
// peak, the backend calls with the copies, and a peaks reset, published too.
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
    // The freed block's host granules count as spilled until swept: its peak
    // follows (it stayed below spilled).
    assert_true(s.spilled_peak >= s.spilled);
    // Copies count in the monitor's backend calls as in nf_stats_t's (after
    // a slow path: they are published in full there).
    assert_true(s.calls.copy > 0);
    assert_int_equal(nf_trim(p), NF_OK);
    nf_stats_get(p, &s);
    assert_int_equal(nf__mon_list(NULL, false, &v, NULL), 1);
    assert_int_equal(v[0].v[NF_PUB_BACKEND_CALLS], s.backend_calls);
    free(v);
    // Peaks reset: the monitor's too, at once.
    nf_stats_reset_peaks(p);
    nf_stats_get(p, &s);
    assert_int_equal(nf__mon_list(NULL, false, &v, NULL), 1);
    assert_int_equal(v[0].v[NF_PUB_LIVE_PEAK], s.live_peak);
    assert_true(s.live_peak < 8 * NF_MiB);
    free(v);
    assert_int_equal(nf_free(p, b), NF_OK);
    nf_pool_destroy(p);
  }
}

// nf_offload and nf_prefetch move granules between tiers: each call
// publishes the tier counters itself (offloaded, away, mapped), so that top
// does not show a prefetched block as still offloaded until some later slow
// path. The monitor is read right after the call, before nf_stats_get
// (which may publish itself).
static void test_tier_counters_after_prefetch(void **state) {
  (void)state;
  const nf_tier_t tiers[] = {NF_TIER_HOST, NF_TIER_HOST_DETACHED, NF_TIER_DISK};
  for (size_t t = 0; t < 3; t++) {
    nf_pool_t *p = new_pool(64 * NF_MiB);
    void *a = nf_alloc(p, 8 * NF_MiB, NULL);
    assert_non_null(a);
    for (int step = 0; step < 3; step++) { // offload, its finish (wait), prefetch
      nf_status_t r = step == 0 ? nf_offload(p, a, NULL, tiers[t]) : step == 1 ? nf_offload_wait(p) : nf_prefetch(p, a, NULL);
      assert_int_equal(r, NF_OK);
      nf_mon_entry_t *v;
      assert_int_equal(nf__mon_list(NULL, false, &v, NULL), 1);
      nf_stats_t s;
      nf_stats_get(p, &s);
      if (v[0].v[NF_PUB_OFFLOADED] != s.offloaded || v[0].v[NF_PUB_MAPPED] != s.mapped)
        fail_msg("tier %d step %d: published offloaded %llu mapped %llu, stats %llu %llu", (int)tiers[t], step,
                 (unsigned long long)v[0].v[NF_PUB_OFFLOADED], (unsigned long long)v[0].v[NF_PUB_MAPPED],
                 (unsigned long long)s.offloaded, (unsigned long long)s.mapped);
      free(v);
    }
    assert_int_equal(nf_free(p, a), NF_OK);
    nf_pool_destroy(p);
  }
}

// A 65th stream gives back unnamed slots after a device wait and finishes the
// offload copies listed then (stream.c, streams_recycle): the offloaded bytes
// change with no mapping change, so the allocation's publish must carry them,
// else top shows the block as still on the device until some later slow path.
// The monitor is read before nf_stats_get, which may publish itself.
static void test_offloaded_after_stream_recycling(void **state) {
  (void)state;
  nf_backend_t *be;
  nf_pool_t *p = nft_pool(&be, 1024 * 64 * 1024ull, 64 * 1024ull, "limit:1MiB");
  assert_non_null(p);
  nf_backend_host_set_manual_events(be, 1); // the copy stays listed until the recycling
  nf_stream_t A = (nf_stream_t)(uintptr_t)0x500;
  void *a = nf_alloc(p, 256 * 1024, A);
  assert_non_null(a);
  assert_int_equal(nf_offload(p, a, A, NF_TIER_HOST), NF_OK);
  for (int i = 0; i < 64; i++) { // 63 more slots, then the 65th stream
    void *x = nf_alloc(p, 1024, (nf_stream_t)(uintptr_t)(0x1000 + i));
    assert_non_null(x);
    if (i == 63) {
      nf_mon_entry_t *v;
      assert_int_equal(nf__mon_list(NULL, false, &v, NULL), 1);
      nf_stats_t s;
      nf_stats_get(p, &s);
      assert_int_equal(s.offloads, 1); // finished by the recycling
      assert_int_equal(v[0].v[NF_PUB_OFFLOADED], s.offloaded);
      free(v);
    }
    assert_int_equal(nf_free(p, x), NF_OK);
  }
  assert_int_equal(nf_free(p, a), NF_OK);
  nf_backend_host_complete_events(be);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_file_lifecycle, setup, teardown),
      cmocka_unit_test_setup_teardown(test_values_match_stats, setup, teardown),
      cmocka_unit_test_setup_teardown(test_largest_free_idle, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dir_default, setup, teardown),
      cmocka_unit_test_setup_teardown(test_child_exit_keeps_parent_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_name_too_long, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stale_largest_free_refreshed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_largest_free_burst_per_window, setup, teardown),
      cmocka_unit_test_setup_teardown(test_offloaded_and_old_layout, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tier_counters_after_free, setup, teardown),
      cmocka_unit_test_setup_teardown(test_offloaded_after_stream_recycling, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tier_counters_after_prefetch, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reader_races_writer, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
