// `nofrag top`: a live view of every nofrag pool on this machine, read from
// the shared-memory files the pools publish (src/monitor.c).
//
//   nofrag top                  refresh every second; q or Ctrl-C quits
//   nofrag top --once [--json]  one table (or a JSON array) and exit
//   nofrag top --clean          remove the files of dead processes (its summary
//                               line goes to stderr with --json)
//   --dir DIR                   read DIR instead of $NOFRAG_SHM_DIR or /dev/shm
//   --selftest-hold SECONDS     (tests) hold a host pool with known live bytes
//   --selftest-exec SECONDS     (tests) the same, then exec `sleep SECONDS`
//
// Exit codes: 0 ok, 2 usage error or unreadable directory.
#include "nofrag.h"
#include "observe/monitor_shm.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

int nfc_top(int argc, char **argv);

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { (void)sig; stop_flag = 1; }

static double now_s(int clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// Compact sizes for the table ("1.50G"), powers of 1024.
static void human(char *buf, size_t n, uint64_t b) {
  const char *u = "BKMGT";
  double v = (double)b;
  int i = 0;
  while (v >= 1024.0 && i < 4) { v /= 1024.0; i++; }
  if (i == 0) snprintf(buf, n, "%lluB", (unsigned long long)b);
  else snprintf(buf, n, "%.2f%c", v, u[i]);
}

// Allocation rate: allocs delta over the refresh period when the previous
// frame saw the same pool, else the average since the pool was created.
// Field k's growth per second: since the previous frame, else since the pool began.
static double rate(const nf_mon_entry_t *e, int k, const nf_mon_entry_t *prev, long nprev, double dt) {
  for (long i = 0; prev && i < nprev; i++)
    if (prev[i].pid == e->pid && prev[i].pool_id == e->pool_id && dt > 0 && e->v[k] >= prev[i].v[k])
      return (double)(e->v[k] - prev[i].v[k]) / dt;
  double up = now_s(CLOCK_REALTIME) - (double)e->start_ns * 1e-9;
  return up > 0.001 ? (double)e->v[k] / up : 0.0;
}
static double alloc_rate(const nf_mon_entry_t *e, const nf_mon_entry_t *prev, long nprev, double dt) {
  return rate(e, NF_PUB_ALLOCS, prev, nprev, dt);
}

static void print_table(FILE *f, const nf_mon_entry_t *v, long n, const nf_mon_entry_t *prev, long nprev,
                        double dt) {
  // CALLS%: the share of wall time the pool spent in backend calls (driver
  // work and host waits), over the last frame.
  fprintf(f, "%-8s %-4s %-8s %10s %10s %10s %10s %6s %10s %9s %9s %10s %6s %6s\n", "PID", "POOL", "DEVICE", "LIVE",
          "MAPPED", "PHYSICAL", "LIMIT", "FRAG%", "LARGEST", "SPILLED", "OFFLOADED", "ALLOC/S", "CALLS%", "OOMS");
  for (long i = 0; i < n; i++) {
    const nf_mon_entry_t *e = &v[i];
    char live[16], mapped[16], phys[16], lim[16], lf[16], sp[16], off[16];
    human(live, sizeof live, e->v[NF_PUB_LIVE]);
    human(mapped, sizeof mapped, e->v[NF_PUB_MAPPED]);
    human(phys, sizeof phys, e->v[NF_PUB_PHYSICAL]);
    human(lim, sizeof lim, e->v[NF_PUB_LIMIT]);
    human(lf, sizeof lf, e->v[NF_PUB_LARGEST_FREE]);
    human(sp, sizeof sp, e->v[NF_PUB_SPILLED]);
    human(off, sizeof off, e->v[NF_PUB_OFFLOADED]);
    char calls[16] = "-"; // an older library's file has no backend time
    if (e->nfields > NF_PUB_BACKEND_NS)
      snprintf(calls, sizeof calls, "%.1f", 1e-7 * rate(e, NF_PUB_BACKEND_NS, prev, nprev, dt));
    fprintf(f, "%-8d %-4u %-8s %10s %10s %10s %10s %6.1f %10s %9s %9s %10.0f %6s %6llu\n", e->pid, e->pool_id,
            e->device, live, mapped, phys, lim, 100.0 * e->fragmentation, lf, sp, off, alloc_rate(e, prev, nprev, dt),
            calls, (unsigned long long)e->v[NF_PUB_OOMS]);
  }
  if (!n) fprintf(f, "(no nofrag pools)\n");
}

static void print_json(FILE *f, const nf_mon_entry_t *v, long n) {
  static const char *names[NF_PUB_NFIELDS] = {
      [NF_PUB_LIVE] = "live", [NF_PUB_LIVE_PEAK] = "live_peak", [NF_PUB_ALLOCS] = "allocs",
      [NF_PUB_FREES] = "frees", [NF_PUB_MAPPED] = "mapped", [NF_PUB_PHYSICAL] = "physical",
      [NF_PUB_LIMIT] = "limit", [NF_PUB_GRANULE] = "granule",
      [NF_PUB_LARGEST_FREE] = "largest_free", [NF_PUB_SPILLED] = "spilled", [NF_PUB_OOMS] = "ooms",
      [NF_PUB_RECLAIMS] = "reclaims", [NF_PUB_BACKEND_CALLS] = "backend_calls", [NF_PUB_OFFLOADED] = "offloaded",
      [NF_PUB_AWAY] = "away", [NF_PUB_BACKEND_NS] = "backend_ns"};
  fputc('[', f);
  for (long i = 0; i < n; i++) {
    const nf_mon_entry_t *e = &v[i];
    // device comes from our own writer ("host", "cuda:N"); escape anyway.
    fprintf(f, "%s\n {\"pid\": %d, \"pool\": %u, \"uid\": %u, \"device\": \"", i ? "," : "", e->pid, e->pool_id,
            e->uid);
    for (const char *c = e->device; *c; c++)
      if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
      else if ((unsigned char)*c >= 0x20) fputc(*c, f);
    fprintf(f, "\", \"start_ns\": %llu", (unsigned long long)e->start_ns);
    for (int k = 0; k < NF_PUB_NFIELDS; k++) fprintf(f, ", \"%s\": %llu", names[k], (unsigned long long)e->v[k]);
    fprintf(f, ", \"fragmentation\": %.6f, \"alloc_rate\": %.1f}", e->fragmentation, alloc_rate(e, NULL, 0, 0));
  }
  fputs(n ? "\n]\n" : "]\n", f);
}

// Interactive view: clear and redraw every second; q, Q or Ctrl-C quits.
// The terminal goes to non-canonical, no-echo mode (signals stay on so that
// Ctrl-C arrives as SIGINT) and is restored on every way out.
static int run_live(const char *dir) {
  struct termios saved, raw;
  int tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
  if (tty) {
    raw = saved;
    raw.c_lflag &= (tcflag_t) ~(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSANOW, &raw);
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  // A reader that goes away (`nofrag top | head`) must not kill us with
  // SIGPIPE before the terminal is restored: the failed write ends the loop.
  signal(SIGPIPE, SIG_IGN);
  // Into a pipe or a file, no terminal codes: one table after another, with a
  // blank line between them (`nofrag top | tee log`).
  const int ansi = isatty(STDOUT_FILENO);
  if (ansi) fputs("\033[?25l", stdout); // hide the cursor while redrawing
  nf_mon_entry_t *prev = NULL;
  long nprev = 0;
  double tprev = 0;
  int rc = 0;
  while (!stop_flag) {
    nf_mon_entry_t *v;
    long n = nf__mon_list(dir, false, &v, NULL);
    if (n < 0) {
      fprintf(stderr, "nofrag top: cannot read %s: %s\n", dir, strerror(errno));
      rc = 2;
      break;
    }
    double t = now_s(CLOCK_MONOTONIC);
    fputs(ansi ? "\033[H\033[2J" : tprev ? "\n" : "", stdout);
    printf("nofrag top — %s — %ld pool%s — q quits\n\n", dir, n, n == 1 ? "" : "s");
    print_table(stdout, v, n, prev, nprev, t - tprev);
    int out_failed = fflush(stdout) != 0 || ferror(stdout);
    free(prev);
    prev = v;
    nprev = n;
    tprev = t;
    if (out_failed) break; // stdout is gone (EPIPE, full disk): nothing more to show
    // Wait up to a second for a key; a signal ends the wait early (EINTR).
    for (double end = t + 1.0; !stop_flag;) {
      double left = end - now_s(CLOCK_MONOTONIC);
      if (left <= 0) break;
      struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
      int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
      if (pr > 0) {
        char c;
        ssize_t r = read(STDIN_FILENO, &c, 1);
        if (r <= 0) { if (!tty) stop_flag = 1; break; } // EOF on a pipe: nothing will ever quit us
        if (c == 'q' || c == 'Q' || c == 3) stop_flag = 1;
      }
    }
  }
  free(prev);
  fputs(ansi ? "\033[?25h\n" : "", stdout);
  fflush(stdout);
  if (tty) tcsetattr(STDIN_FILENO, TCSANOW, &saved);
  return rc;
}

// For tests: a real process with a host pool, 3 live blocks of known sizes
// (live = 12345678 B), one more block allocated and freed ~1000 times a
// second for a visible allocation rate; prints "ready PID" once published.
// then_exec: once ready, exec `sleep SECONDS` instead (same pid, pool gone).
static int selftest_hold(double seconds, bool then_exec) {
  nf_pool_t *p;
  if (nf_pool_create_from_string(&p, "limit:1GiB") != NF_OK) {
    fprintf(stderr, "nofrag top: %s\n", nf_last_error());
    return 1;
  }
  void *keep[3] = {nf_alloc(p, 10000000, NULL), nf_alloc(p, 2000000, NULL), nf_alloc(p, 345678, NULL)};
  if (!keep[0] || !keep[1] || !keep[2]) {
    fprintf(stderr, "nofrag top: %s\n", nf_last_error());
    return 1;
  }
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (then_exec) {
    char arg[32];
    snprintf(arg, sizeof arg, "%.0f", seconds);
    execlp("sleep", "sleep", arg, (char *)NULL);
    fprintf(stderr, "nofrag top: exec sleep: %s\n", strerror(errno));
    return 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  double end = now_s(CLOCK_MONOTONIC) + seconds;
  while (!stop_flag && now_s(CLOCK_MONOTONIC) < end) {
    nf_free(p, nf_alloc(p, 4096, NULL));
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  for (int i = 0; i < 3; i++) nf_free(p, keep[i]);
  nf_pool_destroy(p);
  return 0;
}

static const char top_usage[] =
    "usage: nofrag top [--once [--json]] [--clean] [--dir DIR]\n"
    "Live memory of every nofrag pool on this machine, read from the files the pools\n"
    "publish (NOFRAG_MONITOR=0 in a process turns its publishing off).\n"
    "\n"
    "  (no option)  refresh every second; q or Ctrl-C quits\n"
    "  --once       print one table and exit\n"
    "  --json       with --once: a JSON array instead of the table\n"
    "  --clean      remove the files left by processes that have exited or exec'd\n"
    "               (with --json, its summary line goes to stderr)\n"
    "  --dir DIR    read DIR instead of $NOFRAG_SHM_DIR, else /dev/shm\n";

int nfc_top(int argc, char **argv) {
  int once = 0, json = 0, clean = 0;
  const char *dir = NULL;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) { fputs(top_usage, stdout); return 0; }
    if (strcmp(argv[i], "--once") == 0) once = 1;
    else if (strcmp(argv[i], "--json") == 0) json = 1;
    else if (strcmp(argv[i], "--clean") == 0) clean = 1;
    else if ((strcmp(argv[i], "--dir") == 0 || strcmp(argv[i], "--selftest-hold") == 0 ||
              strcmp(argv[i], "--selftest-exec") == 0) && i + 1 >= argc) {
      fprintf(stderr, "nofrag top: %s needs a value\n", argv[i]);
      return 2;
    }
    else if (strcmp(argv[i], "--dir") == 0) dir = argv[++i];
    else if (strcmp(argv[i], "--selftest-hold") == 0) return selftest_hold(atof(argv[++i]), false);
    else if (strcmp(argv[i], "--selftest-exec") == 0) return selftest_hold(atof(argv[++i]), true);
    else {
      fprintf(stderr, "nofrag top: unknown option '%s'\n"
                      "usage: nofrag top [--once [--json]] [--clean] [--dir DIR]\n", argv[i]);
      return 2;
    }
  }
  if (!dir) dir = nf__mon_dir();
  if (json && !once) {
    fprintf(stderr, "nofrag top: --json needs --once\n");
    return 2;
  }
  if (clean) {
    nf_mon_entry_t *v;
    long dead = 0, n = nf__mon_list(dir, true, &v, &dead);
    free(v);
    if (n < 0) {
      fprintf(stderr, "nofrag top: cannot read %s: %s\n", dir, strerror(errno));
      return 2;
    }
    // With --json, stdout carries only the JSON array: the summary goes to stderr.
    fprintf(json ? stderr : stdout, "removed %ld file%s of dead processes; %ld live pool%s\n", dead,
            dead == 1 ? "" : "s", n, n == 1 ? "" : "s");
    if (!once) return 0;
  }
  if (!once) return run_live(dir);
  nf_mon_entry_t *v;
  long n = nf__mon_list(dir, false, &v, NULL);
  if (n < 0) {
    fprintf(stderr, "nofrag top: cannot read %s: %s\n", dir, strerror(errno));
    return 2;
  }
  if (json) print_json(stdout, v, n);
  else print_table(stdout, v, n, NULL, 0, 0);
  free(v);
  return 0;
}
