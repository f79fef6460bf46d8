// The stand-in driver's options (fake_cuda.c): NF_FAKE_CUDA holds
// 'key=value,...', read at every call so that a test may change them between
// calls (single-threaded moments only: setenv is not thread-safe).
#ifndef NF_FAKE_OPT_H
#define NF_FAKE_OPT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int fake_opt(const char *key, int dflt) {
  const char *s = getenv("NF_FAKE_CUDA");
  size_t n = strlen(key);
  while (s && *s) {
    if (strncmp(s, key, n) == 0 && s[n] == '=') return atoi(s + n + 1);
    s = strchr(s, ',');
    if (s) s++;
  }
  return dflt;
}

// A per-device key: "fd1" for key "fd", device 1.
static inline int fake_dev_opt(const char *key, int dev, int dflt) {
  char k[32];
  snprintf(k, sizeof k, "%s%d", key, dev);
  return fake_opt(k, dflt);
}

#endif
