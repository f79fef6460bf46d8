// The top of the library: a pool assembled from its layers. The core (core/)
// allocates; the tiers (tier/) and observers (observe/) are attached to it
// here through the hooks the core calls (core.h), so that no layer below
// calls one above it:
//
//   torch/        the PyTorch plug-in (a client of everything below)
//   src/nofrag.c  nf_pool_create / _from_string / nf_pool_destroy
//   tier/         offload host / detached / disk        observe/  record, monitor, snapshot
//   core/         pool, placement, vmm (granules, spill), streams, blockmap, stats, config
//   backend/      host (memfd+mmap), cuda (driver VMM), fault injection
//   base/         errors, byte formatter, lock
#include "observe/observe.h"
#include "tier/tier.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

nf_status_t nf_pool_create(nf_pool_t **out, nf_backend_t *be, const nf_config_t *cfg) {
  if (out) *out = NULL; // on every failure, as nf_pool_create_from_string
  if (!out || !be || !cfg) return nf__error(NF_ERR_INVALID, "nofrag: nf_pool_create: NULL argument");
  nf_pool_t *p;
  nf_status_t st = nf__core_create(&p, be, cfg);
  if (st != NF_OK) return st;
  p->tier = nf__tier_hooks;
  p->obs.oom = nf__oom_report;
  p->obs.oom_print = nf__oom_print;
  if (p->cfg.trace[0]) {
    if ((st = nf__rec_open(p)) != NF_OK) { // names the path and errno's text
      nf__core_destroy(p);
      return st;
    }
    p->obs.op = nf__rec_row;
  }
  nf__mon_open(p); // best effort: no monitor file is not an error
  *out = p;
  nf__error_clear();
  return NF_OK;
}

nf_status_t nf_pool_create_from_string(nf_pool_t **out, const char *conf) {
  if (!out) return nf__error(NF_ERR_INVALID, "nofrag: NULL argument");
  *out = NULL;
  if (!conf) conf = getenv("NOFRAG_CONF");
  nf_config_t cfg;
  nf_config_default(&cfg);
  char err[768]; // the unknown-key message lists every key
  if (nf_config_parse(&cfg, conf, err, sizeof err) != NF_OK) return nf__error(NF_ERR_CONFIG, "nofrag: %s", err);
  nf_backend_t *be;
  nf_status_t st = nf__backend_from_config(&be, &cfg, true);
  if (st != NF_OK) {
    // The backend's own message; one "nofrag: " prefix, whoever wrote it.
    char msg[600];
    snprintf(msg, sizeof msg, "%s", nf__unprefixed(nf_last_error()));
    return nf__error(st, "nofrag: backend:%s: %s", cfg.backend == NF_BACKEND_CUDA ? "cuda" : "host", msg);
  }
  if ((st = nf_pool_create(out, be, &cfg)) != NF_OK) {
    nf_backend_destroy(be);
    return st;
  }
  (*out)->owned_be = be;
  return NF_OK;
}

void nf_pool_destroy(nf_pool_t *p) {
  if (!p) return;
  nf__rec_close(p);
  nf__mon_close(p);
  nf__offload_destroy(p); // waits for copies in flight
  nf__core_destroy(p);
}
