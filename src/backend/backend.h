// The backend boundary: the only interface between the allocator core and
// the memory system. One call per CUDA driver VMM/stream call, so the CUDA
// backend is a thin translation and the host backend can mirror it exactly.
//
//   va_reserve   cuMemAddressReserve      va_release  cuMemAddressFree
//   mem_create   cuMemCreate (with tier)  mem_release cuMemRelease
//   map          cuMemMap (one handle)    unmap       cuMemUnmap (any mapped run)
//   set_access   cuMemSetAccess (a run)   granularity cuMemGetAllocationGranularity
//   add_peer     (more devices in set_access: peer access; optional)
//   capacity     cuMemGetInfo             copy        cuMemcpyAsync (offload, prefetch, spill)
//   event_*      cuEventCreate/Record/Query/Synchronize/Destroy
//   stream_wait  cuStreamWaitEvent
//
// Every op returns NF_OK or an error status and, on error, writes a message
// (nf__backend_fail) that nf__backend_err() reads. Ops must leave state
// unchanged on error.
#ifndef NF_BACKEND_H
#define NF_BACKEND_H

#include "base/base.h"
#include "nofrag.h"
#include <stdbool.h>
#include <stdio.h>

typedef uint64_t nf_handle_t; // physical allocation (CUmemGenericAllocationHandle)
typedef void *nf_event_t;     // CUevent

typedef struct nf_backend_ops_s {
  const char *name;
  nf_status_t (*granularity)(nf_backend_t *be, nf_tier_t tier, size_t *out);
  nf_status_t (*capacity)(nf_backend_t *be, nf_tier_t tier, uint64_t *total, uint64_t *free_bytes);
  nf_status_t (*va_reserve)(nf_backend_t *be, size_t size, size_t align, uintptr_t *out);
  nf_status_t (*va_release)(nf_backend_t *be, uintptr_t va, size_t size);
  nf_status_t (*mem_create)(nf_backend_t *be, nf_tier_t tier, size_t size, nf_handle_t *out);
  nf_status_t (*mem_release)(nf_backend_t *be, nf_handle_t h);
  nf_status_t (*map)(nf_backend_t *be, uintptr_t va, size_t size, nf_handle_t h);
  nf_status_t (*unmap)(nf_backend_t *be, uintptr_t va, size_t size);
  nf_status_t (*set_access)(nf_backend_t *be, uintptr_t va, size_t size);
  nf_status_t (*copy)(nf_backend_t *be, uintptr_t dst, uintptr_t src, size_t size, nf_stream_t s);
  nf_status_t (*event_create)(nf_backend_t *be, nf_event_t *out);
  nf_status_t (*event_destroy)(nf_backend_t *be, nf_event_t ev);
  nf_status_t (*event_record)(nf_backend_t *be, nf_event_t ev, nf_stream_t s);
  nf_status_t (*event_query)(nf_backend_t *be, nf_event_t ev); // NF_OK done, NF_ERR_NOT_READY
  nf_status_t (*event_sync)(nf_backend_t *be, nf_event_t ev);
  nf_status_t (*stream_wait)(nf_backend_t *be, nf_stream_t s, nf_event_t ev);
  void (*destroy)(nf_backend_t *be);
  // Optional (NULL: not supported), for sharing memory with another process
  // (src/torch/ipc.c): a POSIX fd (and an offset in it) for a physical
  // allocation (cuMemExportToShareableHandle; the caller closes it), and an
  // allocation made from such an fd received from another process
  // (cuMemImportFromShareableHandle; released with mem_release).
  nf_status_t (*mem_export)(nf_backend_t *be, nf_handle_t h, int *fd, uint64_t *off);
  nf_status_t (*mem_import)(nf_backend_t *be, int fd, uint64_t off, size_t size, nf_handle_t *out);
  // Optional (NULL: not supported), for several GPUs in one process: every
  // later set_access also grants device `device` read/write (cuMemSetAccess
  // with one descriptor per device). What is mapped already is the core's to
  // re-grant (nf_pool_add_peer).
  nf_status_t (*add_peer)(nf_backend_t *be, int device);
  // Optional (NULL: no bound): NF_OK when `n` more mappings fit the backend's
  // bound on them (the host backend: vm.max_map_count, each mapped granule
  // run being a kernel mapping), else an error with the message. The core
  // asks before mapping a request, which would otherwise map up to the bound,
  // fail and unmap it all again. A query: changes nothing.
  nf_status_t (*map_room)(nf_backend_t *be, uint64_t n);
  // Optional (NULL: every stream is), a query: NF_OK when the backend's
  // events may be recorded on stream `s`, else NF_ERR_INVALID with the reason
  // (CUDA: the stream is of another context, e.g. another device's). The core
  // asks once per new stream, so that a wrong stream fails the call that
  // brings it, not an event record in some later free.
  nf_status_t (*stream_check)(nf_backend_t *be, nf_stream_t s);
  // Optional (NULL: the pool never needs it): wait on the host until all work
  // queued on the device, on every stream, is complete (CUDA: cuCtxSynchronize
  // in the primary context). The core calls it only when all 64 stream slots
  // are taken, so that it can give back the slots of streams that may be gone
  // without recording an event on their handles.
  nf_status_t (*sync)(nf_backend_t *be);
  // Optional (NULL: never), a query: *capturing = 1 while stream `s` is being
  // captured into a CUDA graph (cuStreamIsCapturing). nf_private_begin asks
  // before it looks the stream up: a capture may have begun before the pool
  // is told of it (a MemPool begun inside one), and then the look-up must
  // make no host wait (giving back or taking a stream slot).
  nf_status_t (*stream_capturing)(nf_backend_t *be, nf_stream_t s, int *capturing);
} nf_backend_ops_t;

struct nf_backend_s {
  const nf_backend_ops_t *ops;
  nf_backend_t *inner; // the backend a wrapper (fault injection) forwards to, else NULL
};

// The message of the calling thread's last failed backend op. Per thread, not
// per backend: pools sharing one backend each run their ops under their own
// lock, so one backend-wide buffer was written by one pool's failure while
// another read it for its own message. Read right after the failing call.
#define NF_BACKEND_ERR_MAX 256
char *nf__backend_err(void);

// Record the message of a failed op (nf__backend_err) and return `st`.
nf_status_t nf__backend_fail(nf_backend_t *be, nf_status_t st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

// The backend a configuration names (backend:, device:, host_capacity:,
// granule:), for nf_pool_create_from_string and the PyTorch plug-in. Errors
// go to nf_last_error() (no backend object exists yet to carry them).
// `bind`: a CUDA backend made on a thread with no context makes the device's
// primary context current there (nf_backend_cuda_create); the plug-in passes
// false, leaving PyTorch's current device alone (cuda.c).
nf_status_t nf__backend_from_config(nf_backend_t **out, const nf_config_t *cfg, bool bind);
nf_status_t nf__backend_cuda_open(nf_backend_t **out, int device, bool bind);

// Fault backend (fault.c), for tests: besides its plan, call `from + i`
// fails for each bit i set in `mask` (absolute call numbers; from 0: off).
// nf_backend_fault_set clears the mask. Not a fault backend: no-op.
void nf__backend_fault_mask(nf_backend_t *be, uint64_t from, uint64_t mask);

#endif
