// Shared by the monitor tests (test_monitor.c, test_monitor_reader.c,
// test_monitor_liveness.c): every test points NOFRAG_SHM_DIR at its own
// temporary directory, `dir`, which teardown empties and removes.
// Monitor-only, so not in nf_test.h.
#ifndef NF_MONITOR_TEST_H
#define NF_MONITOR_TEST_H

#include "nf_test.h"
#include "observe/observe.h"

#include <dirent.h>
#include <fcntl.h>
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
static inline int list_files(char names[8][256]) {
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

// A monitor file as a writer of this version would leave it, for process
// `pid` started at `start_ns` (0: unknown), with `device` as its name
// (test_monitor_reader.c and test_monitor_liveness.c write them).
static inline void fake_file(const char *path, int mode, int32_t pid, uint64_t start_ns, const char *device) {
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
#endif
