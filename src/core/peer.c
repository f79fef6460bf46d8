// Peer access: another GPU of the process reads and writes this pool's memory
// (model parallelism, tensor.to("cuda:1") over NVLink). With the VMM API,
// cudaDeviceEnablePeerAccess does not cover memory mapped with cuMemMap: each
// mapping must grant the peer itself (cuMemSetAccess). So the backend adds
// the peer to every later grant (add_peer), and this file re-grants what is
// granted already: every ready granule of every chunk (general and private)
// and every parked view (views stay granted and are reused with no new grant).
// Mapped granules not ready yet get the peer when they are made ready.
// Tier ranges (offload staging, the host window) hold no tensor a peer reads.
#include "core/core.h"

// Granule g of c is granted to the devices set_access names (owned and ready,
// or a parked view).
static bool granted(const nf_chunk_t *c, uint64_t g) {
  return (nf__bit(c->mapped, g) && nf__bit(NF_READY(c), g)) || (c->stale && nf__bit(c->stale, g));
}

static nf_status_t regrant(nf_pool_t *p, nf_chunk_t *c) {
  for (uint64_t g = 0; g < c->ngran;) {
    if (!granted(c, g)) { g++; continue; }
    uint64_t e = g + 1;
    while (e < c->ngran && granted(c, e)) e++;
    nf_status_t st = NF_BE(p, set_access, set_access, c->base + (g << p->gshift), (e - g) << p->gshift);
    if (st != NF_OK) return nf__error(st, "nofrag: nf_pool_add_peer: set access failed: %s", nf__backend_err());
    g = e;
  }
  return NF_OK;
}

nf_status_t nf_pool_add_peer(nf_pool_t *p, int device) {
  if (!p) return nf__error(NF_ERR_INVALID, "nofrag: nf_pool_add_peer: NULL pool");
  if (device < 0) return nf__error(NF_ERR_INVALID, "nofrag: nf_pool_add_peer: negative device %d", device);
  nf__pool_lock(p);
  nf_status_t st = NF_OK;
  if (!p->be->ops->add_peer)
    st = nf__error(NF_ERR_UNSUPPORTED, "nofrag: nf_pool_add_peer: the %s backend has no peer devices",
                   p->be->ops->name);
  else if ((st = p->be->ops->add_peer(p->be, device)) != NF_OK)
    st = nf__error(st, "nofrag: nf_pool_add_peer: %s", nf__backend_err());
  // A failed re-grant leaves some ranges granted to the peer: harmless (a
  // permission), and a later call grants the rest.
  for (nf_chunk_t *c = p->chunks; c && st == NF_OK; c = c->next) st = regrant(p, c);
  nf__pool_unlock(p);
  return st;
}
