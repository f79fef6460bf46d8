// Sharing a live block with another process (PyTorch's CUDA IPC through
// torch.multiprocessing: shareIpcHandle / getIpcDevPtr of the C++ adapter).
//
// The exporter turns each granule under the block into a POSIX fd
// (cuMemExportToShareableHandle; the pool creates granules with fd handles)
// and writes a text handle naming its pid and those fds. The importer fetches
// the fds out of the exporter with pidfd_getfd (Linux >= 5.6), as PyTorch's
// expandable segments do, imports them, maps them at a fresh address range and
// sets access. pidfd_getfd needs ptrace access to the exporter (PTRACE_MODE_
// ATTACH_REALCREDS: same user and, under Yama ptrace_scope 1, the exporter a
// descendant of the importer or CAP_SYS_PTRACE); a refusal is reported as such.
// The exporter keeps its fds open until the block is freed (the caller closes
// them: nf_ipc_export hands them back), so the importer can fetch them later.
#include "core/core.h"
#include "torch/torch.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

#define NF_IPC_MAGIC "nofrag-ipc1"

struct nf_ipc_map_s {
  nf_backend_t *be;
  uintptr_t va;
  uint64_t granule, n;
  nf_handle_t *h;  // per granule: the handle of the mapping starting there (0: none, or inside a unit)
  uint32_t *cnt;   // per granule: the granules of that mapping (1, or a unit's size)
  uint64_t mapped; // granules mapped so far (whole mappings, in order)
};

NF_API nf_status_t nf_ipc_export(nf_pool_t *p, const void *ptr, char *buf, size_t len, int *fds, size_t max_fds,
                                 size_t *nfds, uint64_t *offset) {
  if (!p || !buf || !fds || !nfds || !offset) return nf__error(NF_ERR_INVALID, "nofrag: nf_ipc_export: NULL argument");
  *nfds = 0;
  if (!p->be->ops->mem_export)
    return nf__error(NF_ERR_UNSUPPORTED, "nofrag: IPC: the %s backend cannot export memory", p->be->ops->name);
  nf__pool_lock(p);
  nf_status_t st = NF_OK;
  nf_block_t *b = nf__map_find(p, (uintptr_t)ptr);
  const nf_chunk_t *c = b ? b->chunk : NULL;
  uint64_t g0 = 0, g1 = 0;
  if (!b) st = nf__error(NF_ERR_INVALID, "nofrag: IPC: %p is not the start of a live block", ptr);
  uint64_t items = 0;
  if (st == NF_OK && !nf__range_mapped(p, c, b->addr, b->size))
    st = nf__error(NF_ERR_INVALID, "nofrag: IPC: block %p is not resident (offloaded?)", ptr);
  if (st == NF_OK) {
    g0 = (b->addr - c->base) >> p->gshift;
    g1 = (b->addr + b->size - c->base + p->granule - 1) >> p->gshift;
    // A mapping unit (unit.c) maps only whole: the importer maps every unit
    // the block touches, whole, so the range grows to their ends.
    uint64_t u0, un;
    if (nf__unit_of(p, c->phys[g0], &u0, &un)) g0 = u0;
    if (nf__unit_of(p, c->phys[g1 - 1], &u0, &un)) g1 = u0 + un;
    for (uint64_t g = g0; g < g1; g += nf__unit_of(p, c->phys[g], &u0, &un) ? un : 1) {
      items++;
      if (st == NF_OK && p->gran[c->phys[g]].tier != NF_TIER_DEVICE) // spill put it in host memory
        st = nf__error(NF_ERR_UNSUPPORTED, "nofrag: IPC: block %p lies partly in host memory (spill), which CUDA "
                       "cannot share; nf_prefetch it first", ptr);
    }
    if (st == NF_OK && items > max_fds) st = nf__error(NF_ERR_INVALID, "nofrag: IPC: block of %llu mappings, room for %zu fds",
                                        (unsigned long long)items, max_fds);
  }
  int n = st == NF_OK ? snprintf(buf, len, "%s %ld %llu %llu", NF_IPC_MAGIC, (long)getpid(),
                                 (unsigned long long)p->granule, (unsigned long long)(g1 - g0)) : 0;
  // One entry per mapping: fd:offset, and :granules for a unit.
  for (uint64_t g = g0, u0, un; st == NF_OK && g < g1; g += un) {
    int fd = -1;
    uint64_t off = 0;
    if (!nf__unit_of(p, c->phys[g], &u0, &un)) un = 1;
    st = p->be->ops->mem_export(p->be, p->gran[c->phys[g]].handle, &fd, &off);
    if (st != NF_OK) { nf__error(st, "nofrag: IPC: exporting a granule failed: %s", nf__backend_err()); break; }
    fds[(*nfds)++] = fd;
    char *at = (size_t)n < len ? buf + n : buf;
    size_t room = (size_t)n < len ? len - (size_t)n : 0;
    n += un > 1 ? snprintf(at, room, " %d:%llu:%llu", fd, (unsigned long long)off, (unsigned long long)un)
                : snprintf(at, room, " %d:%llu", fd, (unsigned long long)off);
  }
  if (st == NF_OK && (size_t)n >= len) st = nf__error(NF_ERR_INVALID, "nofrag: IPC: handle buffer of %zu B too small", len);
  if (st == NF_OK) {
    *offset = b->addr - (c->base + (g0 << p->gshift));
    b->shared = 1; // nf_offload refuses it from now on: the importer maps these granules
  }
  nf__pool_unlock(p);
  if (st != NF_OK) {
    for (size_t i = 0; i < *nfds; i++) close(fds[i]);
    *nfds = 0;
  }
  return st;
}

NF_API void nf_ipc_close(nf_ipc_map_t *m) {
  if (!m) return;
  nf_backend_t *be = m->be;
  if (m->mapped) be->ops->unmap(be, m->va, m->mapped * m->granule);
  for (uint64_t i = 0; i < m->n; i++)
    if (m->h[i]) be->ops->mem_release(be, m->h[i]);
  if (m->va) be->ops->va_release(be, m->va, m->n * m->granule);
  free(m->h);
  free(m->cnt);
  free(m);
}

static nf_status_t getfd_fail(int e, long pid) {
  if (e == EPERM || e == EACCES)
    return nf__error(NF_ERR_UNSUPPORTED,
                     "nofrag: IPC: pidfd_getfd on process %ld refused (%s): the receiving process needs ptrace access "
                     "to the sender (same user; under kernel.yama.ptrace_scope=1 only an ancestor of the sender, "
                     "or CAP_SYS_PTRACE). Send tensors from child to parent, set ptrace_scope to 0, or copy through "
                     "the CPU", pid, strerror(e));
  if (e == ENOSYS)
    return nf__error(NF_ERR_UNSUPPORTED, "nofrag: IPC: pidfd_getfd is not available (Linux >= 5.6 needed)");
  return nf__error(NF_ERR_BACKEND, "nofrag: IPC: fetching an fd from process %ld failed: %s", pid, strerror(e));
}

NF_API nf_status_t nf_ipc_import(nf_backend_t *be, const char *handle, void **base, nf_ipc_map_t **out) {
  if (!be || !handle || !base || !out) return nf__error(NF_ERR_INVALID, "nofrag: nf_ipc_import: NULL argument");
  *out = NULL;
  *base = NULL;
  if (!be->ops->mem_import)
    return nf__error(NF_ERR_UNSUPPORTED, "nofrag: IPC: the %s backend cannot import memory", be->ops->name);
  long pid;
  unsigned long long gsz, n;
  int used = 0;
  if (sscanf(handle, NF_IPC_MAGIC " %ld %llu %llu%n", &pid, &gsz, &n, &used) != 3 || !n || !gsz || (gsz & (gsz - 1)))
    return nf__error(NF_ERR_INVALID, "nofrag: IPC: not a nofrag handle: '%.60s'", handle);
  nf_ipc_map_t *m = calloc(1, sizeof *m);
  if (m) m->h = calloc(n, sizeof *m->h);
  if (m) m->cnt = calloc(n, sizeof *m->cnt);
  if (!m || !m->h || !m->cnt) {
    if (m) { free(m->h); free(m->cnt); }
    free(m);
    return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  }
  m->be = be;
  m->granule = gsz;
  m->n = n;
  nf_status_t st = NF_OK;
  int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
  if (pidfd < 0) {
    int e = errno;
    // ESRCH: no such pid in this process's PID namespace. Say what we see,
    // so an exited sender can be told from one in another PID namespace.
    if (e == ESRCH)
      st = nf__error(NF_ERR_INVALID,
                     "nofrag: IPC: pidfd_open(%ld) failed with ESRCH in process %ld (parent %ld; kill(%ld, 0): %s): "
                     "the sending process has exited, or it is in another PID namespace",
                     pid, (long)getpid(), (long)getppid(), pid, kill((pid_t)pid, 0) == 0 ? "exists" : strerror(errno));
    else
      st = getfd_fail(e, pid);
  }
  const char *s = handle + used;
  for (uint64_t i = 0, k; st == NF_OK && i < n; i += k) {
    int fd, used2 = 0, used3 = 0;
    unsigned long long off, cnt = 1;
    if (sscanf(s, " %d:%llu%n", &fd, &off, &used2) != 2) { st = nf__error(NF_ERR_INVALID, "nofrag: IPC: truncated handle"); break; }
    s += used2;
    if (*s == ':' && (sscanf(s, ":%llu%n", &cnt, &used3) != 1 || !cnt || cnt > n - i || cnt > UINT32_MAX)) {
      st = nf__error(NF_ERR_INVALID, "nofrag: IPC: bad mapping size in handle");
      break;
    }
    s += used3;
    k = cnt;
    int mine = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    if (mine < 0) { st = getfd_fail(errno, pid); break; }
    st = be->ops->mem_import(be, mine, off, cnt * gsz, &m->h[i]);
    close(mine); // the handle holds the memory
    if (st != NF_OK) nf__error(st, "nofrag: IPC: importing a granule failed: %s", nf__backend_err());
    else m->cnt[i] = (uint32_t)cnt;
  }
  if (pidfd >= 0) close(pidfd);
  if (st == NF_OK && (st = be->ops->va_reserve(be, n * gsz, gsz, &m->va)) != NF_OK) {
    m->va = 0;
    nf__error(st, "nofrag: IPC: reserving %llu B of address space failed: %s", n * gsz, nf__backend_err());
  }
  for (uint64_t i = 0; st == NF_OK && i < n; i += m->cnt[i]) {
    if ((st = be->ops->map(be, m->va + i * gsz, m->cnt[i] * gsz, m->h[i])) != NF_OK)
      nf__error(st, "nofrag: IPC: map failed: %s", nf__backend_err());
    else m->mapped += m->cnt[i];
  }
  if (st == NF_OK && (st = be->ops->set_access(be, m->va, n * gsz)) != NF_OK)
    nf__error(st, "nofrag: IPC: set access failed: %s", nf__backend_err());
  if (st != NF_OK) {
    nf_ipc_close(m);
    return st;
  }
  *base = (void *)m->va;
  *out = m;
  return NF_OK;
}

NF_API nf_backend_t *nf_pool_backend(nf_pool_t *p) { return p ? p->be : NULL; }
