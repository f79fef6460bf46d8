// Input format detection and the PyTorch snapshot bridge (see cli.h).
//
// The pickle converter is Python (standard library only) because a snapshot
// is an arbitrary pickle of dicts and lists: re-implementing the unpickler in
// C would be a large new attack surface for no gain. The CLI runs it as a
// child process into a private temporary file and loads the result like any
// text trace.
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

// First bytes of the (decompressed) file; returns how many were read, -1 on error.
static int peek(const char *path, unsigned char *buf, unsigned n) {
  gzFile gz = gzopen(path, "rb");
  if (!gz) return -1;
  int got = gzread(gz, buf, n);
  gzclose(gz);
  return got;
}

static int has_package(const char *dir) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s/nofrag/snapshot.py", dir) >= (int)sizeof p) return 0;
  return access(p, R_OK) == 0;
}

// The directory holding the nofrag Python package, or NULL.
static const char *python_dir(char *buf, size_t n) {
  const char *env = getenv("NOFRAG_PYTHON_DIR");
  if (env && *env) return has_package(env) ? env : NULL;
  char exe[PATH_MAX];
  ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (l <= 0) return NULL;
  exe[l] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return NULL;
  *slash = 0;
  // build/nofrag in the source tree, or an install's bin/ next to share/.
  static const char *const rel[] = {"/../python", "/python", "/../share/nofrag/python"};
  for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
    if (snprintf(buf, n, "%s%s", exe, rel[i]) < (int)n && has_package(buf)) return buf;
  }
  return NULL;
}

static void copy_file_to_stderr(int fd) {
  char b[4096];
  ssize_t r;
  lseek(fd, 0, SEEK_SET);
  while ((r = read(fd, b, sizeof b)) > 0) fwrite(b, 1, (size_t)r, stderr);
}

static nf_status_t load_pickle(const char *path, nf_trace_t *t, char *err, size_t errlen) {
  char pybuf[PATH_MAX];
  const char *pydir = python_dir(pybuf, sizeof pybuf);
  if (!pydir) {
    snprintf(err, errlen, "%s: a PyTorch snapshot pickle, but the nofrag Python package was not found "
             "(set NOFRAG_PYTHON_DIR to the repository's python/ directory)", path);
    return NF_ERR_INVALID;
  }
  const char *tmpdir = getenv("TMPDIR");
  char tmp[PATH_MAX], errtmp[PATH_MAX];
  if (!tmpdir || !*tmpdir) tmpdir = "/tmp";
  snprintf(tmp, sizeof tmp, "%s/nofrag-snapshot-XXXXXX.trace", tmpdir);
  snprintf(errtmp, sizeof errtmp, "%s/nofrag-snapshot-XXXXXX.err", tmpdir);
  int fd = mkstemps(tmp, 6), efd = mkstemps(errtmp, 4);
  if (fd < 0 || efd < 0) {
    snprintf(err, errlen, "%s: cannot create a temporary file in %s: %s", path, tmpdir, strerror(errno));
    if (fd >= 0) { close(fd); unlink(tmp); }
    if (efd >= 0) { close(efd); unlink(errtmp); }
    return NF_ERR_INVALID;
  }
  close(fd);
  unlink(errtmp); // kept open only: the child's stderr, shown if it fails
  fflush(NULL);
  nf_status_t st = NF_ERR_INVALID;
  pid_t pid = fork();
  if (pid == 0) {
    const char *old = getenv("PYTHONPATH");
    char pp[2 * PATH_MAX];
    snprintf(pp, sizeof pp, "%s%s%s", pydir, old && *old ? ":" : "", old && *old ? old : "");
    setenv("PYTHONPATH", pp, 1);
    dup2(efd, 2);
    dup2(efd, 1);
    execlp("python3", "python3", "-m", "nofrag.snapshot", path, tmp, (char *)NULL);
    _exit(127); // exec failed: python3 not on PATH
  }
  int ws = 0;
  if (pid < 0) snprintf(err, errlen, "%s: cannot start python3: %s", path, strerror(errno));
  else if (waitpid(pid, &ws, 0) < 0) snprintf(err, errlen, "%s: waiting for python3: %s", path, strerror(errno));
  else if (WIFEXITED(ws) && WEXITSTATUS(ws) == 127)
    snprintf(err, errlen, "%s: a PyTorch snapshot pickle needs python3 to convert it, and python3 was not "
             "found on PATH (or convert elsewhere: python3 -m nofrag.snapshot %s OUT.trace.gz)", path, path);
  else if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    copy_file_to_stderr(efd);
    snprintf(err, errlen, "%s: converting the snapshot with python3 -m nofrag.snapshot failed (above)", path);
  } else {
    st = nf__trace_load(t, tmp, err, errlen);
    if (st == NF_OK) { // messages should name the user's file, not our temporary
      char *name = malloc(strlen(path) + 1);
      if (name) { strcpy(name, path); free(t->name); t->name = name; }
    }
  }
  close(efd);
  unlink(tmp);
  return st;
}

nf_status_t nf_cli_load_trace(const char *path, nf_trace_t *t, const char **format, char *err, size_t errlen) {
  unsigned char head[64];
  int got = peek(path, head, sizeof head);
  const char *fmt = "text";
  nf_status_t st;
  memset(t, 0, sizeof *t);
  if (got > 0 && head[0] == 0x80) { fmt = "pickle"; st = load_pickle(path, t, err, errlen); }
  else if (got > 0 && nf__trace_is_rmm((const char *)head, (size_t)got)) { fmt = "rmm"; st = nf__trace_load_rmm(t, path, err, errlen); }
  else st = nf__trace_load(t, path, err, errlen); // also reports unreadable files
  if (format) *format = fmt;
  return st;
}
