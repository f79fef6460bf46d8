// Disk tier of nf_offload: synchronous. The owned range is copied out
// through a bounce buffer into an unlinked file and unmapped; prefetch maps
// device granules again and reads it back (see offload.c for the tiers).
#include "tier/tier.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BOUNCE_MAX (64ull << 20)

static nf_status_t disk_open(nf_pool_t *p) {
  if (p->disk_fd >= 0) return NF_OK;
  const char *dir = p->cfg.offload_dir[0] ? p->cfg.offload_dir : getenv("TMPDIR");
  if (!dir || !*dir) dir = "/tmp";
  char path[NF_TRACE_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/nofrag-offload-XXXXXX", dir);
  int fd = mkstemp(path);
  if (fd < 0) return nf__error(NF_ERR_BACKEND, "nofrag: offload: cannot create a file in %s: %s", dir, strerror(errno));
  unlink(path); // nothing is left behind, whatever happens to the process
  p->disk_fd = fd;
  return NF_OK;
}

// All n bytes at off, or an error: pread/pwrite may move fewer (a full
// disk, a file size limit) and only the next call says why.
static nf_status_t file_io(nf_pool_t *p, bool out, char *buf, uint64_t n, uint64_t off) {
  while (n) {
    ssize_t k = out ? pwrite(p->disk_fd, buf, n, (off_t)off) : pread(p->disk_fd, buf, n, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return nf__error(NF_ERR_BACKEND, "nofrag: %s disk: %s failed: %s", out ? "offload to" : "prefetch from",
                       out ? "write" : "read", k ? strerror(errno) : "unexpected end of file");
    buf += k, n -= (uint64_t)k, off += (uint64_t)k;
  }
  return NF_OK;
}

// *undrained (out only): a copy was queued and could not be waited for: it
// may still read the block (the caller makes the block's free wait for s).
static nf_status_t disk_io(nf_pool_t *p, bool out, uint64_t off, uintptr_t va, uint64_t len, uint32_t s,
                           bool *undrained) {
  uint64_t chunk = len < BOUNCE_MAX ? len : BOUNCE_MAX;
  char *buf = malloc(chunk);
  if (!buf) return nf__error(NF_ERR_NOMEM, "nofrag: offload: out of host memory for a bounce buffer");
  nf_status_t st = NF_OK;
  nf_stream_rec_t *r = &p->streams[s];
  for (uint64_t k = 0; k < len && st == NF_OK; k += chunk) {
    uint64_t n = len - k < chunk ? len - k : chunk;
    if (out) {
      st = NF_BE(p, copy, copy, (uintptr_t)buf, va + k, n, r->handle);
      if (st != NF_OK) { nf__error(st, "nofrag: offload to disk: copy failed: %s", nf__backend_err()); break; }
      if ((st = nf__stream_record(p, s)) == NF_OK) st = NF_BE(p, event_sync, event_sync, nf__stream_event(r));
      if (st != NF_OK) {
        nf__error(st, "nofrag: offload to disk: waiting for the copy failed: %s", nf__backend_err());
        if (!nf__xfer_drain(p, s)) *undrained = true; // (keeps this error)
        break;
      }
      st = file_io(p, true, buf, n, off + k);
    } else if ((st = file_io(p, false, buf, n, off + k)) == NF_OK) {
      // Pageable source: the copy has read the buffer when it returns.
      st = NF_BE(p, copy, copy, va + k, (uintptr_t)buf, n, r->handle);
      if (st != NF_OK) nf__error(st, "nofrag: prefetch from disk: copy failed: %s", nf__backend_err());
    }
  }
  free(buf);
  return st;
}

nf_status_t nf__offload_disk(nf_pool_t *p, nf_block_t *b, uint32_t s, uint64_t g0, uint64_t g1) {
  nf_chunk_t *c = b->chunk;
  uint64_t len = (g1 - g0) << p->gshift;
  nf_offl_t *o = calloc(1, sizeof *o);
  if (!o) return nf__error(NF_ERR_NOMEM, "nofrag: out of host memory");
  nf_status_t st = disk_open(p);
  bool undrained = false;
  if (st == NF_OK) st = nf__order_block(p, b, s);
  if (st == NF_OK) st = disk_io(p, true, p->disk_end, c->base + (g0 << p->gshift), len, s, &undrained);
  if (st == NF_OK) st = nf__unmap_run(p, c, g0, g1); // one mapping run: the block owns it whole
  if (st != NF_OK) {
    if (undrained) nf__prefetched_on(b, s); // a later unmap or free waits for that copy too (as the host tiers)
    free(o);
    return st;
  }
  o->b = b;
  o->n = g1 - g0;
  o->off = p->disk_end;
  o->next = p->offl;
  p->offl = o;
  p->disk_end += len;
  p->away_granules += o->n;
  p->disk_bytes += b->size;
  b->where = NF_TIER_DISK;
  p->st.offloads++;
  return NF_OK;
}

void nf__disk_forget(nf_pool_t *p, nf_offl_t *o) {
  fallocate(p->disk_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)o->off, (off_t)(o->n << p->gshift));
  p->away_granules -= o->n;
  p->disk_bytes -= o->b->size;
  // Extents are not reused while blocks are on disk; once none is, start
  // over, or offsets grow by every block ever offloaded (ext4 stops at 16 TiB).
  if (!p->disk_bytes && ftruncate(p->disk_fd, 0) == 0) p->disk_end = 0;
}

nf_status_t nf__prefetch_disk(nf_pool_t *p, nf_block_t *b, nf_offl_t *o, uint32_t s, uint64_t g0, uint64_t g1) {
  nf_chunk_t *c = b->chunk;
  // Mapping counts the range as new granules: take it out of disk first.
  p->away_granules -= o->n;
  nf_status_t st = nf__map_range(p, c, g0, g1, o->n << p->gshift, false);
  if (st == NF_ERR_OOM) nf__prefetch_oom(p, o->n);
  bool io = st == NF_OK;
  if (io) st = disk_io(p, false, o->off, c->base + (g0 << p->gshift), o->n << p->gshift, s, NULL);
  // Copies into the range that cannot be waited for may still be writing it,
  // which then cannot be unmapped: the whole range is read and queued again
  // instead (the file keeps the data), and the prefetch completes in stream
  // order. Each way is tried 3 times (both failing 3 times: the unmap below
  // goes ahead under them, the one case left).
  for (int t = 0; t < 3 && st != NF_OK && io && !nf__xfer_drain(p, s); t++)
    if (disk_io(p, false, o->off, c->base + (g0 << p->gshift), o->n << p->gshift, s, NULL) == NF_OK) st = NF_OK;
  if (st != NF_OK) {
    // The range must be unmapped again (map_range's own rollback may have
    // left granules behind on a failing backend), once the chunks already
    // queued on s have landed (their source is pageable: asynchronous).
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nf_last_error());
    for (uint64_t g = g0; g < g1; g++) {
      for (int t = 0; t < 3 && nf__bit(c->mapped, g); t++) nf__unmap_run(p, c, g, g + 1);
      if (nf__bit(c->mapped, g)) nf__bit_clr(NF_READY(c), g); // stays, unused: the next prefetch maps around it
    }
    nf__error(st, "%s", msg);
    p->away_granules += o->n;
    return st;
  }
  p->away_granules += o->n; // disk_forget takes it out again
  nf__disk_forget(p, o);
  p->st.prefetches++;
  return NF_OK;
}
