// In-process trace recording (src/record.c, config `trace:PATH`): a recorded
// workload reads back through the RMM reader as exactly the calls made, and
// replays to the same peak live; the size bound; a bad path fails creation.
#include "nf_test.h"
#include "replay.h"
#include "trace.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  int alloc;
  uint64_t ptr, size, stream;
} op_t;

static void tmp_path(char *out, size_t n, const char *tag) {
  const char *d = getenv("TMPDIR");
  snprintf(out, n, "%s/nf_record_%s_XXXXXX", d && *d ? d : "/tmp", tag);
  int fd = mkstemp(out);
  assert_true(fd >= 0);
  close(fd);
}

static nf_pool_t *pool_with(nf_backend_t **be, const char *conf) {
  assert_int_equal(nf_backend_host_create(be, 64 * NF_GiB, 2 * NF_MiB), NF_OK);
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[256] = "";
  if (nf_config_parse(&cfg, conf, err, sizeof err) != NF_OK) fail_msg("%s", err);
  nf_pool_t *p = NULL;
  if (nf_pool_create(&p, *be, &cfg) != NF_OK) fail_msg("%s", nf_last_error());
  return p;
}

// A random workload: allocs of mixed sizes on three streams, frees of random
// live blocks, and calls that fail (must not be recorded). Appends the
// successful calls to ops; returns the number and the peak of live bytes.
static size_t workload(nf_pool_t *p, uint64_t seed, size_t n, op_t *ops, uint64_t *peak) {
  void *live[512];
  uint64_t lsize[512], lstream[512], cur = 0;
  size_t nlive = 0, k = 0;
  const uint64_t streams[3] = {0, 0x10, 0x7f00aa00};
  *peak = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = nft_rand(&seed);
    if (nlive < 512 && (nlive == 0 || r % 100 < 55)) {
      uint64_t sz = r % 4 == 0 ? 1 + nft_rand(&seed) % (8 * NF_MiB) : 1 + nft_rand(&seed) % 4096;
      uint64_t s = streams[nft_rand(&seed) % 3];
      void *q = nf_alloc(p, sz, (nf_stream_t)(uintptr_t)s);
      if (!q) fail_msg("alloc %llu: %s", (unsigned long long)sz, nf_last_error());
      live[nlive] = q, lsize[nlive] = sz, lstream[nlive] = s, nlive++;
      ops[k++] = (op_t){1, (uint64_t)(uintptr_t)q, sz, s};
      cur += sz;
      if (cur > *peak) *peak = cur;
    } else {
      size_t j = nft_rand(&seed) % nlive;
      assert_int_equal(nf_free(p, live[j]), NF_OK);
      ops[k++] = (op_t){0, (uint64_t)(uintptr_t)live[j], lsize[j], lstream[j]};
      cur -= lsize[j];
      // Failing calls: a double free, an interior pointer, a request over the limit.
      if (r % 17 == 0) assert_int_equal(nf_free(p, live[j]), NF_ERR_INVALID);
      nlive--;
      live[j] = live[nlive], lsize[j] = lsize[nlive], lstream[j] = lstream[nlive];
      if (r % 19 == 0 && nlive) assert_int_equal(nf_free(p, (char *)live[0] + 1), NF_ERR_INVALID);
      if (r % 23 == 0) assert_null(nf_alloc(p, 128 * NF_GiB, NULL)); // above the capacity
    }
  }
  return k;
}

static void load(nf_trace_t *t, nf__trace_ops *o, const char *path) {
  char err[512] = "";
  if (nf__trace_load_rmm(t, path, err, sizeof err) != NF_OK) fail_msg("%s", err);
  if (nf__trace_ops_build(o, t, err, sizeof err) != NF_OK) fail_msg("%s", err);
}

static void test_record_replay(void **state) {
  (void)state;
  char path[256], conf[320];
  tmp_path(path, sizeof path, "rr");
  snprintf(conf, sizeof conf, "limit:1GiB,trace:%s", path);
  uint64_t seed = nft_env_seed(4242);
  for (int round = 0; round < 3; round++, seed = seed * 31 + 7) {
    nf_backend_t *be;
    nf_pool_t *p = pool_with(&be, conf);
    size_t n = 3000;
    op_t *ops = calloc(n, sizeof *ops);
    assert_non_null(ops);
    uint64_t peak;
    size_t k = workload(p, seed, n, ops, &peak);
    nf_pool_destroy(p); // flushes the buffer (more than 64 KiB: written in pieces)
    nf_backend_destroy(be);

    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true(sb.st_size > (off_t)(64 << 10));
    nf_trace_t t;
    nf__trace_ops o;
    load(&t, &o, path);
    // Every successful call, in order, nothing else.
    assert_int_equal(t.n_events, k);
    for (size_t i = 0; i < k; i++) {
      const nf_trace_event_t *e = &t.events[i];
      assert_int_equal(e->action, ops[i].alloc ? NF_TRACE_ALLOC : NF_TRACE_FREE_COMPLETED);
      assert_int_equal(e->addr, ops[i].ptr);
      assert_int_equal(e->size, ops[i].size);
      assert_int_equal(e->stream, ops[i].stream);
      assert_true(e->time_us < 86400ull * 1000000ull);
    }
    assert_int_equal(o.n_ops, k);
    assert_int_equal(o.peak_live, peak);
    // Replay through the engine: the same demand.
    nf__replay_opts ro;
    nf__replay_opts_default(&ro);
    ro.verify = 1;
    nf__replay_result res;
    if (nf__replay_run(&o, &ro, &res) != NF_OK) fail_msg("replay: %s", res.error);
    assert_int_equal(res.ops_done, k);
    assert_int_equal(res.stats.live_peak, peak);
    nf__trace_ops_free(&o);
    nf__trace_free(&t);
    free(ops);
  }
  // The header and row shape RMM writes.
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[256];
  assert_non_null(fgets(line, sizeof line, f));
  assert_string_equal(line, "Thread,Time,Action,Pointer,Size,Stream\n");
  assert_non_null(fgets(line, sizeof line, f));
  unsigned long tid;
  unsigned hh, mm, ss, us;
  char act[16];
  assert_int_equal(sscanf(line, "%lu,%2u:%2u:%2u:%6u,%15[a-z],0x", &tid, &hh, &mm, &ss, &us, act), 6);
  assert_string_equal(act, "allocate");
  assert_int_equal(tid, (unsigned long)gettid());
  fclose(f);
  unlink(path);
}

typedef struct {
  const char *conf;
  size_t n;
} bound_arg;

static void run_bounded(void *arg) {
  bound_arg *a = arg;
  nf_backend_t *be;
  nf_pool_t *p = pool_with(&be, a->conf);
  op_t *ops = calloc(a->n, sizeof *ops);
  uint64_t peak;
  workload(p, 99, a->n, ops, &peak);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  free(ops);
}

static void test_bound(void **state) {
  (void)state;
  // Below the buffer (truncated before any write) and above it (flushed
  // pieces, then truncated).
  const uint64_t bounds[] = {1000, 100000, 20};
  for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
    char path[256], conf[320];
    tmp_path(path, sizeof path, "bound");
    snprintf(conf, sizeof conf, "trace_max:%llu, trace:%s ", (unsigned long long)bounds[i], path);
    bound_arg a = {conf, 5000};
    char *err = nft_capture_stderr(run_bounded, &a);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true((uint64_t)sb.st_size <= bounds[i]);
    if (bounds[i] > 128) assert_true((uint64_t)sb.st_size > bounds[i] - 128); // whole rows up to the bound
    char want[400];
    snprintf(want, sizeof want, "nofrag: trace %s truncated at %llu bytes\n", path,
             (unsigned long long)sb.st_size);
    if (strcmp(err, want) != 0) fail_msg("stderr '%s', expected '%s'", err, want);
    if (bounds[i] > 100) { // a prefix of the calls: still a valid log
      nf_trace_t t;
      nf__trace_ops o;
      load(&t, &o, path);
      assert_true(t.n_events > 0);
      nf__trace_ops_free(&o);
      nf__trace_free(&t);
    }
    free(err);
    unlink(path);
  }
}

// A write error (disk full: /dev/full fails every write with ENOSPC): the
// pool keeps working (the workload asserts every call), and stderr gets one
// line naming the path and the error, nothing else: below the bound too,
// where the truncation's flush is what fails (no "truncated at N" for bytes
// that never reached the file).
static void test_write_error(void **state) {
  (void)state;
  if (access("/dev/full", W_OK) != 0) skip();
  const char *confs[] = {"trace:/dev/full", "trace_max:1000,trace:/dev/full"};
  for (size_t i = 0; i < 2; i++) {
    bound_arg a = {confs[i], 5000};
    char *err = nft_capture_stderr(run_bounded, &a);
    const char *want = "nofrag: trace /dev/full: write failed after 0 bytes: No space left on device; "
                       "recording stopped\n";
    if (strcmp(err, want) != 0) fail_msg("%s: stderr '%s', expected '%s'", confs[i], err, want);
    free(err);
  }
}

// A write that fails part-way (disk full after some bytes; here the file
// size limit, RLIMIT_FSIZE, which makes write(2) write up to the limit and
// then fail with EFBIG) must not leave a cut row at the end: the file stays
// whole rows, a prefix of the calls, which the reader loads. Run in a child
// so that the limit does not outlive it.
static void test_partial_write(void **state) {
  (void)state;
  char path[256], conf[320];
  tmp_path(path, sizeof path, "partial");
  // reserve: the host backend sizes its memfd when the first granule is created.
  snprintf(conf, sizeof conf, "limit:1GiB,reserve:2MiB,trace_max:0,trace:%s", path);
  const size_t n = 5000;
  op_t *ops = calloc(n, sizeof *ops);
  assert_non_null(ops);
  const rlim_t lim = 100001; // inside the second 64 KiB buffer, not at a row's end
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    nf_backend_t *be;
    nf_pool_t *p = pool_with(&be, conf); // first: the limit applies to the backend's memfd too
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {lim, lim};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(42);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2); // the one "write failed" line
    uint64_t peak;
    workload(p, 77, n, ops, &peak);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
    _exit(0);
  }
  int ws = 0;
  assert_int_equal(waitpid(child, &ws, 0), child);
  assert_true(WIFEXITED(ws));
  if (WEXITSTATUS(ws) == 42) skip();
  assert_int_equal(WEXITSTATUS(ws), 0);
  uint64_t peak;
  nf_backend_t *be;
  nf_pool_t *p = pool_with(&be, "limit:1GiB,reserve:2MiB"); // the same calls again, to compare
  size_t k = workload(p, 77, n, ops, &peak);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  nf_trace_t t;
  char err[512] = "";
  if (nf__trace_load_rmm(&t, path, err, sizeof err) != NF_OK) fail_msg("%s", err);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_true(sb.st_size > (off_t)(64 << 10) && sb.st_size < (off_t)lim); // whole rows only
  assert_true(t.n_events > 0 && t.n_events < k);
  for (size_t i = 0; i < t.n_events; i++) { // the first calls, exactly (same addresses: same pool, same seed)
    const nf_trace_event_t *e = &t.events[i];
    assert_int_equal(e->action, ops[i].alloc ? NF_TRACE_ALLOC : NF_TRACE_FREE_COMPLETED);
    assert_int_equal(e->addr - t.events[0].addr, ops[i].ptr - ops[0].ptr);
    assert_int_equal(e->size, ops[i].size);
    assert_int_equal(e->stream, ops[i].stream);
  }
  nf__trace_free(&t);
  free(ops);
  unlink(path);
}

// A fork()ed child that uses and destroys its copy of a recording pool: the
// rows buffered before the fork are the parent's and must be written once
// (by the parent), and the child's calls are not the parent's job: the log
// is exactly the parent's calls.
static void test_fork_child(void **state) {
  (void)state;
  char path[256], conf[320];
  tmp_path(path, sizeof path, "fork");
  snprintf(conf, sizeof conf, "limit:1GiB,trace:%s", path);
  nf_backend_t *be;
  nf_pool_t *p = pool_with(&be, conf);
  void *a = nf_alloc(p, 1000, NULL), *b = nf_alloc(p, 2000, NULL);
  assert_true(a && b);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    for (int i = 0; i < 3000; i++) nf_free(p, nf_alloc(p, 4096, NULL)); // more than a buffer
    nf_pool_destroy(p);
    _exit(0);
  }
  int ws = 0;
  assert_int_equal(waitpid(child, &ws, 0), child);
  assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  assert_int_equal(nf_free(p, a), NF_OK);
  nf_pool_destroy(p);
  nf_backend_destroy(be);
  nf_trace_t t;
  char err[512] = "";
  if (nf__trace_load_rmm(&t, path, err, sizeof err) != NF_OK) fail_msg("%s", err);
  assert_int_equal(t.n_events, 3);
  assert_int_equal(t.events[0].addr, (uintptr_t)a);
  assert_int_equal(t.events[1].addr, (uintptr_t)b);
  assert_int_equal(t.events[2].action, NF_TRACE_FREE_COMPLETED);
  assert_int_equal(t.events[2].addr, (uintptr_t)a);
  nf__trace_free(&t);
  unlink(path);
}

// Records in a forked child that exits without destroying its pool: `calls`
// runs on a pool recording to a new file (its name into path), then exit(0)
// runs the atexit handlers, which flush it. Once the child has exited with 0,
// loads the file into t. Shared by the tests of what is written at exit.
static void record_in_child(nf_trace_t *t, char *path, size_t n, const char *tag, void (*calls)(nf_pool_t *p)) {
  char conf[320];
  tmp_path(path, n, tag);
  snprintf(conf, sizeof conf, "limit:1GiB,trace:%s", path);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    nf_backend_t *be;
    calls(pool_with(&be, conf));
    exit(0); // atexit handlers run; the pool is never destroyed
  }
  int ws = 0;
  assert_int_equal(waitpid(child, &ws, 0), child);
  assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  char err[512] = "";
  if (nf__trace_load_rmm(t, path, err, sizeof err) != NF_OK) fail_msg("%s", err);
}

// Ten allocations, four of them freed (in the child: exits 3 or 4 on a failure).
static void alloc_ten_free_four(nf_pool_t *p) {
  void *q[10];
  for (int i = 0; i < 10; i++)
    if (!(q[i] = nf_alloc(p, 4096 * (size_t)(i + 1), NULL))) _exit(3);
  for (int i = 0; i < 4; i++)
    if (nf_free(p, q[i]) != NF_OK) _exit(4);
}

// A pool never destroyed (the PyTorch plug-in's) still leaves every row in
// the file: the atexit flush writes out the last buffer.
static void test_exit_without_destroy(void **state) {
  (void)state;
  char path[256];
  nf_trace_t t;
  record_in_child(&t, path, sizeof path, "exit", alloc_ten_free_four);
  assert_int_equal(t.n_events, 14);
  for (int i = 0; i < 10; i++) assert_int_equal(t.events[i].size, 4096 * (uint64_t)(i + 1));
  assert_int_equal(t.events[13].action, NF_TRACE_FREE_COMPLETED);
  nf__trace_free(&t);
  unlink(path);
}

// The bound holds whole rows up to exactly its size: a bound of the header's
// length keeps the header (a valid, empty log), and says so.
static void test_bound_exact(void **state) {
  (void)state;
  char path[256], conf[320];
  tmp_path(path, sizeof path, "exact");
  const char header[] = "Thread,Time,Action,Pointer,Size,Stream\n";
  snprintf(conf, sizeof conf, "trace_max:%zu,trace:%s", sizeof header - 1, path);
  bound_arg a = {conf, 10};
  char *err = nft_capture_stderr(run_bounded, &a);
  char want[400], got[128] = "";
  snprintf(want, sizeof want, "nofrag: trace %s truncated at %zu bytes\n", path, sizeof header - 1);
  if (strcmp(err, want) != 0) fail_msg("stderr '%s', expected '%s'", err, want);
  free(err);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(got, 1, sizeof got - 1, f);
  fclose(f);
  got[n] = 0;
  assert_string_equal(got, header);
  unlink(path);
}

// A row as RMM writes it: the local time of day (the UTC offset taken at
// pool creation; TZ set here, one and two hours east, so that local and UTC
// differ by a known amount), fields in range, the size in decimal.
static void test_row_fields(void **state) {
  (void)state;
  const char *saved = getenv("TZ");
  char old_tz[128] = "";
  if (saved) snprintf(old_tz, sizeof old_tz, "%s", saved);
  for (int east = 1; east <= 2; east++) {
    char tz[16], path[256], conf[320];
    snprintf(tz, sizeof tz, "NFT-%d", east); // POSIX: local = UTC + east hours
    setenv("TZ", tz, 1);
    tzset();
    tmp_path(path, sizeof path, "row");
    snprintf(conf, sizeof conf, "limit:1GiB,trace:%s", path);
    nf_backend_t *be;
    nf_pool_t *p = pool_with(&be, conf);
    struct timespec t0, t1;
    clock_gettime(CLOCK_REALTIME, &t0);
    void *q = nf_alloc(p, 12345, (nf_stream_t)(uintptr_t)0xabc);
    clock_gettime(CLOCK_REALTIME, &t1);
    assert_non_null(q);
    nf_pool_destroy(p);
    nf_backend_destroy(be);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256];
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    unlink(path);
    unsigned long tid;
    unsigned hh, mm, ss, us;
    unsigned long long ptr, stream;
    char size[32];
    if (sscanf(line, "%lu,%2u:%2u:%2u:%6u,allocate,0x%llx,%31[0-9],0x%llx", &tid, &hh, &mm, &ss, &us, &ptr, size,
               &stream) != 8)
      fail_msg("row '%s'", line);
    assert_string_equal(size, "12345");
    assert_int_equal(ptr, (uintptr_t)q);
    assert_int_equal(stream, 0xabc);
    assert_true(hh < 24 && mm < 60 && ss < 60);
    long long off = east * 3600, day = 86400;
    long long at = hh * 3600ll + mm * 60 + ss, from = ((long long)t0.tv_sec + off) % day;
    long long late = ((at - from) % day + day) % day; // seconds after t0, local time
    if (late > (long long)(t1.tv_sec - t0.tv_sec))
      fail_msg("TZ %s: row time %02u:%02u:%02u, the call was at %02lld:%02lld:%02lld local", tz, hh, mm, ss,
               from / 3600, from / 60 % 60, from % 60);
  }
  if (saved) setenv("TZ", old_tz, 1);
  else unsetenv("TZ");
  tzset();
}

// Frees after the atexit flush (the PyTorch plug-in's pool is never destroyed;
// tensors are freed while the process tears down) are written at once: there
// is no later flush. main registers late_frees first, so it runs after the
// recorder's handler.
static nf_pool_t *late_pool;
static void *late_blocks[3];
static void late_frees(void) {
  if (!late_pool) return;
  for (int i = 0; i < 3; i++) nf_free(late_pool, late_blocks[i]);
}

// Three allocations, left for late_frees (in the child: exits 3 on a failure).
static void alloc_late_blocks(nf_pool_t *p) {
  for (int i = 0; i < 3; i++)
    if (!(late_blocks[i] = nf_alloc(p, 4096 * (size_t)(i + 1), NULL))) _exit(3);
  late_pool = p;
}

static void test_frees_after_exit_flush(void **state) {
  (void)state;
  char path[256];
  nf_trace_t t;
  record_in_child(&t, path, sizeof path, "late", alloc_late_blocks);
  assert_int_equal(t.n_events, 6);
  for (int i = 3; i < 6; i++) {
    assert_int_equal(t.events[i].action, NF_TRACE_FREE_COMPLETED);
    assert_int_equal(t.events[i].size, 4096 * (uint64_t)(i - 2));
  }
  nf__trace_free(&t);
  unlink(path);
}

static void test_bad_path(void **state) {
  (void)state;
  const char *bad = "/nonexistent-nofrag-dir/sub/trace.csv";
  nf_backend_t *be;
  assert_int_equal(nf_backend_host_create(&be, 64 * NF_GiB, 2 * NF_MiB), NF_OK);
  nf_config_t cfg;
  nf_config_default(&cfg);
  snprintf(cfg.trace, sizeof cfg.trace, "%s", bad);
  nf_pool_t *p = (nf_pool_t *)0x1;
  assert_int_equal(nf_pool_create(&p, be, &cfg), NF_ERR_CONFIG);
  assert_null(p);
  assert_non_null(strstr(nf_last_error(), bad));
  assert_non_null(strstr(nf_last_error(), "No such file or directory"));
  uint64_t gr = 1, maps = 1;
  nf_backend_host_usage(be, &gr, &maps);
  assert_int_equal(gr, 0);
  assert_int_equal(maps, 0);
  nf_backend_destroy(be);
  // From a string too, with a reserve to give back.
  char conf[128];
  snprintf(conf, sizeof conf, "reserve:4MiB,trace:%s", bad);
  assert_int_equal(nf_pool_create_from_string(&p, conf), NF_ERR_CONFIG);
  assert_null(p);
  assert_non_null(strstr(nf_last_error(), bad));
  // Off by default: no rows, nothing opened.
  nf_config_default(&cfg);
  assert_int_equal(cfg.trace[0], 0);
  assert_int_equal(cfg.trace_max, 256 * NF_MiB);
}

int main(void) {
  setenv("NOFRAG_QUIET_OOM", "1", 1); // the failing allocs' reports would mix with the captured stderr
  atexit(late_frees); // before any recorder's handler: runs after them
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_record_replay),
      cmocka_unit_test(test_bound),
      cmocka_unit_test(test_write_error),
      cmocka_unit_test(test_partial_write),
      cmocka_unit_test(test_fork_child),
      cmocka_unit_test(test_exit_without_destroy),
      cmocka_unit_test(test_bound_exact),
      cmocka_unit_test(test_row_fields),
      cmocka_unit_test(test_frees_after_exit_flush),
      cmocka_unit_test(test_bad_path),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
