// Host backend: sharing memory with another process (mem_export /
// mem_import; CUDA IPC's counterpart on the host backend, tests/test_ipc.c).
#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Export: a duplicate of the tier's memfd and the extent's offset. Import: a
// record over the received fd (not counted against this backend's capacity).

nf_status_t nf__host_mem_export(nf_backend_t *be, nf_handle_t hd, int *fd, uint64_t *off) {
  host_backend *h = hb(be);
  pthread_mutex_lock(&h->mu);
  uint32_t idx;
  mem_rec *r = nf__host_rec_of(h, hd, &idx);
  nf_status_t st = NF_OK;
  int src = r ? (r->ext_fd >= 0 ? r->ext_fd : h->tiers[r->tier].fd) : -1;
  if (!r) st = nf__backend_fail(be, NF_ERR_INVALID, "host backend: mem_export(%#llx): unknown or released handle",
                                (unsigned long long)hd);
  // As CUDA: host-located allocations are not IPC capable (cuMemCreate takes
  // no handle type for them), so CPU tests cannot pass where the GPU fails.
  else if (r->tier == NF_TIER_HOST && r->ext_fd < 0)
    st = nf__backend_fail(be, NF_ERR_UNSUPPORTED, "host backend: mem_export: host memory cannot be shared (as on CUDA)");
  else if ((*fd = fcntl(src, F_DUPFD_CLOEXEC, 0)) < 0)
    st = nf__backend_fail(be, NF_ERR_BACKEND, "host backend: mem_export: dup: %s", strerror(errno));
  else *off = r->off;
  pthread_mutex_unlock(&h->mu);
  return st;
}

nf_status_t nf__host_mem_import(nf_backend_t *be, int fd, uint64_t off, size_t size, nf_handle_t *out) {
  host_backend *h = hb(be);
  if (size == 0 || size % h->granule)
    return nf__backend_fail(be, NF_ERR_INVALID, "host backend: mem_import(%zu): size not a multiple of granule %llu", size,
                            (unsigned long long)h->granule);
  // The extent must lie in the file at a granule boundary (else map fails
  // late, or the first touch past the end raises SIGBUS).
  struct stat sb;
  if (off % h->granule || fstat(fd, &sb) != 0 || off > (uint64_t)sb.st_size || size > (uint64_t)sb.st_size - off)
    return nf__backend_fail(be, NF_ERR_INVALID, "host backend: mem_import: extent at %llu (%zu B) is not a granule "
                            "of the shared memory", (unsigned long long)off, size);
  int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (mine < 0) return nf__backend_fail(be, NF_ERR_BACKEND, "host backend: mem_import: dup: %s", strerror(errno));
  pthread_mutex_lock(&h->mu);
  nf_status_t st = NF_OK;
  uint32_t idx;
  mem_rec *r = nf__host_rec_new(h, &idx);
  if (!r) {
    st = nf__backend_fail(be, NF_ERR_NOMEM, "host backend: out of host memory");
  } else {
    *r = (mem_rec){.off = off, .size = size, .gen = r->gen, .ext_fd = mine, .tier = NF_TIER_DEVICE, .state = REC_LIVE};
    *out = (uint64_t)r->gen << 32 | (idx + 1);
  }
  pthread_mutex_unlock(&h->mu);
  if (st != NF_OK) close(mine);
  return st;
}

