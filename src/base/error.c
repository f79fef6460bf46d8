// Thread-local error state, status names and the byte formatter: the base
// every layer (backends included) reports through.
#include "base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local nf_status_t tl_status;
static _Thread_local char tl_msg[768];

nf_status_t nf__error(nf_status_t st, const char *fmt, ...) {
  // Formatted aside first: callers may pass nf_last_error() (tl_msg itself)
  // as an argument, and vsnprintf into its own source garbles it.
  char buf[sizeof tl_msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  memcpy(tl_msg, buf, sizeof tl_msg);
  tl_status = st;
  return st;
}

void nf__error_clear(void) { tl_status = NF_OK; tl_msg[0] = 0; }

nf_status_t nf_last_status(void) { return tl_status; }
const char *nf_last_error(void) { return tl_msg; }

const char *nf_status_str(nf_status_t st) {
  switch (st) {
  case NF_OK: return "NF_OK";
  case NF_ERR_INVALID: return "NF_ERR_INVALID";
  case NF_ERR_OOM: return "NF_ERR_OOM";
  case NF_ERR_BACKEND: return "NF_ERR_BACKEND";
  case NF_ERR_CONFIG: return "NF_ERR_CONFIG";
  case NF_ERR_UNSUPPORTED: return "NF_ERR_UNSUPPORTED";
  case NF_ERR_NOMEM: return "NF_ERR_NOMEM";
  case NF_ERR_NOT_READY: return "NF_ERR_NOT_READY";
  case NF_ERR_FOREIGN: return "NF_ERR_FOREIGN";
  }
  return "NF_ERR_UNKNOWN";
}

bool nf__env_on(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

void nf__fmt_bytes(char *buf, size_t n, uint64_t v) {
  if (v >= NF_GiB << 10) snprintf(buf, n, "%.3f TiB", (double)v / (double)(NF_GiB << 10));
  else if (v >= NF_GiB) snprintf(buf, n, "%.3f GiB", (double)v / (double)NF_GiB);
  else if (v >= NF_MiB) snprintf(buf, n, "%.3f MiB", (double)v / (double)NF_MiB);
  else snprintf(buf, n, "%llu B", (unsigned long long)v);
}

void nf_format_bytes(char *buf, size_t n, uint64_t bytes) {
  if (buf && n) nf__fmt_bytes(buf, n, bytes);
}
