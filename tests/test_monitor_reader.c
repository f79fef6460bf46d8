// Live monitor (src/observe/monitor.c), the reading side (nf__mon_read,
// nf__mon_list, what `nofrag top` shows) of files anyone can write under a
// monitor name: the header's size, version and device name (escape bytes, no
// NUL, an older library's shorter layout), a file truncated while read or
// shorter than its length, FIFOs and directories, the listing's order. Which
// files read live or dead, and what --clean removes, is in
// test_monitor_liveness.c; the publishing side is in test_monitor.c.
#include "nf_test.h"
#include "monitor_test.h"
#include "observe/observe.h"

#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// ------------------------------------------------------------------ contents

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

// An older library's file holds fewer fields (the layout grows at its end):
// the reader says how many, so that nofrag top shows "-" for the new ones
// (CALLS%) rather than a 0 that means nothing. This version's file holds all.
static void test_older_layout_fields(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/nofrag.%u.%d.78", dir, (unsigned)getuid(), (int)getpid());
  struct timespec t; // alive, and the file is newer than this process
  clock_gettime(CLOCK_REALTIME, &t);
  fake_file(path, 0600, (int32_t)getpid(), (uint64_t)t.tv_sec * 1000000000ull, "host");
  nf_mon_entry_t e;
  assert_int_equal(nf__mon_read(path, &e), 0);
  assert_int_equal(e.nfields, NF_PUB_NFIELDS);
  int fd = open(path, O_RDWR); // as a writer of the layout before backend_ns left it
  assert_true(fd >= 0);
  nf_mon_shm_t m;
  assert_int_equal(pread(fd, &m, sizeof m, 0), (ssize_t)sizeof m);
  m.size = (uint32_t)(offsetof(nf_mon_shm_t, pub.v) + NF_PUB_BACKEND_NS * sizeof(uint64_t));
  assert_int_equal(pwrite(fd, &m, sizeof m, 0), (ssize_t)sizeof m);
  assert_int_equal(ftruncate(fd, (off_t)m.size), 0);
  close(fd);
  assert_int_equal(nf__mon_read(path, &e), 0);
  assert_int_equal(e.nfields, NF_PUB_BACKEND_NS);
  assert_int_equal(e.v[NF_PUB_BACKEND_NS], 0);
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
  // At least 20,000 reads, and on until one whole copy (a loaded machine may
  // run the writer between every two reads for a while), within a bound.
  for (int i = 0; i < 20000 || (!ok && i < 2000000); i++) {
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

// ------------------------------------------------------------------ header

// Live files (this process, a file newer than it) for the header checks below.
static void live_file(const char *path, const char *device) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  fake_file(path, 0600, (int32_t)getpid(), (uint64_t)t.tv_sec * 1000000000ull, device);
}

// The header's size field, not the file's length, says how many fields the
// writer wrote: bytes past it are not counters (nofrag top would show them);
// a size below the first layout, or another version, is no monitor file; a
// device name that fills its field without a NUL is still cut to a string.
static void test_header_size_and_device_bounds(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/nofrag.%u.%d.80", dir, (unsigned)getuid(), (int)getpid());
  live_file(path, "host");
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  nf_mon_shm_t m;
  assert_int_equal(pread(fd, &m, sizeof m, 0), (ssize_t)sizeof m);
  m.size = (uint32_t)(offsetof(nf_mon_shm_t, pub.v) + NF_PUB_V1_FIELDS * sizeof(uint64_t));
  for (int i = NF_PUB_V1_FIELDS; i < NF_PUB_NFIELDS; i++) m.pub.v[i] = 12345; // past `size`: not fields
  memset(m.device, 'x', sizeof m.device);                                      // no NUL
  assert_int_equal(pwrite(fd, &m, sizeof m, 0), (ssize_t)sizeof m);
  nf_mon_entry_t e;
  assert_int_equal(nf__mon_read(path, &e), 0);
  assert_int_equal(e.nfields, NF_PUB_V1_FIELDS);
  for (int i = NF_PUB_V1_FIELDS; i < NF_PUB_NFIELDS; i++) assert_int_equal(e.v[i], 0);
  assert_int_equal(strlen(e.device), sizeof e.device - 1);
  m.size = (uint32_t)offsetof(nf_mon_shm_t, pub.v); // no fields at all
  assert_int_equal(pwrite(fd, &m, sizeof m, 0), (ssize_t)sizeof m);
  assert_int_equal(nf__mon_read(path, &e), -1);
  m.size = sizeof m;
  m.version = NF_MON_VERSION + 1; // another layout: not read as this one
  assert_int_equal(pwrite(fd, &m, sizeof m, 0), (ssize_t)sizeof m);
  assert_int_equal(nf__mon_read(path, &e), -1);
  close(fd);
  unlink(path);
}

// A file whose length says more than a read gets (truncated between the
// reader's fstat and its read; a sysfs attribute does so always: 4 KiB by
// fstat, a few bytes read) is refused, not read again forever: nofrag top
// would hang on it. The alarm turns a hang into a failure.
static void test_short_read_refused(void **state) {
  (void)state;
  static const char *cands[] = {"/sys/devices/system/cpu/online", "/sys/devices/system/cpu/possible",
                                "/sys/kernel/mm/transparent_hugepage/enabled"};
  const char *path = NULL;
  for (size_t i = 0; i < sizeof cands / sizeof cands[0] && !path; i++) {
    struct stat sb;
    if (stat(cands[i], &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size >= (off_t)sizeof(nf_mon_shm_t)) path = cands[i];
  }
  if (!path) skip(); // no sysfs here
  alarm(10);
  nf_mon_entry_t e;
  assert_int_equal(nf__mon_read(path, &e), -1);
  alarm(0);
}

// nofrag top lists pools by pid, then by pool id within a process, whatever
// order the directory holds the files in.
static void test_list_sorted(void **state) {
  (void)state;
  const int32_t pids[4] = {(int32_t)getpid(), 1, (int32_t)getpid(), (int32_t)getppid()};
  const uint32_t ids[4] = {7, 3, 2, 9};
  for (int i = 0; i < 4; i++) { // live files: running pids, dated now, no lock flag
    char path[512];
    snprintf(path, sizeof path, "%s/nofrag.%u.%d.%u", dir, (unsigned)getuid(), (int)pids[i], ids[i]);
    live_file(path, "host");
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, &pids[i], sizeof pids[i], offsetof(nf_mon_shm_t, pid)), (ssize_t)sizeof pids[i]);
    assert_int_equal(pwrite(fd, &ids[i], sizeof ids[i], offsetof(nf_mon_shm_t, pool_id)), (ssize_t)sizeof ids[i]);
    close(fd);
  }
  nf_mon_entry_t *v;
  long dead = -1;
  assert_int_equal(nf__mon_list(NULL, false, &v, &dead), 4);
  assert_int_equal(dead, 0);
  for (int i = 1; i < 4; i++)
    if (v[i - 1].pid > v[i].pid || (v[i - 1].pid == v[i].pid && v[i - 1].pool_id >= v[i].pool_id))
      fail_msg("entry %d (pid %d, pool %u) listed before (pid %d, pool %u)", i - 1, v[i - 1].pid,
               v[i - 1].pool_id, v[i].pid, v[i].pool_id);
  free(v);
}

// ------------------------------------------------------------------ special files

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
      cmocka_unit_test_setup_teardown(test_special_files_skipped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_device_name_sanitized, setup, teardown),
      cmocka_unit_test_setup_teardown(test_older_layout_fields, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated_while_read, setup, teardown),
      cmocka_unit_test_setup_teardown(test_header_size_and_device_bounds, setup, teardown),
      cmocka_unit_test_setup_teardown(test_short_read_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_list_sorted, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
