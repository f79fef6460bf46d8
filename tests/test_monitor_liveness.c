// Live monitor (src/observe/monitor.c), the reader's judgement of liveness
// (nf__mon_read, nf__mon_list, what `nofrag top` shows and --clean removes):
// files of dead processes, reused pids (by start time, of another user),
// exec'd, killed and zombie writers, the liveness lock's flag, what --clean
// counts and the descriptors it keeps, its race with a writer replacing the
// file it judged. What the reader makes of a file's contents (headers,
// hostile files) is in test_monitor_reader.c; the publishing side is in
// test_monitor.c.
#include "nf_test.h"
#include "monitor_test.h"
#include "observe/observe.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// ------------------------------------------------------------------ dead

// A pid that was this process's child and is gone (reaped): a dead writer's.
static pid_t dead_pid(void) {
  pid_t gone = fork();
  assert_true(gone >= 0);
  if (gone == 0) _exit(0);
  assert_int_equal(waitpid(gone, NULL, 0), gone);
  return gone;
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

// A live pid whose process started after the file was written is a reuse
// of that pid: the file is stale. The start is /proc/PID/stat's 22nd field;
// dated a few seconds after boot, the file is older than this process
// (the 1970 date of test_dead_process_ignored_and_cleaned is older than
// anything, whichever field is read).
static void test_reused_pid_by_start_time(void **state) {
  (void)state;
  FILE *f = fopen("/proc/stat", "r");
  if (!f) skip();
  unsigned long long btime = 0;
  char line[256];
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "btime %llu", &btime) == 1) break;
  fclose(f);
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  if (!btime || (unsigned long long)t.tv_sec < btime + 60) skip(); // this process must start well after boot
  char path[512];
  snprintf(path, sizeof path, "%s/nofrag.%u.%d.81", dir, (unsigned)getuid(), (int)getpid());
  fake_file(path, 0600, (int32_t)getpid(), (btime + 3) * 1000000000ull, "host");
  nf_mon_entry_t e;
  assert_int_equal(nf__mon_read(path, &e), 1);
  unlink(path);
}

// --clean keeps the fd of a file judged dead for its unlink only: listing
// live files, junk and dead files leaves no descriptor open (top --clean
// runs once, but a tool calling nf__mon_list in a loop would run out).
static void test_clean_leaves_no_fds(void **state) {
  (void)state;
  nf_pool_t *p = new_pool(64 * NF_MiB); // live
  pid_t gone = dead_pid();
  char path[512];
  snprintf(path, sizeof path, "%s/nofrag.%u.%d.0", dir, (unsigned)getuid(), (int)gone);
  fake_file(path, 0600, (int32_t)gone, 0, "host"); // dead
  snprintf(path, sizeof path, "%s/nofrag.junk", dir);
  FILE *f = fopen(path, "w"); // not a monitor file
  assert_non_null(f);
  fputs("hello", f);
  fclose(f);
  int before = nft_open_fds();
  for (int i = 0; i < 3; i++) {
    nf_mon_entry_t *v;
    long dead = -1;
    assert_int_equal(nf__mon_list(NULL, true, &v, &dead), 1);
    assert_int_equal(dead, i == 0);
    free(v);
  }
  assert_int_equal(nft_open_fds(), before);
  nf_pool_destroy(p);
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
  pid_t gone = dead_pid();
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

// ------------------------------------------------------------------ clean race

// --clean judges a file dead, then removes it; in between, its pid's next
// writer (the pid after an exec, or reused) may replace it with a live file
// under the same name, which must stay. The judgement and the removal are
// called apart here, the replacement between them. Without a replacement the
// judged file goes.
static void test_clean_spares_replaced_file(void **state) {
  (void)state;
  pid_t gone = dead_pid();
  char path[512];
  snprintf(path, sizeof path, "%s/nofrag.%u.%d.0", dir, (unsigned)getuid(), (int)gone);
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  for (int replace = 0; replace < 2; replace++) {
    fake_file(path, 0600, (int32_t)gone, 0, "host");
    nf_mon_entry_t e;
    int fd = -1, live = -1;
    assert_int_equal(nf__mon_read_fd(path, &e, &fd), 1);
    assert_true(fd >= 0);
    if (replace) { // a new writer's file, flagged and locked as monitor.c makes them
      assert_int_equal(unlink(path), 0);
      fake_file(path, 0600, (int32_t)gone, (uint64_t)t.tv_sec * 1000000000ull, "host");
      live = open(path, O_RDWR);
      assert_true(live >= 0);
      uint32_t flags = NF_MON_LOCKED;
      assert_int_equal(pwrite(live, &flags, sizeof flags, offsetof(nf_mon_shm_t, flags)), (ssize_t)sizeof flags);
      struct flock l = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_len = NF_MON_GUARD_AT};
      assert_int_equal(fcntl(live, F_OFD_SETLK, &l), 0);
      assert_int_equal(nf__mon_read(path, &e), 0);
    }
    bool removed = nf__mon_unlink_dead(fd, &e);
    close(fd);
    if (replace && removed) fail_msg("--clean removed the live file that replaced the dead one");
    assert_int_equal(removed, !replace);
    assert_int_equal(access(path, F_OK), replace ? 0 : -1);
    if (replace) {
      close(live);
      unlink(path);
    }
  }
}

// The cleaner's half of test_writer_waits_for_cleaner: a writer holding the
// name guard is replacing the dead file itself; --clean leaves it alone
// rather than unlink a name that may already be the new file's.
static void test_clean_yields_to_writer(void **state) {
  (void)state;
  pid_t gone = dead_pid();
  char path[512];
  snprintf(path, sizeof path, "%s/nofrag.%u.%d.0", dir, (unsigned)getuid(), (int)gone);
  fake_file(path, 0600, (int32_t)gone, 0, "host");
  nf_mon_entry_t e;
  int fd = -1;
  assert_int_equal(nf__mon_read_fd(path, &e, &fd), 1);
  int w = open(path, O_RDWR); // the writer's, as unlink_stale takes it
  assert_true(w >= 0);
  struct flock g = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = NF_MON_GUARD_AT, .l_len = 1};
  assert_int_equal(fcntl(w, F_OFD_SETLK, &g), 0);
  assert_false(nf__mon_unlink_dead(fd, &e));
  assert_int_equal(access(path, F_OK), 0);
  close(w); // the guard let go: now it goes
  assert_true(nf__mon_unlink_dead(fd, &e));
  close(fd);
  assert_int_equal(access(path, F_OK), -1);
}

static void *create_pool(void *arg) {
  nf_pool_t **p = arg;
  if (nf_pool_create_from_string(p, "limit:64MiB") != NF_OK) *p = NULL;
  return NULL;
}

// The writer's half: replacing a stale file under its name (here, the name
// this process's next pool gets), it waits while a cleaner holds that file's
// name guard (between the cleaner's check that the name still names the file
// and its unlink), so that the unlink cannot hit the new file. A guard never
// let go costs the pool its monitor file, not a hang.
static void test_writer_waits_for_cleaner(void **state) {
  (void)state;
  nf_pool_t *p = new_pool(64 * NF_MiB);
  char names[8][256], path[512];
  assert_int_equal(list_files(names), 1);
  snprintf(path, sizeof path, "%s/%s", dir, names[0]);
  nf_mon_entry_t e;
  assert_int_equal(nf__mon_read(path, &e), 0);
  uint32_t next = e.pool_id + 1; // pool ids count up in a process
  nf_pool_destroy(p);
  for (int let_go = 1; let_go >= 0; let_go--, next++) {
    snprintf(path, sizeof path, "%s/nofrag.%u.%d.%u", dir, (unsigned)getuid(), (int)getpid(), next);
    fake_file(path, 0600, (int32_t)getpid(), 1000000000ull, "host"); // stale: dated 1970
    int fd = open(path, O_RDONLY); // a cleaner's, holding the guard
    assert_true(fd >= 0);
    struct flock g = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = NF_MON_GUARD_AT, .l_len = 1};
    assert_int_equal(fcntl(fd, F_OFD_SETLK, &g), 0);
    struct stat held, now;
    assert_int_equal(fstat(fd, &held), 0);
    p = NULL;
    if (let_go) {
      pthread_t th;
      assert_int_equal(pthread_create(&th, NULL, create_pool, &p), 0);
      usleep(200000); // the pool's creation waits (unguarded, it is done long before)
      bool replaced = lstat(path, &now) != 0 || now.st_ino != held.st_ino;
      int gone = replaced ? 0 : unlink(path); // the cleaner's unlink, then it lets go
      close(fd);
      assert_int_equal(pthread_join(th, NULL), 0); // before any failure: p is the thread's
      if (replaced) fail_msg("the writer replaced the file while a cleaner held its guard");
      assert_int_equal(gone, 0);
      assert_non_null(p);
      assert_int_equal(nf__mon_read(path, &e), 0); // the pool's own file, live
      assert_int_equal(e.pid, getpid());
      assert_int_equal(e.pool_id, next);
    } else {
      p = new_pool(64 * NF_MiB); // gives up waiting: no file
      assert_int_equal(lstat(path, &now), 0);
      assert_int_equal(now.st_ino, held.st_ino);
      assert_int_equal(list_files(names), 1);
      close(fd);
      unlink(path);
    }
    nf_pool_destroy(p);
    assert_int_equal(list_files(names), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_dead_process_ignored_and_cleaned, setup, teardown),
      cmocka_unit_test_setup_teardown(test_clean_leaves_no_fds, setup, teardown),
      cmocka_unit_test_setup_teardown(test_clean_counts_removed_only, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reused_pid_of_other_user, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reused_pid_by_start_time, setup, teardown),
      cmocka_unit_test_setup_teardown(test_exec_leaves_dead, setup, teardown),
      cmocka_unit_test_setup_teardown(test_other_process_live_then_killed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_lock_flag, setup, teardown),
      cmocka_unit_test_setup_teardown(test_clean_spares_replaced_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_writer_waits_for_cleaner, setup, teardown),
      cmocka_unit_test_setup_teardown(test_clean_yields_to_writer, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
