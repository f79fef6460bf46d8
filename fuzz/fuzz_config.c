// libFuzzer target for the config parser: nf_config_parse must never crash,
// overrun the error buffer or half-apply a config; every config it accepts
// must format to a string that parses back to the same config.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nofrag.h"

static int same(const nf_config_t *a, const nf_config_t *b) {
  return a->limit == b->limit && a->reserve == b->reserve &&
         a->release_threshold == b->release_threshold && a->retain == b->retain &&
         a->granule == b->granule && a->small_max == b->small_max && a->va_chunk == b->va_chunk &&
         a->device == b->device && a->backend == b->backend && a->host_capacity == b->host_capacity;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // Exact-size heap copies so that ASan sees any read past the terminator.
  char *s = malloc(size + 1);
  if (!s) return 0;
  memcpy(s, data, size);
  s[size] = '\0';

  nf_config_t cfg, before;
  nf_config_default(&cfg);
  before = cfg;
  char err[256];
  nf_status_t st = nf_config_parse(&cfg, s, err, sizeof err);
  if (st != NF_OK) {
    if (st != NF_ERR_CONFIG || !memchr(err, '\0', sizeof err) || err[0] == '\0' || !same(&cfg, &before))
      abort();
    // The same error into a tiny exact-size buffer must stay inside it.
    size_t n = 1 + size % 7;
    char *small = malloc(n);
    if (small) {
      if (nf_config_parse(&cfg, s, small, n) != NF_ERR_CONFIG || strlen(small) >= n) abort();
      free(small);
    }
    free(s);
    return 0;
  }

  // Round trip: format, then parse into a config that differs everywhere.
  int len = nf_config_format(&cfg, NULL, 0);
  if (len <= 0) abort();
  char *buf = malloc((size_t)len + 1);
  if (!buf) abort();
  if (nf_config_format(&cfg, buf, (size_t)len + 1) != len || strlen(buf) != (size_t)len) abort();
  nf_config_t back;
  nf_config_default(&back);
  back.limit = ~cfg.limit, back.reserve = ~cfg.reserve, back.retain = ~cfg.retain;
  back.release_threshold = ~cfg.release_threshold, back.granule = cfg.granule ? 0 : 4096;
  back.small_max = cfg.small_max ? 0 : 1, back.va_chunk = ~cfg.va_chunk;
  back.device = cfg.device ? 0 : 1, back.backend = !cfg.backend, back.host_capacity = ~cfg.host_capacity;
  if (nf_config_parse(&back, buf, err, sizeof err) != NF_OK) {
    fprintf(stderr, "round trip failed: '%s' -> %s\n", buf, err);
    abort();
  }
  if (!same(&cfg, &back)) {
    fprintf(stderr, "round trip differs: '%s'\n", buf);
    abort();
  }
  free(buf);
  free(s);
  return 0;
}
