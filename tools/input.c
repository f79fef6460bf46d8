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
  if (snprintf(p, sizeof p, "%s/nofrag/torch_trace.py", dir) >= (int)sizeof p) return 0;
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
  // build/nofrag in the source tree, an install's bin/ next to share/, or the
  // pip package's nofrag/_bin/nofrag (site-packages/nofrag/...).
  static const char *const rel[] = {"/../python", "/python", "/../share/nofrag/python", "/../.."};
  for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
    if (snprintf(buf, n, "%s%s", exe, rel[i]) < (int)n && has_package(buf)) return buf;
  }
#ifdef NF_SOURCE_PYTHON_DIR
  // A build directory outside the checkout: the checkout it was built from.
  if (snprintf(buf, n, "%s", NF_SOURCE_PYTHON_DIR) < (int)n && has_package(buf)) return buf;
#endif
  return NULL;
}

static void copy_file_to_stderr(int fd) {
  char b[4096];
  ssize_t r;
  lseek(fd, 0, SEEK_SET);
  while ((r = read(fd, b, sizeof b)) > 0) fwrite(b, 1, (size_t)r, stderr);
}

// ------------------------------------------------------------ call sites

void nfc_sites_free(nfc_sites *s) {
  for (size_t i = 0; i < s->n; i++) { free(s->site[i]); free(s->func[i]); }
  free(s->site);
  free(s->func);
  free(s->of_event);
  free(s->hash);
  memset(s, 0, sizeof *s);
}

static uint64_t fnv(const char *a, const char *b) {
  uint64_t h = 1469598103934665603ull;
  for (; *a; a++) h = (h ^ (unsigned char)*a) * 1099511628211ull;
  h = (h ^ 9) * 1099511628211ull;
  for (; *b; b++) h = (h ^ (unsigned char)*b) * 1099511628211ull;
  return h;
}

static char *str_dup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

// Id of (site, func), added if new; 0 on out of memory (the alloc then
// counts as having no stack: a smaller report, not a wrong one).
static uint32_t intern(nfc_sites *s, const char *site, const char *func) {
  if (2 * (s->n + 1) > s->hcap) { // grow and rehash: load factor <= 1/2
    size_t hc = s->hcap ? s->hcap * 2 : 1024;
    uint32_t *h = calloc(hc, sizeof *h);
    if (!h) return 0;
    for (size_t i = 1; i < s->n; i++) {
      size_t k = (size_t)fnv(s->site[i], s->func[i]) & (hc - 1);
      while (h[k]) k = (k + 1) & (hc - 1);
      h[k] = (uint32_t)i;
    }
    free(s->hash);
    s->hash = h;
    s->hcap = hc;
  }
  size_t k = (size_t)fnv(site, func) & (s->hcap - 1);
  for (; s->hash[k]; k = (k + 1) & (s->hcap - 1))
    if (!strcmp(s->site[s->hash[k]], site) && !strcmp(s->func[s->hash[k]], func)) return s->hash[k];
  if (s->n == s->cap) {
    size_t nc = s->cap * 2;
    char **a = realloc(s->site, nc * sizeof *a);
    if (a) s->site = a;
    char **b = realloc(s->func, nc * sizeof *b);
    if (b) s->func = b;
    if (!a || !b) return 0;
    s->cap = nc;
  }
  char *ds = str_dup(site), *df = str_dup(func);
  if (!ds || !df || s->n >= UINT32_MAX) { free(ds); free(df); return 0; }
  s->site[s->n] = ds;
  s->func[s->n] = df;
  s->hash[k] = (uint32_t)s->n;
  return (uint32_t)s->n++;
}

// Read the '#site' lines of the text trace at `file`, which `t` was loaded
// from (event lines are known, so a site line is matched to the event on the
// line just before it). Returns 0, -1 on out of memory or read error.
static int load_sites(const char *file, const nf_trace_t *t, nfc_sites *s) {
  memset(s, 0, sizeof *s);
  s->cap = 64;
  s->n_events = t->n_events;
  s->site = calloc(s->cap, sizeof *s->site);
  s->func = calloc(s->cap, sizeof *s->func);
  s->of_event = calloc(t->n_events ? t->n_events : 1, sizeof *s->of_event);
  if (!s->site || !s->func || !s->of_event) return -1;
  s->site[0] = str_dup("<no stack>:0");
  s->func[0] = str_dup("");
  if (!s->site[0] || !s->func[0]) return -1;
  s->n = 1;
  gzFile gz = gzopen(file, "rb");
  if (!gz) return -1;
  char buf[NF_TRACE_MAX_LINE + 2];
  size_t e = 0;
  uint64_t line = 0;
  while (gzgets(gz, buf, sizeof buf)) {
    size_t len = strlen(buf);
    if (len && buf[len - 1] == '\n') { buf[--len] = 0; line++; }
    else line++; // the last line (the parser already refused over-long ones)
    if (strncmp(buf, "#site\t", 6) != 0) continue;
    while (e < t->n_events && t->events[e].line < line) e++;
    if (!e || t->events[e - 1].line + 1 != line || t->events[e - 1].action != NF_TRACE_ALLOC) continue;
    char *site = buf + 6, *tab = strchr(site, '\t');
    if (tab) *tab = 0;
    uint32_t id = intern(s, site, tab ? tab + 1 : "");
    s->of_event[e - 1] = id;
  }
  gzclose(gz);
  return 0;
}

static nf_status_t load_pickle(const char *path, nf_trace_t *t, nfc_sites *sites, char *err, size_t errlen) {
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
    execlp("python3", "python3", "-m", "nofrag.torch_trace", path, tmp, (char *)NULL);
    _exit(127); // exec failed: python3 not on PATH
  }
  int ws = 0;
  if (pid < 0) snprintf(err, errlen, "%s: cannot start python3: %s", path, strerror(errno));
  else if (waitpid(pid, &ws, 0) < 0) snprintf(err, errlen, "%s: waiting for python3: %s", path, strerror(errno));
  else if (WIFEXITED(ws) && WEXITSTATUS(ws) == 127)
    snprintf(err, errlen, "%s: a PyTorch snapshot pickle needs python3 to convert it, and python3 was not "
             "found on PATH (or convert elsewhere: python3 -m nofrag.torch_trace %s OUT.trace.gz)", path, path);
  else if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    copy_file_to_stderr(efd);
    snprintf(err, errlen, "%s: converting the snapshot with python3 -m nofrag.torch_trace failed (above)", path);
  } else {
    st = nf__trace_load(t, tmp, err, errlen);
    if (st == NF_OK && sites && load_sites(tmp, t, sites) != 0) {
      snprintf(err, errlen, "%s: out of memory reading call sites", path);
      nfc_sites_free(sites);
      nf__trace_free(t);
      st = NF_ERR_NOMEM;
    }
    if (st == NF_OK) { // messages should name the user's file, not our temporary
      char *name = malloc(strlen(path) + 1);
      if (name) { strcpy(name, path); free(t->name); t->name = name; }
    }
  }
  close(efd);
  unlink(tmp);
  return st;
}

nf_status_t nfc_load_trace(const char *path, nf_trace_t *t, const char **format, char *err, size_t errlen) {
  return nfc_load_trace_sites(path, t, NULL, format, err, errlen);
}

static nf_status_t load_file(const char *path, nf_trace_t *t, nfc_sites *sites, const char **format, char *err,
                             size_t errlen);

// Replace the first `from` in err by `to` (messages name the user's input,
// not our temporary copy of it).
static void rename_in_err(char *err, size_t errlen, const char *from, const char *to) {
  char *at = strstr(err, from);
  if (!at) return;
  char rest[1024];
  snprintf(rest, sizeof rest, "%s", at + strlen(from));
  snprintf(at, errlen - (size_t)(at - err), "%s%s", to, rest);
}

// A pipe, FIFO, terminal or socket (`<(zcat t.gz)`, /dev/stdin) can be read
// only once, and the input is read several times (the format is detected
// from its first bytes, call sites are a second pass): copy it whole to a
// private temporary file (removed afterwards) and load that. Read errors
// are reported; a copy that could not be completed is never loaded.
static nf_status_t load_stream(const char *path, nf_trace_t *t, nfc_sites *sites, const char **format, char *err,
                               size_t errlen) {
  const char *tmpdir = getenv("TMPDIR");
  char tmp[PATH_MAX];
  if (!tmpdir || !*tmpdir) tmpdir = "/tmp";
  snprintf(tmp, sizeof tmp, "%s/nofrag-input-XXXXXX", tmpdir);
  int in = open(path, O_RDONLY);
  if (in < 0) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return NF_ERR_INVALID;
  }
  int fd = mkstemp(tmp);
  if (fd < 0) {
    snprintf(err, errlen, "%s: not a regular file, and cannot create a temporary copy in %s: %s", path, tmpdir,
             strerror(errno));
    close(in);
    return NF_ERR_INVALID;
  }
  char buf[1 << 16];
  nf_status_t st = NF_OK;
  for (;;) {
    ssize_t r = read(in, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
      st = NF_ERR_INVALID;
      break;
    }
    if (r == 0) break;
    for (ssize_t w = 0; w < r;) {
      ssize_t k = write(fd, buf + w, (size_t)(r - w));
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) {
        snprintf(err, errlen, "%s: not a regular file, and writing its temporary copy %s failed: %s", path, tmp,
                 strerror(errno));
        st = NF_ERR_INVALID;
        break;
      }
      w += k;
    }
    if (st != NF_OK) break;
  }
  close(in);
  if (close(fd) != 0 && st == NF_OK) {
    snprintf(err, errlen, "%s: not a regular file, and writing its temporary copy %s failed: %s", path, tmp,
             strerror(errno));
    st = NF_ERR_INVALID;
  }
  if (st == NF_OK) {
    st = load_file(tmp, t, sites, format, err, errlen);
    if (st != NF_OK) rename_in_err(err, errlen, tmp, path);
    else { // messages should name the user's input, not our temporary
      char *name = malloc(strlen(path) + 1);
      if (name) { strcpy(name, path); free(t->name); t->name = name; }
    }
  }
  unlink(tmp);
  return st;
}

nf_status_t nfc_load_trace_sites(const char *path, nf_trace_t *t, nfc_sites *sites, const char **format,
                                    char *err, size_t errlen) {
  struct stat sb;
  if (stat(path, &sb) == 0 && (S_ISFIFO(sb.st_mode) || S_ISCHR(sb.st_mode) || S_ISSOCK(sb.st_mode)))
    return load_stream(path, t, sites, format, err, errlen);
  return load_file(path, t, sites, format, err, errlen);
}

static nf_status_t load_file(const char *path, nf_trace_t *t, nfc_sites *sites, const char **format, char *err,
                             size_t errlen) {
  unsigned char head[64];
  if (sites) memset(sites, 0, sizeof *sites);
  int got = peek(path, head, sizeof head);
  const char *fmt = "text";
  nf_status_t st;
  memset(t, 0, sizeof *t);
  if (got > 0 && head[0] == 0x80) { fmt = "pickle"; st = load_pickle(path, t, sites, err, errlen); }
  else if (got > 0 && nf__trace_is_rmm((const char *)head, (size_t)got)) { fmt = "rmm"; st = nf__trace_load_rmm(t, path, err, errlen); }
  else {
    st = nf__trace_load(t, path, err, errlen); // also reports unreadable files
    // A converted trace keeps its '#site' lines: the two-step route works too.
    if (st == NF_OK && sites && load_sites(path, t, sites) != 0) {
      snprintf(err, errlen, "%s: out of memory reading call sites", path);
      nfc_sites_free(sites);
      nf__trace_free(t);
      st = NF_ERR_NOMEM;
    }
  }
  if (st == NF_OK && t->n_events == 0) { // nothing to replay: say so rather than print a summary of zeros
    snprintf(err, errlen, "%s: empty trace: no events (%s)", path,
             strcmp(fmt, "rmm") == 0 ? "an RMM CSV log with its header but no rows"
             : strcmp(fmt, "pickle") == 0 ? "the snapshot's device trace has no alloc/free entries"
                                          : "expected lines 'ACTION ADDR SIZE STREAM TIME_US'");
    if (sites) nfc_sites_free(sites);
    nf__trace_free(t);
    st = NF_ERR_INVALID;
  }
  if (format) *format = fmt;
  return st;
}
