// libFuzzer target: arbitrary bytes as a text trace with '#site' lines, read
// by the CLI's loader (tools/input.c: trace, then the call sites matched to
// their alloc lines). Loading must never crash, leak or read out of bounds;
// every event's site id must name an interned site.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // A pickle (first byte 0x80) would start python3: not this target's job
  // (fuzz/fuzz_pickle.py covers the converter).
  if (size && data[0] == 0x80) return 0;
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("fuzz_sites", 0);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
  nf_trace_t t;
  nfc_sites s;
  const char *fmt = NULL;
  char err[256];
  err[0] = 0;
  if (nfc_load_trace_sites(path, &t, &s, &fmt, err, sizeof err) != NF_OK) {
    if (strncmp(err, path, strlen(path)) != 0 || t.events || s.site) abort();
    return 0;
  }
  if (strcmp(fmt, "rmm") != 0) { // the RMM reader keeps no sites
    if (s.n < 1 || s.n_events != t.n_events || !s.of_event) abort();
    for (size_t e = 0; e < s.n_events; e++) {
      if (s.of_event[e] >= s.n) abort();
      if (s.of_event[e] && t.events[e].action != NF_TRACE_ALLOC) abort();
    }
    for (size_t i = 0; i < s.n; i++) {
      if (!s.site[i] || !s.func[i] || strchr(s.site[i], '\t')) abort();
    }
  }
  nfc_sites_free(&s);
  nf__trace_free(&t);
  return 0;
}
