// Helpers shared by every backend: error reporting and destruction.
#include "backend.h"

#include <stdarg.h>
#include <unistd.h>

static _Thread_local char tl_err[NF_BACKEND_ERR_MAX];

char *nf__backend_err(void) { return tl_err; }

nf_status_t nf__backend_fail(nf_backend_t *be, nf_status_t st, const char *fmt, ...) {
  (void)be; // (NULL from a constructor that failed before it had one)
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tl_err, sizeof tl_err, fmt, ap);
  va_end(ap);
  return st;
}

NF_API void nf_backend_destroy(nf_backend_t *be) {
  if (be && be->ops && be->ops->destroy) be->ops->destroy(be);
}

nf_status_t nf__backend_from_config(nf_backend_t **out, const nf_config_t *cfg, bool bind) {
  *out = NULL;
  if (cfg->backend == NF_BACKEND_CUDA) return nf__backend_cuda_open(out, cfg->device, bind);
  // The simulated device: an H200's 141 GiB unless host_capacity says otherwise.
  uint64_t cap = cfg->host_capacity ? cfg->host_capacity : (uint64_t)141 * NF_GiB;
  uint64_t g = cfg->granule ? cfg->granule : 2 * NF_MiB;
  // The host backend's own checks, put in the configuration's terms (which key).
  long page = sysconf(_SC_PAGESIZE);
  if (g < (uint64_t)page)
    return nf__error(NF_ERR_CONFIG, "nofrag: granule %llu B is below the page size (%ld B), the host backend's least",
                     (unsigned long long)g, page);
  if (cap < g)
    return nf__error(NF_ERR_CONFIG, "nofrag: host_capacity %llu B is below one granule (%llu B)%s",
                     (unsigned long long)cap, (unsigned long long)g,
                     cfg->host_capacity ? "" : " (the default host_capacity, 141 GiB: set granule smaller)");
  return nf_backend_host_create(out, cap, g);
}
